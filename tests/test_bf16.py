"""bf16, as the GPU recipes train: every method trains a bf16 model, and TIDE's streamed statistics of bf16 hidden
states and LM heads, accumulated in float32, stay within 1e-3 of a float64 computation."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import (
    make_tiny_model,
    make_tiny_tokenizer,
    tiny_config,
    tiny_trainer,
)

from trl_credit.methods import CREDIT_METHODS
from trl_credit.trainer.lm_head_statistics import LogitTransform, hellinger_and_entropy


@pytest.mark.parametrize("method", ["grpo", *sorted(CREDIT_METHODS)])
def test_every_method_trains_a_bf16_model(tmp_path, method):
    tokenizer = make_tiny_tokenizer()
    model = make_tiny_model(tokenizer).to(torch.bfloat16)
    before = {name: param.detach().clone() for name, param in model.named_parameters()}
    args = tiny_config(method, tmp_path, bf16=True, max_steps=2)
    trainer = tiny_trainer(args, model=model, tokenizer=tokenizer)
    trainer.train()

    params = dict(model.named_parameters())
    assert all(param.dtype == torch.bfloat16 and torch.isfinite(param).all() for param in params.values())
    assert any(not torch.equal(params[name], value) for name, value in before.items())
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == 2
    for entry in logged:
        credit = {key: value for key, value in entry.items() if key.startswith("credit/")}
        assert method == "grpo" or credit, f"{method} logged no credit metric"
        for key, value in {"loss": entry["loss"], **credit}.items():
            assert math.isfinite(value), f"{method}: {key} = {value}"


def _float64_statistics(logits, ref_logits, transform, temperature):
    logp = torch.log_softmax(transform(logits.double(), temperature), dim=-1)
    logq = torch.log_softmax(transform(ref_logits.double(), temperature), dim=-1)
    deviation = (1 - torch.exp(0.5 * (logp + logq)).sum(-1)).clamp(0, 1)
    return deviation, -(logp.exp() * logp).sum(-1)


def test_streamed_statistics_of_bf16_inputs_stay_within_1e3_of_float64():
    torch.manual_seed(0)
    tokens, hidden_size, vocab = 48, 64, 2000
    hidden = torch.randn(tokens, hidden_size).bfloat16()
    ref_hidden = (hidden.float() + 0.3 * torch.randn(tokens, hidden_size)).bfloat16()
    weight = (0.4 * torch.randn(vocab, hidden_size)).bfloat16()
    ref_weight = (weight.float() + 0.05 * torch.randn(vocab, hidden_size)).bfloat16()
    transform, temperature = LogitTransform(scale=1.0, softcap=30.0), 0.7

    deviation, entropy = hellinger_and_entropy(
        hidden,
        ref_hidden,
        weight,
        ref_weight,
        temperature=temperature,
        token_chunk_size=16,
        vocab_chunk_size=300,
        transform=transform,
    )
    want_deviation, want_entropy = _float64_statistics(
        hidden.double() @ weight.double().T, ref_hidden.double() @ ref_weight.double().T, transform, temperature
    )
    assert deviation.dtype == entropy.dtype == torch.float32
    assert 0.05 < want_deviation.mean() < 0.95  # far from the trivial ends
    assert (deviation.double() - want_deviation).abs().max() < 1e-3
    assert (entropy.double() - want_entropy).abs().max() < 1e-3

    # The bound is tight enough to matter: logits rounded to bf16 (a bf16 GEMM with a bf16 output) miss it.
    rounded_deviation, _ = _float64_statistics(hidden @ weight.T, ref_hidden @ ref_weight.T, transform, temperature)
    assert (rounded_deviation - want_deviation).abs().max() > 1e-3
