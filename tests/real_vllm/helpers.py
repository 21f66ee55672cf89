"""Checks on TRL's real vLLM path: what the loss received against an independent recomputation from the batch vLLM
generated, TRL's importance-sampling ratio against its definition, and vLLM's weights against the trainer's."""

from __future__ import annotations

import torch
from conftest import naive_logprobs, sampled
from reference_formulas import otb_loop, stare_loop
from trainer_helpers import AdvantageRecorder, _inputs, _row_key

from trl_credit import CreditGRPOTrainer

# vLLM stacks some of the checkpoint's projections into one parameter, in this order (its `packed_modules_mapping`).
STACKED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def text_length_reward(completions, **kwargs):
    """A reward that varies within groups on vLLM's completions (its detokenizer joins the tiny tokenizer's words
    without spaces, so the main tests' word count is the same for every completion)."""
    return [float(len(c[0]["content"]) % 5) for c in completions]


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
    """[`AdvantageRecorder`] (TACO, EAPO, TIDE) with STARE and OTB, on TRL's real vLLM path, keeping what it saw:

    * `max_difference`: the largest |advantage TRL's loss consumed - recomputation| over the run;
    * `weight_checks`: at each generation batch, after TRL's weight sync, the vLLM parameters that differ from the
      trainer's (a list per batch; `[]` means equal);
    * `is_ratios`, `sampling_logps_seen`: TRL's importance-sampling ratios, checked against
      `clamp(exp(old - sampling), max=cap)` with `old` the policy's own log-probs recomputed here, and the rows of
      vLLM's sampling log-probs.
    """

    def __init__(self, monkeypatch, trainer):
        super().__init__(monkeypatch, trainer)
        self.max_difference = 0.0
        self.weight_checks, self.is_ratios, self.sampling_logps = [], [], []
        self.batch_entropy = None
        if (
            trainer.args.credit_method == "otb"
        ):  # its rewards and groups are in the batch once the credit trainer is done
            original_generate = CreditGRPOTrainer._generate_and_score_completions

            def generate(trainer_self, inputs):
                batch = original_generate(trainer_self, inputs)
                self._expect_otb(batch)
                return batch

            monkeypatch.setattr(CreditGRPOTrainer, "_generate_and_score_completions", generate)

    @torch.no_grad()
    def _expect_generation(self, batch):
        trainer = self.trainer
        self.weight_checks.append(weights_differing_from_vllm(trainer))
        _, _, mask = _inputs(batch)
        logp_policy = naive_logprobs(trainer.model, batch, trainer.temperature, torch.float64)
        logps = sampled(logp_policy, batch["completion_ids"])
        self._check_importance_sampling(batch, logps, mask)
        method = trainer.args.credit_method
        if method == "otb":
            return  # `_expect_otb`, once the credit trainer has written the rewards
        if method == "stare":
            entropy = -(logp_policy.exp() * logp_policy).sum(-1)
            self.batch_entropy = entropy[mask.bool()].mean().item()
        else:
            super()._expect_generation(batch)

    @torch.no_grad()
    def _expect_otb(self, batch):
        trainer = self.trainer
        _, _, mask = _inputs(batch)
        logp_policy = naive_logprobs(trainer.model, batch, trainer.temperature, torch.float64)
        logps, sum_sq = sampled(logp_policy, batch["completion_ids"]), (2 * logp_policy).exp().sum(-1)
        hp = trainer.args.credit_hyperparameters()
        expected = otb_loop(
            batch["credit_rewards"], batch["credit_group_index"], logps, sum_sq, mask, hp["otb_handle_zero_tail"]
        )
        for i in range(mask.size(0)):
            self.expected[_row_key(batch["prompt_ids"][i], batch["completion_ids"][i])] = expected[i]

    def _expect_stare(self, inputs, consumed, mask):
        """The official rule's advantages (`stare_loop`) on the policy as TRL's loss saw it (no optimizer step has run
        since its forward). The rule ranks tokens by surprisal and takes the top k: tokens of equal surprisal (rows
        that share a prefix) may be taken in either order, so where the two differ both tokens must sit at the k-th
        surprisal of their sign, and the counts of reweighted tokens must agree; those positions take the recorder's
        own choice, counted in `stare_tie_swaps`."""
        trainer = self.trainer
        logps = sampled(naive_logprobs(trainer.model, inputs, trainer.temperature), inputs["completion_ids"]).double()
        hp = trainer.args.credit_hyperparameters()
        sequence = inputs["credit_sequence_advantages"].double()
        want = stare_loop(
            sequence,
            logps,
            mask.bool(),
            self.batch_entropy,
            hp["stare_variant"],
            hp["stare_top_p_ratio"],
            hp["stare_reweight_w"],
            hp["stare_reweight_m"],
            hp["stare_target_entropy"],
        )
        advantages_BT = sequence.unsqueeze(1).expand_as(want) * mask
        reweighted_want = (want - advantages_BT).abs() > 1e-9
        reweighted_got = (consumed - advantages_BT).abs() > 1e-6
        assert reweighted_want.sum() == reweighted_got.sum(), "a different number of tokens was reweighted"
        swapped = reweighted_want != reweighted_got
        surprisal = -logps
        for sign in (1, -1):
            candidates = mask.bool() & (torch.sign(advantages_BT) == sign)
            if not candidates.any():
                continue
            n = int(candidates.sum())
            k = min(max(1, int(n * hp["stare_top_p_ratio"] + 0.999999)), n)
            threshold = surprisal[candidates].sort(descending=True).values[k - 1]
            tied = (surprisal - threshold).abs() <= 1e-5
            assert not (swapped & candidates & ~tied).any(), "a token below the k-th surprisal was reweighted"
        self.stare_tie_swaps = getattr(self, "stare_tie_swaps", 0) + int(swapped.sum()) // 2
        return torch.where(swapped, consumed, want)

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

    @torch.no_grad()
    def _check(self, inputs, expected):
        trainer = self.trainer
        consumed = inputs["advantages"].double()
        _, _, mask = _inputs(inputs)
        method = trainer.args.credit_method
        assert consumed.shape == mask.shape, "TRL's loss received sequence advantages, not (B, T) ones"
        if method == "taco":
            want = expected.double()
        elif method == "stare":
            want = self._expect_stare(inputs, consumed, mask)
        else:
            rows = [_row_key(inputs["prompt_ids"][i], inputs["completion_ids"][i]) for i in range(consumed.size(0))]
            want = torch.stack([self.expected[row].double() for row in rows])
        difference = ((consumed - want) * mask).abs().max().item()
        self.max_difference = max(self.max_difference, difference)
        torch.testing.assert_close(consumed * mask, want * mask, atol=1e-4, rtol=1e-4)
        assert (consumed[mask == 0] == 0).all()
        self.checked_batches += 1
