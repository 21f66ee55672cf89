"""Every registered method and documented stack trains with `use_vllm=True, vllm_mode="colocate"` on real vLLM (its
CPU build), all trainers of the session generating with one engine (`shared_colocated_engine`).

At every step, the `(B, T)` advantages and the loss mask TRL's loss receives equal the reference rules of
`tests/reference_credit.py` run on statistics recomputed from the model's logits (`RealVLLMRecorder`), at 1e-5; after
TRL's weight sync vLLM holds exactly the trainer's weights; with TRL's importance-sampling correction on, its ratio is
`exp(old - sampling)` of the policy's log-probs and vLLM's sampling log-probs. The methods read the policy's rollout
statistics, never vLLM's sampling log-probs: from TRL's old-log-prob forward where it runs (IS correction on, or
`num_iterations > 1`), else from one extra policy forward per generation batch (`credit/extra_forwards`, derived here
from the statistics each registration declares).

The matrix: every case in three cells, (IS on, `num_iterations=1`, TRL's defaults), (IS on, 2) and (IS off, 1), which
covers IS on and off and `num_iterations` 1 and 2 for every method and stack; TACO adds (IS off, 2).

Why a case cannot fail by chance, nor pass with a method that does nothing:

- Each method of the stack must move credit where it stands: at some token, the stage's reference output without it
  lies outside the comparison's allowance around the output with it (`RealVLLMRecorder.component_shares`), so a
  trainer whose method did nothing there fails the 1e-5 comparison. A stack's components are asserted one by one.
- What they move does not hang on a lucky sample. Each step holds 4 prompts with 4 completions each, rewarded by
  the rank of their tokens among their group's distinct completions (`distinct_in_group_reward`): a group's rewards
  tie only if vLLM sampled one completion 4 times, and a step trains nothing only if that happened in all 4 groups
  (for the tiny model, whose next-token entropy has a median near 1.7 nats, a chance no test run meets). So the
  completions have non-zero advantages of both signs in every group, and the first step moves the policy off its
  reference (TIDE's deviation, the old policy of a second iteration). The settings (`job_settings`) make each method
  move a share of the tokens, not a rare few (the shares are printed per case), so that a case where one moved none
  would take every one of hundreds of tokens falling outside the method's condition.
- Where float32 and the float64 reference may round a token to either side of a method's cut (near-equal statistics,
  rows that share a prefix), the comparison allows it there and only there (`float32_slack`), and such a token does
  not count as moved.
- Sampling is reproducible: a colocated vLLM samples in the trainer's process from torch's generator, which the
  trainer seeds (`seed=0`), so the same case samples the same completions in every run (the digest printed per
  case); server mode seeds each request (test_server.py).
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import make_tiny_tokenizer, tiny_config, tiny_prompt_dataset, train_changing_every_parameter
from trainer_helpers import TRAINING_FORWARD_STATISTICS, path_cases

from real_vllm.helpers import RealVLLMRecorder, distinct_in_group_reward, job_settings, weights_differing_from_vllm
from trl_credit import CreditGRPOTrainer

# (IS correction, num_iterations, steps): the cells every case runs in, and the one only TACO adds.
CELLS = {
    "is-on-one-iteration": (True, 1, 2),  # TRL's defaults
    "is-on-two-iterations": (True, 2, 3),
    "is-off-one-iteration": (False, 1, 2),
}
TACO_CELLS = {"is-off-two-iterations": (False, 2, 3)}


def colocated_trainer(method, model_dir, output_dir, importance_sampling, num_iterations, steps):
    args = tiny_config(
        method,
        output_dir,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=0.1,
        vllm_importance_sampling_correction=importance_sampling,
        vllm_importance_sampling_mode="token_truncate",
        vllm_importance_sampling_clip_max=2.0,
        num_iterations=num_iterations,
        max_steps=steps,
        per_device_train_batch_size=16,  # 4 prompts of 4 completions a step
        **job_settings(method),
    )
    # The tokenizer given, not loaded by TRL from the folder: in this environment the loaded one decoded each token of
    # a completion without the space in front of it, so HICRA's grams matched no whole word and it moved no credit.
    return CreditGRPOTrainer(
        model=model_dir,
        reward_funcs=distinct_in_group_reward,
        args=args,
        train_dataset=tiny_prompt_dataset(),
        processing_class=make_tiny_tokenizer(),
    )


def expected_extra_forwards(trainer) -> int:
    """Policy forwards the stack adds per generation batch: one where a method reads a statistic of the generation
    batch and TRL runs no old-log-prob forward to take it from (IS correction off and `num_iterations=1`)."""
    args = trainer.args
    reads_rollout = any(
        name not in TRAINING_FORWARD_STATISTICS
        for method in [step.method for step in args.credit_stack]
        for name in method.statistics_for(args.method_hyperparameters(method))
    )
    scoring_forward = trainer.vllm_importance_sampling_correction or trainer.num_iterations > 1
    return int(reads_rollout and not scoring_forward)


CASES = [
    pytest.param(case.values[0], cell, id=f"{case.id}-{cell}", marks=case.marks)
    for case in path_cases()
    for cell in CELLS
] + [pytest.param("taco", cell, id=f"taco-{cell}") for cell in TACO_CELLS]


@pytest.mark.parametrize("method,cell", CASES)
def test_colocate_training_is_exact(monkeypatch, tmp_path, vllm_model_dir, shared_colocated_engine, method, cell):
    importance_sampling, num_iterations, steps = {**CELLS, **TACO_CELLS}[cell]
    trainer = colocated_trainer(method, vllm_model_dir, tmp_path / "out", importance_sampling, num_iterations, steps)
    assert trainer.use_vllm and trainer.vllm_importance_sampling_correction == importance_sampling
    recorder = RealVLLMRecorder(monkeypatch, trainer)
    train_changing_every_parameter(trainer)

    assert recorder.checked_batches == steps
    recorder.assert_each_component_moved()
    # TRL syncs at each generation: vLLM held the trainer's weights then (the shared engine the previous trainer's
    # before it); after the last step too.
    generations = -(-steps // num_iterations)
    assert recorder.weight_checks == [[]] * generations
    trainer.vllm_generation.sync_weights()
    assert weights_differing_from_vllm(trainer) == []

    logged = [entry for entry in trainer.state.log_history if "credit/extra_forwards" in entry]
    assert len(logged) == steps
    extra = expected_extra_forwards(trainer)
    generation_steps = range(0, steps, num_iterations)  # the steps that generate count the batch's forwards
    want = [extra if step in generation_steps else 0 for step in range(steps)]
    assert [entry["credit/extra_forwards"] for entry in logged] == want
    ratio = "IS off"
    if importance_sampling:
        ratios, sampling = torch.cat(recorder.is_ratios), torch.cat(recorder.sampling_logps)
        assert ratios.numel() and torch.isfinite(ratios).all() and (ratios != 1).any()
        assert torch.isfinite(sampling).all() and (sampling < 0).all()
        generated = [logged[step] for step in generation_steps]  # TRL logs its ratio at the steps that generate
        assert all(math.isfinite(entry["sampling/importance_sampling_ratio/mean"]) for entry in generated)
        ratio = f"IS ratio in [{ratios.min().item():.4f}, {ratios.max().item():.4f}]"
    print(
        f"\n[real vLLM colocate] {method} {cell}: max |consumed - recomputed| = {recorder.max_difference:.2e}, "
        f"moved share = {recorder.moved_share():.3f}, moved where it stands = {recorder.component_summary()}, "
        f"tie swaps = {recorder.tie_swaps}, credit/extra_forwards = {want}, {ratio}, "
        f"completions {recorder.completions.hexdigest()[:12]}"
    )
