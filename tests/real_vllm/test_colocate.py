"""TACO, EAPO, TIDE, STARE and OTB train with `use_vllm=True, vllm_mode="colocate"` on real vLLM (its CPU build).

At every step: the `(B, T)` advantages TRL's loss receives equal an independent recomputation (the reference formulas
of `tests/reference_formulas.py`) from the batch vLLM generated, with the statistics of the policy as TRL's loss sees
it; TRL's importance-sampling correction is on and its ratio is `exp(old - sampling)` of the policy's log-probs and
vLLM's sampling log-probs; after TRL's weight sync vLLM holds exactly the trainer's weights.
None of the five methods reads vLLM's sampling log-probs: their rollout statistics are the policy's, from TRL's
old-log-prob forward (`trl_credit/trainer/statistics_sources.py`), and that forward runs because the IS correction is on, so
`credit/extra_forwards` is 0 for all five.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_config, tiny_prompt_dataset, train_changing_every_parameter

from real_vllm.helpers import RealVLLMRecorder, text_length_reward, weights_differing_from_vllm
from trl_credit import CreditGRPOTrainer

# Policy forwards the methods add per optimizer step on this path: TRL's IS correction runs the old-log-prob forward
# the methods take their rollout statistics from, and TIDE's reference forward is counted apart.
EXTRA_FORWARDS = {"taco": 0, "eapo": 0, "tide": 0, "stare": 0, "otb": 0}
METHOD_SETTINGS = {"stare": {"stare_target_entropy": 100.0, "stare_variant": "C2"}}  # the gate on: tokens reweighted


def colocated_trainer(method, model_dir, output_dir, **overrides):
    args = tiny_config(
        method,
        output_dir,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=0.1,
        vllm_importance_sampling_mode="token_truncate",
        vllm_importance_sampling_clip_max=2.0,
        max_steps=2,
        **{**METHOD_SETTINGS.get(method, {}), **overrides},
    )
    return CreditGRPOTrainer(
        model=model_dir, reward_funcs=text_length_reward, args=args, train_dataset=tiny_prompt_dataset()
    )


@pytest.mark.parametrize("method", sorted(EXTRA_FORWARDS))
def test_colocate_training_is_exact(monkeypatch, tmp_path, vllm_model_dir, colocated_engines, method):
    trainer = colocated_trainer(method, vllm_model_dir, tmp_path / "out")
    colocated_engines.append(trainer)
    assert trainer.use_vllm and trainer.vllm_importance_sampling_correction
    recorder = RealVLLMRecorder(monkeypatch, trainer)
    train_changing_every_parameter(trainer)

    assert recorder.checked_batches == 2
    # TRL syncs at each generation: vLLM held the initial weights, then the weights after step 1; after step 2, too.
    assert recorder.weight_checks == [[], []]
    trainer.vllm_generation.sync_weights()
    assert weights_differing_from_vllm(trainer) == []

    ratios = torch.cat(recorder.is_ratios)
    sampling = torch.cat(recorder.sampling_logps)
    assert ratios.numel() and torch.isfinite(ratios).all() and (ratios != 1).any()
    assert torch.isfinite(sampling).all() and (sampling < 0).all()
    steps = [entry for entry in trainer.state.log_history if "credit/extra_forwards" in entry]
    assert len(steps) == 2
    assert [entry["credit/extra_forwards"] for entry in steps] == [EXTRA_FORWARDS[method]] * 2
    assert all(math.isfinite(entry["sampling/importance_sampling_ratio/mean"]) for entry in steps)
    print(
        f"\n[real vLLM colocate] {method}: max |consumed - recomputed| = {recorder.max_difference:.2e}, "
        f"vLLM weights equal after every sync: {recorder.weight_checks == [[], []]}, "
        f"credit/extra_forwards = {steps[0]['credit/extra_forwards']}, "
        f"IS ratio in [{ratios.min().item():.6f}, {ratios.max().item():.6f}], "
        f"STARE tie swaps: {getattr(recorder, 'stare_tie_swaps', 0)}"
    )
