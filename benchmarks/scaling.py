"""How each method's cost grows with completion length, group size and vocabulary, and what a 32B run would spend.

    python benchmarks/scaling.py           # ~3 min on 2 shared CPU cores

Measured here (one process, 1 torch thread):

* reshaping (`taco/eapo/tide_advantages`, and EAPO's batch quantiles) for B x T with T = 1k..8k at B = 64, and
  B = 32..256 at T = 2048 (B = prompts x group size G: G enters only through B). Each size interleaves the methods
  with the elementwise floor, repeated, median; reported as ns per token and as a ratio to the floor;
* the streamed TIDE statistics for N tokens x V vocabulary rows x H hidden: a least-squares fit
  `t = a N V H + b N V` (matmul part + per-logit elementwise part) over a grid of (N, V, H), and its residuals.

The 32B projection then uses those fitted per-token costs and FLOP counts; the arithmetic is printed with it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
from reshaping import make_inputs  # noqa: E402
from tide_statistics import make_inputs as make_head_inputs  # noqa: E402


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


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--head-repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
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
