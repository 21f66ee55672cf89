"""Full-vocabulary statistics, streamed so the `(N, V)` logits are never held: TIDE's deviation and entropy, and one
model's log-probability, entropy, logit gap, `1 - p` and `sum_v p_v^2` (the sampled token's term left out) of the
sampled tokens from recorded hidden states.

For N token positions with final hidden states `h` (policy) and `h_ref` (reference) and LM heads `W`, `W_ref`
(`V x H`), TIDE needs per token the squared Hellinger distance `d = 1 - sum_v sqrt(p_v q_v)` between the two
next-token distributions and the policy entropy `H = -sum_v p_v log p_v`.

Logits go through the model's output transform, as TRL's fused LM head applies it: `z = softcap * tanh((h W^T + b)
* scale / softcap) / temperature` (without a softcap, `(h W^T + b) * scale / temperature`).

One pass over vocabulary chunks keeps, per token, online log-sum-exp accumulators relative to running maxima
`m` (policy) and `m'` (reference): `s = sum e^(z - m)`, `u = sum e^(z - m) (z - m)` and `s' = sum e^(z' - m')`,
and the Bhattacharyya sum `g = sum e^((z - m) / 2 + (z' - m') / 2)`. Then `sum_v sqrt(p_v q_v) = g / sqrt(s s')`
and `H = log s - u / s`. The extra memory is O(N + token_chunk x vocab_chunk), whatever N and V.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch


@dataclass(frozen=True)
class LogitTransform:
    """What a model does to `hidden @ lm_head.T + bias` before its softmax: a scale, then an optional softcap."""

    scale: float = 1.0
    softcap: float | None = None

    def __call__(self, logits: torch.Tensor, temperature: float) -> torch.Tensor:
        logits = logits * self.scale
        if self.softcap is not None:
            logits = self.softcap * torch.tanh(logits / self.softcap)
        return logits / temperature


def _product_float32(hidden_nH: torch.Tensor, weight_CH: torch.Tensor) -> torch.Tensor:
    """`hidden @ weight.T` as float32. On CUDA, half-precision operands stay in their dtype and the GEMM accumulates
    and returns float32 (`out_dtype`), with no float32 copy of the LM-head chunk; other devices have no such kernel
    (`aten::mm.dtype` is CUDA-only in torch 2.13), so there the operands are cast first. Both round nothing but the
    float32 sums: every product of two bf16 or fp16 numbers is exact in float32."""
    half = (torch.bfloat16, torch.float16)
    if hidden_nH.is_cuda and hidden_nH.dtype in half and weight_CH.dtype == hidden_nH.dtype:
        return torch.mm(hidden_nH, weight_CH.T, out_dtype=torch.float32)
    return hidden_nH.float() @ weight_CH.float().T


def _logits(hidden_nH, weight_VH, bias_V, start, end, transform, temperature) -> torch.Tensor:
    logits_nC = _product_float32(hidden_nH, weight_VH[start:end])
    if bias_V is not None:
        logits_nC = logits_nC + bias_V[start:end].float()
    return transform(logits_nC, temperature)


class _StreamedSoftmax:
    """Softmax statistics of `(n, V)` logits that arrive in vocabulary chunks, relative to the running maximum `m`:
    `s = sum e^(z - m)` and `u = sum e^(z - m) (z - m)`, so that `log sum e^z = m + log s` and the entropy is
    `log s - u / s`."""

    def __init__(self, num_tokens: int, device: torch.device):
        self.max = torch.full((num_tokens,), -torch.inf, device=device)
        self.sum = torch.zeros(num_tokens, device=device)
        self.moment = torch.zeros(num_tokens, device=device)

    def add(self, z_nC: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Fold in one chunk; return its logits centred on the new maximum, their exponentials, and the factor
        `e^(m_old - m_new)` that re-centred the running sums."""
        new_max = torch.maximum(self.max, z_nC.amax(dim=1))
        rescale = torch.exp(self.max - new_max)
        shift = torch.where(torch.isfinite(self.max), self.max - new_max, 0.0)  # (z - m_new) = (z - m_old) + shift
        centred_nC = z_nC - new_max.unsqueeze(1)
        exp_nC = torch.exp(centred_nC)
        self.moment = rescale * (self.moment + shift * self.sum) + (exp_nC * centred_nC).sum(dim=1)
        self.sum = rescale * self.sum + exp_nC.sum(dim=1)
        self.max = new_max
        return centred_nC, exp_nC, rescale

    def log_normalizer(self) -> torch.Tensor:
        return self.max + torch.log(self.sum)

    def entropy(self) -> torch.Tensor:
        return (torch.log(self.sum) - self.moment / self.sum).clamp(min=0.0)


def _check_chunk_sizes(token_chunk_size: int, vocab_chunk_size: int) -> None:
    if token_chunk_size < 1 or vocab_chunk_size < 1:
        raise ValueError(f"chunk sizes must be >= 1, got {token_chunk_size} and {vocab_chunk_size}")


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
    vocab_chunk_size: int = 16384,
    transform: LogitTransform = LogitTransform(),
    ref_transform: LogitTransform | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Squared Hellinger distance to the reference and policy entropy, `(N,)` each, in float32.

    Args:
        hidden_NH: `(N, H)` final hidden states of the policy at the scored positions.
        ref_hidden_NH: `(N, H)` final hidden states of the reference at the same positions.
        weight_VH: `(V, H)` policy LM head. `ref_weight_VH` defaults to it (tied heads, PEFT).
        bias_V, ref_bias_V: optional LM head biases.
        temperature: logits are divided by it, as when sampling.
        token_chunk_size, vocab_chunk_size: streaming block sizes; any values give the same result.
        transform, ref_transform: the models' logit transforms (`ref_transform` defaults to `transform`).
    """
    if hidden_NH.shape != ref_hidden_NH.shape:
        raise ValueError(f"hidden_NH {tuple(hidden_NH.shape)} and ref_hidden_NH {tuple(ref_hidden_NH.shape)} differ")
    _check_chunk_sizes(token_chunk_size, vocab_chunk_size)
    ref_weight_VH = weight_VH if ref_weight_VH is None else ref_weight_VH
    ref_transform = transform if ref_transform is None else ref_transform
    num_tokens, vocab_size = hidden_NH.shape[0], weight_VH.shape[0]
    deviation_N = torch.zeros(num_tokens, device=hidden_NH.device)
    entropy_N = torch.zeros(num_tokens, device=hidden_NH.device)
    for t0 in range(0, num_tokens, token_chunk_size):
        rows = slice(t0, min(t0 + token_chunk_size, num_tokens))
        policy = _StreamedSoftmax(rows.stop - rows.start, hidden_NH.device)
        reference = _StreamedSoftmax(rows.stop - rows.start, hidden_NH.device)
        geo = torch.zeros(rows.stop - rows.start, device=hidden_NH.device)  # sum e^((z - m) / 2 + (z' - m') / 2)
        for v0 in range(0, vocab_size, vocab_chunk_size):
            v1 = min(v0 + vocab_chunk_size, vocab_size)
            centred_p, _, rescale_p = policy.add(
                _logits(hidden_NH[rows], weight_VH, bias_V, v0, v1, transform, temperature)
            )
            centred_q, _, rescale_q = reference.add(
                _logits(ref_hidden_NH[rows], ref_weight_VH, ref_bias_V, v0, v1, ref_transform, temperature)
            )
            geo = torch.sqrt(rescale_p * rescale_q) * geo + torch.exp(0.5 * (centred_p + centred_q)).sum(dim=1)
        deviation_N[rows] = (1.0 - geo / torch.sqrt(policy.sum * reference.sum)).clamp(0.0, 1.0)
        entropy_N[rows] = policy.entropy()
    return deviation_N, entropy_N


class TokenStatistics(NamedTuple):
    """Per-token statistics of one model's next-token distributions at the given tokens, `(N,)` float32 each."""

    logps: torch.Tensor  # log-probability of the given token
    entropy: torch.Tensor  # full-vocabulary entropy
    logit_gap: torch.Tensor  # the given token's logit minus the largest logit, `<= 0`
    unsampled_mass: torch.Tensor  # 1 - p_y, summed over every other token (exact as p_y -> 1)
    unsampled_sum_sq_probs: torch.Tensor  # sum_{v != y} p_v^2


@torch.no_grad()
def token_statistics(
    hidden_NH: torch.Tensor,
    weight_VH: torch.Tensor,
    token_ids_N: torch.Tensor,
    bias_V: torch.Tensor | None = None,
    temperature: float = 1.0,
    token_chunk_size: int = 1024,
    vocab_chunk_size: int = 16384,
    transform: LogitTransform = LogitTransform(),
) -> TokenStatistics:
    """The log-probability of `token_ids_N`, the entropy, the logit gap `z_y - max_v z_v`, and the probability mass
    and the sum of squared probabilities of every token but `y`, streamed.

    From final hidden states recorded elsewhere, what TRL's forward gives for sampled tokens:
    `log p_y = z_y - log sum_v e^(z_v)`, logits `z` after the transform (temperature included). The gap is taken from
    the logits themselves, as the official min-p code reads it: `log p_y - log max_v p_v` is the same number in exact
    arithmetic, but each float32 log-prob carries the rounding of `log sum_v e^(z_v)`. With `m = max_v z_v` and
    `s = sum_v e^(z_v - m)`, `1 - p_y = sum_{v != y} e^(z_v - m) / s` and `sum_{v != y} p_v^2 = sum_{v != y}
    e^(2 (z_v - m)) / s^2`: sums of the other tokens' terms only, so both keep float32's relative precision where
    `p_y -> 1` (`1 - p_y` from `p_y`, or `sum_v p_v^2 - p_y^2`, would cancel to rounding noise there).
    """
    _check_chunk_sizes(token_chunk_size, vocab_chunk_size)
    num_tokens, vocab_size = hidden_NH.shape[0], weight_VH.shape[0]
    statistics_5N = torch.zeros(5, num_tokens, device=hidden_NH.device)
    for t0 in range(0, num_tokens, token_chunk_size):
        rows = slice(t0, min(t0 + token_chunk_size, num_tokens))
        ids_n = token_ids_N[rows]
        policy = _StreamedSoftmax(rows.stop - rows.start, hidden_NH.device)
        sampled_logit_n = torch.zeros(rows.stop - rows.start, device=hidden_NH.device)
        unsampled_sum_n = torch.zeros_like(sampled_logit_n)  # sum_{v != y} e^(z_v - m)
        unsampled_square_sum_n = torch.zeros_like(sampled_logit_n)  # sum_{v != y} e^(2 (z_v - m))
        for v0 in range(0, vocab_size, vocab_chunk_size):
            v1 = min(v0 + vocab_chunk_size, vocab_size)
            z_nC = _logits(hidden_NH[rows], weight_VH, bias_V, v0, v1, transform, temperature)
            _, exp_nC, rescale_n = policy.add(z_nC)
            in_chunk_n1 = ((ids_n >= v0) & (ids_n < v1)).unsqueeze(1)
            column_n1 = (ids_n - v0).clamp(0, v1 - v0 - 1).unsqueeze(1)
            sampled_logit_n = torch.where(in_chunk_n1, z_nC.gather(1, column_n1), sampled_logit_n.unsqueeze(1))[:, 0]
            # The sampled token's term is left out, never subtracted: the sums stay exact however large it is.
            unsampled_nC = exp_nC.scatter(1, column_n1, torch.where(in_chunk_n1, 0.0, exp_nC.gather(1, column_n1)))
            unsampled_sum_n = rescale_n * unsampled_sum_n + unsampled_nC.sum(dim=1)
            unsampled_square_sum_n = rescale_n**2 * unsampled_square_sum_n + unsampled_nC.square().sum(dim=1)
        statistics_5N[:, rows] = torch.stack(
            [
                sampled_logit_n - policy.log_normalizer(),
                policy.entropy(),
                sampled_logit_n - policy.max,
                unsampled_sum_n / policy.sum,
                unsampled_square_sum_n / policy.sum**2,
            ]
        )
    return TokenStatistics(*statistics_5N)
