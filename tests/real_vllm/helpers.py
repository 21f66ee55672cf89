"""Checks on TRL's real vLLM path: what the loss received against an independent recomputation from the batch vLLM
generated, TRL's importance-sampling ratio against its definition, and vLLM's weights against the trainer's."""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict

import torch
from reference_credit import reference_stack
from trainer_helpers import AdvantageRecorder, moving_settings

# What the job sets on top of `moving_settings`, so that each method of a stack moves a share of the tokens where it
# stands, not a rare few:
# - TACO's tail at alpha = 1 (p < exp(-H)) and TAMPO's probability cut at 0.05: in the official actor's order
#   (`ar_lopti+taco+tampo+clip_cov`) TAMPO drops the positive tokens with p <= cut, and under `MOVING_SETTINGS` (0.2
#   against TACO's p < 0.5 exp(-H)) those were nearly all the tokens TACO had shrunk;
# - STAPO's entropy cut at the micro-batch's 7/8 quantile instead of 0.6: more of its candidates qualify (alone it
#   moved 3-5 % of the tokens at 0.6, 1 token in 64 with a step of one prompt).
JOB_SETTINGS = {
    "taco": {"taco_alpha": 1.0},
    "tampo": {"tampo_prob_threshold": 0.05},
    "stapo": {"stapo_entropy_quantile": 0.875},
}

# vLLM stacks some of the checkpoint's projections into one parameter, in this order (its `packed_modules_mapping`).
STACKED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def text_length_reward(completions, **kwargs):
    """A reward that varies within groups on vLLM's completions (its detokenizer joins the tiny tokenizer's words
    without spaces, so the main tests' word count is the same for every completion)."""
    return [float(len(c[0]["content"]) % 5) for c in completions]


def job_settings(credit_method: str) -> dict:
    """`moving_settings(credit_method)` with `JOB_SETTINGS` on top."""
    settings = moving_settings(credit_method)
    for name in credit_method.split("+"):
        settings.update(JOB_SETTINGS.get(name, {}))
    return settings


def distinct_in_group_reward(prompts, completion_ids, **kwargs):
    """The rank of the completion's token ids among the distinct completions of its prompt in this call (0, 1, ...).

    On one process TRL scores a whole generation batch in one call, so two completions of a group get the same reward
    only when they are the same tokens: unless vLLM sampled one completion for the whole group, the group's rewards
    differ, every group holds advantages of both signs and the step trains. Equal completions get equal rewards, as a
    real reward gives them (the recorder matches rows by their tokens)."""
    distinct = defaultdict(set)
    for prompt, ids in zip(prompts, completion_ids, strict=True):
        distinct[repr(prompt)].add(tuple(ids))
    ranks = {prompt: {ids: rank for rank, ids in enumerate(sorted(group))} for prompt, group in distinct.items()}
    return [float(ranks[repr(prompt)][tuple(ids)]) for prompt, ids in zip(prompts, completion_ids, strict=True)]


def vllm_model(trainer):
    """The model vLLM generates with, in this process (colocate mode): where TRL's weight sync writes."""
    return trainer.vllm_generation.llm.llm_engine.model_executor.driver_worker.model_runner.model


@torch.no_grad()
def weights_differing_from_vllm(trainer) -> list[str]:
    """Names of vLLM's parameters that are not exactly the trainer's (stacked ones compared part by part)."""
    ours = dict(trainer.accelerator.unwrap_model(trainer.model).named_parameters())
    differing, compared = [], 0
    for name, theirs in vllm_model(trainer).named_parameters():
        compared += 1
        stacked = next((key for key in STACKED if f".{key}." in name), None)
        if stacked is None:
            want = ours[name]
        else:
            want = torch.cat([ours[name.replace(stacked, part)] for part in STACKED[stacked]], dim=0)
        if theirs.dim() == 2 and theirs.shape[0] > want.shape[0] == len(trainer.processing_class):
            theirs = theirs[: want.shape[0]]  # vLLM pads the vocabulary rows of its embedding and LM head
        if theirs.shape != want.shape or not torch.equal(theirs, want.to(theirs.dtype)):
            differing.append(name)
    assert compared >= len(ours) // 2, "vLLM's model has lost its parameters"
    return differing


class RealVLLMRecorder(AdvantageRecorder):
    """[`AdvantageRecorder`] on TRL's real vLLM path, which also keeps, at each generation batch:

    * `weight_checks`: in colocate mode, after TRL's weight sync, the vLLM parameters that differ from the trainer's
      (a list per batch; `[]` means equal);
    * `is_ratios`, `sampling_logps`: with TRL's importance-sampling correction on, its ratios, checked against
      `clamp(exp(old - sampling), max=cap)` with `old` the policy's own log-probs recomputed here, and the rows of
      vLLM's sampling log-probs;
    * `completions`: a digest of every completion vLLM generated, in order (two runs that sampled alike agree);

    and at each stage of the reference stack, for each of its methods, the tokens it moved where it stands
    (`component_shares()`): those where the stage's reference output without that method lies outside the
    comparison's allowance around the output with it (`assert_within`'s `atol + atol |want| + slack`), in an
    advantage or a loss weight. At such a token a trainer whose method did nothing fails the comparison.
    """

    def __init__(self, monkeypatch, trainer, atol=1e-5):
        super().__init__(monkeypatch, trainer, atol)
        self.weight_checks, self.is_ratios, self.sampling_logps = [], [], []
        self.completions = hashlib.sha256()
        self.component_moved, self.component_valid = Counter(), Counter()

    def on_stage(self, stage, handed, expected, slack_BT, slack_weights_BT):
        for name in stage:
            without = reference_stack([other for other in stage if other != name], handed, self.hyperparameters)
            allowance_BT = self.atol + self.atol * expected.advantages_BT.abs() + slack_BT
            moved_BT = (without.advantages_BT - expected.advantages_BT).abs() > allowance_BT
            allowance_BT = self.atol + self.atol * expected.loss_weights_BT.abs() + slack_weights_BT
            moved_BT |= (without.loss_weights_BT - expected.loss_weights_BT).abs() > allowance_BT
            self.component_moved[name] += int((moved_BT & handed.mask_BT).sum())
            self.component_valid[name] += int(handed.mask_BT.sum())

    def component_shares(self) -> dict[str, float]:
        """Each method of the stack: the share of the valid tokens handed to it that it moved where it stands."""
        return {name: self.component_moved[name] / max(self.component_valid[name], 1) for name in self.hyperparameters}

    def component_summary(self) -> str:
        return ", ".join(f"{name} {share:.3f}" for name, share in self.component_shares().items()) or "-"

    def assert_each_component_moved(self):
        """Every method of the stack moved credit where it stands; GRPO, an empty stack, moved none."""
        if not self.trainer.args.credit_stack:
            self.assert_credit_moved()
            return
        unmoved = [name for name, share in self.component_shares().items() if share == 0]
        assert not unmoved, f"{unmoved} moved no credit where they stand in {self.trainer.args.credit_method!r}"

    def on_generation(self, batch, rollout_logps_BT, mask_BT):
        for ids, mask in zip(batch["completion_ids"].tolist(), mask_BT.tolist(), strict=True):
            self.completions.update(repr([i for i, valid in zip(ids, mask, strict=True) if valid]).encode())
        if self.trainer.args.vllm_mode == "colocate":  # a server's weights live in its own process
            self.weight_checks.append(weights_differing_from_vllm(self.trainer))
        if self.trainer.vllm_importance_sampling_correction:
            self._check_importance_sampling(batch, rollout_logps_BT, mask_BT.double())

    def _check_importance_sampling(self, batch, policy_logps, mask):
        """TRL's old log-probs are the policy's; its ratio is `exp(old - sampling)` clamped at the cap (token_truncate)."""
        args = self.trainer.args
        assert args.vllm_importance_sampling_mode == "token_truncate"
        old, sampling = batch["old_per_token_logps"].double(), batch["sampling_per_token_logps"].double()
        torch.testing.assert_close(old * mask, policy_logps * mask, atol=1e-4, rtol=1e-4)
        want = torch.exp((policy_logps - sampling) * mask).clamp(max=args.vllm_importance_sampling_clip_max)
        got = batch["importance_sampling_ratio"].double()
        torch.testing.assert_close(got * mask, want * mask, atol=1e-3, rtol=1e-3)
        self.is_ratios.append(got[mask.bool()])
        self.sampling_logps.append(sampling[mask.bool()])
