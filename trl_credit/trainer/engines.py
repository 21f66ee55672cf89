"""Engine-aware access to a causal LM's final hidden states and LM head (plain, PEFT, ZeRO-3, FSDP2).

TIDE streams the LM head itself instead of calling the model's forward, so it must reach the decoder
and the head directly and gather what DeepSpeed ZeRO-3 or FSDP2 shard.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from accelerate.utils import is_peft_model

from ..statistics import LogitTransform


def final_hidden(model, **model_inputs) -> torch.Tensor:
    """`(b, L, H)` final (post-norm) hidden states, without computing the LM head.

    Calls the backbone as TRL's fused LM head does (`model.base_model`), so vision-language models get their
    image inputs; a PEFT model's adapters stay in effect.
    """
    hf_model = model.get_base_model() if is_peft_model(model) else model
    return hf_model.base_model(**model_inputs, use_cache=False).last_hidden_state


def logit_transform(model) -> LogitTransform:
    """The scale and softcap a model applies after its LM head, read from its config as TRL's fused LM head reads
    them (`trl.trainer.utils.add_fused_lm_head`): Gemma-2's `final_logit_softcapping`, Cohere's `logit_scale`,
    `output_multiplier`, Falcon-H1's `lm_head_multiplier`, Granite's and MiniCPM3's `1 / logits_scaling`
    (HyperCLOVA X multiplies by it)."""
    config = model.config.get_text_config()
    scale = getattr(config, "logit_scale", None)
    if scale is None:
        scale = getattr(config, "output_multiplier", None)
    if scale is None:
        scale = getattr(config, "lm_head_multiplier", None)
    if scale is None and getattr(config, "logits_scaling", None) is not None:
        scale = config.logits_scaling if config.model_type == "hyperclovax" else 1 / config.logits_scaling
    return LogitTransform(scale=1.0 if scale is None else scale, softcap=getattr(config, "final_logit_softcapping", None))


def vocab_size(model) -> int:
    """Rows of the LM head; ZeRO-3 empties partitioned parameters (`shape == (0,)`) and keeps the shape in `ds_shape`.

    An FSDP2 DTensor reports its global shape, so it needs nothing special.
    """
    weight = model.get_output_embeddings().weight
    return getattr(weight, "ds_shape", weight.shape)[0]


@contextmanager
def unsharded_root(model):
    """Under FSDP2, gather the root module's own parameters (embeddings, final norm, LM head) for the duration.

    `final_hidden` calls the decoder directly, which skips the root's pre-forward hook that normally unshards them;
    the decoder layers are their own FSDP units and unshard in their own hooks. No-op for any other model (ZeRO-3
    hooks every sub-module, so calling the decoder there gathers what it needs).
    """
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(model, FSDPModule):
        yield
        return
    model.unshard()
    try:
        yield
    finally:
        model.reshard()


@contextmanager
def full_lm_head(model):
    """Yield the full `(V, H)` LM-head weight and bias, gathering them under DeepSpeed ZeRO-3 or FSDP2."""
    head = model.get_output_embeddings()
    params = [p for p in (head.weight, head.bias) if p is not None]
    if any(hasattr(p, "ds_id") for p in params):  # ZeRO-3 partitions parameters and tags them with ds_id
        import deepspeed

        with deepspeed.zero.GatheredParameters(params):
            yield head.weight, head.bias
        return
    from torch.distributed.tensor import DTensor

    # FSDP2 shards parameters as DTensors; the streamed product needs the whole head.
    yield tuple(p.full_tensor() if isinstance(p, DTensor) else p for p in (head.weight, head.bias))
