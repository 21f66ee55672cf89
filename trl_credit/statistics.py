"""Full-vocabulary statistics for TIDE, streamed so the `(N, V)` logits of a batch are never held.

For N token positions with final hidden states `h` (policy) and `h_ref` (reference) and LM heads `W`,
`W_ref` (`V x H`), TIDE needs per token

* the squared Hellinger distance `d = 1 - sum_v sqrt(p_v * q_v)` between the two next-token
  distributions, and
* the policy entropy `H = -sum_v p_v log p_v`.

Both follow from online log-sum-exp accumulators over vocabulary chunks, kept per token in base 2 (the
`log2(e) / temperature` scale is folded into the hidden states, so the kernel calls `exp2`, cheaper than `exp` on
CPU). With `e = 2^(l - m)` and `e' = 2^(l' - m')` relative to the running maxima of the policy and reference logits:

* `s = sum e`, `s' = sum e'` (normalisers), `u = sum e (l - m)` (so `H = ln 2 (log2 s - u / s)`);
* `g = sum sqrt(e e')`, so `sum_v sqrt(p_v q_v) = g / sqrt(s s')`: the Bhattacharyya sum costs a multiply and a
  square root per logit instead of a third exponential.

Each `(token chunk x vocabulary chunk)` block is computed into one of three preallocated buffers and updated in
place, so the extra memory is `3 x token_chunk_size x vocab_chunk_size` floats plus O(N), whatever N and V; the
vocabulary loop is outermost so that each LM-head chunk is cast to float32 once.
"""

from __future__ import annotations

import math

import torch

_LOG2E = 1.0 / math.log(2.0)


def _chunk_logits(hidden_NH, weight_VH, bias_V, start, end, temperature):
    logits_NC = hidden_NH @ weight_VH[start:end].float().T
    if bias_V is not None:
        logits_NC = logits_NC + bias_V[start:end].float()
    return logits_NC / temperature


@torch.no_grad()
def hellinger_and_entropy(
    hidden_NH: torch.Tensor,
    ref_hidden_NH: torch.Tensor,
    weight_VH: torch.Tensor,
    ref_weight_VH: torch.Tensor | None = None,
    bias_V: torch.Tensor | None = None,
    ref_bias_V: torch.Tensor | None = None,
    temperature: float = 1.0,
    token_chunk_size: int = 1024,
    vocab_chunk_size: int = 8192,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Squared Hellinger distance to the reference and policy entropy, `(N,)` each, in float32.

    Args:
        hidden_NH: `(N, H)` final hidden states of the policy at the scored positions.
        ref_hidden_NH: `(N, H)` final hidden states of the reference at the same positions.
        weight_VH: `(V, H)` policy LM head. `ref_weight_VH` defaults to it (tied heads, PEFT).
        bias_V, ref_bias_V: optional LM head biases.
        temperature: logits are divided by it, as when sampling.
        token_chunk_size, vocab_chunk_size: streaming block sizes; any values give the same result.
    """
    if hidden_NH.shape != ref_hidden_NH.shape:
        raise ValueError(f"hidden_NH {tuple(hidden_NH.shape)} and ref_hidden_NH {tuple(ref_hidden_NH.shape)} differ")
    if token_chunk_size < 1 or vocab_chunk_size < 1:
        raise ValueError(f"chunk sizes must be >= 1, got {token_chunk_size} and {vocab_chunk_size}")
    ref_weight_VH = weight_VH if ref_weight_VH is None else ref_weight_VH
    num_tokens, vocab_size = hidden_NH.shape[0], weight_VH.shape[0]
    device = hidden_NH.device
    # Logits in base 2 (scaled by log2(e) / temperature, folded into the (n, H) hidden chunk): exp2 instead of exp.
    scale = _LOG2E / temperature
    # Per token: running max m, sum s = sum 2^(l - m), moment u = sum 2^(l - m) (l - m) of the policy; max and sum
    # of the reference; and g = sum sqrt(2^(l - m) 2^(l' - m')), the Bhattacharyya sum relative to both maxes.
    max_p, sum_p, moment_p = (torch.zeros(num_tokens, device=device) for _ in range(3))
    max_q, sum_q, geo = (torch.zeros(num_tokens, device=device) for _ in range(3))
    # Three reusable (token chunk x vocab chunk) blocks: no allocation (and no page faults) inside the loops.
    block = min(token_chunk_size, max(num_tokens, 1)) * min(vocab_chunk_size, vocab_size)
    logits_flat, ref_flat, exp_flat = (torch.empty(block, device=device) for _ in range(3))
    # Vocabulary outermost: each head chunk is cast to float32 once, whatever the number of token chunks.
    for v0 in range(0, vocab_size, vocab_chunk_size):
        v1 = min(v0 + vocab_chunk_size, vocab_size)
        weight_CH = weight_VH[v0:v1].float()
        ref_weight_CH = weight_CH if ref_weight_VH is weight_VH else ref_weight_VH[v0:v1].float()
        bias_C = None if bias_V is None else bias_V[v0:v1].float() * scale
        ref_bias_C = None if ref_bias_V is None else ref_bias_V[v0:v1].float() * scale
        for t0 in range(0, num_tokens, token_chunk_size):
            t1 = min(t0 + token_chunk_size, num_tokens)
            n, c = t1 - t0, v1 - v0
            logits_nC = _scaled_logits(hidden_NH[t0:t1], weight_CH, bias_C, scale, logits_flat[: n * c].view(n, c))
            ref_nC = _scaled_logits(ref_hidden_NH[t0:t1], ref_weight_CH, ref_bias_C, scale, ref_flat[: n * c].view(n, c))
            exp_nC = exp_flat[: n * c].view(n, c)
            rows = slice(t0, t1)
            if v0 == 0:
                old = None
                max_p[rows], max_q[rows] = logits_nC.amax(dim=1), ref_nC.amax(dim=1)
            else:
                old = max_p[rows].clone(), max_q[rows].clone()
                torch.maximum(max_p[rows], logits_nC.amax(dim=1), out=max_p[rows])
                torch.maximum(max_q[rows], ref_nC.amax(dim=1), out=max_q[rows])
            logits_nC.sub_(max_p[rows].unsqueeze(1))  # l - m <= 0
            ref_nC.sub_(max_q[rows].unsqueeze(1))
            torch.exp2(logits_nC, out=exp_nC)
            chunk_sum_p = exp_nC.sum(dim=1)
            chunk_moment_p = logits_nC.mul_(exp_nC).sum(dim=1)  # in place: vecdot would allocate an (n, c) product
            chunk_sum_q = ref_nC.exp2_().sum(dim=1)
            chunk_geo = exp_nC.mul_(ref_nC).sqrt_().sum(dim=1)
            if old is None:
                sum_p[rows], moment_p[rows], sum_q[rows], geo[rows] = chunk_sum_p, chunk_moment_p, chunk_sum_q, chunk_geo
            else:
                shift_p, shift_q = old[0] - max_p[rows], old[1] - max_q[rows]  # <= 0
                rescale_p, rescale_q = torch.exp2(shift_p), torch.exp2(shift_q)
                # Re-centre the old moment on the new max: (l - m_new) = (l - m_old) + (m_old - m_new).
                moment_p[rows] = rescale_p * (moment_p[rows] + shift_p * sum_p[rows]) + chunk_moment_p
                sum_p[rows] = rescale_p * sum_p[rows] + chunk_sum_p
                sum_q[rows] = rescale_q * sum_q[rows] + chunk_sum_q
                geo[rows] = torch.sqrt(rescale_p * rescale_q) * geo[rows] + chunk_geo
    bhattacharyya_N = geo / torch.sqrt(sum_p * sum_q)
    deviation_N = (1.0 - bhattacharyya_N).clamp(0.0, 1.0)
    entropy_N = ((torch.log2(sum_p) - moment_p / sum_p) * math.log(2.0)).clamp(min=0.0)  # bits -> nats
    return deviation_N, entropy_N


def _scaled_logits(hidden_nH, weight_CH, bias_C, scale, out_nC):
    """`(hidden @ weight.T + bias) * scale` into `out_nC`; the scale goes on the small `(n, H)` side."""
    torch.mm(hidden_nH.float() * scale, weight_CH.T, out=out_nC)
    if bias_C is not None:
        out_nC.add_(bias_C)
    return out_nC


@torch.no_grad()
def hellinger_and_entropy_naive(
    hidden_NH, ref_hidden_NH, weight_VH, ref_weight_VH=None, bias_V=None, ref_bias_V=None, temperature=1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference implementation that materialises both `(N, V)` logit matrices (tests and benchmarks)."""
    ref_weight_VH = weight_VH if ref_weight_VH is None else ref_weight_VH
    vocab_size = weight_VH.shape[0]
    logp_NV = torch.log_softmax(_chunk_logits(hidden_NH.float(), weight_VH, bias_V, 0, vocab_size, temperature), -1)
    logq_NV = torch.log_softmax(
        _chunk_logits(ref_hidden_NH.float(), ref_weight_VH, ref_bias_V, 0, vocab_size, temperature), -1
    )
    deviation_N = (1.0 - torch.exp(0.5 * (logp_NV + logq_NV)).sum(-1)).clamp(0.0, 1.0)
    entropy_N = -(logp_NV.exp() * logp_NV).sum(-1)
    return deviation_N, entropy_N
