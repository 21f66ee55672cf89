"""How each method's cost grows with completion length, group size and vocabulary, and what a 32B run would spend.

    python benchmarks/scaling.py --parts reshaping   # ~3 min on 2 shared CPU cores (the "Scaling" section)

Measured here (one process, 1 torch thread):

* reshaping (`taco/eapo/tide_advantages`, and EAPO's batch quantiles) for B x T with T = 1k..8k at B = 64, and
  B = 32..256 at T = 2048 (B = prompts x group size G: G enters only through B). Each size interleaves the methods
  with the elementwise floor, repeated, median; reported as ns per token and as a ratio to the floor;
* the streamed TIDE statistics for N tokens x V vocabulary rows x H hidden: a least-squares fit
  `t = a N V H + b N V` (matmul part + per-logit elementwise part) over a grid of (N, V, H), and its residuals.

The 32B projection then uses those fitted per-token costs and FLOP counts; the arithmetic is printed with it.

Every registered method (`--parts methods`, its own section and `docs/images/scaling_methods.png`), driven by
`trl_credit.methods.CREDIT_METHODS`: each method's own call (`CreditMethod.on_tensors`, as the trainer runs it, input
and result checks included) on the synthetic batches of `_method_inputs.py`, B in {16, 64, 256} rows x T in {512, 2k,
8k, 16k} tokens at G = 4 (and G = 16 at the largest size), every size interleaving the methods with an elementwise
floor, median of `--repeats` rounds. Its extra peak memory is measured in a child process whose large allocations go
back to the kernel when freed (`_method_inputs.MEMORY_ENV`), as the resident-set high-water mark above the resident
set before the call. Growth: least-squares slopes of log time and log memory against log(B x T). The statistics that
a method needs streamed through the LM head (`--parts streams`) are timed on hidden states at V in {49k, 151k}.

    python benchmarks/scaling.py --parts methods streams   # ~3 min on 2 idle CPU cores (21 min at load 12-15)
    python benchmarks/scaling.py --parts methods --quick   # seconds: small sizes, nothing written
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
from _method_inputs import MEMORY_ENV, arguments_for, extra_peak_bytes, method_batch  # noqa: E402
from reshaping import make_inputs  # noqa: E402
from tide_statistics import make_inputs as make_head_inputs  # noqa: E402

# (B rows, T tokens) at G = 4; G = 16 again at the sizes of GROUP_16_SIZES. The largest is 256 x 16,384 = 4.2M tokens.
METHOD_SIZES = [(b, t) for t in (512, 2048, 8192) for b in (16, 64, 256)] + [(64, 16384), (256, 16384)]
GROUP_16_SIZES = [(256, 2048), (64, 16384)]
QUICK_SIZES = [(8, 64), (16, 128), (32, 256)]
FIT_MIN_TOKENS = 131_072  # below this a call's fixed cost (checks, Python) dominates; the slopes fit the sizes above
# A method's slope this far above the floor's flags it superlinear: on a shared CPU even the floor's slope exceeds 1
# (larger batches leave the caches and share the memory bandwidth), so the floor is the reference.
SUPERLINEAR_MARGIN = 0.1
# Statistics the trainer streams through an LM head over recorded hidden states, and the kernel it uses. On TRL's plain
# `generate` path the rollout_* statistics also come from `token_statistics` (see docs/benchmarks.md).
STREAMED = {
    "reference_deviation": "hellinger_and_entropy",
    "previous_policy_deviation": "hellinger_and_entropy",
    "rollout_unsampled_mass": "token_statistics",
    "rollout_unsampled_sum_sq_probs": "token_statistics",
    "policy_logit_gap": "token_statistics",
}
STREAM_POINTS = [(n, v) for v in (49_152, 151_936) for n in (256, 1024)]
QUICK_STREAM_POINTS = [(n, v) for v in (4096, 16384) for n in (128, 512)]
PLOT = _common.REPO_ROOT / "docs" / "images" / "scaling_methods.png"


def reshaping_points(args):
    from trl_credit import methods

    sizes = [(64, t) for t in (1024, 2048, 4096, 8192)] + [(b, 2048) for b in (32, 128, 256)]
    points = []
    for b, t in sizes:
        adv_B, logps_BT, entropy_BT, deviation_BT, mask_BT = make_inputs(b, t)
        fns = {
            "floor": lambda: adv_B.unsqueeze(1) * entropy_BT,
            "taco": lambda: (
                methods.taco_advantages(adv_B, mask_BT, policy_logps=logps_BT, policy_entropy=entropy_BT).advantages_BT
            ),
            # EAPO's batch quantiles included
            "eapo": lambda: methods.eapo_advantages(adv_B, mask_BT, rollout_entropy=entropy_BT).advantages_BT,
            "tide": lambda: (
                methods.tide_advantages(
                    adv_B, mask_BT, reference_deviation=deviation_BT, rollout_entropy=entropy_BT, vocab_size=151_936
                ).advantages_BT
            ),
        }
        ratios = _common.paired_ratios(fns, "floor", args.repeats, inner=3)
        floor = _common.interleaved_medians({"floor": fns["floor"]}, args.repeats, inner=3)["floor"]
        points.append({"B": b, "T": t, "floor_ns": floor / (b * t) * 1e9, "ratios": ratios})
        print(b, t, {k: round(v, 1) for k, v in ratios.items()}, flush=True)
    return points


def head_points(args):
    from trl_credit.trainer.lm_head_statistics import hellinger_and_entropy

    grid = [
        (512, 49_152, 128),
        (1024, 49_152, 128),
        (2048, 49_152, 128),
        (1024, 16_384, 128),
        (1024, 151_936, 128),
        (1024, 49_152, 32),
        (1024, 49_152, 512),
    ]
    points = []
    for n, v, h in grid:
        inputs = make_head_inputs(n, v, h)
        samples = []
        for _ in range(args.head_repeats):
            start = time.perf_counter()
            hellinger_and_entropy(*inputs, token_chunk_size=1024, vocab_chunk_size=16384)
            samples.append(time.perf_counter() - start)
        points.append({"N": n, "V": v, "H": h, "s": statistics.median(samples)})
        print(points[-1], flush=True)
    return points


def fit(points):
    """Least squares for t = a N V H + b N V (no intercept), by the 2x2 normal equations."""
    xs = [(p["N"] * p["V"] * p["H"], p["N"] * p["V"]) for p in points]
    ys = [p["s"] for p in points]
    s11 = sum(x1 * x1 for x1, _ in xs)
    s12 = sum(x1 * x2 for x1, x2 in xs)
    s22 = sum(x2 * x2 for _, x2 in xs)
    y1 = sum(x1 * y for (x1, _), y in zip(xs, ys))
    y2 = sum(x2 * y for (_, x2), y in zip(xs, ys))
    det = s11 * s22 - s12 * s12
    a, b = (y1 * s22 - y2 * s12) / det, (s11 * y2 - s12 * y1) / det
    return a, b, [y / (a * x1 + b * x2) - 1 for (x1, x2), y in zip(xs, ys)]


def method_calls(rows: int, length: int, group_size: int) -> dict:
    """The elementwise floor and every registered method's own call on one synthetic batch, by name."""
    from trl_credit.methods import CREDIT_METHODS

    advantages_B, mask_BT, named = method_batch(rows, length, group_size)
    calls = {"floor": lambda: advantages_B.unsqueeze(1) * named["policy_entropy"]}
    for name, method in sorted(CREDIT_METHODS.items()):
        incoming = None if method.estimates_advantages else advantages_B
        calls[name] = functools.partial(method.on_tensors, incoming, mask_BT, **arguments_for(method, named))
    return calls


def stream_calls(tokens: int, vocab: int, hidden: int) -> dict:
    """The two LM-head kernels the trainer streams statistics with, on random hidden states and heads."""
    import torch

    from trl_credit.trainer.lm_head_statistics import hellinger_and_entropy, token_statistics

    hidden_NH, ref_hidden_NH, weight_VH, ref_weight_VH = make_head_inputs(tokens, vocab, hidden)
    ids_N = torch.randint(0, vocab, (tokens,), generator=torch.Generator().manual_seed(1))
    return {
        "token_statistics": lambda: token_statistics(hidden_NH, weight_VH, ids_N),
        "hellinger_and_entropy": lambda: hellinger_and_entropy(hidden_NH, ref_hidden_NH, weight_VH, ref_weight_VH),
    }


def timed_rounds(calls: dict, repeats: int) -> dict[str, list[float]]:
    """Seconds of each call in each of `repeats` round-robin rounds, after one warm-up call each."""
    for fn in calls.values():
        fn()
    samples = {name: [] for name in calls}
    for _ in range(repeats):
        for name, fn in calls.items():
            start = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - start)
    return samples


def memory_worker(job: dict) -> None:
    """Child process (`MEMORY_ENV`): print one JSON line of extra peak bytes per (size, call)."""
    import torch

    torch.set_num_threads(job["threads"])
    for rows, length, group_size in job["methods"]:
        calls = method_calls(rows, length, group_size)
        for name, fn in calls.items():
            fn()
            peak = extra_peak_bytes(fn)
            print(json.dumps({"size": [rows, length, group_size], "name": name, "bytes": peak}), flush=True)
    for tokens, vocab in job["streams"]:
        for name, fn in stream_calls(tokens, vocab, job["hidden"]).items():
            peak = extra_peak_bytes(fn)
            print(json.dumps({"size": [tokens, vocab], "name": name, "bytes": peak}), flush=True)


def measure_memory(method_sizes, stream_points, args) -> dict:
    job = {"methods": method_sizes, "streams": stream_points, "hidden": args.stream_hidden, "threads": args.threads}
    env = {**os.environ, **MEMORY_ENV}
    output = subprocess.run(
        [sys.executable, __file__, "--memory-worker", json.dumps(job)], env=env, capture_output=True, text=True
    )
    if output.returncode:
        raise RuntimeError(f"memory worker failed:\n{output.stderr[-3000:]}")
    lines = [json.loads(line) for line in output.stdout.splitlines() if line.startswith("{")]
    return {(tuple(line["size"]), line["name"]): line["bytes"] for line in lines}


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of log y against log x (points with y > 0); nan with fewer than two."""
    logs = [(math.log(x), math.log(y)) for x, y in points if y > 0]
    if len(logs) < 2:
        return float("nan")
    mean_x = statistics.fmean(x for x, _ in logs)
    mean_y = statistics.fmean(y for _, y in logs)
    sxx = sum((x - mean_x) ** 2 for x, _ in logs)
    return sum((x - mean_x) * (y - mean_y) for x, y in logs) / sxx if sxx else float("nan")


def _mib(num_bytes: float) -> str:
    return f"{num_bytes / 2**30:.2f} GiB" if num_bytes >= 2**30 else f"{num_bytes / 2**20:.1f} MiB"


def _seconds(value: float) -> str:
    return f"{value:.2f} s" if value >= 1 else f"{value * 1e3:.1f} ms"


def method_points(args):
    """Time (median, and ratio to the floor, per round) and extra peak memory of every method at every size."""
    sizes = [(b, t, 4) for b, t in (QUICK_SIZES if args.quick else METHOD_SIZES)]
    sizes += [(b, t, 16) for b, t in ([QUICK_SIZES[-1]] if args.quick else GROUP_16_SIZES)]
    points = []
    for rows, length, group_size in sizes:
        repeats = args.repeats if rows * length < 1 << 20 else max(3, args.repeats // 3)
        samples = timed_rounds(method_calls(rows, length, group_size), repeats)
        for name, values in samples.items():
            ratio = statistics.median(v / f for v, f in zip(values, samples["floor"]))
            points.append(
                {"B": rows, "T": length, "G": group_size, "name": name, "s": statistics.median(values), "ratio": ratio}
            )
        print(rows, length, group_size, {p["name"]: f"{p['s']:.4f}" for p in points[-len(samples) :]}, flush=True)
    return points


def stream_points(args):
    grid = QUICK_STREAM_POINTS if args.quick else STREAM_POINTS
    points = []
    for tokens, vocab in grid:
        samples = timed_rounds(stream_calls(tokens, vocab, args.stream_hidden), args.stream_repeats)
        for name, values in samples.items():
            points.append({"N": tokens, "V": vocab, "name": name, "s": statistics.median(values)})
        print(tokens, vocab, {p["name"]: f"{p['s']:.2f}" for p in points[-2:]}, flush=True)
    return points


def render_plot(rows_by_method: dict, path: Path) -> None:
    """Two log-log panels: each method's time and extra peak memory against B x T (G = 4)."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    figure = Figure(figsize=(12, 5), layout="constrained")
    time_ax, memory_ax = figure.subplots(1, 2)
    colors = colormaps["tab20"]
    for index, (name, by_tokens) in enumerate(sorted(rows_by_method.items())):
        tokens = sorted(by_tokens)
        style = {"color": "black", "linestyle": "--"} if name == "floor" else {"color": colors(index % 20)}
        for ax, key in ((time_ax, "s"), (memory_ax, "bytes")):
            values = [statistics.fmean(p[key] for p in by_tokens[n]) for n in tokens]
            kept = [(n, v) for n, v in zip(tokens, values) if v > 0]
            ax.plot([n for n, _ in kept], [v for _, v in kept], marker="o", markersize=3, label=name, **style)
    time_ax.set(xscale="log", yscale="log", xlabel="B x T (tokens)", ylabel="seconds per call (median)")
    memory_ax.set(xscale="log", yscale="log", xlabel="B x T (tokens)", ylabel="extra peak memory (bytes)")
    time_ax.set_title("time of the method's own call (G = 4)")
    memory_ax.set_title("extra peak resident memory (G = 4)")
    for ax in (time_ax, memory_ax):
        ax.grid(True, which="both", alpha=0.3)
    memory_ax.legend(fontsize=7, ncol=2, loc="upper left")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def methods_section(args) -> str:
    from trl_credit.methods import CREDIT_METHODS

    start = time.perf_counter()
    load_before = os.getloadavg()
    points = method_points(args)
    streams = stream_points(args) if "streams" in args.parts else []
    sizes = sorted({(p["B"], p["T"], p["G"]) for p in points})
    memory = measure_memory(sizes, sorted({(p["N"], p["V"]) for p in streams}), args)
    for p in points:
        p["bytes"] = memory[((p["B"], p["T"], p["G"]), p["name"])]
    for p in streams:
        p["bytes"] = memory[((p["N"], p["V"]), p["name"])]
    elapsed = time.perf_counter() - start
    load_after = os.getloadavg()

    fit_min = 0 if args.quick else FIT_MIN_TOKENS
    by_method: dict[str, dict[int, list]] = {}
    for p in points:
        if p["G"] == 4:
            by_method.setdefault(p["name"], {}).setdefault(p["B"] * p["T"], []).append(p)
    largest = max((p for p in points if p["G"] == 4), key=lambda p: p["B"] * p["T"])
    big_b, big_t = largest["B"], largest["T"]
    floor_slope = slope(
        [
            (p["B"] * p["T"], p["s"])
            for p in points
            if p["name"] == "floor" and p["G"] == 4 and p["B"] * p["T"] >= fit_min
        ]
    )
    rows = []
    for name in ["floor", *sorted(CREDIT_METHODS)]:
        mine = [p for p in points if p["name"] == name]
        at_g4 = [p for p in mine if p["G"] == 4 and p["B"] * p["T"] >= fit_min]
        time_slope = slope([(p["B"] * p["T"], p["s"]) for p in at_g4])
        memory_slope = slope([(p["B"] * p["T"], p["bytes"]) for p in at_g4])
        top = next(p for p in mine if (p["B"], p["T"], p["G"]) == (big_b, big_t, 4))
        g16 = max((p for p in mine if p["G"] == 16), key=lambda p: p["B"] * p["T"], default=None)
        g4 = next((p for p in mine if g16 and (p["B"], p["T"], p["G"]) == (g16["B"], g16["T"], 4)), None)
        tokens = big_b * big_t
        method = CREDIT_METHODS.get(name)
        streamed = sorted(
            {STREAMED[s] for s in (method.statistics_for(method.hyperparameters()) if method else ()) if s in STREAMED}
        )
        flag = " **superlinear**" if time_slope > floor_slope + SUPERLINEAR_MARGIN else ""
        rows.append(
            [
                f"`{name}`",
                ", ".join(f"`{s}`" for s in (method.statistics_for(method.hyperparameters()) if method else ()))
                or "-",
                f"{time_slope:.2f}{flag}",
                f"{memory_slope:.2f}",
                _seconds(top["s"]),
                f"{top['s'] / tokens * 1e9:.1f}",
                f"{top['ratio']:.0f}x",
                _mib(top["bytes"]),
                f"{top['bytes'] / tokens / 4:.1f}",
                f"{g16['s'] / g4['s']:.2f}x" if g16 and g4 else "-",
                ", ".join(f"`{k}`" for k in streamed) or "-",
            ]
        )
    table = _common.markdown_table(
        [
            "method",
            "statistics read",
            "time slope in B x T",
            "memory slope in B x T",
            f"time at {big_b} x {big_t:,}",
            "ns / token",
            "/ floor",
            "extra peak memory",
            "floats (4 B) / token",
            "G = 16 / G = 4 time (at {} x {:,})".format(
                *max(((p["B"], p["T"]) for p in points if p["G"] == 16), key=math.prod)
            ),
            "streams the LM head with",
        ],
        rows,
    )
    size_rows = []
    for b, t, g in sizes:
        at = {p["name"]: p for p in points if (p["B"], p["T"], p["G"]) == (b, t, g)}
        size_rows.append(
            [f"{b} x {t:,}, G = {g}"]
            + [f"{_seconds(at[n]['s'])} / {_mib(at[n]['bytes'])}" for n in sorted(CREDIT_METHODS)]
        )
    size_table = _common.markdown_table(["B x T"] + [f"`{n}`" for n in sorted(CREDIT_METHODS)], size_rows)

    stream_text = ""
    if streams:
        stream_rows = []
        for name in ("token_statistics", "hellinger_and_entropy"):
            mine = [p for p in streams if p["name"] == name]
            top_v = max(p["V"] for p in mine)
            top_n = max(p["N"] for p in mine)
            n_slope = slope([(p["N"], p["s"]) for p in mine if p["V"] == top_v])
            v_slope = slope([(p["V"], p["s"]) for p in mine if p["N"] == top_n])
            users = sorted(
                n
                for n, m in CREDIT_METHODS.items()
                if any(STREAMED.get(s) == name for s in m.statistics_for(m.hyperparameters()))
            )
            for p in mine:
                stream_rows.append(
                    [
                        f"`{name}`",
                        ", ".join(f"`{u}`" for u in users),
                        f"{p['N']:,}",
                        f"{p['V']:,}",
                        _seconds(p["s"]),
                        f"{p['s'] / (p['N'] * p['V']) * 1e9:.1f}",
                        _mib(p["bytes"]),
                        f"{n_slope:.2f} / {v_slope:.2f}",
                    ]
                )
        stream_table = _common.markdown_table(
            [
                "kernel",
                "methods",
                "N tokens",
                "V",
                "time",
                "ns per token x vocab row",
                "extra peak memory",
                "time slope in N / in V",
            ],
            stream_rows,
        )
        stream_text = f"""

### The LM-head streams, against tokens N and vocabulary V

H = {args.stream_hidden}, the trainer's chunks (1024 tokens x 16384 vocabulary rows), random heads, median of
{args.stream_repeats} interleaved call(s); memory as above. `token_statistics` is one pass that yields log-prob, entropy,
logit gap and `sum_v p^2` together; `hellinger_and_entropy` streams two heads (policy and reference). Both hold one
chunk of logits at a time, so their extra memory is bounded by the chunk (3 x 1024 x 16384 floats, 192 MiB) plus a few
floats per token, whatever V; their time is linear in N x V (x H for the matmul part, see the fit above).

{stream_table}"""

    if not args.no_write:
        render_plot(by_method, PLOT)
    command = "python benchmarks/scaling.py --parts " + " ".join(args.parts) + (" --quick" if args.quick else "")
    superlinear = [r[0] for r in rows if "superlinear" in r[2]]
    return f"""`{command}`; {_common.machine_note()}; whole part {elapsed / 60:.1f} min; load average
{load_before[0]:.1f} at the start, {load_after[0]:.1f} at the end (2 cores shared with other jobs: absolute times are
for scale only, the slopes and the ratios to the floor are same-run measures).

Each registered method's own call (`CreditMethod.on_tensors`: input checks, the method, result checks, metrics), on
synthetic batches of B rows x T completion tokens (`benchmarks/_method_inputs.py`: every statistic as a `(B, T)`
float32 tensor as TRL's forward hands it over, GRPO advantages of 0/1 rewards, lengths uniform in [T/4, T],
completion ids and texts for the token-reading methods, prompt groups of G). Per size, every method interleaved with
the elementwise floor (`A[:, None] * H`), median of {args.repeats} rounds ({max(3, args.repeats // 3)} at a million
tokens and more); "/ floor" is the median per-round ratio. Extra peak memory: resident-set high-water mark above the
resident set before the call, in a child process whose allocations of 64 KiB and more go back to the kernel when freed
(it includes the method's outputs). Slopes: least squares of log time and log memory against log(B x T) over the
sizes of at least {fit_min:,} tokens at G = 4 (1 = linear); more than {SUPERLINEAR_MARGIN} above the floor's slope
({floor_slope:.2f}) is flagged superlinear: {", ".join(superlinear) or "none"}. The largest size, {big_b} x {big_t:,} = {big_b * big_t:,} tokens, ran for every method.

![time and extra peak memory of every method against B x T](images/scaling_methods.png)

{table}

Every size (time / extra peak memory):

{size_table}{stream_text}"""


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--head-repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument(
        "--parts",
        nargs="+",
        default=["reshaping", "methods", "streams"],
        choices=["reshaping", "methods", "streams"],
        help="reshaping: TACO/EAPO/TIDE reshaping, the TIDE-kernel fit and the 32B projection (section 'scaling'); "
        "methods: every registered method (section 'scaling_methods'); streams: with methods, the LM-head kernels",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke test; writes nothing")
    parser.add_argument("--stream-hidden", type=int, default=128)
    parser.add_argument("--stream-repeats", type=int, default=1)
    parser.add_argument("--memory-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    if args.memory_worker:
        memory_worker(json.loads(args.memory_worker))
        return
    if args.quick:
        args.no_write, args.repeats, args.head_repeats = True, 3, 1
    if "methods" in args.parts:
        body = methods_section(args)
        print(body)
        if not args.no_write:
            _common.write_section("scaling_methods", "Scaling: every registered method", body)
    if "reshaping" in args.parts:
        reshaping_section(args)


def reshaping_section(args):
    start = time.perf_counter()
    reshaping = reshaping_points(args)
    heads = head_points(args)
    a, b, residuals = fit(heads)
    elapsed = time.perf_counter() - start

    names = ["taco", "eapo", "tide"]
    rows = [
        [
            f"{p['B']} x {p['T']}",
            f"{p['floor_ns']:.2f}",
            *(f"{p['ratios'][n]:.1f}x" for n in names),
            *(f"{p['ratios'][n] * p['floor_ns']:.1f}" for n in ("taco", "eapo", "tide")),
        ]
        for p in reshaping
    ]
    reshape_table = _common.markdown_table(
        [
            "B x T",
            "floor ns/token",
            *(f"`{n}` / floor" for n in names),
            "taco ns/token",
            "eapo ns/token",
            "tide ns/token",
        ],
        rows,
    )
    head_rows = [
        [
            f"{p['N']:,}",
            f"{p['V']:,}",
            p["H"],
            f"{p['s']:.2f} s",
            f"{p['s'] / (p['N'] * p['V']) * 1e9:.1f}",
            f"{r:+.0%}",
        ]
        for p, r in zip(heads, residuals)
    ]
    head_table = _common.markdown_table(
        ["N", "V", "H", "streamed time", "ns per token x vocab row", "fit residual"], head_rows
    )

    # 32B projection (Qwen2.5-32B / Qwen3-32B class: 64 layers, H = 5120, ~32.5e9 parameters, V = 151,936).
    params, hidden, vocab = 32.5e9, 5120, 151_936
    per_token_head_cpu = a * vocab * hidden + b * vocab  # seconds per token on this CPU (one thread)
    head_flops = 2 * 2 * hidden * vocab  # two LM heads (policy, reference), 2 FLOPs per multiply-add
    fwd_flops = 2 * params  # one no-grad forward per token
    train_flops = 6 * params  # forward + backward of the training step
    gen_flops = 2 * params  # sampling the token (KV-cached decode)
    step_flops = train_flops + gen_flops
    tide_extra = fwd_flops + head_flops  # the reference's hidden-state forward + the two heads
    eapo_extra = fwd_flops  # one rollout-entropy forward where neither TRL's scoring forward nor `generate` serves
    mem_stream = 3 * 1024 * 16384 * 4
    tokens_per_forward = 8 * 4096  # e.g. per_device_train_batch_size 8 x 4096 completion tokens
    mem_naive = 4 * tokens_per_forward * vocab * 4
    projection = f"""Per completion token, FLOPs (2 per multiply-add; N_params = {params:.3g}, H = {hidden}, V = {vocab:,}):

* training step of GRPO itself: generation 2 N_params + forward/backward 6 N_params = {step_flops / 1e9:.0f} GFLOP;
* TACO: 0 extra FLOPs of model compute (statistics come from the training forward); reshaping ~{reshaping[-1]["ratios"]["taco"] * reshaping[-1]["floor_ns"]:.0f} ns
  per token on this CPU (table above) -- for 1M tokens per step, ~{reshaping[-1]["ratios"]["taco"] * reshaping[-1]["floor_ns"]:.1f} ms;
* EAPO: no extra forward where TRL runs its old-log-prob forward (vLLM importance sampling, off-policy steps: the
  entropies its fused LM head computed there) or samples with one `generate` call (one LM-head stream over the
  hidden states `generate` computed, 2 H V); otherwise one no-grad forward, 2 N_params = {eapo_extra / 1e9:.0f} GFLOP = {eapo_extra / step_flops:.0%} of
  the step's FLOPs;
* TIDE: the reference's hidden-state forward 2 N_params = {fwd_flops / 1e9:.0f} GFLOP (the policy's hidden states come from
  TRL's old-log-prob forward or from `generate`; with neither, one more forward), plus the two LM heads
  2 x 2 H V = {head_flops / 1e9:.2f} GFLOP: {tide_extra / 1e9:.0f} GFLOP = {tide_extra / step_flops:.0%} of the step's FLOPs. The streamed statistics
  themselves are {head_flops / tide_extra:.1%} of TIDE's extra FLOPs; on this CPU the fit gives
  a H V + b V = {a * 1e12:.2f} ps x {hidden} x {vocab:,} + {b * 1e9:.2f} ns x {vocab:,} = {per_token_head_cpu * 1e3:.1f} ms per token (one core), of
  which the per-logit elementwise part b V is {b * vocab / per_token_head_cpu:.0%}: at 32B scale the kernel is matmul-bound.

FLOP shares overstate wall time where generation is memory-bound (it usually dominates GRPO's wall clock: the
TIDE paper reports about +3.6 % time for TIDE at 32B). Memory at V = {vocab:,}, {tokens_per_forward:,} tokens per forward
batch: streamed 3 x 1024 x 16384 x 4 B = {mem_stream / 2**20:.0f} MiB plus 6 floats per token ({6 * 4 * tokens_per_forward / 2**20:.1f} MiB), whatever V;
the naive path would hold ~4 x N x V x 4 B = {mem_naive / 2**30:.0f} GiB."""

    body = f"""`python benchmarks/scaling.py`; {_common.machine_note()}; whole run {elapsed / 60:.1f} min.

### Reshaping vs completion length T and batch B (= prompts x group size G)

Inputs as in the reshaping section; TIDE with V = 151,936. Ratios are to the elementwise floor at the same size,
paired per round (median of {args.repeats}); ns/token are absolute (scale only). All three reshapings are a fixed number of
passes over the `(B, T)` tensors, so their cost is linear in B x T: ns/token stays flat, apart from cache effects
(small sizes stay in cache and the floor gets relatively cheaper). Group size enters only through B: quantiles
are batch-global, weights are per row. EAPO's quantiles are the one super-linear part: they sort the batch's valid
entropies (N log N).

{reshape_table}

### TIDE statistics vs tokens N, vocabulary V and hidden size H

Streamed kernel, chunks 1024 x 16384, random heads; median of {args.head_repeats} calls. Fit over these points:
`t = a N V H + b N V` with a = {a * 1e12:.3f} ps (per multiply-add pair of the two heads' matmuls) and b = {b * 1e9:.2f} ns
(per logit: max, exp2 x 2, sqrt, sums); residuals show how well linear-in-N and linear-in-V hold.

{head_table}

### Projection: a 32B model with a 151k vocabulary

{projection}"""
    print(body)
    if not args.no_write:
        _common.write_section("scaling", "Scaling", body)


if __name__ == "__main__":
    main()
