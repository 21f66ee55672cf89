"""Per-token reshaping cost of the registered methods the trainer runs (through `taco/eapo/tide_advantages`, input
checks included) against a plain elementwise multiply (the floor).

    python benchmarks/reshaping.py [--batch 256 --length 4096 --repeats 25 --baseline REV]

Inputs are what the trainer passes: float32 `(B, T)` statistics, TRL's 0/1 int32 completion mask (lengths
uniform in [T/4, T]) and `(B,)` advantages. The floor is `advantages_B[:, None] * entropy_BT`: one read of a
`(B, T)` tensor and one fresh `(B, T)` output, the least any per-token reshaping must do. Every variant is
timed round-robin with the floor, repeated, median; the table reports time / floor.

CPU timings of 4 MB tensors depend on the allocator: when glibc hands a freed block back to the kernel, the
next allocation page-faults ~1000 fresh pages, which can cost more than the arithmetic. Each regime runs in
its own subprocess: "warm" keeps freed memory in the process (`MALLOC_TRIM_THRESHOLD_`/`MALLOC_MMAP_THRESHOLD_`
large, the steady state of a long training process or of jemalloc/tcmalloc), "default" is glibc as it comes.
`--baseline REV` also times the functions as they were at git revision REV (before the fast paths).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402  (sets sys.path and offline environment)

WARM_ENV = {"MALLOC_TRIM_THRESHOLD_": str(1 << 34), "MALLOC_MMAP_THRESHOLD_": str(32 << 20)}
BASELINE_REV = "3f0c114"  # the methods before the fast paths (boolean indexing, torch.where, sort)
VARIANTS = ["taco", "eapo", "tide"]


def load_baseline(rev: str):
    """Import `trl_credit.methods` as it was at `rev` (a temporary package), or None if git cannot."""
    files = ["__init__.py", "_checks.py", "taco.py", "eapo.py", "tide.py"]
    target = Path(tempfile.mkdtemp()) / "trl_credit_baseline_methods"
    target.mkdir()
    try:
        for name in files:
            text = subprocess.run(
                ["git", "show", f"{rev}:trl_credit/methods/{name}"],
                cwd=_common.REPO_ROOT,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            (target / name).write_text(text)
    except (subprocess.CalledProcessError, FileNotFoundError):
        return None
    sys.path.insert(0, str(target.parent))
    import trl_credit_baseline_methods

    return trl_credit_baseline_methods


def make_inputs(batch: int, length: int, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    adv_B = torch.randn(batch, generator=g)
    lengths_B = torch.randint(length // 4, length + 1, (batch,), generator=g)
    mask_BT = (torch.arange(length).unsqueeze(0) < lengths_B.unsqueeze(1)).int()
    entropy_BT = torch.rand(batch, length, generator=g) * 3
    logps_BT = -torch.rand(batch, length, generator=g) * 6
    deviation_BT = torch.rand(batch, length, generator=g) * 0.3
    return adv_B, logps_BT, entropy_BT, deviation_BT, mask_BT


def variant_fns(methods, inputs, vocab_size: int = 151_936):
    """The registered methods on plain tensors, their input checks included (EAPO's batch quantiles with them)."""
    adv_B, logps_BT, entropy_BT, deviation_BT, mask_BT = inputs
    return {
        "taco": lambda: (
            methods.taco_advantages(adv_B, mask_BT, policy_logps=logps_BT, policy_entropy=entropy_BT).advantages_BT
        ),
        "eapo": lambda: methods.eapo_advantages(adv_B, mask_BT, rollout_entropy=entropy_BT).advantages_BT,
        "tide": lambda: (
            methods.tide_advantages(
                adv_B, mask_BT, reference_deviation=deviation_BT, rollout_entropy=entropy_BT, vocab_size=vocab_size
            ).advantages_BT
        ),
    }


def baseline_variant_fns(methods, inputs, vocab_size: int = 151_936):
    """The same at `BASELINE_REV`, whose helpers took the statistics positionally."""
    adv_B, logps_BT, entropy_BT, deviation_BT, mask_BT = inputs
    return {
        "taco": lambda: methods.taco_advantages(adv_B, logps_BT, entropy_BT, mask_BT),
        "eapo": lambda: methods.eapo_advantages(adv_B, entropy_BT, mask_BT),
        "tide": lambda: methods.tide_advantages(adv_B, deviation_BT, entropy_BT, mask_BT, vocab_size),
    }


def worker(args) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    from trl_credit import methods

    inputs = make_inputs(args.batch, args.length)
    adv_B, _, entropy_BT, _, mask_BT = inputs
    fns = {"floor": lambda: adv_B.unsqueeze(1) * entropy_BT}
    fns.update(variant_fns(methods, inputs))
    if args.worker == "baseline":  # its own process, so that its temporaries do not fragment the other's heap
        baseline = load_baseline(args.baseline)
        if baseline is None:
            return {}
        for name, fn in baseline_variant_fns(baseline, inputs).items():
            torch.testing.assert_close(fn(), fns[name](), rtol=1e-5, atol=1e-5)
            fns[name] = fn
    ratios = _common.paired_ratios(fns, "floor", args.repeats, inner=args.inner)
    floor_ms = _common.interleaved_medians({"floor": fns["floor"]}, args.repeats, inner=args.inner)["floor"] * 1e3
    return {"floor_ms": floor_ms, "ratios": ratios}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument("--inner", type=int, default=3, help="calls per timed sample")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--baseline", default=BASELINE_REV, help="git revision to compare with ('' = none)")
    parser.add_argument("--worker", choices=["current", "baseline"], help=argparse.SUPPRESS)
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return

    results = {}
    runs = [("current", "warm", WARM_ENV), ("current", "default", {})]
    if args.baseline:
        runs += [("baseline", "warm", WARM_ENV), ("baseline", "default", {})]
    for code, regime, extra_env in runs:
        env = {k: v for k, v in os.environ.items() if k not in WARM_ENV} | extra_env
        cmd = [sys.executable, __file__, *sys.argv[1:], "--worker", code]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(out.stderr)
        results[code, regime] = json.loads(out.stdout.strip().splitlines()[-1])
        print(code, regime, json.dumps(results[code, regime]))

    rows = [
        [
            "floor `A[:, None] * H`",
            *(f"1.0x ({results['current', r]['floor_ms']:.2f} ms)" for r in ("warm", "default")),
        ]
    ]
    for name in VARIANTS:
        row = [f"`{name}`"]
        for regime in ("warm", "default"):
            cell = f"{results['current', regime]['ratios'][name]:.1f}x"
            if results.get(("baseline", regime)):
                cell += f" (was {results['baseline', regime]['ratios'][name]:.0f}x)"
            row.append(cell)
        rows.append(row)
    table = _common.markdown_table(["variant", "time / floor, warm allocator", "time / floor, default glibc"], rows)
    print(table)
    if args.no_write:
        return
    was = (
        f'\n"(was ...)" is the same function at git `{args.baseline}`, timed in its own process against its own floor '
        "(results equal to 1e-5, asserted)."
        if args.baseline
        else ""
    )
    command = f"python benchmarks/reshaping.py --batch {args.batch} --length {args.length} --repeats {args.repeats}"
    command += f" --baseline {args.baseline!r}" if args.baseline != BASELINE_REV else ""
    body = f"""`{command}`;
B x T = {args.batch} x {args.length} float32, TRL's int32 0/1 mask, {_common.machine_note(args.threads)}. Median of
{args.repeats} interleaved rounds ({args.inner} calls each) of the ratio to the floor timed in the same round; absolute floor
time in parentheses, for scale only.
Each variant is the registered method the trainer runs, with its input checks; `eapo` includes its two batch
quantiles (a sort of the valid tokens' entropies).{was}

{table}

Target: each method <= 5x the floor. Why the floor is hard to approach: it is one multiply over data in cache,
while every method needs one `exp` per token (alone ~2-3x the floor with `exp2`, ~5x with `exp`), a per-row
reduction (EAPO, TIDE) and a validity check of its inputs."""
    _common.write_section("reshaping", "Per-token reshaping vs an elementwise multiply", body)


if __name__ == "__main__":
    main()
