"""Full-vocabulary statistics for TIDE, streamed so the `(N, V)` logits of a batch are never held.

For N token positions with final hidden states `h` (policy) and `h_ref` (reference) and LM heads `W`,
`W_ref` (`V x H`), TIDE needs per token

* the squared Hellinger distance `d = 1 - sum_v sqrt(p_v * q_v)` between the two next-token
  distributions, and
* the policy entropy `H = -sum_v p_v log p_v`.

Both follow from three online log-sum-exp accumulators over vocabulary chunks:
`log Z_p`, `log Z_q` and `log sum_v exp((l_v + l'_v) / 2)`, since
`sum_v sqrt(p_v q_v) = exp(LSE((l + l') / 2) - (log Z_p + log Z_q) / 2)`, and the entropy is
`log s - u / s` with `s = sum exp(l - m)` and `u = sum exp(l - m) (l - m)` for the running max `m`.
Peak extra memory is O(token_chunk_size x vocab_chunk_size) instead of O(N x V).
"""

from __future__ import annotations

import torch


class _OnlineLogSumExp:
    """Running `m = max l`, `s = sum exp(l - m)` and, optionally, `u = sum exp(l - m) (l - m)` per row."""

    def __init__(self, rows: int, device, with_entropy: bool = False):
        self.max_N = torch.full((rows,), -torch.inf, device=device)
        self.sum_N = torch.zeros(rows, device=device)
        self.moment_N = torch.zeros(rows, device=device) if with_entropy else None

    def update(self, logits_NC: torch.Tensor) -> None:
        new_max_N = torch.maximum(self.max_N, logits_NC.max(dim=1).values)
        shift_N = self.max_N - new_max_N  # <= 0; -inf on the first chunk
        rescale_N = torch.exp(shift_N)
        centred_NC = logits_NC - new_max_N.unsqueeze(1)
        exp_NC = torch.exp(centred_NC)
        if self.moment_N is not None:
            # Re-centre the old moment on the new max: (l - m) = (l - m_old) + (m_old - m_new).
            shift_N = torch.nan_to_num(shift_N, neginf=0.0)  # the first chunk has nothing to re-centre
            self.moment_N = rescale_N * (self.moment_N + shift_N * self.sum_N) + (exp_NC * centred_NC).sum(dim=1)
        self.sum_N = rescale_N * self.sum_N + exp_NC.sum(dim=1)
        self.max_N = new_max_N

    def logsumexp(self) -> torch.Tensor:
        return self.max_N + torch.log(self.sum_N)

    def entropy(self) -> torch.Tensor:
        return torch.log(self.sum_N) - self.moment_N / self.sum_N


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
    deviation_N = torch.empty(num_tokens, device=hidden_NH.device)
    entropy_N = torch.empty(num_tokens, device=hidden_NH.device)
    for t0 in range(0, num_tokens, token_chunk_size):
        t1 = min(t0 + token_chunk_size, num_tokens)
        h_nH, h_ref_nH = hidden_NH[t0:t1].float(), ref_hidden_NH[t0:t1].float()
        policy = _OnlineLogSumExp(t1 - t0, hidden_NH.device, with_entropy=True)
        reference = _OnlineLogSumExp(t1 - t0, hidden_NH.device)
        geometric = _OnlineLogSumExp(t1 - t0, hidden_NH.device)
        for v0 in range(0, vocab_size, vocab_chunk_size):
            v1 = min(v0 + vocab_chunk_size, vocab_size)
            logits_nC = _chunk_logits(h_nH, weight_VH, bias_V, v0, v1, temperature)
            ref_logits_nC = _chunk_logits(h_ref_nH, ref_weight_VH, ref_bias_V, v0, v1, temperature)
            policy.update(logits_nC)
            reference.update(ref_logits_nC)
            geometric.update(0.5 * (logits_nC + ref_logits_nC))
        log_bc_n = geometric.logsumexp() - 0.5 * (policy.logsumexp() + reference.logsumexp())
        deviation_N[t0:t1] = (1.0 - torch.exp(log_bc_n)).clamp(0.0, 1.0)
        entropy_N[t0:t1] = policy.entropy().clamp(min=0.0)
    return deviation_N, entropy_N


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
