"""Engine-aware access to a causal LM's final hidden states and LM head (plain, PEFT, ZeRO-3, FSDP2).

TIDE streams the LM head itself instead of calling the model's forward, so it must reach the decoder
and the head directly and gather what DeepSpeed ZeRO-3 or FSDP2 shard.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from accelerate.utils import is_peft_model

from .lm_head_statistics import LogitTransform
from .trl_compat import attending_without_growing, cache_keyword, output_cache


def backbone(model):
    """The decoder TRL's fused LM head calls (`model.base_model`); a PEFT model's adapters stay in effect."""
    return (model.get_base_model() if is_peft_model(model) else model).base_model


def final_hidden(model, **model_inputs) -> torch.Tensor:
    """`(b, L, H)` final (post-norm) hidden states, without computing the LM head.

    Calls the backbone as TRL's fused LM head does, so vision-language models get their image inputs.
    """
    return backbone(model)(**model_inputs, use_cache=False).last_hidden_state


def completion_hidden(model, prompt_ids, prompt_mask, completion_ids, completion_mask, **multimodal) -> torch.Tensor:
    """`(b, T, H)` final hidden states that score each completion token: position `P - 1 + t` of prompt + completion.

    Rows with the same prompt (a GRPO group) share its forward: each distinct prompt runs once with a KV cache, the
    cache is repeated for its rows, and the completions run on it with the whole attention mask, continuing at
    position P as one forward over prompt + completion does (`tests/test_architectures.py` checks the equality). The
    completions' own keys and values are not kept in the cache (`attending_without_growing`): each layer's are freed
    once it has used them. With image inputs, one forward over prompt + completion.
    """
    prompt_len, completion_len = prompt_ids.size(1), completion_ids.size(1)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
    if multimodal:
        hidden_BLH = final_hidden(
            model,
            input_ids=torch.cat([prompt_ids, completion_ids], dim=1),
            attention_mask=attention_mask,
            **multimodal,
        )
        return hidden_BLH[:, prompt_len - 1 : prompt_len - 1 + completion_len]
    decoder = backbone(model)
    distinct, row_prompt = torch.unique(torch.cat([prompt_ids, prompt_mask], dim=1), dim=0, return_inverse=True)
    prompt_out = decoder(input_ids=distinct[:, :prompt_len], attention_mask=distinct[:, prompt_len:], use_cache=True)
    cache = output_cache(prompt_out)
    cache.reorder_cache(row_prompt)  # each row gets its prompt's keys and values
    with attending_without_growing(decoder, cache):
        completion_out = decoder(
            input_ids=completion_ids,
            attention_mask=attention_mask,
            use_cache=True,
            **{cache_keyword(decoder.forward): cache},
        )
    # The prompt's last position scores the first completion token; the last completion token scores nothing.
    return torch.cat([prompt_out.last_hidden_state[row_prompt, -1:], completion_out.last_hidden_state[:, :-1]], dim=1)


def logit_transform(model) -> LogitTransform:
    """The scale and softcap a model applies after its LM head, read from its config as TRL's fused LM head reads
    them (`trl.trainer.utils.add_fused_lm_head`; `trl_compat.LOGIT_TRANSFORM_KEYS` checks the keys): Gemma-2's `final_logit_softcapping`, Cohere's `logit_scale`,
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
    return LogitTransform(
        scale=1.0 if scale is None else scale, softcap=getattr(config, "final_logit_softcapping", None)
    )


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
