"""The trainer's credit path in seconds: short runs of the tiny model (`tests/conftest.py`) through every stage and
statistics source a training step takes, checked against the plain recomputation of `trainer_helpers.AdvantageRecorder`,
and every cross-process reduction on two thread-backed stand-ins of processes (`conftest.on_threads_as_processes`).

These are in the fast selection of the mutation runs (`[tool.mutmut]` in pyproject.toml, docs/testing.md): a mutant of
a trainer module meets a trainer here. Each case is one the longer trainer files (`test_trainer.py`,
`test_multiprocess.py`, `test_resume.py`, `test_architectures.py`) reach only among many: a sampling temperature with
a reference that moved, two iterations over a batch whose credit moved, evaluation between training batches, each
source of the rollout statistics (`generate`, TRL's old-log-prob forward, its vLLM importance-sampling forward, a
forward of their own), an LM head with a bias or an output transform, image inputs in the deviation pass, activation
checkpointing around the statistics' forward, a STARE gate decided by which tokens its mean counts, a resume, and
TRL 1.15's fused head. The cases that run in milliseconds come first, so that a mutant they kill costs no training
run.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from collections import Counter
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import transformers
import trl
import trl.trainer.utils as trl_utils
from conftest import (
    PACKAGE_METHODS,
    length_reward,
    make_tiny_model,
    make_tiny_tokenizer,
    make_tiny_vision_language_model,
    naive_logprobs,
    on_threads_as_processes,
    sampled,
    tiny_config,
    tiny_prompt_dataset,
    tiny_trainer,
)
from trainer_helpers import (
    AdvantageRecorder,
    engine_rollout,
    frozen_copy,
    make_rollout_func,
    moving_settings,
    on_vllm_branch,
)
from transformers import TrainerCallback
from transformers.modeling_outputs import BaseModelOutput, BaseModelOutputWithPast
from trl import GRPOTrainer

from trl_credit import CreditGRPOConfig, CreditGRPOTrainer
from trl_credit.methods import (
    CREDIT_METHODS,
    GENERATION_STATISTICS,
    POLICY_ENTROPY,
    PREVIOUS_POLICY_DEVIATION,
    REFERENCE_DEVIATION,
    ROLLOUT_ENTROPY,
    ROLLOUT_LOGPS,
    ROLLOUT_MEAN_ENTROPY,
    CreditBatch,
    CreditResult,
    SettingError,
    register_credit_method,
)
from trl_credit.methods.registry import paper
from trl_credit.methods.stack import StackCredit
from trl_credit.reports.token_view import read_token_credit
from trl_credit.trainer import token_credit_log, trl_compat
from trl_credit.trainer.batch_layout import (
    GROUP_INDEX,
    REWARDS,
    SEQUENCE_ADVANTAGES,
    groups_and_rewards,
    loss_weights,
    rows_of,
    sequence_inputs,
    valid_mask,
)
from trl_credit.trainer.credit_trainer import trl_card_attributes
from trl_credit.trainer.diagnostics import credit_metrics, gather_all, unscored_answers
from trl_credit.trainer.recorders import (
    ROLLOUT_DISTRIBUTION,
    GenerationHidden,
    ScoringForward,
    recorded_final_hidden,
    recorded_rollout,
)
from trl_credit.trainer.reference import (
    PREVIOUS_POLICY_FILE,
    DeviationReference,
    copy_initial_model,
    same_mode_as_training_args,
)
from trl_credit.trainer.run_record import RUN_RECORD, NothingToTrain
from trl_credit.trainer.run_safety import NonFiniteGuard
from trl_credit.trainer.statistics_sources import StatisticsSources
from trl_credit.trainer.token_credit_log import token_credit_step
from trl_credit.trainer.token_credit_records import method_statistic_name


def _trainer(method, output_dir, trainer_class=CreditGRPOTrainer, **settings):
    tokenizer = make_tiny_tokenizer()
    rollout_func = settings.pop("rollout_func", None)
    return trainer_class(
        model=make_tiny_model(tokenizer),
        reward_funcs=length_reward,
        args=tiny_config(method, output_dir, **{**moving_settings(method), **settings}),
        train_dataset=tiny_prompt_dataset(),
        eval_dataset=tiny_prompt_dataset(2) if settings.get("eval_strategy") == "steps" else None,
        processing_class=tokenizer,
        **({"rollout_func": rollout_func} if rollout_func else {}),
    )


def _checked_run(monkeypatch, tmp_path, method, **settings):
    """A run of `method` (under the settings that move its credit on the tiny model) whose every consumed advantage
    and loss mask the recorder checked; returns the trainer and the recorder."""
    trainer = _trainer(method, tmp_path / "out", **settings)
    recorder = AdvantageRecorder(monkeypatch, trainer)
    trainer.train()
    return trainer, recorder


def _logged(trainer, metric) -> list[float]:
    return [entry[metric] for entry in trainer.state.log_history if metric in entry]


def _consumed_by_trls_loss(monkeypatch) -> list[dict]:
    """The tensors of each micro-batch as TRL's loss consumed them (copied after it ran), appended as it runs."""
    consumed, original = [], GRPOTrainer._compute_loss

    def compute_loss(self, model, inputs):  # named as TRL's, which the trainer checks
        loss = original(self, model, inputs)
        consumed.append({key: value.detach().clone() for key, value in inputs.items() if torch.is_tensor(value)})
        return loss

    monkeypatch.setattr(GRPOTrainer, "_compute_loss", compute_loss)
    return consumed


def _reads(method: str, statistics) -> bool:
    registered = CREDIT_METHODS[method]
    return bool(set(registered.statistics_for(registered.hyperparameters())) & set(statistics))


TRAINING_FORWARD_METHODS = [
    m for m in PACKAGE_METHODS if CREDIT_METHODS[m].reads_training_forward(CREDIT_METHODS[m].hyperparameters())
]
ROLLOUT_DISTRIBUTION_METHODS = [m for m in PACKAGE_METHODS if _reads(m, ROLLOUT_DISTRIBUTION)]
GENERATION_STATISTICS_METHODS = [m for m in PACKAGE_METHODS if _reads(m, GENERATION_STATISTICS)]


# ------------------------------------------------------------------------------- cross-process reductions


class ThreadAccelerator:
    """The collectives of accelerate's `Accelerator` (`gather`, `reduce`, `pad_across_processes`) for one thread-backed
    process of `on_threads_as_processes`, built on its `gather`. As accelerate's, `gather` needs the same size on
    every process."""

    def __init__(self, rank: int, gather, processes: int = 2):
        self.process_index, self.num_processes, self._gather = rank, processes, gather
        self.device = torch.device("cpu")

    def _sizes(self, tensor) -> list[int]:
        return self._gather(torch.tensor([tensor.size(0)])).long().tolist()

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        sizes = self._sizes(tensor)
        if len(set(sizes)) != 1:
            raise RuntimeError(f"accelerate gathers tensors of one size on every process, got sizes {sizes}")
        return self._gather(tensor).view(-1, *tensor.shape[1:]).to(tensor.dtype)

    def reduce(self, tensor: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
        assert reduction == "sum"
        return self.gather(tensor.unsqueeze(0)).sum(0).to(tensor.dtype)

    def pad_across_processes(self, tensor: torch.Tensor, dim: int = 0) -> torch.Tensor:
        assert dim == 0
        padding = max(self._sizes(tensor)) - tensor.size(0)
        return torch.cat([tensor, tensor.new_zeros(padding, *tensor.shape[1:])])


def _on_processes(run, processes: int = 2):
    return on_threads_as_processes(
        lambda rank, gather: run(rank, ThreadAccelerator(rank, gather, processes)), processes
    )


def _credit(advantages_BT, out_BT, mask_BT, kept_BT):
    """The `StackCredit` of one method, `m`, that turned `advantages_BT` into `out_BT` and kept `kept_BT`, with a
    metric of each kind: a (numerator, denominator) pair, a per-token tensor and an already global number."""
    handed = CreditBatch(advantages_BT, advantages_BT.sum(1), mask_BT)
    result = CreditResult(
        out_BT,
        loss_mask_BT=kept_BT,
        metrics={"pair": (out_BT.gt(0) & mask_BT, mask_BT), "per_token": out_BT * 2, "global": 0.25},
    )
    return StackCredit(handed.followed_by(result), kept_BT, None, (("m", handed, result),))


def test_credit_metrics_over_processes_are_those_of_their_rows_on_one():
    """Three processes: rank 0 with 2 rows, rank 1 with one row without a valid token, rank 2 with the largest
    advantage (so the factor's floor, 1e-3 of the largest |A| of every process, drops some of rank 0's tokens): every
    metric is that of the 4 rows on one process."""
    generator = torch.Generator().manual_seed(0)
    advantages_BT = torch.randn(4, 5, generator=generator)
    advantages_BT[3, 0] = 50.0
    out_BT = advantages_BT * torch.rand(4, 5, generator=generator) * 3
    mask_BT = torch.rand(4, 5, generator=generator) > 0.3
    mask_BT[2] = False
    mask_BT[3, 0] = True
    kept_BT = (torch.rand(4, 5, generator=generator) > 0.5).float()
    rows = [slice(0, 2), slice(2, 3), slice(3, 4)]
    single = ThreadAccelerator(0, lambda values: values.float().flatten(), 1)
    whole = credit_metrics(single, _credit(advantages_BT, out_BT, mask_BT, kept_BT), mask_BT)
    parts = _on_processes(
        lambda rank, accelerator: credit_metrics(
            accelerator,
            _credit(advantages_BT[rows[rank]], out_BT[rows[rank]], mask_BT[rows[rank]], kept_BT[rows[rank]]),
            mask_BT[rows[rank]],
        ),
        processes=3,
    )
    assert parts[0] == parts[1] == parts[2]
    assert parts[0].keys() == whole.keys()
    for name, value in whole.items():
        assert parts[0][name] == pytest.approx(value, rel=1e-6, abs=1e-7), name
    # docs/metrics.md by hand: factors where |A| exceeds 1e-3 of the largest |A| or |Â|; dropped tokens carry 0.
    floor = 1e-3 * torch.maximum(advantages_BT.abs(), out_BT.abs())[mask_BT].max()
    weights = (out_BT / advantages_BT)[mask_BT & (advantages_BT.abs() > floor)]
    assert ((advantages_BT.abs() <= floor) & mask_BT).any()  # the floor drops tokens
    assert whole["m/weight_max"] == pytest.approx(weights.max().item(), rel=1e-6)
    assert whole["m/mean_weight"] == pytest.approx(weights.mean().item(), rel=1e-6)
    assert whole["m/weight_std"] == pytest.approx(weights.std(unbiased=False).item(), rel=1e-4)
    assert whole["m/mean_shift"] == pytest.approx((out_BT - advantages_BT)[mask_BT].mean().item(), rel=1e-6)
    assert whole["credit/adv_abs_mean"] == pytest.approx((out_BT * kept_BT)[mask_BT].abs().mean().item(), rel=1e-6)
    assert whole["m/kept_fraction"] == pytest.approx(kept_BT[mask_BT].mean().item(), rel=1e-6)
    assert whole["m/pair"] == pytest.approx(out_BT[mask_BT].gt(0).float().mean().item(), rel=1e-6)
    assert whole["m/per_token"] == pytest.approx(2 * out_BT[mask_BT].mean().item(), rel=1e-6)
    assert whole["m/global"] == 0.25


def test_the_gathers_sums_and_flags_of_two_processes():
    """`gather_all` (sizes 3 and 0), the unscored-answer counts, the non-finite flags (true on any process) and the
    recorded-source check (true on every process) on two processes."""

    class Counts:
        def __init__(self, counts):
            self.counts = counts

        def snapshot_and_reset(self):
            counts, self.counts = self.counts, Counter()
            return counts

    def run(rank, accelerator):
        sources = StatisticsSources()
        sources.accelerator = accelerator
        guard = NonFiniteGuard(accelerator)
        return (
            gather_all(accelerator, torch.arange(3.0) + 10 if rank == 0 else torch.zeros(0)),
            unscored_answers(
                [Counts(Counter({"rewards/no_answer": 2 + rank, "rewards/timeouts": rank}))], accelerator
            ),
            guard._on_any_process(torch.tensor([rank == 1, False])),
            [sources._on_every_process(found, "cpu") for found in (True, rank == 0)],
        )

    for gathered, unscored, any_flags, every in _on_processes(run):
        assert torch.equal(gathered, torch.tensor([10.0, 11.0, 12.0]))
        assert unscored == {"rewards/no_answer": 5.0, "rewards/timeouts": 1.0}
        assert any_flags == [True, False]
        assert every == [True, False]


def test_groups_and_rewards_of_the_second_process_are_its_rows_of_the_whole_batch():
    batch = {"completion_ids": torch.zeros(4, 3, dtype=torch.long)}
    rewards_N = torch.arange(8.0) * 1.5  # every process's rows, in process order
    keys = groups_and_rewards(batch, rewards_N, process_index=1, num_generations=2)
    assert torch.equal(keys[GROUP_INDEX], torch.tensor([2, 2, 3, 3]))
    assert torch.equal(keys[REWARDS], rewards_N[4:])


def test_the_mean_entropy_of_the_generation_batch_counts_every_valid_token_of_every_process():
    """Two processes with padded rows: the mean is over the valid tokens of both (the padded positions' entropies are
    large, so counting them would move it), from the entropies TRL's scoring forward gave."""
    generator = torch.Generator().manual_seed(1)
    entropy_PBT = torch.rand(2, 2, 4, generator=generator) + torch.tensor([[0.0, 0.0, 0.0, 9.0], [0.0, 0.0, 9.0, 9.0]])
    mask_PBT = torch.tensor([[[1, 1, 1, 0], [1, 1, 0, 0]], [[1, 0, 0, 0], [0, 0, 0, 0]]])
    want = entropy_PBT[mask_PBT.bool()].mean().item()

    def run(rank, accelerator):
        sources = StatisticsSources()
        sources.accelerator = accelerator
        logps_BT = -torch.rand(2, 4, generator=torch.Generator().manual_seed(rank))
        batch = {
            "completion_ids": torch.zeros(2, 4, dtype=torch.long),
            "completion_mask": mask_PBT[rank],
            "old_per_token_logps": logps_BT,
        }
        scoring = ScoringForward(keep_hidden=False)
        scoring.calls = [(logps_BT, entropy_PBT[rank], None)]  # TRL's scoring forward, one call for the two rows
        return sources._generation_batch_statistics(batch, (ROLLOUT_ENTROPY, ROLLOUT_MEAN_ENTROPY), scoring=scoring)

    for rank, statistics in enumerate(_on_processes(run)):
        valid_BT = mask_PBT[rank].bool()
        torch.testing.assert_close(statistics[ROLLOUT_ENTROPY], torch.where(valid_BT, entropy_PBT[rank], 0.0))
        torch.testing.assert_close(statistics[ROLLOUT_MEAN_ENTROPY], torch.where(valid_BT, want, 0.0))


def test_a_generation_batch_without_a_valid_token_on_any_process_has_no_mean_entropy_to_divide():
    """Every completion masked on both processes (`mask_truncated_completions` with every completion truncated): the
    mean over no token is 0 at no position, not a division by zero."""

    def run(rank, accelerator):
        sources = StatisticsSources()
        sources.accelerator = accelerator
        batch = {"completion_ids": torch.zeros(2, 3, dtype=torch.long), "completion_mask": torch.zeros(2, 3)}
        scoring = ScoringForward(keep_hidden=False)
        scoring.calls = [(-torch.rand(2, 3), torch.rand(2, 3), None)]
        batch["old_per_token_logps"] = scoring.calls[0][0]
        return sources._generation_batch_statistics(batch, (ROLLOUT_MEAN_ENTROPY,), scoring=scoring)

    for statistics in _on_processes(run):
        assert list(statistics) == [ROLLOUT_MEAN_ENTROPY]
        assert torch.equal(statistics[ROLLOUT_MEAN_ENTROPY], torch.zeros(2, 3))


@pytest.mark.parametrize(
    "statistics,beta,copied",
    [
        ((), 0.0, False),
        (("reference_deviation",), 0.0, True),
        (("reference_deviation",), 0.1, False),  # TRL keeps its own reference model
        (("previous_policy_deviation",), 0.1, True),
        (("rollout_entropy",), 0.0, False),
    ],
)
def test_the_initial_policy_is_copied_only_for_a_deviation_without_trls_reference(statistics, beta, copied):
    model = make_tiny_model(make_tiny_tokenizer())
    copy = copy_initial_model(model, SimpleNamespace(beta=beta), None, statistics)
    assert (copy is not None) == copied
    if copied:
        assert copy is not model and torch.equal(copy.lm_head.weight, model.lm_head.weight)
    assert copy_initial_model("some/model", SimpleNamespace(beta=0.0), None, ("previous_policy_deviation",)) is None
    # A LoRA run: the initial model is the policy with its adapter disabled, so nothing is copied.
    lora = object()  # any PEFT config: only whether one is given counts
    assert copy_initial_model(model, SimpleNamespace(beta=beta), lora, statistics) is None


def test_a_config_records_its_stack_and_every_hyperparameter_that_trains(tmp_path):
    config = tiny_config("eapo+taco", tmp_path, taco_alpha=0.2)
    assert config.credit_hyperparameters() == {"credit_method": "eapo+taco", **config.credit_kwargs}
    assert config.credit_kwargs["taco_alpha"] == 0.2 and "eapo_kappa" in config.credit_kwargs


def test_training_by_epochs_needs_a_positive_epoch_count(tmp_path):
    assert tiny_config("grpo", tmp_path, max_steps=-1, num_train_epochs=0.5).num_train_epochs == 0.5
    with pytest.raises(ValueError, match=r"num_train_epochs must be > 0 when max_steps is -1, got 0"):
        tiny_config("grpo", tmp_path, max_steps=-1, num_train_epochs=0)


def test_a_paper_record_is_the_title_the_arxiv_id_and_a_bibtex_entry():
    record = paper("A Title", "2601.00001", "doe2026title", "Doe, Jane", 2025)
    assert record == {
        "title": "A Title",
        "id": "2601.00001",
        "citation": "@article{doe2026title,\n    title        = {{A Title}},\n    author       = {Doe, Jane},\n"
        "    year         = 2025,\n    eprint       = {arXiv:2601.00001},\n}",
    }


# ------------------------------------------------------------------------------ what the sources record


def _backbone_output(hidden_BLH, cache=True):
    """A backbone's output as `generate` (with its KV cache) or a scoring forward (without) returns it."""
    return BaseModelOutputWithPast(last_hidden_state=hidden_BLH, past_key_values=object() if cache else None)


def test_generate_s_hidden_states_cover_the_completion_positions_they_scored():
    """A prefill over a prompt of 3 positions, then 2 decoding steps, of 2 rows: the hidden state that scored
    completion token t is the last position of call t (prompt_len - 1 + t), 3 tokens; a forward without a cache is
    not one."""
    generator = torch.Generator().manual_seed(0)
    calls = [torch.randn(2, 3, 4, generator=generator)] + [torch.randn(2, 1, 4, generator=generator) for _ in range(2)]
    record = GenerationHidden()
    for hidden_BLH in calls:
        record(None, (), _backbone_output(hidden_BLH))
    record(None, (), _backbone_output(torch.randn(2, 6, 4), cache=False))  # a scoring forward: not recorded
    batch = {
        "prompt_ids": torch.zeros(2, 3, dtype=torch.long),
        "completion_ids": torch.zeros(2, 4, dtype=torch.long),
        "completion_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]),
    }
    want_BTH = torch.stack([calls[0][:, -1], calls[1][:, 0], calls[2][:, 0], torch.zeros(2, 4)], dim=1)
    torch.testing.assert_close(record.completion_hidden(batch), want_BTH)  # TRL padded one position further
    assert record.completion_hidden({**batch, "completion_mask": torch.ones(2, 4)}) is None  # a token not generated
    assert record.completion_hidden({**batch, "prompt_ids": torch.zeros(2, 2, dtype=torch.long)}) is None
    other_rows = {key: value[:1] for key, value in batch.items()}
    assert record.completion_hidden(other_rows) is None


def test_a_backbone_output_without_a_kv_cache_field_is_not_a_generation_step():
    """An output class with no cache field at all (`BaseModelOutput`, as a model without a KV cache returns) holds
    no cache: the record skips it instead of failing inside `generate`."""
    record = GenerationHidden()
    record(None, (), BaseModelOutput(last_hidden_state=torch.randn(2, 3, 4)))
    assert trl_compat.output_cache(BaseModelOutput(last_hidden_state=torch.randn(2, 3, 4))) is None
    assert record.length == 0 and record.last_hidden == []


@pytest.mark.parametrize(
    "global_step, logging_steps, logging_first_step, want",
    [
        (0, 1, False, 1),  # step 1 is logged and trains on the batch
        (0, 2, False, None),  # the batch serves step 1 alone; step 2's log reports the next batch
        (0, 2, True, 1),  # TRL logs the first step
        (1, 2, False, 2),
        (2, 2, False, 4),  # the batch serves steps 3 and 4 (two iterations): step 4's log reports it
    ],
)
def test_a_generation_batch_is_recorded_under_the_logged_step_it_serves(
    global_step, logging_steps, logging_first_step, want
):
    """Steps 1-based as TRL logs them: a batch generated after `global_step` optimizer steps trains the next
    `steps_per_generation * num_iterations / gradient_accumulation_steps` steps (1 here, 2 in the last case)."""
    args = SimpleNamespace(
        steps_per_generation=2, gradient_accumulation_steps=2, logging_first_step=logging_first_step
    )
    state = SimpleNamespace(global_step=global_step, logging_steps=logging_steps)
    assert token_credit_step(args, state, num_iterations=2 if global_step == 2 else 1) == want


def test_steps_served_are_whole_optimizer_steps():
    """3 micro-batches per generation at 2 per optimizer step serve 1 whole step: step 2's log reports the next batch."""
    args = SimpleNamespace(steps_per_generation=3, gradient_accumulation_steps=2, logging_first_step=False)
    assert token_credit_step(args, SimpleNamespace(global_step=0, logging_steps=2), num_iterations=1) is None


@pytest.mark.parametrize("images, recorded_hidden", [(True, True), (True, False), (False, True)])
def test_the_preview_scores_the_sampled_rows_or_with_images_every_row(images, recorded_hidden):
    """The preview scores only the sampled rows; image inputs are not laid out per row, so with them it scores the
    whole batch (with its images) and keeps the sampled rows' log-probs, entropies and recorded hidden states (None
    when none were). The generation stage's statistic stands where the training-forward stage shows none."""
    batch = {
        "prompt_ids": torch.arange(8).view(4, 2),
        "completion_ids": torch.arange(12).view(4, 3),
        "prompt_mask": torch.ones(4, 2, dtype=torch.long),
        "completion_mask": torch.ones(4, 3, dtype=torch.long),
        "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5]),
        **({"pixel_values": torch.ones(4, 3, 2, 2)} if images else {}),
    }
    rows = [0, 3]  # 2 samples spread over 4 rows
    logps_BT, entropy_BT, hidden_BTH = -torch.rand(4, 3), torch.rand(4, 3), torch.randn(4, 3, 2)
    generation_statistic_BT = torch.rand(4, 3)
    scored, handed = [], {}

    def score(inputs):
        scored.append(inputs)
        scored_rows = slice(None) if images else rows
        hidden = list(hidden_BTH[scored_rows].split(2)) if recorded_hidden else None
        return logps_BT[scored_rows], entropy_BT[scored_rows], hidden

    def credit(sampled, logps_bT, entropy_bT, hidden):
        handed.update(rows=sampled, logps=logps_bT, entropy=entropy_bT, hidden=hidden)
        return CreditResult(sampled["advantages"].unsqueeze(1) * sampled["completion_mask"])

    preview = token_credit_log.preview_token_credit(
        batch, generation_statistic_BT, step=3, samples=2, score=score, credit=credit
    )
    [scored_inputs] = scored
    assert (
        scored_inputs is batch
        if images
        else torch.equal(scored_inputs["completion_ids"], batch["completion_ids"][rows])
    )
    assert torch.equal(handed["rows"]["completion_ids"], batch["completion_ids"][rows])
    assert "pixel_values" not in handed["rows"] and preview.step == 3
    assert torch.equal(handed["logps"], logps_BT[rows]) and torch.equal(preview.entropy_bT, entropy_BT[rows])
    assert torch.equal(preview.statistic_bT, generation_statistic_BT[rows])
    if recorded_hidden:
        [hidden_bTH] = handed["hidden"]
        assert torch.equal(hidden_bTH, hidden_BTH[rows])
    else:
        assert handed["hidden"] is None


def test_with_logging_every_two_steps_the_token_credit_log_records_the_logged_steps_batches(tmp_path):
    """The batch of step 1 is not reported by a log entry (logging_steps=2): nothing is written at step 1's end, and
    step 2's batch is recorded under step 2."""
    trainer = _trainer(
        "grpo", tmp_path / "run", max_steps=2, logging_steps=2, log_token_credit=True, token_credit_samples=2
    )
    trainer.train()
    assert [record["step"] for record in read_token_credit(tmp_path / "run")] == [2, 2]


def test_tide_against_the_previous_policy_is_refused_under_peft_naming_what_works(tmp_path):
    """A copy of the whole policy per generation batch is not made for a LoRA run: the error says where it works."""
    import peft  # a declared test dependency (the `test` extra)

    tokenizer = make_tiny_tokenizer()
    with pytest.raises(ValueError) as error:
        CreditGRPOTrainer(
            model=make_tiny_model(tokenizer),
            reward_funcs=length_reward,
            args=tiny_config("tide", tmp_path / "out", tide_reference="old"),
            train_dataset=tiny_prompt_dataset(),
            processing_class=tokenizer,
            peft_config=peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
        )
    assert str(error.value) == (
        "previous_policy_deviation (tide_reference='old') keeps a full copy of the policy that is refreshed every "
        "generation batch; it is supported without PEFT, DeepSpeed and FSDP. Use tide_reference='ref' there."
    )


@pytest.mark.parametrize("engine_plugin", ["deepspeed_plugin", "fsdp_plugin"])
def test_tide_against_the_previous_policy_is_refused_under_deepspeed_and_fsdp(engine_plugin):
    """The engine is read from accelerate's state as `Trainer` reads it (a plugin set or None), before anything is
    copied. The state is a stand-in with accelerate's two attributes: a real plugin needs processes of its own, and
    `tests/test_multiprocess.py` runs TIDE under each engine there."""
    state = SimpleNamespace(deepspeed_plugin=None, fsdp_plugin=None)
    setattr(state, engine_plugin, object())
    policy = make_tiny_model(make_tiny_tokenizer())
    with pytest.raises(ValueError, match=r"it is supported without PEFT, DeepSpeed and FSDP\."):
        DeviationReference(
            PREVIOUS_POLICY_DEVIATION, policy, frozen_copy(policy), None, SimpleNamespace(state=state), None
        )


@pytest.mark.parametrize("method", GENERATION_STATISTICS_METHODS)
def test_rollout_statistics_read_trls_old_log_prob_forward_without_a_forward_of_their_own(
    monkeypatch, tmp_path, method
):
    """With `num_iterations=2` TRL scores each generation batch once more (its old-log-prob forward), and a rollout
    function like an inference engine's leaves no `generate` to record: the rollout log-probs (AR-Lopti, Clip-Cov)
    are that forward's output, EAPO's entropies are recorded from it, and OTB's other-token mass and TIDE's policy
    side are streamed from the final hidden states recorded with it. That
    forward stays the only no-grad forward of the policy, and `credit/extra_forwards` is 0."""
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.16
    trainer = _trainer(method, tmp_path, max_steps=2, num_iterations=2, rollout_func=engine_rollout)
    scoring_forwards = []

    def count(module, args, kwargs, output):
        if kwargs.get("fused_lm_head") and not torch.is_grad_enabled():
            scoring_forwards.append(1)

    trainer.model.register_forward_hook(count, with_kwargs=True)
    trainer.train()
    logged = [
        entry["credit/extra_forwards"] for entry in trainer.state.log_history if "credit/extra_forwards" in entry
    ]
    assert logged == [0, 0] and len(scoring_forwards) == 1  # one generation batch for both steps


@pytest.mark.parametrize("enabled", [True, False])
def test_the_final_hidden_states_are_kept_only_when_asked(enabled):
    """A `(b, L, H)` tensor per backbone forward is memory a loss forward keeps only for a statistic that reads it."""
    policy = make_tiny_model(make_tiny_tokenizer())
    input_ids = torch.tensor([[7, 8, 9], [9, 8, 7]])
    with torch.no_grad(), recorded_final_hidden(policy, enabled) as hidden:
        policy(input_ids=input_ids)
    if enabled:
        assert len(hidden) == 1 and torch.equal(hidden[0], policy.model(input_ids=input_ids).last_hidden_state)
    else:
        assert hidden == []


def test_a_scoring_record_without_the_hidden_states_it_must_keep_is_not_used():
    """With `keep_hidden`, a call whose log-probs are the batch's but whose backbone output was not recorded gives no
    statistics (the caller then runs a forward of its own); with its hidden states the same call is used."""
    generator = torch.Generator().manual_seed(0)
    logps, entropy, hidden = torch.randn(2, 5, generator=generator), torch.rand(2, 5), torch.randn(2, 5, 3)
    batch = {"old_per_token_logps": logps[:, 1:]}
    record = ScoringForward(keep_hidden=True)
    record.calls = [(logps, entropy, None)]
    assert record.statistics(batch) is None
    record.calls = [(logps, entropy, hidden)]
    entropy_BT, [hidden_BTH] = record.statistics(batch)
    assert torch.equal(entropy_BT, entropy[:, 1:]) and torch.equal(hidden_BTH, hidden[:, 1:])


@pytest.mark.parametrize(
    "statistics,scoring_forward,recorded",
    [((ROLLOUT_ENTROPY,), True, True), ((ROLLOUT_ENTROPY,), False, False), ((ROLLOUT_LOGPS,), True, False)],
)
def test_trls_scoring_forward_is_recorded_where_it_runs_and_a_statistic_reads_the_full_distribution(
    statistics, scoring_forward, recorded
):
    """The sampled tokens' log-probs are TRL's own `old_per_token_logps`: no record of its forward is kept for them."""
    tokenizer = make_tiny_tokenizer()
    policy = make_tiny_model(tokenizer)
    recording = recorded_rollout(
        policy, policy, statistics, one_generate_call=False, scoring_forward=scoring_forward, keep_hidden=False
    )
    with recording as (generation, scoring):
        assert generation is None and (scoring is not None) == recorded


def test_the_scoring_forward_record_is_the_calls_whose_log_probs_trl_returned():
    """Calls recorded in order: another forward's (of 2 rows, whose log-probs are not the batch's), then TRL's
    old-log-prob forward of the batch's 3 rows in two row chunks, then the other forward again (TRL's reference forward
    with PEFT comes after it); the record is the old-log-prob forward's entropies and hidden states, found past the
    calls that do not add up to the batch."""
    generator = torch.Generator().manual_seed(0)
    other = (torch.randn(2, 5, generator=generator), torch.rand(2, 5, generator=generator), torch.randn(2, 5, 2))
    chunks = [(torch.randn(rows, 5, generator=generator), torch.rand(rows, 5, generator=generator)) for rows in (2, 1)]
    hidden = [torch.randn(rows, 5, 2, generator=generator) for rows in (2, 1)]
    record = ScoringForward(keep_hidden=True)
    record.calls = [other, *((logps, entropy, h) for (logps, entropy), h in zip(chunks, hidden)), other]
    old_BT = torch.cat([logps for logps, _ in chunks])[:, 1:]  # TRL keeps the completion's last positions
    entropy_BT, hidden_chunks = record.statistics({"old_per_token_logps": old_BT})
    torch.testing.assert_close(entropy_BT, torch.cat([entropy for _, entropy in chunks])[:, 1:])
    torch.testing.assert_close(torch.cat(hidden_chunks), torch.cat(hidden)[:, 1:])
    # The calls' own states, not a copy of them: the batch's states are held once.
    assert [h.untyped_storage().data_ptr() for h in hidden_chunks] == [h.untyped_storage().data_ptr() for h in hidden]
    assert record.statistics({"old_per_token_logps": old_BT + 1}) is None
    assert record.statistics({}) is None


def test_saved_weights_take_the_mode_of_training_args_and_a_folder_without_it_is_left_alone(tmp_path):
    """safetensors writes through a temporary file (mode 0600); the trainer gives the `.safetensors` files of a saved
    folder the mode of the `training_args.bin` beside them, and changes nothing where that file is absent."""
    saved, other = tmp_path / "saved", tmp_path / "other"
    for folder in (saved, other):
        folder.mkdir()
        for name in ("model.safetensors", PREVIOUS_POLICY_FILE, "notes.txt"):
            (folder / name).write_bytes(b"")
            (folder / name).chmod(0o600)
    (saved / "training_args.bin").write_bytes(b"")
    (saved / "training_args.bin").chmod(0o640)
    same_mode_as_training_args(str(saved))
    same_mode_as_training_args(str(other))
    modes = {path.relative_to(tmp_path).as_posix(): path.stat().st_mode & 0o777 for path in tmp_path.rglob("*")}
    assert modes == {
        "saved": modes["saved"],
        "other": modes["other"],
        "saved/model.safetensors": 0o640,
        f"saved/{PREVIOUS_POLICY_FILE}": 0o640,
        "saved/notes.txt": 0o600,
        "saved/training_args.bin": 0o640,
        "other/model.safetensors": 0o600,
        f"other/{PREVIOUS_POLICY_FILE}": 0o600,
        "other/notes.txt": 0o600,
    }


def test_loss_weights_are_the_completion_mask_times_the_tool_mask():
    batch = {"completion_mask": torch.tensor([[1, 1, 1, 0]]), "tool_mask": torch.tensor([[1.0, 0.0, 0.5, 1.0]])}
    assert torch.equal(loss_weights(batch), torch.tensor([[1.0, 0.0, 0.5, 0.0]]))
    assert torch.equal(valid_mask(batch), torch.tensor([[True, False, True, False]]))
    assert torch.equal(valid_mask({"completion_mask": batch["completion_mask"]}), batch["completion_mask"].bool())
    assert torch.equal(
        loss_weights({"completion_mask": batch["completion_mask"]}), torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    )


def test_rows_of_row_chunks_are_those_rows_of_the_chunks_laid_end_to_end():
    """Every slice of rows, across chunk boundaries or inside one chunk (a view there, no copy), as the same rows of
    the chunks concatenated."""
    chunks = [torch.arange(6.0).view(2, 3), torch.arange(6.0, 9.0).view(1, 3), torch.arange(9.0, 18.0).view(3, 3)]
    whole = torch.cat(chunks)
    for start in range(6):
        for stop in range(start + 1, 7):
            assert torch.equal(rows_of(chunks, slice(start, stop)), whole[start:stop]), (start, stop)
    assert rows_of(chunks, slice(3, 5)).data_ptr() == chunks[2][0].data_ptr()  # inside one chunk: a view
    assert torch.equal(rows_of(chunks, slice(4, 8)), whole[4:6])  # a last chunk of rows past the end, as slicing


def test_the_models_inputs_are_prompt_then_completion_with_the_image_inputs_the_batch_holds():
    batch = {
        "prompt_ids": torch.tensor([[5, 6]]),
        "completion_ids": torch.tensor([[7, 8, 0]]),
        "prompt_mask": torch.tensor([[0, 1]]),
        "completion_mask": torch.tensor([[1, 1, 0]]),
        "pixel_values": torch.ones(1, 3, 4, 4),
        "image_grid_thw": None,  # what TRL leaves for a model without it
    }
    input_ids, attention_mask, multimodal = sequence_inputs(batch)
    assert input_ids.tolist() == [[5, 6, 7, 8, 0]] and attention_mask.tolist() == [[0, 1, 1, 1, 0]]
    assert multimodal.keys() == {"pixel_values"} and multimodal["pixel_values"] is batch["pixel_values"]


def _batch_with_images() -> dict:
    """Four rows of the tiny Qwen2-VL's batch as TRL carries it: each prompt holds one image of 2 x 2 patches (four
    image tokens, id 5, between vision start 6 and end 7), then a completion of up to three tokens."""
    prompt_ids = torch.tensor([[9, 6, 5, 5, 5, 5, 7, 10], [11, 6, 5, 5, 5, 5, 7, 12]]).repeat(2, 1)
    completion_ids = torch.tensor([[13, 14, 15], [16, 17, 2], [18, 19, 20], [21, 2, 0]])
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completion_ids,
        "completion_mask": torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 0]]),
        "pixel_values": torch.randn(16, 3 * 2 * 2, generator=torch.Generator().manual_seed(0)),
        "image_grid_thw": torch.tensor([[1, 2, 2]] * 4),
        "num_images": [1, 1, 1, 1],
        # Which positions hold image tokens, over prompt + completion, as TRL's batch carries it for Qwen2-VL.
        "mm_token_type_ids": (torch.cat([prompt_ids, completion_ids], dim=1) == 5).long(),
    }


def _own_log_probs(model, batch, temperature: float) -> torch.Tensor:
    """`(B, T, V)` float64 log-probabilities of `model`'s own logits at the completion positions of `batch`, with its
    image inputs, at the sampling temperature."""
    images = {key: batch[key] for key in ("pixel_values", "image_grid_thw", "mm_token_type_ids")}
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    scored = slice(batch["prompt_ids"].size(1) - 1, -1)
    logits_BTV = model(input_ids, attention_mask=attention_mask, **images).logits[:, scored]
    return torch.log_softmax(logits_BTV.double() / temperature, -1)


@torch.no_grad()
def test_the_statistics_own_forward_scores_a_batch_with_images_as_the_model_does(tmp_path):
    """Where TRL ran no forward over a generation batch, the statistics take one of their own through TRL's scoring
    forward: with images, the model gets the image inputs, and the log-probs and entropies are those of its own
    logits at the sampling temperature (a trainer of the tiny Qwen2-VL)."""
    policy = make_tiny_vision_language_model(0)
    trainer = tiny_trainer(tiny_config("otb", tmp_path, temperature=0.7), model=policy)
    batch = _batch_with_images()
    logps_BT, entropy_BT = trainer.policy_logps_and_entropy(batch)
    logp_BTV = _own_log_probs(policy, batch, 0.7)
    valid_BT = batch["completion_mask"].bool()
    want_logps_BT = logp_BTV.gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)
    want_entropy_BT = -(logp_BTV.exp() * logp_BTV).sum(-1)
    torch.testing.assert_close(logps_BT[valid_BT].double(), want_logps_BT[valid_BT], atol=1e-4, rtol=0)
    torch.testing.assert_close(entropy_BT[valid_BT].double(), want_entropy_BT[valid_BT], atol=1e-4, rtol=0)


@torch.no_grad()
def test_the_deviation_pass_over_a_batch_with_images_reads_them_in_one_chunk():
    """Four rows (more than completion tokens) with an image each, a forward batch size of one: image inputs are not
    laid out per row, so every row goes through the policy and the reference in one forward with the images, and the
    deviation and entropy equal those of the models' own logits."""
    policy, reference = make_tiny_vision_language_model(0), make_tiny_vision_language_model(1)
    batch = _batch_with_images()
    sources = StatisticsSources()
    sources.model, sources.temperature, sources.forward_counts = policy, 0.7, Counter()
    sources.accelerator = SimpleNamespace(unwrap_model=lambda model: model)
    sources.args = SimpleNamespace(
        per_device_eval_batch_size=1,
        gradient_checkpointing_kwargs=None,
        statistics_token_chunk_size=4,
        statistics_vocab_chunk_size=16,
    )
    sources.deviation_reference = SimpleNamespace(model_and_context=lambda policy: (reference, nullcontext()))
    deviation_BT, entropy_BT = sources._deviation_and_entropy(batch)

    logp_BTV, logq_BTV = (_own_log_probs(model, batch, 0.7) for model in (policy, reference))
    valid_BT = batch["completion_mask"].bool()
    want_deviation_BT = (1 - torch.exp(0.5 * (logp_BTV + logq_BTV)).sum(-1)).clamp(0, 1)
    want_entropy_BT = -(logp_BTV.exp() * logp_BTV).sum(-1)
    torch.testing.assert_close(deviation_BT.double(), torch.where(valid_BT, want_deviation_BT, 0.0), atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy_BT.double(), torch.where(valid_BT, want_entropy_BT, 0.0), atol=1e-5, rtol=0)
    assert want_deviation_BT[valid_BT].min() > 0.01  # distinct models: the comparison is not trivial


def test_trl_1_15s_fused_head_fallback_scores_as_the_models_own_logits(tmp_path):
    """The fallback `torch_fused_head` routes TRL 1.15's fused head through (exercised here on any release): TRL's
    scoring forward inside it gives the log-probs and entropies of the model's own full-vocabulary logits, and, on a
    release whose kernel runs on this CPU (TRL 1.16), what TRL's kernel gives outside it. TRL's kernel is back after."""
    trainer = _trainer("grpo", tmp_path)
    kernel = trl_utils._ChunkedLogProbFunction
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(7, len(trainer.processing_class), (3, 9), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :2] = 0
    halves = {"prompt_ids": input_ids[:, :5], "completion_ids": input_ids[:, 5:]}
    halves |= {"prompt_mask": attention_mask[:, :5], "completion_mask": attention_mask[:, 5:]}
    logp_BTV = naive_logprobs(trainer.model, halves, trainer.temperature)
    naive = (sampled(logp_BTV, halves["completion_ids"]), -(logp_BTV.exp() * logp_BTV).sum(-1))

    def trls_scores():
        return GRPOTrainer._get_per_token_logps_and_entropies(
            trainer, trainer.model, input_ids, attention_mask, 4, compute_entropy=True
        )

    with trl_compat._torch_fused_head():
        assert trl_utils._ChunkedLogProbFunction is trl_compat._FusedHeadFunction
        with trl_compat._torch_fused_head():  # re-entrant
            pass
        assert trl_utils._ChunkedLogProbFunction is trl_compat._FusedHeadFunction
        got = trls_scores()
    assert trl_utils._ChunkedLogProbFunction is kernel
    for value, reference in zip(got[:2], naive):
        torch.testing.assert_close(value, reference, rtol=1e-5, atol=1e-5)
    if not trl_compat.needs_torch_fused_head(trl.__version__):  # TRL's own kernel runs on this CPU
        for value, reference in zip(got[:2], trls_scores()[:2]):
            torch.testing.assert_close(value, reference, rtol=1e-5, atol=1e-5)
    own = trainer._get_per_token_logps_and_entropies(trainer.model, input_ids, attention_mask, 4, compute_entropy=True)
    torch.testing.assert_close(own[0], naive[0], rtol=1e-5, atol=1e-5)  # the trainer's own scoring, on this release


# ------------------------------------------------------------------------------------------------ training runs


@pytest.mark.parametrize("reference", ["ref", "old"])
def test_tide_at_a_sampling_temperature_measures_a_reference_that_moved(monkeypatch, tmp_path, reference):
    """At temperature 0.7 the deviation is between the policy's and the reference's tempered distributions; from the
    second batch on the reference differs from the policy, so TIDE's weights are not flat."""
    trainer, recorder = _checked_run(
        monkeypatch, tmp_path, "tide", temperature=0.7, max_steps=2, tide_reference=reference
    )
    assert recorder.checked_batches == 2
    recorder.assert_credit_moved()
    assert _logged(trainer, "tide/mean_deviation")[1] > 1e-4


@pytest.mark.parametrize("method", TRAINING_FORWARD_METHODS)
def test_two_iterations_over_a_batch_reshape_its_advantages_once(monkeypatch, tmp_path, method):
    """TRL hands the same buffered micro-batch to both iterations: the second must start from GRPO's advantages, not
    from the first iteration's reshaped ones (the trainer works on a shallow copy)."""
    trainer, recorder = _checked_run(monkeypatch, tmp_path, method, num_iterations=2, max_steps=2)
    assert recorder.checked_batches == 2
    recorder.assert_credit_moved()


@pytest.mark.parametrize("reference", ["ref", "old"])
def test_evaluation_between_training_batches_leaves_the_deviation_reference(monkeypatch, tmp_path, reference):
    """An evaluation batch changes no reference: after it, tide_reference='old' still measures the deviation from the
    policy of the previous training batch (the recorder's own copy follows the training batches only)."""
    trainer, recorder = _checked_run(
        monkeypatch, tmp_path, "tide", tide_reference=reference, max_steps=3, eval_strategy="steps", eval_steps=1
    )
    assert len(_logged(trainer, "eval_loss")) == 3
    assert len(_logged(trainer, "eval_tide/mean_deviation")) == 3  # an evaluation's credit metrics are its own
    # ... and so are its forwards: one reference forward for each batch, training's or an evaluation's.
    assert _logged(trainer, "eval_credit/extra_reference_forwards") == [1.0, 1.0, 1.0]
    assert _logged(trainer, "credit/extra_reference_forwards") == [1.0, 1.0, 1.0]
    assert recorder.checked_batches == 3 + 3  # the training batches and the evaluation batches (one each)
    recorder.assert_credit_moved()
    assert min(_logged(trainer, "tide/mean_deviation")[1:]) > 1e-4


def test_an_evaluation_groups_its_completions_by_its_own_generation_count(monkeypatch, tmp_path):
    """`num_generations_eval=2` beside 4 in training: OTB's per-group baselines of an evaluation batch are over
    groups of 2 (the recorder's reference groups them so)."""
    trainer, recorder = _checked_run(
        monkeypatch, tmp_path, "otb", max_steps=1, eval_strategy="steps", eval_steps=1, num_generations_eval=2
    )
    assert trainer.num_generations_eval == 2 and len(_logged(trainer, "eval_loss")) == 1
    assert recorder.checked_batches == 1 + 1
    recorder.assert_credit_moved()


DROPPING_METHODS = [m for m in PACKAGE_METHODS if CREDIT_METHODS[m].drops_tokens]


@pytest.mark.parametrize("method", DROPPING_METHODS)
def test_a_method_dropping_tokens_keeps_the_tokens_the_tool_mask_took_out(monkeypatch, tmp_path, method):
    """A tool mask that takes every completion's second token out of the loss, as TRL's tool loop masks tool output:
    the loss mask TRL consumes is the tool mask times what the method kept, so that token stays out (the recorder's
    reference starts from the completion mask times the tool mask)."""
    generate = GRPOTrainer._generate_and_score_completions

    def generate_with_a_tool_mask(trainer_self, inputs):
        batch = generate(trainer_self, inputs)
        batch["tool_mask"] = torch.ones_like(batch["completion_mask"])
        batch["tool_mask"][:, 1] = 0
        return batch

    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", generate_with_a_tool_mask)
    trainer = _trainer(method, tmp_path / "out", max_steps=2)
    recorder = AdvantageRecorder(monkeypatch, trainer)
    trainer.train()
    assert recorder.checked_batches == 2
    recorder.assert_credit_moved()


def test_clip_cov_reads_trls_clip_range(monkeypatch, tmp_path):
    """Clip-Cov leaves out the tokens TRL's PPO clip already stops: with `epsilon=1e-3` the second iteration's ratios
    pass the clip, so which tokens it may detach is decided by TRL's range, not the default 0.2."""
    trainer, recorder = _checked_run(monkeypatch, tmp_path, "clip_cov", num_iterations=2, max_steps=2, epsilon=1e-3)
    assert (trainer.epsilon_low, trainer.epsilon_high) == (1e-3, 1e-3) and recorder.checked_batches == 2
    recorder.assert_credit_moved()


def test_the_rewards_a_method_reads_are_trls_weighted_sum(monkeypatch, tmp_path):
    """`reward_weights=[0.5]`: OTB's advantages are the raw rewards TRL weighs, minus their baselines."""
    trainer, recorder = _checked_run(monkeypatch, tmp_path, "otb", max_steps=1, reward_weights=[0.5])
    assert trainer.reward_weights.tolist() == [0.5] and recorder.checked_batches == 1
    recorder.assert_credit_moved()


# Where TRL generates in one `generate` call, the hidden states it computed; with two steps per generation TRL runs its
# no-grad old-log-prob forward, whose entropies (and hidden states) are recorded. Three steps there: two generation
# batches (TIDE's reference differs from the policy from the second on; under seed 1 its rewards are not all tied).
SOURCES = {"generate": {"max_steps": 2}, "old_log_prob": {"steps_per_generation": 2, "max_steps": 3, "seed": 1}}


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("method", ROLLOUT_DISTRIBUTION_METHODS)
def test_a_forward_trl_ran_is_the_source_of_the_rollout_statistics(monkeypatch, tmp_path, method, source):
    """The rollout statistics come from what TRL computed anyway, so no policy forward is added, and they equal the
    plain recomputation (the recorder)."""
    trainer, recorder = _checked_run(monkeypatch, tmp_path, method, **SOURCES[source])
    steps = trainer.args.max_steps
    assert recorder.checked_batches == steps
    recorder.assert_credit_moved()
    assert _logged(trainer, "credit/extra_forwards") == [0] * steps


@pytest.mark.parametrize("method", GENERATION_STATISTICS_METHODS)
def test_without_a_forward_trl_ran_the_rollout_statistics_take_one_policy_forward(monkeypatch, tmp_path, method):
    """Completions from an inference engine and one step per generation batch: TRL neither decodes nor scores the
    batch with the policy (no old log-probs either), so the statistics run one no-grad forward of it (whose final
    hidden states give OTB's other-token mass and TIDE's policy side), count it, and equal the plain recomputation
    (the recorder)."""
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.16
    trainer, recorder = _checked_run(
        monkeypatch, tmp_path, method, max_steps=2, rollout_func=make_rollout_func(6, 0.0, True)
    )
    assert recorder.checked_batches == 2
    recorder.assert_credit_moved()
    assert _logged(trainer, "credit/extra_forwards") == [1, 1]
    if _reads(method, (REFERENCE_DEVIATION,)):  # and one of the reference a step
        assert _logged(trainer, "credit/extra_reference_forwards") == [1, 1]


class _BiasedHeadQwen2(transformers.Qwen2ForCausalLM):
    """The tiny model's family with a bias in its LM head (a class of its own, so that a copy has one too)."""

    def __init__(self, config):
        super().__init__(config)
        self.lm_head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=True)


def _model_with_head(tokenizer, head: str):
    """The tiny model with an LM head whose scores are not `W h`: a bias (as Phi's), or a family's output transform."""
    if head != "bias":
        return make_tiny_model(tokenizer, family=head)
    unbiased = make_tiny_model(tokenizer)
    model = _BiasedHeadQwen2(unbiased.config)
    model.load_state_dict(unbiased.state_dict(), strict=False)
    with torch.no_grad():
        model.lm_head.bias.copy_(torch.randn(len(tokenizer), generator=torch.Generator().manual_seed(0)))
    return model


@pytest.mark.parametrize("head", ["bias", "gemma2", "cohere"])  # Gemma-2 softcaps its logits, Cohere scales them
@pytest.mark.parametrize("method", ["otb", "tide"])  # the policy's head alone, and beside the reference's
def test_the_statistics_streamed_through_an_lm_head_score_as_the_model_does(monkeypatch, tmp_path, method, head):
    """The statistics streamed through the policy's LM head, and through the reference's for the deviation, with its
    bias or its family's output transform, equal the plain recomputation from the model's own logits (the
    recorder)."""
    tokenizer = make_tiny_tokenizer()
    args = tiny_config(method, tmp_path / "out", max_steps=2, **moving_settings(method))
    trainer = tiny_trainer(args, model=_model_with_head(tokenizer, head), tokenizer=tokenizer)
    recorder = AdvantageRecorder(monkeypatch, trainer)
    trainer.train()
    assert recorder.checked_batches == 2
    recorder.assert_credit_moved()


def test_each_forward_of_an_optimizer_step_is_counted(monkeypatch, tmp_path):
    """Two generation batches per optimizer step (a generation each accumulation step, no old-log-prob forward):
    the statistics run a forward over each, and `credit/extra_forwards` counts both."""
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.16
    settings = dict(gradient_accumulation_steps=2, steps_per_generation=1, max_steps=1)
    trainer = _trainer("eapo", tmp_path / "out", rollout_func=make_rollout_func(6, 0.0, True), **settings)
    trainer.train()
    assert _logged(trainer, "credit/extra_forwards") == [2]


@pytest.mark.parametrize("method", ROLLOUT_DISTRIBUTION_METHODS)
def test_on_trls_vllm_branch_its_importance_sampling_forward_is_the_source(monkeypatch, tmp_path, method):
    """One step per generation batch, but vLLM's importance-sampling correction on: TRL scores the batch with the
    policy (its old-log-prob forward), and the statistics read that forward instead of running one of their own."""
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.16
    trainer = _trainer(method, tmp_path / "out", max_steps=2, rollout_func=make_rollout_func(6, 0.3, True))
    on_vllm_branch(trainer)
    assert trainer.vllm_importance_sampling_correction and trainer.num_iterations == 1
    recorder = AdvantageRecorder(monkeypatch, trainer)
    trainer.train()
    assert recorder.checked_batches == 2
    recorder.assert_credit_moved()
    assert _logged(trainer, "credit/extra_forwards") == [0, 0]


@pytest.mark.parametrize("method", ["otb", "tide"])  # the policy's forward alone, and beside the reference's
def test_the_statistics_forward_gives_activation_checkpointing_back_with_the_users_settings(
    monkeypatch, tmp_path, method
):
    """The no-grad forward turns activation checkpointing off for its duration; the loss forward after it must
    checkpoint as the user asked (`use_reentrant=True` here; transformers' own default is False)."""
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.16
    checkpointing = {"use_reentrant": True}
    seen = []

    class CheckpointingAtStepEnd(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            functions = [
                m._gradient_checkpointing_func for m in model.modules() if getattr(m, "gradient_checkpointing", 0)
            ]
            seen.append([function.keywords for function in functions] if functions else None)

    trainer = _trainer(
        method,
        tmp_path / "out",
        max_steps=1,
        rollout_func=make_rollout_func(6, 0.0),
        activation_checkpointing=True,
        gradient_checkpointing=True,
        gradient_checkpointing_kwargs=checkpointing,
    )
    trainer.add_callback(CheckpointingAtStepEnd())
    trainer.train()
    assert _logged(trainer, "credit/extra_forwards") == [1]  # the statistics ran their own forward
    layers = trainer.model.config.num_hidden_layers
    assert seen == [[checkpointing] * (layers + 1)]  # each decoder layer and the backbone


def _mean_entropies(monkeypatch, tmp_path, settings) -> tuple[float, float]:
    """The policy's mean entropy over the valid tokens of the run's first generation batch, and over every position."""
    means = []
    original = GRPOTrainer._generate_and_score_completions

    def generate(trainer_self, inputs):
        batch = original(trainer_self, inputs)
        logp_BTV = naive_logprobs(trainer_self.model, batch, trainer_self.temperature, torch.float64)
        entropy_BT = -(logp_BTV.exp() * logp_BTV).sum(-1)
        means.append((entropy_BT[batch["completion_mask"].bool()].mean().item(), entropy_BT.mean().item()))
        return batch

    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", generate)
    _trainer("stare", tmp_path / "probe", **settings).train()
    monkeypatch.undo()
    return means[0]


def test_a_stare_gate_between_the_masked_and_the_unmasked_mean_entropy(monkeypatch, tmp_path):
    """Completions of different lengths (right padding): the gate's target halfway between the mean entropy of the
    valid tokens and that of every position, so only the mean over valid tokens decides the gate as it must."""
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.16
    settings = dict(max_steps=1, stare_target_entropy=100.0)
    masked, unmasked = _mean_entropies(
        monkeypatch, tmp_path, {**settings, "rollout_func": make_rollout_func(6, 0.0, True)}
    )
    assert abs(masked - unmasked) > 0.01  # the padded positions move the mean
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    target = (masked + unmasked) / 2
    trainer, recorder = _checked_run(
        monkeypatch,
        tmp_path,
        "stare",
        rollout_func=make_rollout_func(6, 0.0, True),
        **{**settings, "stare_target_entropy": target},
    )
    assert recorder.checked_batches == 1
    assert _logged(trainer, "stare/gate_on") == [1.0 if masked < target else 0.0]
    assert _logged(trainer, "stare/batch_entropy")[0] == pytest.approx(masked, abs=1e-4)


class _Interrupt(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2:
            raise KeyboardInterrupt


def test_a_resumed_run_records_each_step_once_and_restores_the_previous_policy(tmp_path, caplog):
    """Interrupted after step 2 (logged, not saved), resumed from checkpoint-1: step 2 is recorded once, by the resumed
    run, with the credit the interrupted run gave it (TIDE against the previous policy saved in checkpoint-1)."""
    settings = dict(max_steps=2, save_strategy="steps", save_steps=1, log_token_credit=True, token_credit_samples=2)
    settings.update(tide_reference="old")
    interrupted = _trainer("tide", tmp_path / "run", **settings)
    interrupted.add_callback(_Interrupt())
    with pytest.raises(KeyboardInterrupt):
        interrupted.train()
    before = [r for r in read_token_credit(tmp_path / "run") if r["step"] == 2]
    assert before and any(max(r["weights"]) - min(r["weights"]) > 1e-3 for r in before)  # TIDE moved step 2's credit

    with caplog.at_level("WARNING"):
        _trainer("tide", tmp_path / "run", **settings).train(
            resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-1")
        )
    assert (
        "token_credit.jsonl: dropped 2 records of steps after step 1, written before this run began (by the "
        "interrupted run it resumes, or an earlier run in this output_dir); this run records those steps again"
    ) in caplog.text
    records = read_token_credit(tmp_path / "run")
    assert Counter(r["step"] for r in records) == {1: 2, 2: 2}
    for got, want in zip([r for r in records if r["step"] == 2], before):
        assert got["token_ids"] == want["token_ids"]
        assert got["weights"] == pytest.approx(want["weights"], abs=1e-5)

    # A checkpoint without the previous policy (an older version's) resumes from the resumed policy, and says so.
    checkpoint = tmp_path / "run" / "checkpoint-1"
    (checkpoint / PREVIOUS_POLICY_FILE).unlink()
    caplog.clear()
    with caplog.at_level("WARNING"):
        _trainer("tide", tmp_path / "older", **settings).train(resume_from_checkpoint=str(checkpoint))
    assert (
        f"{checkpoint} has no {PREVIOUS_POLICY_FILE}: the previous-policy reference starts from the resumed policy "
        "instead of the policy of the previous generation batch."
    ) in caplog.text


def test_a_hyperparameter_search_trial_saves_its_checkpoint_in_the_trials_folder(tmp_path):
    """Under `hyperparameter_search`, transformers saves a trial's checkpoints in `output_dir/run-<trial number>`
    (optuna's naming): the run record and the previous policy go into that same checkpoint, beside the model."""
    trainer = _trainer("tide", tmp_path / "search", max_steps=1, tide_reference="old")
    trainer.train()
    trainer.hp_search_backend = transformers.trainer_utils.HPSearchBackend.OPTUNA
    trainer._save_checkpoint(trainer.model, trial=SimpleNamespace(number=3))  # optuna's `Trial` names its number
    saved = {path.name for path in (tmp_path / "search" / "run-3" / "checkpoint-1").iterdir()}
    assert {"model.safetensors", RUN_RECORD, PREVIOUS_POLICY_FILE} <= saved


def test_resume_from_checkpoint_true_resumes_the_last_checkpoint(tmp_path):
    """transformers' `resume_from_checkpoint=True` is the last checkpoint of `output_dir`: a run of 3 steps interrupted
    after step 2 (checkpoint-1 saved) trains steps 2 and 3 again, with the optimizer and schedule it saved; a run
    resumed from its last step has nothing to train, and says which checkpoint that is."""
    settings = dict(max_steps=3, save_strategy="steps", save_steps=1)
    interrupted = _trainer("taco", tmp_path / "run", **settings)
    interrupted.add_callback(_Interrupt())
    with pytest.raises(KeyboardInterrupt):
        interrupted.train()
    resumed, steps = _trainer("taco", tmp_path / "run", **settings), []

    class StepsTrained(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            steps.append(state.global_step)

    resumed.add_callback(StepsTrained())
    resumed.train(resume_from_checkpoint=True)
    assert steps == [2, 3]
    whole = _trainer("taco", tmp_path / "whole", **settings)
    whole.train()
    assert _logged(resumed, "learning_rate")[-2:] == _logged(whole, "learning_rate")[-2:]
    assert _logged(whole, "learning_rate")[0] > _logged(whole, "learning_rate")[-1] > 0  # the schedule decays

    finished = tmp_path / "run" / "checkpoint-3"
    with pytest.raises(NothingToTrain) as refused:
        _trainer("taco", tmp_path / "run", **settings).train(resume_from_checkpoint=True)
    assert str(refused.value) == f"{finished} is at step 3 and the run ends at step 3: nothing to train"


def test_the_token_credit_log_changes_no_logged_credit_metric(tmp_path):
    """The preview credits a few rows of the batch as the training forward will, without logging their metrics: a
    run with the log and the same run without it log the same (the forwards are counted apart)."""
    logged, forwards = [], []
    for log_token_credit in (False, True):
        output_dir = tmp_path / str(log_token_credit)
        trainer = _trainer("taco", output_dir, max_steps=1, log_token_credit=log_token_credit, token_credit_samples=2)
        trainer.train()
        [entry] = [entry for entry in trainer.state.log_history if "loss" in entry]
        logged.append({k: v for k, v in entry.items() if k != "step_time" and "forwards" not in k})
        forwards.append({k: v for k, v in entry.items() if "forwards" in k})
    assert "taco/tail_fraction" in logged[0] and logged[0] == logged[1]
    assert forwards[0] == {"credit/extra_forwards": 0}
    # The preview's two sampled rows take one forward at the training batch size (4).
    assert forwards[1] == {"credit/extra_forwards": 0, "credit/token_credit_log_forwards": 1}


def test_two_stacked_methods_that_drop_tokens_in_the_training_forward_are_named_in_one_warning(tmp_path):
    with pytest.warns(UserWarning) as warned:
        _trainer("tampo+stapo", tmp_path / "out", max_steps=1)
    assert [str(w.message) for w in warned if "normaliser" in str(w.message)] == [
        "credit_method 'tampo+stapo': the tokens that tampo, stapo drop from the loss in the training forward still "
        "count in the normaliser of loss_type='dapo', which TRL counts when the batch is generated. Use "
        "loss_type='bnpo' to reproduce the official per-micro-batch token mean."
    ]


@pytest.mark.parametrize("method", ["grpo", "taco", "eapo"])
def test_the_token_credit_log_records_the_credit_and_statistics_the_loss_read(monkeypatch, tmp_path, method):
    """Every row of a step's batch (token_credit_samples = the batch), as TRL's loss consumed it: each token's weight
    Â / A, the log-prob and entropy of the policy that generated it (float64 from its full logits), and the method's
    token statistic (TACO's tail risk r = -log p - H + log alpha, by its docstring); GRPO and a generation-stage
    method (EAPO) as well as a training-forward one (TACO)."""
    trainer = _trainer(method, tmp_path / "run", max_steps=1, log_token_credit=True, token_credit_samples=4)
    initial = frozen_copy(trainer.model)
    consumed = _consumed_by_trls_loss(monkeypatch)
    trainer.train()
    [batch] = consumed
    mask_BT = batch["completion_mask"].bool()
    sequence_B = batch.get(SEQUENCE_ADVANTAGES, batch["advantages"])
    advantages_BT = batch["advantages"] if batch["advantages"].dim() == 2 else sequence_B.unsqueeze(1) * mask_BT
    logp_BTV = naive_logprobs(initial, batch, trainer.temperature, torch.float64)
    entropy_BT = -(logp_BTV.exp() * logp_BTV).sum(-1)
    logps_BT = logp_BTV.gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)
    records = read_token_credit(tmp_path / "run")
    assert [(r["step"], r["method"]) for r in records] == [(1, method)] * 4
    # The texts as a reader wants them: the user's question without the chat template's special tokens.
    questions = {row["prompt"][-1]["content"] for row in tiny_prompt_dataset()}
    assert all(record["prompt"] in questions for record in records)
    moved = 0
    for record in records:
        i = next(i for i in range(4) if batch["completion_ids"][i][mask_BT[i]].tolist() == record["token_ids"])
        valid = mask_BT[i]
        advantage = sequence_B[i].item()
        assert record["advantage"] == pytest.approx(advantage, abs=1e-6)
        want = (advantages_BT[i][valid] / advantage).tolist() if advantage else [1.0] * int(valid.sum())
        assert record["weights"] == pytest.approx(want, abs=1e-5)
        assert record["logps"] == pytest.approx(logps_BT[i][valid].tolist(), abs=1e-4)
        assert record["entropies"] == pytest.approx(entropy_BT[i][valid].tolist(), abs=1e-4)
        assert record["statistic_name"] == method_statistic_name(method)
        if method == "grpo":
            assert record["statistic"] is None
        else:
            assert len(record["statistic"]) == len(record["tokens"])
        if method == "taco":
            alpha = trainer.args.credit_kwargs["taco_alpha"]
            risk = -logps_BT[i][valid] - entropy_BT[i][valid] + math.log(alpha)
            assert record["statistic"] == pytest.approx(risk.tolist(), abs=1e-4)
        moved += max(want) - min(want) > 1e-3
    assert bool(moved) == (method != "grpo")  # the method moved the credit of some completion
    if method != "grpo":  # the last stage (TACO's is the training forward) logs mean |A| after the whole stack
        [logged] = [entry for entry in trainer.state.log_history if "loss" in entry]
        want = advantages_BT[mask_BT].abs().mean().item()
        assert logged["credit/adv_abs_mean"] == pytest.approx(want, rel=1e-5)


def test_a_stack_over_both_stages_logs_the_mean_credit_once_after_its_last_stage(monkeypatch, tmp_path):
    """EAPO at the generation batch, then TACO in the training forward: `credit/adv_abs_mean` is the mean |A| of the
    advantages TRL's loss consumed, not averaged with what the generation stage left."""
    consumed = _consumed_by_trls_loss(monkeypatch)
    trainer = _trainer("eapo+taco", tmp_path / "run", max_steps=1)
    trainer.train()
    [batch] = consumed
    mask_BT = batch["completion_mask"].bool()
    [logged] = [entry for entry in trainer.state.log_history if "loss" in entry]
    want = batch["advantages"][mask_BT].abs().mean().item()
    assert logged["credit/adv_abs_mean"] == pytest.approx(want, rel=1e-5)
    assert logged["eapo/weight_std"] > 0 and logged["taco/tail_fraction"] > 0  # both stages moved credit


def test_a_generation_stage_method_that_drops_tokens_recounts_trls_normaliser(monkeypatch, tmp_path):
    """A method of the generation batch that returns a loss mask (a user's: it drops each completion's first token):
    its mask reaches TRL's loss as the tool mask, and `num_items_in_batch` (the normaliser of loss_type='dapo', which
    TRL counts at generation) counts only the tokens it kept."""

    @register_credit_method("credit_path_drop_first", drops_tokens=True)
    def drop_first(batch):
        keep_BT = torch.ones(batch.mask_BT.shape)
        keep_BT[:, 0] = 0.0
        return CreditResult(batch.advantages_BT, loss_mask_BT=keep_BT)

    consumed = _consumed_by_trls_loss(monkeypatch)
    _trainer("credit_path_drop_first", tmp_path, max_steps=1, loss_type="dapo").train()
    [batch] = consumed
    want_BT = batch["completion_mask"].float()
    want_BT[:, 0] = 0.0
    torch.testing.assert_close(batch["tool_mask"] * batch["completion_mask"], want_BT)
    assert batch["num_items_in_batch"].item() == want_BT.sum().item()


def test_a_later_stage_reads_the_soft_loss_weights_an_earlier_stage_left(tmp_path):
    """A user's method of the generation batch halves each completion's first token in the loss; a user's method of
    the training forward, stacked after it, reads those weights as its batch's `loss_weights_BT` (Clip-Cov's verl
    `response_mask`), not the bare completion mask."""

    @register_credit_method("credit_path_halve_first", drops_tokens=True)
    def halve_first(batch):
        weights_BT = torch.ones(batch.mask_BT.shape)
        weights_BT[:, 0] = 0.5
        return CreditResult(batch.advantages_BT, loss_mask_BT=weights_BT)

    seen = []

    @register_credit_method("credit_path_reads_weights", statistics=(POLICY_ENTROPY,))
    def reads_weights(batch):
        seen.append((batch.loss_weights_BT.clone(), batch.mask_BT.clone()))
        return batch.advantages_BT

    _trainer("credit_path_halve_first+credit_path_reads_weights", tmp_path, max_steps=1).train()
    assert seen
    for weights_BT, mask_BT in seen:
        want_BT = mask_BT.float()
        want_BT[:, 0] *= 0.5
        torch.testing.assert_close(weights_BT, want_BT, rtol=0, atol=0)


def test_with_a_kl_term_the_deviation_is_measured_from_trls_own_reference_model(tmp_path, tiny_model_dir):
    """`beta != 0`: TRL keeps a reference model, and TIDE reads it (no copy of its own)."""
    tokenizer = make_tiny_tokenizer()
    trainer = tiny_trainer(tiny_config("tide", tmp_path / "out", beta=0.04), model=tiny_model_dir, tokenizer=tokenizer)
    policy = trainer.accelerator.unwrap_model(trainer.model)
    reference, _ = trainer.deviation_reference.model_and_context(policy)
    assert trainer.deviation_reference.model is None and trainer.ref_model is not None
    assert reference is trainer.accelerator.unwrap_model(trainer.ref_model) and reference is not policy


def test_under_a_lora_config_the_deviation_is_measured_from_the_policy_with_its_adapter_disabled(
    monkeypatch, tmp_path
):
    """A `peft_config` handed to the trainer: the initial model is the policy with its adapter off, so the reference
    is the policy itself and no copy of the model is made (at 32B, a copy would not fit beside it)."""
    import peft  # a declared test dependency (the `test` extra)

    from trl_credit.trainer import reference as reference_module

    copied = []

    def deepcopy(model):
        copied.append(type(model).__name__)
        return copy.deepcopy(model)

    monkeypatch.setattr(reference_module, "copy", SimpleNamespace(deepcopy=deepcopy))
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = tiny_trainer(tiny_config("tide", tmp_path / "out"), peft_config=lora)
    policy = trainer.accelerator.unwrap_model(trainer.model)
    reference, _ = trainer.deviation_reference.model_and_context(policy)
    assert reference is policy and copied == []
    tiny_trainer(tiny_config("tide", tmp_path / "full"))  # without LoRA the initial model is copied
    assert copied == ["Qwen2ForCausalLM"]


def test_a_policy_that_arrives_with_a_trained_adapter_is_measured_from_trls_copy_of_it(tmp_path):
    """A PeftModel with a non-zero adapter and `beta != 0`: TRL copies the adapter as "ref", and TIDE's reference is
    the model under that copy (the initial adapter), not the base model with adapters disabled."""
    import peft  # a declared test dependency (the `test` extra)

    tokenizer = make_tiny_tokenizer()
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = peft.get_peft_model(make_tiny_model(tokenizer), lora)
    trainer = CreditGRPOTrainer(
        model=model,
        reward_funcs=length_reward,
        args=tiny_config("tide", tmp_path / "out", beta=0.04),
        train_dataset=tiny_prompt_dataset(),
        processing_class=tokenizer,
    )
    policy = trainer.accelerator.unwrap_model(trainer.model)
    assert "ref" in policy.peft_config
    input_ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        adapted = policy(input_ids=input_ids).logits
        with policy.disable_adapter():
            base = policy(input_ids=input_ids).logits
        reference, context = trainer.deviation_reference.model_and_context(policy)
        with context:
            measured = reference(input_ids=input_ids).logits
    assert not torch.allclose(adapted, base)
    torch.testing.assert_close(measured, adapted)


def test_a_reference_reloaded_by_name_takes_the_policys_dtype_not_the_checkpoints(tmp_path):
    """A bfloat16 checkpoint that TRL loads in float32 here: the weights loaded again for TIDE's reference are float32
    too (transformers alone would load the checkpoint's bfloat16)."""
    tokenizer = make_tiny_tokenizer()
    path = tmp_path / "bf16-model"
    make_tiny_model(tokenizer).to(torch.bfloat16).save_pretrained(path)
    tokenizer.save_pretrained(path)
    trainer = tiny_trainer(tiny_config("tide", tmp_path / "out"), model=str(path), tokenizer=tokenizer)
    policy = trainer.accelerator.unwrap_model(trainer.model)
    reference, _ = trainer.deviation_reference.model_and_context(policy)
    assert policy.dtype == torch.float32 and reference.dtype == torch.float32


def test_a_reference_reloaded_by_name_gets_the_users_model_init_arguments(tmp_path, tiny_model_dir):
    """A `model_init_kwargs` entry that transformers reads into the model's config and that the policy's own
    attributes do not restore: the weights loaded again for TIDE's reference get it, as TRL's policy did."""
    config = tiny_config("tide", tmp_path / "out", model_init_kwargs={"attention_dropout": 0.25})
    trainer = tiny_trainer(config, model=tiny_model_dir, tokenizer=make_tiny_tokenizer())
    policy = trainer.accelerator.unwrap_model(trainer.model)
    reference, _ = trainer.deviation_reference.model_and_context(policy)
    assert reference is not policy
    assert policy.config.attention_dropout == 0.25 and reference.config.attention_dropout == 0.25


REMOTE_CODE = """
from transformers import Qwen2Config, Qwen2ForCausalLM


class RemoteTinyConfig(Qwen2Config):
    model_type = "remote-tiny"


class RemoteTinyForCausalLM(Qwen2ForCausalLM):
    config_class = RemoteTinyConfig
"""


def test_a_reference_reloaded_by_name_trusts_remote_code_as_trl_does(tmp_path):
    """A model whose code ships with its checkpoint (`auto_map`): with `trust_remote_code` TRL loads the policy, and
    TIDE's reference is loaded again from the same code (transformers refuses it without the flag)."""
    tokenizer = make_tiny_tokenizer()
    path = tmp_path / f"remote-tiny-{tmp_path.name}"  # transformers caches the code under the folder's name
    make_tiny_model(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / "modeling_remote_tiny.py").write_text(REMOTE_CODE)
    saved = json.loads((path / "config.json").read_text())
    saved["model_type"], saved["architectures"] = "remote-tiny", ["RemoteTinyForCausalLM"]
    saved["auto_map"] = {
        "AutoConfig": "modeling_remote_tiny.RemoteTinyConfig",
        "AutoModelForCausalLM": "modeling_remote_tiny.RemoteTinyForCausalLM",
    }
    (path / "config.json").write_text(json.dumps(saved))
    config = tiny_config("tide", tmp_path / "out", trust_remote_code=True)
    trainer = tiny_trainer(config, model=str(path), tokenizer=tokenizer)
    policy = trainer.accelerator.unwrap_model(trainer.model)
    reference, _ = trainer.deviation_reference.model_and_context(policy)
    assert type(policy).__name__ == type(reference).__name__ == "RemoteTinyForCausalLM"
    for name, value in policy.state_dict().items():
        assert torch.equal(reference.state_dict()[name], value), name


def test_a_policy_given_by_name_is_measured_against_its_weights_loaded_as_trl_loads_it(
    monkeypatch, tmp_path, tiny_model_dir
):
    """TIDE's reference for a policy given by its path: the initial weights loaded again with TRL's model-init
    arguments (here the eager attention), so the deviation is from the initial policy (the recorder's own copy)."""
    tokenizer = make_tiny_tokenizer()
    settings = dict(max_steps=2, model_init_kwargs={"attn_implementation": "eager"})
    trainer = tiny_trainer(
        tiny_config("tide", tmp_path / "out", **settings), model=tiny_model_dir, tokenizer=tokenizer
    )
    policy = trainer.accelerator.unwrap_model(trainer.model)
    reference = trainer.deviation_reference.model_and_context(policy)[0]
    assert reference is not policy and reference.config._attn_implementation == "eager"
    assert reference.dtype == policy.dtype and not any(p.requires_grad for p in reference.parameters())
    for name, value in policy.state_dict().items():
        assert torch.equal(reference.state_dict()[name], value), name
    recorder = AdvantageRecorder(monkeypatch, trainer)
    trainer.train()
    assert recorder.checked_batches == 2
    recorder.assert_credit_moved()


def test_an_integer_sampling_setting_becomes_the_float_transformers_wants(tmp_path):
    """YAML reads `temperature: 1` as an int; transformers' sampling checks want floats."""
    config = tiny_config("grpo", tmp_path, temperature=1, top_p=1, repetition_penalty=2)
    for name, value in (("temperature", 1.0), ("top_p", 1.0), ("repetition_penalty", 2.0)):
        assert type(getattr(config, name)) is float and getattr(config, name) == value, name


@pytest.mark.parametrize(
    "settings,trls_message",
    [
        ({"auto_find_batch_size": True}, r"auto_find_batch_size is not supported by GRPO, because the generation"),
        (
            {"eval_strategy": "steps", "eval_steps": 1, "per_device_eval_batch_size": 3},
            r"The global eval batch size \(3 \* 1\) must be divisible by the number of generations used for",
        ),
    ],
    ids=["before-the-generation-batch", "after-it-of-whole-groups"],
)
def test_trls_other_refusals_reach_the_user_as_trl_wrote_them(tmp_path, settings, trls_message):
    """The generation-batch message is for a partial group only: TRL's refusals before it derives
    `generation_batch_size`, or after it derived one of whole groups, pass through."""
    with pytest.raises(ValueError, match=f"^{trls_message}"):
        tiny_config("grpo", tmp_path, **settings)


@pytest.mark.parametrize(
    "name", ["statistics_token_chunk_size", "statistics_vocab_chunk_size", "token_credit_samples"]
)
def test_a_chunk_size_or_sample_count_of_one_is_taken_and_zero_refused(tmp_path, name):
    assert getattr(tiny_config("grpo", tmp_path, **{name: 1}), name) == 1
    with pytest.raises(SettingError, match=rf"{name}.* must be an integer >= 1, got 0$"):
        tiny_config("grpo", tmp_path, **{name: 0})


def test_a_config_checked_again_keeps_its_plan_until_its_credit_fields_change(tmp_path):
    """The stack is resolved and planned once: checking the config again (as the trainer does) keeps the plan, and a
    change of `credit_kwargs` plans again with the new value."""
    config = tiny_config("taco", tmp_path)
    plan = config.stage_plan
    config.validate_credit_fields()
    assert config.stage_plan is plan
    config.credit_kwargs = {"taco_alpha": 0.02}
    config.validate_credit_fields()
    assert config.stage_plan is not plan and config.credit_stack[0].hyperparameters["taco_alpha"] == 0.02


def test_a_list_hyperparameter_changed_in_place_is_planned_again(tmp_path):
    """The plan keeps its own copy of what it was made from: a list in `credit_kwargs` edited in place (EAPO's
    quantiles) is a change."""
    config = tiny_config("eapo", tmp_path)
    plan = config.stage_plan
    config.credit_kwargs["eapo_quantiles"][0] = 0.25
    config.validate_credit_fields()
    assert config.stage_plan is not plan and config.credit_stack[0].hyperparameters["eapo_quantiles"] == [0.25, 0.9]


def test_a_config_pickles_without_its_plan_and_plans_again_when_read(tmp_path, credit_method_registry):
    """`training_args.bin` is a pickle: the plan holds the methods' functions, and one registered in a script or a
    function need not pickle, so the plan is left out and made again on first use."""
    import pickle

    @register_credit_method("registered_in_a_function")
    def registered_in_a_function(batch):
        """A function local to a test: pickle cannot name it."""
        return batch.advantages_BT

    config = tiny_config("registered_in_a_function", tmp_path)
    restored = pickle.loads(pickle.dumps(config))
    assert "_stage_plan" not in restored.__dict__
    assert [step.method.name for step in restored.stage_plan.steps] == ["registered_in_a_function"]


def test_a_missing_attribute_of_a_config_is_named(tmp_path):
    """Python's own message for a name that is no field and no method's hyperparameter; a method's hyperparameter
    says where it lives."""
    config = tiny_config("grpo", tmp_path)
    with pytest.raises(AttributeError) as error:
        _ = config.no_such_field
    assert str(error.value) == "'CreditGRPOConfig' object has no attribute 'no_such_field'"
    with pytest.raises(AttributeError) as error:
        _ = config.taco_alpha
    assert str(error.value) == (
        "CreditGRPOConfig has no field 'taco_alpha': a method's hyperparameters are entries of credit_kwargs "
        "(config.credit_kwargs['taco_alpha'])"
    )


@pytest.mark.parametrize(
    "registration,stack,message",
    [
        (
            {"statistics": (PREVIOUS_POLICY_DEVIATION,)},
            "tide+by_a_test",
            "credit_method 'tide+by_a_test' needs two deviation references: "
            "['previous_policy_deviation', 'reference_deviation']",
        ),
        (
            {"estimates_advantages": True},
            "eapo+otb+by_a_test",
            "credit_method 'eapo+otb+by_a_test': otb, by_a_test computes the token advantages from the rewards, "
            "replacing what came before it: it must come first in the stack",
        ),
    ],
    ids=["two-deviation-references", "late-advantage-estimators"],
)
def test_a_stack_only_a_users_method_can_make_impossible_is_refused_naming_why(
    tmp_path, credit_method_registry, registration, stack, message
):
    """TIDE is the package's only deviation reader and OTB its only advantage estimator: a method registered here
    reads the previous policy's deviation beside TIDE's reference, or estimates advantages after OTB."""

    def passes_through(batch):
        """Passes the advantages through."""
        return batch.advantages_BT

    register_credit_method("by_a_test", **registration)(passes_through)
    with pytest.raises(ValueError) as error:
        tiny_config(stack, tmp_path)
    assert str(error.value) == message


def test_a_credit_method_given_as_a_list_is_the_stack_of_its_names(tmp_path):
    """A list from Python or YAML (`credit_method: [taco, tampo]`) is the `+` stack."""
    assert tiny_config(["taco", "tampo"], tmp_path).credit_method == "taco+tampo"


def test_a_method_reading_a_statistic_the_trainer_does_not_compute_is_refused_naming_what_it_does(
    tmp_path, credit_method_registry
):
    """A statistic only a trainer subclass supplies (as the lab's `task_decisive`): the plain trainer refuses the
    method at construction, naming the statistic and listing the ones it computes."""

    @register_credit_method("reads_a_subclass_statistic", statistics=("task_decisive",))
    def reads_a_subclass_statistic(batch):
        return batch.advantages_BT

    supplied = list(CreditGRPOTrainer.supplied_statistics)
    with pytest.raises(ValueError) as refused:
        _trainer("reads_a_subclass_statistic", tmp_path)
    assert str(refused.value) == (
        "credit method 'reads_a_subclass_statistic' reads ['task_decisive'], which CreditGRPOTrainer does not compute "
        f"(it supplies {supplied})"
    )


@pytest.mark.parametrize("given_as", ["name", "model"])
def test_a_trainer_built_without_arguments_takes_its_methods_config_named_as_trls(
    monkeypatch, tmp_path, tiny_model_dir, given_as
):
    """`GRPOTrainer(model, reward_funcs)` builds `GRPOConfig("<model name>-GRPO")`; a single-method trainer builds its
    method's config, named after the method (here one whose defaults suit a CPU: TRL's default bf16 needs a GPU)."""
    from trl_credit import TACOConfig, TACOTrainer

    @dataclasses.dataclass
    class CPUTACOConfig(TACOConfig):
        use_cpu: bool = True
        bf16: bool = False

    class CPUTACOTrainer(TACOTrainer):
        config_class = CPUTACOConfig

    monkeypatch.chdir(tmp_path)
    model = tiny_model_dir if given_as == "name" else transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    trainer = CPUTACOTrainer(
        model, length_reward, train_dataset=tiny_prompt_dataset(), processing_class=make_tiny_tokenizer()
    )
    assert type(trainer.args) is CPUTACOConfig and trainer.args.credit_method == "taco"
    assert trainer.args.output_dir == f"{Path(tiny_model_dir).name}-TACO"


def test_resume_from_checkpoint_false_trains_from_the_start(tmp_path):
    """transformers reads `resume_from_checkpoint=False` as "do not resume": no checkpoint is looked for."""
    trainer = _trainer("taco", tmp_path / "out", max_steps=1)
    trainer.train(resume_from_checkpoint=False)
    assert trainer.state.global_step == 1


def test_a_trainer_pinned_to_a_method_takes_its_card_attributes_from_the_registration():
    """`class T(CreditGRPOTrainer, credit_method="taco")`: TRL's model card names TACO, cites its paper and tags it."""
    taco = CREDIT_METHODS["taco"]

    class PinnedTrainer(CreditGRPOTrainer, credit_method="taco"):
        pass

    assert PinnedTrainer._name == taco.display_name == "TACO"
    assert PinnedTrainer._paper == taco.paper and "taco" in PinnedTrainer._tag_names
    with pytest.raises(ValueError) as refused:
        PinnedTrainer(None, length_reward, tiny_config("eapo", "unused"))  # refused before any model is read
    assert str(refused.value) == (
        "PinnedTrainer trains with credit_method='taco', but args.credit_method is 'eapo'; use CreditGRPOTrainer to "
        "choose the method from the config"
    )


def test_a_stack_of_methods_from_one_paper_is_named_on_trls_card_as_the_stack():
    """TACO with its min-p support share TACO's paper: TRL's card names both and cites that paper once."""
    taco, minp_support = CREDIT_METHODS["taco"], CREDIT_METHODS["minp_support"]
    attributes = trl_card_attributes([taco, minp_support])
    assert attributes["_name"] == "TACO + min-p support" and attributes["_paper"] == taco.paper
    assert attributes["_tag_names"] == ["trl", "grpo", "trl-credit", "taco", "minp_support"]


def test_the_state_dict_transformers_hands_to_save_is_the_one_saved(tmp_path):
    """transformers hands `_save` the weights to write where the module's own are not whole (DeepSpeed ZeRO-3's
    gathered state dict, FSDP's full one): those are what the checkpoint holds."""
    from safetensors.torch import load_file

    trainer = tiny_trainer(tiny_config("taco", tmp_path / "out"))
    gathered = {name: torch.full_like(value, 0.5) for name, value in trainer.model.state_dict().items()}
    trainer._save(str(tmp_path / "saved"), state_dict=gathered)
    saved = load_file(str(tmp_path / "saved" / "model.safetensors"))
    assert saved and all(torch.equal(value, torch.full_like(value, 0.5)) for value in saved.values())
    # ... with the mode of the training_args.bin saved beside them (safetensors alone would leave 0600).
    modes = {path.name: path.stat().st_mode & 0o777 for path in (tmp_path / "saved").iterdir()}
    assert modes["model.safetensors"] == modes["training_args.bin"]


def test_reward_functions_get_trls_completion_ids(tmp_path):
    """A reward function that reads the sampled token ids gets them as TRL hands them: one list of ids a completion."""
    seen = []

    def ids_reward(completions, completion_ids, **kwargs):
        seen.append(completion_ids)
        return [float(len(ids)) for ids in completion_ids]

    tiny_trainer(tiny_config("taco", tmp_path / "out", max_steps=1), reward_funcs=ids_reward).train()
    (ids,) = seen
    assert len(ids) == 4 and all(isinstance(i, int) for row in ids for i in row) and all(ids)


def test_a_hub_token_in_the_config_is_warned_of_as_pickled_into_the_checkpoint(tmp_path):
    with pytest.warns(UserWarning) as caught:
        tiny_trainer(tiny_config("taco", tmp_path / "out", hub_token="hf_not_a_real_token"))
    assert (
        "hub_token is pickled into training_args.bin, which push_to_hub uploads; log in with `hf auth login` or set "
        "HF_TOKEN instead"
    ) in [str(w.message) for w in caught]


def test_a_reward_function_trl_cannot_call_is_refused_before_the_model_loads(tmp_path):
    """TRL calls each reward function with `prompts=`, `completions=`, ... and the data set's columns."""

    def reward_of_completions_only(completions):
        return [0.0] * len(completions)

    with pytest.raises(ValueError, match=r"reward function .*reward_of_completions_only cannot take the arguments"):
        CreditGRPOTrainer("no/such-model", reward_of_completions_only, tiny_config("taco", tmp_path))


def test_a_data_set_given_by_position_is_checked_before_the_model_loads(tmp_path):
    from datasets import Dataset

    questions = Dataset.from_dict({"question": ["what is 1 + 1 ?"]})
    with pytest.raises(ValueError, match=r"^train_dataset has no 'prompt' column, which GRPOTrainer samples"):
        CreditGRPOTrainer("no/such-model", length_reward, tiny_config("taco", tmp_path), questions)


def test_train_hands_transformers_every_argument_so_an_unknown_one_is_refused(tmp_path):
    trainer = _trainer("taco", tmp_path / "out", max_steps=1)
    with pytest.raises(TypeError, match=r"train\(\) got an unexpected keyword argument 'no_such_option'"):
        trainer.train(no_such_option=1)
    # `Trainer.train(resume_from_checkpoint, trial, ignore_keys_for_eval)`: a fourth positional argument is too many.
    with pytest.raises(TypeError, match=r"train\(\) takes from 1 to 4 positional arguments but 5 were given"):
        trainer.train(None, None, None, "one too many")


def test_the_trainer_takes_grpo_trainers_arguments_by_position(tmp_path):
    """`GRPOTrainer(model, reward_funcs, args, train_dataset, eval_dataset, processing_class)`: the same order here."""
    tokenizer, dataset = make_tiny_tokenizer(), tiny_prompt_dataset()
    args = tiny_config("taco", tmp_path)
    trainer = CreditGRPOTrainer(make_tiny_model(tokenizer), length_reward, args, dataset, None, tokenizer)
    assert trainer.train_dataset is dataset and trainer.processing_class is tokenizer


def test_a_generation_batch_of_partial_groups_is_named_in_the_fields_the_user_set():
    """TRL derives `generation_batch_size`; the error names what the user set, and which of them the command line
    must show as given (`mentions`)."""
    with pytest.raises(SettingError) as refused:
        CreditGRPOConfig(
            output_dir="/tmp/u", per_device_train_batch_size=3, num_generations=2, use_cpu=True, report_to=[]
        )
    assert str(refused.value) == (
        "per_device_train_batch_size 3 is not divisible by num_generations 2: a generation batch "
        "(per_device_train_batch_size x gradient_accumulation_steps 1 x 1 processes = 3 completions) must hold whole "
        "groups"
    )
    assert refused.value.name == "per_device_train_batch_size"
    assert refused.value.mentions == ("num_generations", "gradient_accumulation_steps")
