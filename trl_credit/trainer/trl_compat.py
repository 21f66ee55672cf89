"""What differs between the TRL releases trl-credit supports (1.15 and 1.16), in one place.

TRL 1.15's fused LM head (`trl.trainer.utils.add_fused_lm_head`, which `GRPOTrainer` always calls with
`fused_lm_head=True`) runs a Triton kernel, and TRL 1.15 leaves it undefined when Triton cannot be imported: on a
machine without Triton (the CPU wheels of torch) every `GRPOTrainer` forward fails with
`AttributeError: 'NoneType' object has no attribute 'apply'`, and with Triton installed the kernel still cannot
read CPU tensors. TRL 1.16 folds the same tiles in torch off CUDA/XPU. `install()` gives TRL 1.15 that fallback:
`chunked_logprob_torch` below, used for tensors that are not on a CUDA/XPU device with Triton, while TRL's own
kernel keeps every other case. Nothing is changed on TRL 1.16.
"""

from __future__ import annotations

import torch
from packaging.version import Version

OPTIONAL_OUTPUTS = ("entropy", "log_sum_sq_probs", "mean_logits", "is_top1")
_TOKEN_CHUNK = 1024


def needs_torch_fused_head(trl_version: str) -> bool:
    """Whether this TRL release's fused LM head has no torch path for devices without Triton (TRL 1.15)."""
    return Version(trl_version).release[:2] == (1, 15)


def chunked_logprob_torch(
    hidden_NH: torch.Tensor,
    weight_VH: torch.Tensor,
    bias_V: torch.Tensor | None,
    targets_N: torch.Tensor,
    temperature: float,
    chunk_size: int,
    final_logit_softcapping: float | None = None,
    logit_scale: float = 1.0,
    outputs: tuple[str, ...] = OPTIONAL_OUTPUTS,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """TRL's `ChunkedLogProbFunction.apply` contract in plain torch (autograd through `hidden`, `weight`, `bias`).

    The logits `z = T((hidden @ weight.T + bias) * logit_scale) / temperature` (`T` the optional tanh softcap) are
    formed for `_TOKEN_CHUNK` tokens at a time in float32. Returns `(log p(target), entropy, log sum p^2,
    mean logit, target is the first argmax)`, each `(N,)`, the optional ones `None` unless named in `outputs`.
    `chunk_size` (TRL's vocabulary tile) is accepted for the signature; whole rows are formed here.
    """
    del chunk_size
    if torch.is_autocast_enabled(hidden_NH.device.type):
        dtype = torch.get_autocast_dtype(hidden_NH.device.type)
    else:
        dtype = hidden_NH.dtype
    pieces: dict[str, list[torch.Tensor]] = {name: [] for name in ("log_probs", *OPTIONAL_OUTPUTS)}
    # At least one (possibly empty) chunk: with no valid token the outputs are empty but still part of the graph,
    # so that an all-masked micro-batch backpropagates a zero loss, as with TRL's kernel.
    for start in range(0, max(hidden_NH.shape[0], 1), _TOKEN_CHUNK):
        hidden_nH, targets_n = hidden_NH[start:start + _TOKEN_CHUNK], targets_N[start:start + _TOKEN_CHUNK]
        z_nV = (hidden_nH.to(dtype) @ weight_VH.to(dtype).T).float()
        if bias_V is not None:
            z_nV = z_nV + bias_V.float()
        z_nV = z_nV * logit_scale
        if final_logit_softcapping is not None:
            z_nV = final_logit_softcapping * torch.tanh(z_nV / final_logit_softcapping)
        z_nV = z_nV / temperature
        logp_nV = torch.log_softmax(z_nV, dim=-1)
        pieces["log_probs"].append(logp_nV.gather(-1, targets_n.unsqueeze(-1)).squeeze(-1))
        if "entropy" in outputs:
            pieces["entropy"].append(-(logp_nV.exp() * logp_nV).sum(-1))
        if "log_sum_sq_probs" in outputs:
            pieces["log_sum_sq_probs"].append(torch.logsumexp(2 * logp_nV, dim=-1).detach())
        if "mean_logits" in outputs:
            pieces["mean_logits"].append(z_nV.mean(-1).detach())
        if "is_top1" in outputs:
            pieces["is_top1"].append(z_nV.argmax(-1) == targets_n)
    optional = (torch.cat(pieces[name]) if name in outputs else None for name in OPTIONAL_OUTPUTS)
    return (torch.cat(pieces["log_probs"]), *optional)


class _FusedHeadFunction:
    """Stands where TRL 1.15's fused head looks up its kernel: TRL's on CUDA/XPU with Triton, else torch."""

    triton_function = None  # TRL's `ChunkedLogProbFunction` when Triton imports

    @classmethod
    def apply(cls, hidden, *args):
        if cls.triton_function is not None and hidden.device.type in ("cuda", "xpu"):
            return cls.triton_function.apply(hidden, *args)
        return chunked_logprob_torch(hidden, *args)


def install() -> bool:
    """On TRL 1.15, route the fused LM head's kernel through `_FusedHeadFunction`; return whether it did."""
    import trl
    import trl.trainer.utils as trl_utils

    if not needs_torch_fused_head(trl.__version__):
        return False
    try:
        from trl.kernels import ChunkedLogProbFunction
    except ImportError:  # TRL 1.15 imports Triton there unconditionally
        ChunkedLogProbFunction = None
    _FusedHeadFunction.triton_function = ChunkedLogProbFunction
    trl_utils._ChunkedLogProbFunction = _FusedHeadFunction
    return True
