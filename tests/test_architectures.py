"""Every statistic equals a plain full-logits forward, on each architecture family TRL trains.

Two probe methods registered through the public interface read every statistic the trainer offers (one at
generation, one in the training forward) and hand the advantages on unchanged. The trainer runs one step, so the
policy at generation and in the training forward is the initial model (on TRL's plain `generate` path, on its vLLM
branch and on its off-policy branch, where TRL's old-log-prob forward is the source and no second policy forward
runs); the reference is a perturbed copy, so the
deviation is not trivially zero. The expectation is computed here from `model(...).logits`, which applies each
family's own output transform (Gemma-2's final-logit softcapping, Cohere's `logit_scale`, Granite's
`logits_scaling`), divided by the sampling temperature.
"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import (
    TINY_FAMILIES,
    make_tiny_model,
    make_tiny_tokenizer,
    make_tiny_vision_language_model,
    naive_logprobs,
    sampled,
    tiny_config,
    tiny_trainer,
)
from reference_formulas import unsampled_statistics

from trl_credit import CreditGRPOTrainer, register_credit_method
from trl_credit.methods import (
    POLICY_ENTROPY,
    POLICY_LOGPS,
    REFERENCE_DEVIATION,
    ROLLOUT_ENTROPY,
    ROLLOUT_LOGPS,
    ROLLOUT_MEAN_ENTROPY,
    ROLLOUT_UNSAMPLED_MASS,
    ROLLOUT_UNSAMPLED_SUM_SQ_PROBS,
)
from trl_credit.trainer.model_parts import completion_hidden

RECORDS: list[dict] = []


@register_credit_method(
    "probe_generation",
    statistics=(
        ROLLOUT_LOGPS,
        ROLLOUT_ENTROPY,
        ROLLOUT_UNSAMPLED_MASS,
        ROLLOUT_UNSAMPLED_SUM_SQ_PROBS,
        ROLLOUT_MEAN_ENTROPY,
        REFERENCE_DEVIATION,
    ),
)
def probe_generation(batch):
    RECORDS.append(
        {"stage": "generation", "mask": batch.mask_BT.clone(), **{k: v.clone() for k, v in batch.statistics.items()}}
    )
    return batch.advantages_BT


@register_credit_method("probe_rollout", statistics=(ROLLOUT_LOGPS, ROLLOUT_ENTROPY))
def probe_rollout(batch):
    """The rollout statistics without a deviation: EAPO's and AR-Lopti's case, where no hidden states are needed."""
    RECORDS.append(
        {"stage": "generation", "mask": batch.mask_BT.clone(), **{k: v.clone() for k, v in batch.statistics.items()}}
    )
    return batch.advantages_BT


@register_credit_method("probe_forward", statistics=(POLICY_LOGPS, POLICY_ENTROPY))
def probe_forward(batch):
    RECORDS.append(
        {"stage": "forward", "mask": batch.mask_BT.clone(), **{k: v.clone() for k, v in batch.statistics.items()}}
    )
    return batch.advantages_BT


FAMILIES = list(TINY_FAMILIES)


def _naive(model, batch, temperature):
    """Sampled-token log-probs and full-vocabulary log-probs `(B, T, V)`, in float64, from the model's own logits."""
    logp_BTV = naive_logprobs(model, batch, temperature, dtype=torch.float64)
    return sampled(logp_BTV, batch["completion_ids"]), logp_BTV


class BatchKeeper(CreditGRPOTrainer):
    """Keeps the generation batch and the (shuffled) micro-batch, the rows each probe saw, in order."""

    def _generate_and_score_completions(self, inputs):
        batch = super()._generate_and_score_completions(inputs)
        self.generation_batch = {k: v.clone() for k, v in batch.items() if isinstance(v, torch.Tensor)}
        return batch

    def _compute_loss(self, model, inputs):
        self.micro_batch = {k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)}
        return super()._compute_loss(model, inputs)


@torch.no_grad()
def _perturbed(reference):
    """Move the reference away from the policy (the deviation must be far from 0); return a copy of it."""
    for param in reference.parameters():
        param.add_(0.3 * torch.randn_like(param))
    return copy.deepcopy(reference).eval()


def _prompts_of_several_lengths():
    """Prompts of 5 to 9 words, so that generation left-pads them."""
    from datasets import Dataset

    words = ["what is {a} + 1 ?", "what is the sum of {a} and 1 ?", "solve : {a} + 1 = x , so x ?"]
    prompts = [[{"role": "user", "content": words[a % 3].format(a=a)}] for a in range(8)]
    return Dataset.from_dict({"prompt": prompts})


def _close_batch_statistics(record, logp_BTV, ids_BT, mask):
    """`1 - p_y` and `sum_{v != y} p_v^2` per token and the batch's mean entropy against the full-vocabulary float64
    log-probs."""
    want_mass, want_others_sq = unsampled_statistics(logp_BTV, ids_BT)
    for name, want in ((ROLLOUT_UNSAMPLED_MASS, want_mass), (ROLLOUT_UNSAMPLED_SUM_SQ_PROBS, want_others_sq)):
        torch.testing.assert_close(record[name][mask].double(), want[mask], atol=1e-6, rtol=1e-5)
    mean_entropy = (-(logp_BTV.exp() * logp_BTV).sum(-1))[mask].mean()
    got = record[ROLLOUT_MEAN_ENTROPY][mask].double()
    torch.testing.assert_close(got, torch.full_like(got, mean_entropy.item()), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "temperature,generation_kwargs",
    [
        (1.0, None),
        (0.7, {"top_k": 5, "repetition_penalty": 1.3, "prefill_chunk_size": 4}),
        (1.0, {"use_cache": False}),
    ],
    ids=["t1.0", "t0.7-topk-reppen-prefill", "t1.0-no-kv-cache"],
)
@pytest.mark.parametrize("family", FAMILIES)
def test_statistics_equal_the_models_own_forward(tmp_path, monkeypatch, family, temperature, generation_kwargs):
    from trl_credit.trainer import statistics_sources

    tokenizer = make_tiny_tokenizer()
    model = make_tiny_model(tokenizer, family=family)
    initial = copy.deepcopy(model).eval()
    args = tiny_config(
        "probe_generation+probe_forward",
        tmp_path,
        max_steps=1,
        temperature=temperature,
        generation_kwargs=generation_kwargs,
        max_completion_length=6,
        per_device_train_batch_size=8,
        num_generations=2,
    )
    trainer = tiny_trainer(
        args, BatchKeeper, model=model, tokenizer=tokenizer, train_dataset=_prompts_of_several_lengths()
    )
    # Which models the deviation pass runs a forward of: the policy's hidden states come from `generate`, which
    # records them only when it decodes with a KV cache; without one the policy's backbone runs again.
    forwarded = []
    monkeypatch.setattr(
        statistics_sources,
        "completion_hidden",
        lambda m, *a, **k: forwarded.append(m) or completion_hidden(m, *a, **k),
    )
    reference = trainer.deviation_reference.model
    reference_snapshot = _perturbed(reference)
    RECORDS.clear()
    trainer.train()

    generation, forward = (
        [r for r in RECORDS if r["stage"] == "generation"],
        [r for r in RECORDS if r["stage"] == "forward"],
    )
    assert len(generation) == 1 and len(forward) == 1
    assert any(m is reference for m in forwarded)
    assert any(m is model for m in forwarded) == (generation_kwargs == {"use_cache": False})

    def close(got, want, mask):
        torch.testing.assert_close(got[mask].double(), want[mask], atol=1e-5, rtol=1e-5)

    batch, mask = trainer.generation_batch, generation[0]["mask"]
    assert mask.any() and (batch["prompt_mask"] == 0).any()  # left-padded prompts
    logps, logp_BTV = _naive(initial, batch, temperature)
    _, logq_BTV = _naive(reference_snapshot, batch, temperature)
    deviation = (1 - torch.exp(0.5 * (logp_BTV + logq_BTV)).sum(-1)).clamp(0, 1)
    assert deviation[mask].mean() > 0.01
    close(generation[0][ROLLOUT_LOGPS], logps, mask)
    close(generation[0][ROLLOUT_ENTROPY], -(logp_BTV.exp() * logp_BTV).sum(-1), mask)
    close(generation[0][REFERENCE_DEVIATION], deviation, mask)
    _close_batch_statistics(generation[0], logp_BTV, batch["completion_ids"], mask)
    # The training forward (TRL's fused LM head) of the same, not yet updated, policy, on the shuffled micro-batch.
    micro_batch, mask = trainer.micro_batch, forward[0]["mask"]
    logps, logp_BTV = _naive(initial, micro_batch, temperature)
    close(forward[0][POLICY_LOGPS], logps, mask)
    close(forward[0][POLICY_ENTROPY], -(logp_BTV.exp() * logp_BTV).sum(-1), mask)


@pytest.mark.parametrize("probe", ["probe_rollout", "probe_generation"])
@pytest.mark.parametrize("branch", ["vllm", "off_policy", "on_policy"])
@pytest.mark.parametrize("family", FAMILIES)
def test_statistics_from_trls_scoring_forward_equal_the_models_own_forward(
    tmp_path, monkeypatch, family, branch, probe
):
    """Where TRL runs its old-log-prob forward and no `generate` call samples the batch (a `rollout_func`), the
    rollout statistics come from that forward: equal to the model's own logits, and no second policy forward runs.

    `vllm`: TRL's vLLM branch (importance-sampling correction on), emulated as in `test_engines.py`. `off_policy`:
    `steps_per_generation=2` with one accumulation step, so TRL scores the batch for its off-policy ratio.
    `on_policy`: TRL runs no scoring forward, so the trainer runs the one policy forward itself.
    """
    from trainer_helpers import make_rollout_func, on_vllm_branch

    from trl_credit.trainer import model_parts, statistics_sources

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.16
    tokenizer = make_tiny_tokenizer()
    model = make_tiny_model(tokenizer, family=family)
    initial = copy.deepcopy(model).eval()
    off_policy = {"steps_per_generation": 2} if branch == "off_policy" else {}
    args = tiny_config(
        f"{probe}+probe_forward",
        tmp_path,
        max_steps=1,
        temperature=0.7,
        max_completion_length=6,
        per_device_train_batch_size=8,
        num_generations=2,
        **off_policy,
    )
    trainer = tiny_trainer(
        args,
        BatchKeeper,
        model=model,
        tokenizer=tokenizer,
        train_dataset=_prompts_of_several_lengths(),
        rollout_func=make_rollout_func(vary_lengths=True),
    )
    if branch == "vllm":
        on_vllm_branch(trainer)
    # Spies on every way a policy forward can run: the forwards without a KV cache (TRL's fused LM head, the trainer's
    # `final_hidden`), the trainer's KV-cache forward of the deviation pass, and its calls of TRL's forward.
    no_cache_forwards, hidden_forwards, trl_forwards = [], [], []
    model_parts.backbone(model).register_forward_pre_hook(
        lambda module, args, kwargs: no_cache_forwards.append(1) if kwargs.get("use_cache") is False else None,
        with_kwargs=True,
    )
    monkeypatch.setattr(
        statistics_sources,
        "completion_hidden",
        lambda m, *a, **k: hidden_forwards.append(m) or completion_hidden(m, *a, **k),
    )
    trl_forward = trainer._get_per_token_logps_and_entropies
    monkeypatch.setattr(
        trainer, "_get_per_token_logps_and_entropies", lambda *a, **k: trl_forwards.append(1) or trl_forward(*a, **k)
    )
    reference_snapshot = _perturbed(trainer.deviation_reference.model) if trainer.deviation_reference else None
    RECORDS.clear()
    trainer.train()

    generation = [r for r in RECORDS if r["stage"] == "generation"]
    assert len(generation) == 1
    batch, mask = trainer.generation_batch, generation[0]["mask"]
    scored = branch != "on_policy"
    assert ("old_per_token_logps" in batch) == scored
    num_rows = batch["completion_ids"].size(0)
    assert (batch["prompt_mask"] == 0).any() and (batch["completion_mask"] == 0).any()  # left- and right-padded
    # TRL's scoring forward (one fused call per chunk of 8 rows), or else the trainer's own forward of TRL's, and the
    # one training forward; nothing else. On-policy, the deviation pass also runs the policy's backbone.
    assert len(trl_forwards) == 2
    assert len(no_cache_forwards) == (num_rows // 8 if scored else 1) + 1
    assert any(m is model for m in hidden_forwards) == (not scored and probe == "probe_generation")

    def close(got, want):
        torch.testing.assert_close(got[mask].double(), want[mask], atol=1e-5, rtol=1e-5)

    logps, logp_BTV = _naive(initial, batch, 0.7)
    close(generation[0][ROLLOUT_LOGPS], logps)
    close(generation[0][ROLLOUT_ENTROPY], -(logp_BTV.exp() * logp_BTV).sum(-1))
    if reference_snapshot is not None:
        _, logq_BTV = _naive(reference_snapshot, batch, 0.7)
        deviation = (1 - torch.exp(0.5 * (logp_BTV + logq_BTV)).sum(-1)).clamp(0, 1)
        assert deviation[mask].mean() > 0.01
        close(generation[0][REFERENCE_DEVIATION], deviation)
        _close_batch_statistics(generation[0], logp_BTV, batch["completion_ids"], mask)


@torch.no_grad()
def test_deviation_pass_passes_image_inputs_to_a_vision_language_model():
    """The deviation pass calls the backbone with the batch's image inputs, as TRL's fused forward does."""
    from trl_credit.trainer.lm_head_statistics import hellinger_and_entropy
    from trl_credit.trainer.model_parts import final_hidden, full_lm_head, logit_transform

    policy, reference = make_tiny_vision_language_model(0), make_tiny_vision_language_model(1)
    grid = torch.tensor([[1, 2, 2]])  # one image of 2 x 2 patches -> 4 image tokens
    input_ids = torch.tensor([[9, 6, 5, 5, 5, 5, 7, 10, 11, 12, 13]])
    inputs = dict(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        pixel_values=torch.randn(4, 3 * 2 * 2),
        image_grid_thw=grid,
        mm_token_type_ids=(input_ids == 5).long(),
    )
    hidden, ref_hidden = final_hidden(policy, **inputs)[0], final_hidden(reference, **inputs)[0]
    with full_lm_head(policy) as (weight, bias), full_lm_head(reference) as (ref_weight, ref_bias):
        deviation, entropy = hellinger_and_entropy(
            hidden, ref_hidden, weight, ref_weight, bias, ref_bias, temperature=0.7, transform=logit_transform(policy)
        )
    logp = torch.log_softmax(policy(**inputs).logits[0].double() / 0.7, -1)
    logq = torch.log_softmax(reference(**inputs).logits[0].double() / 0.7, -1)
    torch.testing.assert_close(entropy.double(), -(logp.exp() * logp).sum(-1), atol=1e-5, rtol=1e-5)
    want = (1 - torch.exp(0.5 * (logp + logq)).sum(-1)).clamp(0, 1)
    torch.testing.assert_close(deviation.double(), want, atol=1e-5, rtol=1e-5)
    without_image = final_hidden(
        policy,
        input_ids=input_ids,
        attention_mask=inputs["attention_mask"],
        mm_token_type_ids=inputs["mm_token_type_ids"],
    )[0]
    assert (without_image - hidden).abs().max() > 1e-3  # the image changed the hidden states: not a vacuous check


def test_scoring_forward_is_told_apart_from_trls_peft_reference_forward(tmp_path, monkeypatch):
    """With PEFT and `beta != 0`, TRL's reference forward runs the same module with the adapter disabled, right after
    its old-log-prob forward: the rollout entropies must be the adapted policy's, not the base model's."""
    import peft
    from trainer_helpers import make_rollout_func, on_vllm_branch

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    tokenizer = make_tiny_tokenizer()
    model = make_tiny_model(tokenizer)
    # Random B matrices (not LoRA's zeros), so the adapter changes the distribution from the first step.
    lora = peft.LoraConfig(
        r=4,
        lora_alpha=8,
        target_modules=["q_proj", "v_proj"],
        lora_dropout=0.0,
        task_type="CAUSAL_LM",
        init_lora_weights=False,
    )
    args = tiny_config(
        "probe_rollout+probe_forward",
        tmp_path,
        max_steps=1,
        beta=0.04,
        max_completion_length=6,
        per_device_train_batch_size=8,
        num_generations=2,
    )
    trainer = tiny_trainer(
        args,
        BatchKeeper,
        model=model,
        tokenizer=tokenizer,
        train_dataset=_prompts_of_several_lengths(),
        rollout_func=make_rollout_func(vary_lengths=True),
        peft_config=lora,
    )
    on_vllm_branch(trainer)
    # The initial policy, in a model TRL did not patch (a copy of the patched one would call the original's forward).
    initial = peft.get_peft_model(make_tiny_model(tokenizer), lora)
    initial.load_state_dict(trainer.accelerator.unwrap_model(trainer.model).state_dict())
    initial.eval()
    trl_forwards = []
    trl_forward = trainer._get_per_token_logps_and_entropies
    monkeypatch.setattr(
        trainer, "_get_per_token_logps_and_entropies", lambda *a, **k: trl_forwards.append(1) or trl_forward(*a, **k)
    )
    RECORDS.clear()
    trainer.train()

    generation = [r for r in RECORDS if r["stage"] == "generation"]
    batch, mask = trainer.generation_batch, generation[0]["mask"]
    assert "ref_per_token_logps" in batch and len(trl_forwards) == 3  # old log-probs, reference, training forward
    _, logp_BTV = _naive(initial, batch, 1.0)
    with initial.disable_adapter():
        _, base_logp_BTV = _naive(initial, batch, 1.0)
    entropy, base_entropy = (-(lp.exp() * lp).sum(-1) for lp in (logp_BTV, base_logp_BTV))
    assert (entropy - base_entropy)[mask].abs().max() > 1e-2  # the adapter matters: not a vacuous check
    torch.testing.assert_close(generation[0][ROLLOUT_ENTROPY][mask].double(), entropy[mask], atol=1e-5, rtol=1e-5)


def test_scoring_record_is_used_only_where_it_matches_trls_old_log_probs():
    """`ScoringForward.statistics` returns the calls whose log-probs are exactly `old_per_token_logps`, else None."""
    from types import SimpleNamespace

    from trl_credit.trainer.recorders import ScoringForward

    torch.manual_seed(0)
    record = ScoringForward(keep_hidden=True)

    def forward(rows, fused=True):  # one fused-LM-head call: backbone first, then the model's output
        hidden = torch.randn(rows, 6, 3)
        record.backbone_hook(None, (), SimpleNamespace(last_hidden_state=hidden))
        output = SimpleNamespace(log_probs=torch.randn(rows, 5), entropy=torch.rand(rows, 5))
        record.model_hook(None, (), {"fused_lm_head": fused}, output)
        return output, hidden

    forward(4)  # e.g. TRL's PEFT reference forward, same rows
    forward(4, fused=False)  # e.g. a rollout_func's plain forward: not recorded
    chunks = [forward(2), forward(2)]  # TRL's old-log-prob forward, two row chunks
    old_BT = torch.cat([out.log_probs[:, -4:] for out, _ in chunks])
    entropy_BT, hidden_chunks = record.statistics({"old_per_token_logps": old_BT})
    torch.testing.assert_close(entropy_BT, torch.cat([out.entropy[:, -4:] for out, _ in chunks]), atol=0, rtol=0)
    torch.testing.assert_close(torch.cat(hidden_chunks), torch.cat([h[:, 1:5] for _, h in chunks]), atol=0, rtol=0)
    assert len(record.calls) == 3
    assert record.statistics({}) is None  # TRL ran no scoring forward
    assert record.statistics({"old_per_token_logps": old_BT[:3]}) is None  # rows not covered call by call
    assert record.statistics({"old_per_token_logps": old_BT + 1e-7}) is None  # not TRL's log-probs exactly
