"""Every registered method and documented stack trains with `use_vllm=True, vllm_mode="colocate"` on real vLLM (its
CPU build), all trainers of the session generating with one engine (`shared_colocated_engine`).

At every step, the `(B, T)` advantages and the loss mask TRL's loss receives equal the reference rules of
`tests/reference_credit.py` run on statistics recomputed from the model's logits (`RealVLLMRecorder`), at 1e-5, in
settings where each method moves credit (asserted); after TRL's weight sync vLLM holds exactly the trainer's weights;
with TRL's importance-sampling correction on, its ratio is `exp(old - sampling)` of the policy's log-probs and vLLM's
sampling log-probs. The methods read the policy's rollout statistics, never vLLM's sampling log-probs: from TRL's
old-log-prob forward where it runs (IS correction on, or `num_iterations > 1`), else from one extra policy forward per
generation batch (`credit/extra_forwards`, derived here from the statistics each registration declares).

The matrix: every case in two cells, (IS on, `num_iterations=2`, 3 steps: two generation batches) and (IS off,
`num_iterations=1`, 2 steps), which covers IS on and off and `num_iterations` 1 and 2 for every method and stack;
the two other cells run for TACO.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import make_tiny_tokenizer, tiny_config, tiny_prompt_dataset, train_changing_every_parameter
from trainer_helpers import TRAINING_FORWARD_STATISTICS, moving_settings, path_cases

from real_vllm.helpers import RealVLLMRecorder, text_length_reward, weights_differing_from_vllm
from trl_credit import CreditGRPOTrainer

# (IS correction, num_iterations, steps): the cells every case runs in, and those only TACO adds.
CELLS = {"is-on-two-iterations": (True, 2, 3), "is-off-one-iteration": (False, 1, 2)}
TACO_CELLS = {"is-on-one-iteration": (True, 1, 2), "is-off-two-iterations": (False, 2, 3)}


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
        **moving_settings(method),
    )
    # The tokenizer given, not loaded by TRL from the folder: in this environment the loaded one decoded each token of
    # a completion without the space in front of it, so HICRA's grams matched no whole word and it moved no credit.
    return CreditGRPOTrainer(
        model=model_dir,
        reward_funcs=text_length_reward,
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
    recorder.assert_credit_moved()
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
        f"moved share = {recorder.moved_share():.3f}, tie swaps = {recorder.tie_swaps}, "
        f"credit/extra_forwards = {want}, {ratio}"
    )
