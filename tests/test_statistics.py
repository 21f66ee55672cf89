"""The streamed Hellinger/entropy statistics against the naive full-logit computation."""

import pytest
import torch
from reference_formulas import hellinger_and_entropy_naive

from trl_credit.trainer.lm_head_statistics import (
    LogitTransform,
    hellinger_and_entropy,
    token_statistics,
)


@pytest.mark.parametrize("token_chunk,vocab_chunk", [(1, 1000), (37, 129), (500, 10_000)])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_streamed_matches_naive(token_chunk, vocab_chunk, temperature):
    g = torch.Generator().manual_seed(0)
    n, h, v = 120, 24, 3000
    hidden = torch.randn(n, h, generator=g)
    ref_hidden = hidden + 0.5 * torch.randn(n, h, generator=g)
    weight = torch.randn(v, h, generator=g)
    ref_weight = weight + 0.2 * torch.randn(v, h, generator=g)
    bias = torch.randn(v, generator=g)
    streamed = hellinger_and_entropy(
        hidden, ref_hidden, weight, ref_weight, bias, None, temperature, token_chunk, vocab_chunk
    )
    naive = hellinger_and_entropy_naive(hidden, ref_hidden, weight, ref_weight, bias, None, temperature)
    for got, want in zip(streamed, naive):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    deviation, entropy = streamed
    assert (deviation >= 0).all() and (deviation <= 1).all() and deviation.mean() > 0.01
    assert (entropy >= 0).all() and (entropy <= torch.log(torch.tensor(float(v))) + 1e-4).all()


def test_identical_models_have_zero_deviation_and_extreme_logits_stay_finite():
    hidden = torch.randn(10, 8) * 100  # very peaked distributions
    weight = torch.randn(500, 8)
    deviation, entropy = hellinger_and_entropy(hidden, hidden, weight, vocab_chunk_size=64)
    assert deviation.abs().max() < 1e-5
    assert torch.isfinite(entropy).all() and (entropy >= 0).all()


def test_a_reference_a_hair_from_the_policy_has_deviations_near_0_and_never_below():
    g = torch.Generator().manual_seed(0)
    hidden = 3 * torch.randn(64, 8, generator=g)
    weight = torch.randn(500, 8, generator=g)
    ref_hidden = hidden + 1e-6 * torch.randn(64, 8, generator=g)
    deviation, _ = hellinger_and_entropy(hidden, ref_hidden, weight, vocab_chunk_size=64)
    # Rounding puts the Bhattacharyya coefficient of such close models on either side of 1 (by about 1e-7 here); a
    # squared distance is never below 0.
    assert (deviation >= 0).all() and deviation.max() < 1e-5


def test_bad_chunk_size_is_rejected():
    with pytest.raises(ValueError, match="chunk sizes must be >= 1"):
        hellinger_and_entropy(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(4, 3), vocab_chunk_size=0)


def test_hidden_states_of_two_shapes_are_rejected_naming_both():
    with pytest.raises(ValueError, match=r"^hidden_NH \(2, 3\) and ref_hidden_NH \(3, 3\) differ$"):
        hellinger_and_entropy(torch.zeros(2, 3), torch.zeros(3, 3), torch.zeros(4, 3))


@pytest.mark.parametrize("token_chunk,vocab_chunk", [(4096, 100_000), (7, 3000), (64, 1)])
def test_streamed_edge_chunks_low_precision_heads_and_both_biases(token_chunk, vocab_chunk):
    g = torch.Generator().manual_seed(1)
    n, h, v = 50, 16, 3000
    hidden = torch.randn(n, h, generator=g) * 3
    ref_hidden = torch.randn(n, h, generator=g) * 3  # unrelated: deviations close to 1
    weight = torch.randn(v, h, generator=g).bfloat16()
    ref_weight = torch.randn(v, h, generator=g).bfloat16()
    bias, ref_bias = torch.randn(v, generator=g), torch.randn(v, generator=g)
    args = (hidden, ref_hidden, weight, ref_weight, bias, ref_bias, 0.7)
    streamed = hellinger_and_entropy(*args, token_chunk_size=token_chunk, vocab_chunk_size=vocab_chunk)
    for got, want in zip(streamed, hellinger_and_entropy_naive(*args)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert streamed[0].mean() > 0.5


def test_a_reference_with_its_own_logit_transform_is_streamed_with_that_transform():
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(40, 16, generator=g) * 3
    weight = torch.randn(700, 16, generator=g)
    policy, reference = LogitTransform(), LogitTransform(scale=0.5, softcap=2.0)
    streamed = hellinger_and_entropy(
        hidden, hidden, weight, temperature=0.7, vocab_chunk_size=128, transform=policy, ref_transform=reference
    )
    naive = hellinger_and_entropy_naive(
        hidden, hidden, weight, temperature=0.7, transform=policy, ref_transform=reference
    )
    for got, want in zip(streamed, naive):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert streamed[0].mean() > 0.05  # the same hidden states: only the transforms differ


def test_bf16_hidden_states_and_head_on_cpu_are_multiplied_in_float32():
    # Off CUDA there is no bf16 x bf16 -> float32 GEMM (`aten::mm.dtype`): the operands are cast first.
    g = torch.Generator().manual_seed(3)
    hidden, ref_hidden = (torch.randn(30, 16, generator=g).bfloat16() for _ in range(2))
    weight, ids = torch.randn(900, 16, generator=g).bfloat16(), torch.randint(0, 900, (30,), generator=g)
    streamed = hellinger_and_entropy(hidden, ref_hidden, weight, vocab_chunk_size=256)
    for got, want in zip(streamed, hellinger_and_entropy_naive(hidden, ref_hidden, weight)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    logps = token_statistics(hidden, weight, ids, vocab_chunk_size=256).logps
    want = torch.log_softmax(hidden.double() @ weight.double().T, dim=-1).gather(1, ids[:, None]).squeeze(1)
    torch.testing.assert_close(logps, want.float(), atol=1e-5, rtol=1e-5)


def test_streamed_matches_float64():
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(40, 32, generator=g)
    weight = torch.randn(5000, 32, generator=g) * 0.4
    ref_weight = weight + 0.05 * torch.randn(5000, 32, generator=g)
    deviation, entropy = hellinger_and_entropy(hidden, hidden, weight, ref_weight, vocab_chunk_size=777)
    logp = torch.log_softmax(hidden.double() @ weight.double().T, -1)
    logq = torch.log_softmax(hidden.double() @ ref_weight.double().T, -1)
    torch.testing.assert_close(deviation.double(), 1 - torch.exp(0.5 * (logp + logq)).sum(-1), atol=1e-6, rtol=0)
    torch.testing.assert_close(entropy.double(), -(logp.exp() * logp).sum(-1), atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize("token_chunk,vocab_chunk", [(1, 1000), (13, 97), (4096, 100_000)])
def test_sampled_logprob_entropy_logit_gap_and_unsampled_mass_and_squares_match_float64(token_chunk, vocab_chunk):
    g = torch.Generator().manual_seed(3)
    n, h, v = 60, 16, 1000
    hidden, weight, bias = (
        torch.randn(n, h, generator=g) * 2,
        torch.randn(v, h, generator=g),
        torch.randn(v, generator=g),
    )
    # Tokens at both ends of the vocabulary and of every chunk, and random ones.
    token_ids = torch.cat(
        [
            torch.tensor([0, v - 1, min(vocab_chunk - 1, v - 1), min(vocab_chunk, v - 1)]),
            torch.randint(0, v, (n - 4,), generator=g),
        ]
    )
    transform = LogitTransform(scale=0.5, softcap=3.0)
    logps, entropy, logit_gap, unsampled_mass, unsampled_sum_sq = token_statistics(
        hidden, weight, token_ids, bias, 0.7, token_chunk, vocab_chunk, transform
    )
    z_NV = transform(hidden.double() @ weight.double().T + bias.double(), 0.7)
    logp_NV = torch.log_softmax(z_NV, dim=-1)
    torch.testing.assert_close(
        logps.double(), logp_NV.gather(1, token_ids.unsqueeze(1)).squeeze(1), atol=1e-5, rtol=1e-5
    )
    torch.testing.assert_close(entropy.double(), -(logp_NV.exp() * logp_NV).sum(-1), atol=1e-5, rtol=1e-5)
    gap_N = z_NV.gather(1, token_ids.unsqueeze(1)).squeeze(1) - z_NV.amax(-1)
    torch.testing.assert_close(logit_gap.double(), gap_N, atol=1e-5, rtol=1e-5)
    others_NV = logp_NV.exp().scatter(1, token_ids.unsqueeze(1), 0.0)  # the sampled token's probability left out
    torch.testing.assert_close(unsampled_mass.double(), others_NV.sum(-1), atol=1e-7, rtol=1e-5)
    torch.testing.assert_close(unsampled_sum_sq.double(), others_NV.square().sum(-1), atol=1e-7, rtol=1e-5)
