"""Every private TRL and transformers surface trl-credit relies on, in one place, checked when a trainer is built.

TRL's public API has no seam for per-token advantages, so the trainer overrides a few private methods of
`GRPOTrainer` and reads a few of its attributes; `PRIVATE_SURFACES` names each with what for. `check_trl_surfaces`
checks the installed TRL by its version (`SUPPORTED_TRL`) and by the signatures and fields below, and fails with one
message naming the supported range; `tests/test_trl_compat.py` checks TRL's behaviour on both supported releases.
What differs between them lives here too: `torch_fused_head()` gives TRL 1.15's fused LM head a torch path off
CUDA/XPU, only inside the trainer's own scoring calls. See docs/layout.md ("TRL's private surfaces").
"""

from __future__ import annotations

import dataclasses
import inspect
from contextlib import contextmanager, nullcontext
from functools import cache

import torch
import trl
from packaging.version import Version
from trl import GRPOTrainer
from trl.trainer.utils import FusedCausalLMOutput

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
GENERATION_ATTRIBUTES = ("use_vllm", "use_transformers_continuous_batching", "rollout_func", "tools", "_is_vlm")
NORMALISER_AT_GENERATION = ("cispo", "dapo", "vespo")  # normalised by `num_items_in_batch`
LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")  # the same in TRL 1.15 and 1.16
# The values of `GRPOConfig`'s enumerated fields, as TRL's help lists them (the same in TRL 1.15 and 1.16): TRL declares
# no `choices` for them and compares them only inside a training step (`loss_type` at the first loss, `scale_rewards`
# at the first rewards), after the model has loaded. `tests/test_trl_compat.py` checks each against TRL's help.
TRL_CHOICES = {
    "loss_type": LOSS_TYPES,
    "scale_rewards": ("group", "batch", "none"),  # TRL maps True/False to group/none in `GRPOConfig.__post_init__`
    "multi_objective_aggregation": ("sum_then_normalize", "normalize_then_sum"),
    "importance_sampling_level": ("token", "sequence"),
    "vllm_mode": ("server", "colocate"),
    "vllm_model_impl": ("transformers", "vllm"),
    "vllm_importance_sampling_mode": ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"),
}
PRIVATE_SURFACES = {
    # GRPOTrainer's methods the trainer overrides (each calls `super()`), and the ones it calls.
    "_generate_and_score_completions": "overridden: the generation stage runs on TRL's generation batch",
    "_compute_loss": "overridden: hands the micro-batch to the training-forward stage, then TRL's loss",
    "_get_per_token_logps_and_entropies": "overridden: TRL's scoring forward, whose log-probs the methods read",
    "_calculate_rewards": "overridden: keeps the rewards per function and logs the unscored answers",
    "_save_checkpoint": "overridden: saves the previous-policy reference and the run's record with the checkpoint",
    "_load_optimizer_and_scheduler": "overridden: loads the previous-policy reference on resume",
    "_save": "overridden: gives the saved .safetensors files the mode of the other saved files",
    "_get_output_dir": "called: the folder of the checkpoint being saved",
    # GRPOTrainer's attributes.
    "_metrics": "appended to: the credit metrics, logged with TRL's own",
    "_is_vlm": "read: whether TRL generates for a vision-language model (`GENERATION_ATTRIBUTES`)",
    "_tag_names": "set: the Hub tags of the card TRL writes",
    "_name": "set: the trainer's name in the card",
    "_paper": "set: the paper the card cites",
    # transformers and TRL modules.
    "_attn_implementation": "read from the policy's config: the reference model loads with the same attention",
    "_ChunkedLogProbFunction": "swapped inside `torch_fused_head` on TRL 1.15 (its fused head's kernel)",
}
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
    """Raise `UnsupportedTRLError` unless the installed TRL is a supported release with every class-level surface
    above (the version pins what no signature shows: the behaviour `tests/test_trl_compat.py` checks)."""
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
    if tuple(inspect.signature(GRPOTrainer._compute_loss).parameters) != ("self", "model", "inputs"):
        raise _unsupported("has a GRPOTrainer._compute_loss that does not take (model, inputs)")
    fields = {f.name for f in dataclasses.fields(FusedCausalLMOutput)}
    if not set(FUSED_OUTPUT_FIELDS) <= fields:
        raise _unsupported(f"has a fused LM head output without {sorted(set(FUSED_OUTPUT_FIELDS) - fields)}")


def check_trainer_attributes(trainer: GRPOTrainer) -> None:
    """Raise `UnsupportedTRLError` unless a built trainer has the attributes that say how TRL generates."""
    missing = [name for name in GENERATION_ATTRIBUTES if not hasattr(trainer, name)]
    if missing:
        raise _unsupported(f"builds a GRPOTrainer without the attributes {missing}")


def runs_scoring_forward(args, num_iterations: int, use_vllm: bool, vllm_importance_sampling_correction: bool) -> bool:
    """Whether TRL's `_generate_and_score_completions` runs its no-grad old-log-prob forward of the policy (the same
    condition in TRL 1.15 and 1.16), from the trainer's `args` and attributes of those names. Only decides whether to
    record: `ScoringForward.statistics` checks the record against the batch."""
    generate_every = args.steps_per_generation * num_iterations
    return args.gradient_accumulation_steps % generate_every != 0 or (use_vllm and vllm_importance_sampling_correction)


def output_cache(output):
    """The KV cache a backbone returned: `cache` from transformers 5.24, `past_key_values` before; None from an
    output class with no cache field (a model without a KV cache)."""
    names = {f.name for f in dataclasses.fields(output)}
    return getattr(output, "cache" if "cache" in names else "past_key_values", None)


def cache_keyword(forward) -> str:
    """The keyword a backbone's forward takes its KV cache by: `cache` from transformers 5.24, else
    `past_key_values` (the old name still works there, with a warning)."""
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


@contextmanager
def attending_without_growing(backbone, cache):
    """Within the block, `backbone`'s forwards attend to `cache` (a transformers `Cache`) without keeping what they add
    to it: after each attention module (a module with a `layer_idx`) runs, its layer of the cache is put back as it
    was. A forward of T new tokens then frees each layer's T keys and values once that layer has used them, as a
    forward without a cache does, instead of holding every layer's to the end (at 16k tokens, 4 rows of Qwen2.5-32B:
    33 GiB). The model computes with what `Cache.update` returns, so its outputs do not change."""
    layers = cache.layers
    as_given = [dict(vars(layer)) for layer in layers]

    def put_back(module, args, output):
        layer = layers[module.layer_idx]
        vars(layer).clear()
        vars(layer).update(as_given[module.layer_idx])

    hooks = [
        module.register_forward_hook(put_back)
        for module in backbone.modules()
        if isinstance(getattr(module, "layer_idx", None), int)
    ]
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


# ------------------------------------------------------------------------------------ TRL 1.15's fused LM head

OPTIONAL_OUTPUTS = ("entropy", "log_sum_sq_probs", "mean_logits", "is_top1")
_TOKEN_CHUNK = 1024


def needs_torch_fused_head(trl_version: str) -> bool:
    """Whether this TRL release's fused LM head has no torch path for devices without Triton (TRL 1.15)."""
    return Version(trl_version).release[:2] == (1, 15)


_NEEDS_TORCH_FUSED_HEAD = needs_torch_fused_head(trl.__version__)


def chunked_logprob_torch(
    hidden_NH: torch.Tensor,
    weight_VH: torch.Tensor,
    bias_V: torch.Tensor | None,
    targets_N: torch.Tensor,
    temperature: float,
    chunk_size: int,
    final_logit_softcapping: float | None,
    logit_scale: float,
    outputs: tuple[str, ...],
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


@contextmanager
def _torch_fused_head():
    """Route TRL 1.15's fused LM head kernel through `_FusedHeadFunction` inside the block, and put TRL's own back after
    it (re-entrant). Only the forward looks the kernel up: the backward runs on the autograd graph the block built, so
    the loss may backpropagate after the block."""
    import trl.trainer.utils as trl_utils

    if _FusedHeadFunction.triton_function is None:
        try:
            from trl.kernels import ChunkedLogProbFunction
        except ImportError:  # TRL 1.15 imports Triton there unconditionally
            ChunkedLogProbFunction = None
        _FusedHeadFunction.triton_function = ChunkedLogProbFunction
    kernel = trl_utils._ChunkedLogProbFunction
    trl_utils._ChunkedLogProbFunction = _FusedHeadFunction
    try:
        yield
    finally:
        trl_utils._ChunkedLogProbFunction = kernel


# On TRL 1.15 the block above; on other releases a plain no-op block.
torch_fused_head = _torch_fused_head if _NEEDS_TORCH_FUSED_HEAD else nullcontext
