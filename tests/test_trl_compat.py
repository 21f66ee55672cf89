"""`trl_credit.trainer.trl_compat`: the TRL seams checked against the installed TRL (a moved one fails naming the
supported range), and the torch fused-head fallback that TRL 1.15 lacks off CUDA/XPU."""

import tomllib
from pathlib import Path

import pytest
import torch
import trl
from trl import GRPOTrainer
from trl.trainer import utils as trl_utils

from trl_credit.trainer import trl_compat
from trl_credit.trainer.trl_compat import chunked_logprob_torch, needs_torch_fused_head


@pytest.fixture(autouse=True)
def fresh_check():
    trl_compat.check_trl_surfaces.cache_clear()
    yield
    # After the test's monkeypatches are undone: cache the real TRL's verdict again for the trainers of later tests.
    trl_compat.check_trl_surfaces.cache_clear()
    trl_compat.check_trl_surfaces()


def test_the_installed_trl_has_every_surface():
    trl_compat.check_trl_surfaces()


def test_the_supported_range_is_the_one_pyproject_declares():
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    (requirement,) = [r for r in project["dependencies"] if r.replace(" ", "").startswith("trl>")]
    assert requirement.replace(" ", "") == f"trl{trl_compat.SUPPORTED_TRL}"


def _fails_naming_the_range(match):
    with pytest.raises(trl_compat.UnsupportedTRLError, match=match) as error:
        trl_compat.check_trl_surfaces()
    assert f"trl{trl_compat.SUPPORTED_TRL}" in str(error.value) and trl.__version__ in str(error.value)


def test_a_new_multimodal_keyword_of_the_scoring_forward_is_caught(monkeypatch):
    original = GRPOTrainer._get_per_token_logps_and_entropies

    def scoring(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        pixel_values=None,
        video_grid_thw=None,
    ):
        return original(self, model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy)

    monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies", scoring)
    _fails_naming_the_range("scores tokens with _get_per_token_logps_and_entropies")


def test_a_new_logit_transform_of_the_fused_head_is_caught(monkeypatch):
    def add_fused_lm_head(model, temperature=1.0, cast_lm_head_to_fp32=False, outputs=("log_probs",)):
        text_config = model.config.get_text_config()
        for key in trl_compat.LOGIT_TRANSFORM_KEYS + ("logit_bias_scale",):
            getattr(text_config, key, None)

    monkeypatch.setattr(trl_compat, "add_fused_lm_head", add_fused_lm_head)
    _fails_naming_the_range("transforms the fused LM head's logits")


def test_a_version_outside_the_range_is_refused(monkeypatch):
    monkeypatch.setattr(trl, "__version__", "1.17.0")
    _fails_naming_the_range("is outside that range")


def test_the_fused_output_fields_are_checked(monkeypatch):
    monkeypatch.setattr(trl_compat, "FUSED_OUTPUT_FIELDS", ("log_probs", "entropy", "max_logit"))
    _fails_naming_the_range(r"fused LM head output without \['max_logit'\]")
    assert trl_utils.FusedCausalLMOutput is trl_compat.FusedCausalLMOutput


ALL_OUTPUTS = ("log_probs", *trl_compat.OPTIONAL_OUTPUTS)


def _inputs(seed: int, n: int = 37, hidden: int = 12, vocab: int = 50):
    generator = torch.Generator().manual_seed(seed)
    hidden_NH = torch.randn(n, hidden, generator=generator, requires_grad=True)
    weight_VH = torch.randn(vocab, hidden, generator=generator, requires_grad=True)
    bias_V = torch.randn(vocab, generator=generator, requires_grad=True)
    targets_N = torch.randint(0, vocab, (n,), generator=generator)
    return hidden_NH, weight_VH, bias_V, targets_N


def test_only_trl_1_15_needs_the_fallback():
    assert needs_torch_fused_head("1.15.0") and needs_torch_fused_head("1.15.2")
    assert not needs_torch_fused_head("1.16.0") and not needs_torch_fused_head("1.14.2")
    assert trl_compat.install() == needs_torch_fused_head(trl.__version__)


@pytest.mark.parametrize("softcap", [None, 3.0])
def test_fallback_matches_the_softmax_of_the_transformed_logits(monkeypatch, softcap):
    monkeypatch.setattr(trl_compat, "_TOKEN_CHUNK", 8)  # several token chunks, the last one partial
    hidden_NH, weight_VH, bias_V, targets_N = _inputs(0)
    temperature, scale = 0.7, 0.5
    got = chunked_logprob_torch(hidden_NH, weight_VH, bias_V, targets_N, temperature, 16, softcap, scale, ALL_OUTPUTS)

    z_NV = (hidden_NH @ weight_VH.T + bias_V) * scale
    if softcap is not None:
        z_NV = softcap * torch.tanh(z_NV / softcap)
    z_NV = z_NV / temperature
    p_NV = torch.softmax(z_NV.double(), -1)
    expected = (
        p_NV.gather(-1, targets_N[:, None]).squeeze(-1).log(),
        -(p_NV * p_NV.log()).sum(-1),
        (p_NV**2).sum(-1).log(),
        z_NV.double().mean(-1),
    )
    for value, reference in zip(got[:4], expected):
        torch.testing.assert_close(value.double(), reference.detach(), rtol=1e-5, atol=1e-5)
    assert torch.equal(got[4], z_NV.argmax(-1) == targets_N)
    only_logps = chunked_logprob_torch(hidden_NH, weight_VH, bias_V, targets_N, temperature, 16, softcap, scale, ())
    assert all(value is None for value in only_logps[1:])

    # Gradients of a loss on log-probs and entropy reach hidden states, LM head and bias exactly.
    (got[0].sum() + 0.3 * got[1].sum()).backward()
    mine = [t.grad.clone() for t in (hidden_NH, weight_VH, bias_V)]
    for t in (hidden_NH, weight_VH, bias_V):
        t.grad = None
    logp_NV = torch.log_softmax(z_NV, -1)
    (logp_NV.gather(-1, targets_N[:, None]).sum() - 0.3 * (logp_NV.exp() * logp_NV).sum()).backward()
    for value, reference in zip(mine, (hidden_NH.grad, weight_VH.grad, bias_V.grad)):
        torch.testing.assert_close(value, reference, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(needs_torch_fused_head(trl.__version__), reason="TRL 1.15's own kernel needs Triton on CUDA/XPU")
def test_fallback_agrees_with_trl_kernel_on_cpu():
    """TRL 1.16's `ChunkedLogProbFunction` runs on CPU: the fallback must give what it gives, values and gradients."""
    from trl.kernels import ChunkedLogProbFunction

    results = []
    for function in (chunked_logprob_torch, ChunkedLogProbFunction.apply):
        hidden_NH, weight_VH, bias_V, targets_N = _inputs(1)
        values = function(hidden_NH, weight_VH, bias_V, targets_N, 0.9, 16, 2.0, 0.8, trl_compat.OPTIONAL_OUTPUTS)
        (values[0].sum() + 0.5 * values[1].sum()).backward()
        results.append((values, (hidden_NH.grad, weight_VH.grad, bias_V.grad)))
    (mine, my_grads), (trls, trl_grads) = results
    for value, reference in zip(mine[:4], trls[:4]):
        torch.testing.assert_close(value, reference, rtol=1e-5, atol=1e-5)
    assert torch.equal(mine[4], trls[4])
    for value, reference in zip(my_grads, trl_grads):
        torch.testing.assert_close(value, reference, rtol=1e-4, atol=1e-5)


def test_fallback_without_valid_tokens_stays_in_the_graph():
    """An all-masked micro-batch (every completion truncated and masked) must still backpropagate a zero loss."""
    hidden_NH, weight_VH, bias_V, _ = _inputs(2)
    values = chunked_logprob_torch(
        hidden_NH[:0], weight_VH, bias_V, torch.zeros(0, dtype=torch.long), 1.0, 16, None, 1.0, ALL_OUTPUTS[1:]
    )
    assert [tuple(value.shape) for value in values] == [(0,)] * 5
    (values[0].sum() + values[1].sum()).backward()
    assert weight_VH.grad is not None and not weight_VH.grad.any()
