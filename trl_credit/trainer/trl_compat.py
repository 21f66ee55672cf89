"""Every private TRL and transformers surface trl-credit relies on, in one place, checked when a trainer is built.

TRL's public API has no seam for per-token advantages, so the trainer reaches a few private surfaces of
`GRPOTrainer` and of the models it patches. Each one is named here with what it is used for; `check_trl_surfaces`
verifies them against the installed versions and fails with one message naming the supported TRL range, instead of
a wrong result or an `AttributeError` deep inside a training step.

* `GRPOTrainer._generate_and_score_completions`, `_compute_loss`, `_calculate_rewards`: overridden (each calls
  `super()`).
* `GRPOTrainer._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, batch_size,
  compute_entropy, **multimodal)`: TRL's own scoring forward; its multimodal keywords are `MULTIMODAL_KEYS`.
* `_compute_loss` builds its loss mask from `completion_mask * tool_mask` before its policy forward and reads
  `inputs["advantages"]` after it: methods of the training forward fill in the advantages from that forward, and
  methods that drop tokens enter through `tool_mask` (`tests/test_trainer.py` checks what the loss consumed).
* The fused LM head (`add_fused_lm_head`): the policy forward inside `_compute_loss` returns a `FusedCausalLMOutput`
  whose `FUSED_OUTPUT_FIELDS` the trainer reads, and it applies the output transform of `LOGIT_TRANSFORM_KEYS`,
  which `engines.logit_transform` reads the same way.
* Trainer attributes read to know how TRL generates and scores: `GENERATION_ATTRIBUTES`.
* `NORMALISER_AT_GENERATION`: the loss types whose normaliser TRL counts when the batch is generated.
* Without a tool mask, `_compute_loss`'s loss mask is the very tensor `inputs["completion_mask"]`, read after its
  forward: methods that drop tokens remove them from it there (`weigh_trl_loss_mask`) instead of paying a forward.
* When `_generate_and_score_completions` runs its old-log-prob forward (`runs_scoring_forward`): its log-probs and
  the entropies its fused head computes alongside give the rollout statistics, with no second policy forward.
* transformers: the backbone's output cache (`output_cache`) and its forward keyword (`cache_keyword`).

What differs between the two supported releases lives here too. TRL 1.15's fused LM head runs a Triton kernel and
leaves it undefined when Triton cannot be imported: on a machine without Triton (the CPU wheels of torch) every
`GRPOTrainer` forward fails with `AttributeError: 'NoneType' object has no attribute 'apply'`, and with Triton
installed the kernel still cannot read CPU tensors. TRL 1.16 folds the same tiles in torch off CUDA/XPU.
`install()` gives TRL 1.15 that fallback (`chunked_logprob_torch`) for tensors that are not on a CUDA/XPU device with
Triton, while TRL's own kernel keeps every other case; nothing is changed on TRL 1.16.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from functools import cache

import torch
import trl
from packaging.version import Version
from trl import GRPOTrainer
from trl.trainer.utils import FusedCausalLMOutput, add_fused_lm_head

SUPPORTED_TRL = ">=1.15,<1.17"

# Keywords TRL passes to `_get_per_token_logps_and_entropies` besides the token ids (see `_compute_loss`).
MULTIMODAL_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)
_SCORING_KEYWORDS = ("model", "input_ids", "attention_mask", "logits_to_keep", "batch_size", "compute_entropy")
FUSED_OUTPUT_FIELDS = ("log_probs", "entropy")
# The config attributes `add_fused_lm_head` reads for the scale and softcap it applies after the LM head.
LOGIT_TRANSFORM_KEYS = (
    "final_logit_softcapping",
    "logit_scale",
    "output_multiplier",
    "lm_head_multiplier",
    "logits_scaling",
)
# ... and the MoE router settings it reads for the load-balancing loss, which do not touch the logits.
_ROUTER_KEYS = ("output_router_logits", "router_aux_loss_coef", "num_experts", "num_experts_per_tok")
GENERATION_ATTRIBUTES = ("use_vllm", "use_transformers_continuous_batching", "rollout_func", "tools", "_is_vlm")
NORMALISER_AT_GENERATION = ("cispo", "dapo", "vespo")  # normalised by `num_items_in_batch`
# `_compute_loss`'s loss mask is `inputs["completion_mask"]` itself when the batch has no tool mask.
_COMPLETION_MASK_LINE = 'completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]'
_LOSS_MASK_LINE = 'mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]'
# When `_generate_and_score_completions` runs its old-log-prob forward (`runs_scoring_forward`).
_SCORING_CONDITION = "if self.args.gradient_accumulation_steps % generate_every != 0 or ("
_OVERRIDDEN = (
    "_generate_and_score_completions",
    "_compute_loss",
    "_calculate_rewards",
    "_get_per_token_logps_and_entropies",
)


class UnsupportedTRLError(RuntimeError):
    """The installed TRL lacks a private surface trl-credit relies on."""


def _unsupported(what: str) -> UnsupportedTRLError:
    return UnsupportedTRLError(
        f"trl-credit supports trl{SUPPORTED_TRL}; the installed trl {trl.__version__} {what}. "
        f"Install a supported version: pip install 'trl{SUPPORTED_TRL}'"
    )


@cache
def check_trl_surfaces() -> None:
    """Raise `UnsupportedTRLError` unless every class-level surface above is as trl-credit expects."""
    low, high = (Version(bound.lstrip("<>=")) for bound in SUPPORTED_TRL.split(","))
    if not low <= Version(Version(trl.__version__).base_version) < high:
        raise _unsupported("is outside that range")
    for name in _OVERRIDDEN:
        if not callable(getattr(GRPOTrainer, name, None)):
            raise _unsupported(f"has no GRPOTrainer.{name}")
    keywords = tuple(inspect.signature(GRPOTrainer._get_per_token_logps_and_entropies).parameters)[1:]  # self
    missing = [k for k in _SCORING_KEYWORDS if k not in keywords]
    multimodal = tuple(k for k in keywords if k not in _SCORING_KEYWORDS and k != "compute_aux_loss")
    if missing or set(multimodal) != set(MULTIMODAL_KEYS):
        raise _unsupported(
            f"scores tokens with _get_per_token_logps_and_entropies{keywords}, expected the keywords "
            f"{_SCORING_KEYWORDS} and the multimodal inputs {MULTIMODAL_KEYS}"
        )
    fields = {f.name for f in dataclasses.fields(FusedCausalLMOutput)}
    if not set(FUSED_OUTPUT_FIELDS) <= fields:
        raise _unsupported(f"has a fused LM head output without {sorted(set(FUSED_OUTPUT_FIELDS) - fields)}")
    read = set(_config_attributes_read(add_fused_lm_head))
    if read != set(LOGIT_TRANSFORM_KEYS + _ROUTER_KEYS):
        raise _unsupported(f"transforms the fused LM head's logits with the config keys {sorted(read)}")
    source = inspect.getsource(GRPOTrainer._compute_loss)
    mask_at, forward_at = source.find(_LOSS_MASK_LINE), source.find("_get_per_token_logps_and_entropies(")
    advantages_at = source.find('inputs["advantages"]')
    if _COMPLETION_MASK_LINE not in source or not 0 <= mask_at < forward_at < advantages_at:
        raise _unsupported(
            "builds GRPOTrainer._compute_loss's loss mask, forward and advantages otherwise than as "
            f'`{_COMPLETION_MASK_LINE}`, then `{_LOSS_MASK_LINE}`, then its forward, then `inputs["advantages"]`'
        )
    if _SCORING_CONDITION not in inspect.getsource(GRPOTrainer._generate_and_score_completions):
        raise _unsupported(f"decides otherwise than `{_SCORING_CONDITION}` whether to run its scoring forward")


def _config_attributes_read(function) -> list[str]:
    """The attribute names `function` reads with `getattr(text_config, "name", ...)` or `text_config.name`."""
    source = inspect.getsource(function)
    names = re.findall(r'getattr\(text_config, "(\w+)"', source) + re.findall(r"text_config\.(\w+)", source)
    return [name for name in dict.fromkeys(names) if name != "model_type"]


def check_trainer_attributes(trainer: GRPOTrainer) -> None:
    """Raise `UnsupportedTRLError` unless a built trainer has the attributes that say how TRL generates."""
    missing = [name for name in GENERATION_ATTRIBUTES if not hasattr(trainer, name)]
    if missing:
        raise _unsupported(f"builds a GRPOTrainer without the attributes {missing}")


def runs_scoring_forward(trainer) -> bool:
    """Whether TRL's `_generate_and_score_completions` runs its no-grad old-log-prob forward of the policy (TRL 1.16's
    condition). Only decides whether to record: `ScoringForward.statistics` checks the record against the batch."""
    generate_every = trainer.args.steps_per_generation * trainer.num_iterations
    return trainer.args.gradient_accumulation_steps % generate_every != 0 or (
        trainer.use_vllm and trainer.vllm_importance_sampling_correction
    )


def trl_loss_mask(inputs) -> torch.Tensor | None:
    """The tensor TRL 1.16's `_compute_loss` masks its loss with, when it is a batch tensor that can still be changed
    after TRL's forward: without a tool mask TRL uses `inputs["completion_mask"]` itself (its forward reads a
    concatenated copy as the attention mask); with one, TRL multiplies the two before its forward (None)."""
    return None if "tool_mask" in inputs else inputs["completion_mask"]


def weigh_trl_loss_mask(inputs, loss_mask_BT: torch.Tensor) -> None:
    """Multiply TRL's loss mask (`trl_loss_mask`, the micro-batch's own clone) by `loss_mask_BT`, in place, between
    TRL's forward and its loss. The weights may be soft (min-p's), so the tensor takes their float dtype through
    `.data`: TRL holds this very object as its mask, and an integer tensor cannot hold them."""
    mask_BT = trl_loss_mask(inputs)
    mask_BT.data = mask_BT * loss_mask_BT


def fused_statistics(output, num_tokens: int):
    """`(log_probs, entropy)` of the last `num_tokens` positions of the fused LM head's output."""
    return output.log_probs[:, -num_tokens:], output.entropy[:, -num_tokens:]


def output_cache(output):
    """The KV cache a backbone returned: `cache` from transformers 5.24, `past_key_values` before."""
    names = {f.name for f in dataclasses.fields(output)}
    return getattr(output, "cache" if "cache" in names else "past_key_values", None)


def cache_keyword(forward) -> str:
    """The keyword a backbone's forward takes its KV cache by: `cache` from transformers 5.24, else
    `past_key_values` (the old name still works there, with a warning)."""
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


# ------------------------------------------------------------------------------------ TRL 1.15's fused LM head

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
        hidden_nH, targets_n = hidden_NH[start : start + _TOKEN_CHUNK], targets_N[start : start + _TOKEN_CHUNK]
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
