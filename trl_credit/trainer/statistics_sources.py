"""Where each statistic comes from: TRL's own forward path, once per batch, and what each source costs.

The policy at generation is read, in this order, from TRL's old-log-prob forward where it runs one, from the hidden
states `generate` computed where TRL samples in one call, or else from one no-grad forward of the policy; the
deviations stream the policy's and the reference's final hidden states through both LM heads; `policy_logps` and
`policy_entropy` come from the training forward itself, `policy_logit_gap` from its recorded hidden states. Every
forward a source adds is counted where it runs (`_count_forward`) and logged once per optimizer step. Every process
runs the same forwards and LM-head gathers whatever its masks, so ZeRO-3 and FSDP2 stay in step. See
docs/layout.md ("Where each statistic comes from") for each statistic's source and cost.
"""

from __future__ import annotations

from collections import Counter
from contextlib import nullcontext

import torch
from trl.models.utils import disable_gradient_checkpointing

from ..methods import (
    PREVIOUS_POLICY_DEVIATION,
    REFERENCE_DEVIATION,
    ROLLOUT_ENTROPY,
    ROLLOUT_LOGPS,
    ROLLOUT_MEAN_ENTROPY,
    ROLLOUT_UNSAMPLED,
    ROLLOUT_UNSAMPLED_MASS,
    ROLLOUT_UNSAMPLED_SUM_SQ_PROBS,
)
from .batch_layout import rows_of, sequence_inputs, valid_mask
from .config import StagePlan
from .diagnostics import EXTRA_FORWARDS, EXTRA_REFERENCE_FORWARDS
from .lm_head_statistics import TokenStatistics, hellinger_and_entropy, token_statistics
from .model_parts import completion_hidden, full_lm_head, logit_transform, unsharded_root
from .recorders import recorded_final_hidden, recorded_rollout
from .reference import DeviationReference
from .trl_compat import GENERATION_ATTRIBUTES, runs_scoring_forward

# TRL's own bookkeeping among them: how many images and tiles each row has, never passed to the model.
_ROW_COUNTS = ("num_images", "num_tiles")


def completion_positions(batch, hidden_BLH: torch.Tensor) -> torch.Tensor:
    """`(B, T, H)`: the final hidden states of prompt + completion at the positions that score the completion."""
    prompt_len, completion_len = batch["prompt_ids"].size(1), batch["completion_ids"].size(1)
    # The hidden state at position p predicts token p + 1: completion token t is scored at prompt_len - 1 + t.
    return hidden_BLH[:, prompt_len - 1 : prompt_len - 1 + completion_len]


class StatisticsSources:
    """The statistics sources of `CreditGRPOTrainer`, which inherits them. Of `GRPOTrainer` they read `model`,
    `accelerator`, `args`, `temperature`, `num_iterations`, `use_vllm`, `vllm_importance_sampling_correction`, the
    attributes `GENERATION_ATTRIBUTES` names and `_get_per_token_logps_and_entropies`; of the credit trainer, the
    attributes declared here, which its `__init__` sets."""

    stage_plan: StagePlan  # which statistics the generation stage gathers
    deviation_reference: DeviationReference | None  # the reference model of a deviation statistic
    forward_counts: Counter  # forwards the sources ran since the last optimizer step, by metric name

    def _count_forward(self, counted_as: str = EXTRA_FORWARDS) -> None:
        """Count one forward of a model over a batch (in however many row chunks) under the metric `counted_as`."""
        self.forward_counts[counted_as] += 1

    def _forward_batch_size(self) -> int:
        return self.args.per_device_train_batch_size if self.model.training else self.args.per_device_eval_batch_size

    def _policy(self):
        return self.accelerator.unwrap_model(self.model)

    def _deviation_reference(self, initial_copy) -> DeviationReference | None:
        """The reference model of the stack's deviation statistic, or None when no method reads one; `initial_copy`:
        the policy copied before TRL wrapped it (`reference.copy_initial_model`), if one was taken."""
        deviation = self.stage_plan.deviation
        if deviation is None:
            return None
        return DeviationReference(deviation, self._policy(), initial_copy, self.ref_model, self.accelerator, self.args)

    def _recorded_rollout(self):
        """A context manager yielding the records of TRL's generation of a batch that the generation statistics can
        use (`recorders.recorded_rollout`); `(None, None)` without generation statistics."""
        if not self.stage_plan.generation_statistics:
            return nullcontext((None, None))
        return recorded_rollout(
            self.model,
            self._policy(),
            self.stage_plan.generation_statistics,
            one_generate_call=not any(getattr(self, name) for name in GENERATION_ATTRIBUTES),
            scoring_forward=runs_scoring_forward(
                self.args, self.num_iterations, self.use_vllm, self.vllm_importance_sampling_correction
            ),
            keep_hidden=self.deviation_reference is not None,
        )

    @torch.no_grad()
    def policy_logps_and_entropy(
        self, batch, batch_size: int | None = None, counted_as: str = EXTRA_FORWARDS
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """TRL's own no-grad forward of the policy over `batch`: sampled-token log-probs and entropies, `(B, T)`."""
        self._count_forward(counted_as)
        input_ids, attention_mask, multimodal = sequence_inputs(batch)
        with disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            logps_BT, entropy_BT, _ = self._get_per_token_logps_and_entropies(
                self.model,
                input_ids,
                attention_mask,
                batch["completion_ids"].size(1),
                batch_size=batch_size,
                compute_entropy=True,
                **multimodal,
            )
        return logps_BT.float(), entropy_BT.float()

    def _on_every_process(self, found: bool, device) -> bool:
        """Whether `found` holds on every process: the sources' forwards and head gathers are collective under ZeRO-3
        and FSDP2, so every process must take the same path."""
        return bool(self.accelerator.gather(torch.tensor([found], device=device)).all())

    @torch.no_grad()
    def _policy_logit_gap(self, batch, hidden_BLH: torch.Tensor) -> torch.Tensor:
        """`(B, T)` sampled token's logit minus the policy's largest logit at each completion position, zero where
        masked, from the final hidden states `hidden_BLH` of prompt + completion."""
        return self._streamed_policy_statistics(batch, [completion_positions(batch, hidden_BLH)]).logit_gap

    @torch.no_grad()
    def _streamed_policy_statistics(self, batch, hidden_chunks: list[torch.Tensor]) -> TokenStatistics:
        """The policy's sampled-token log-probs, entropies, logit gaps to the largest logit and the other tokens'
        probability mass and sum of squares, `(B, T)` each, zero where masked, from its final hidden states at the
        completion positions (`(b, T, H)` row chunks, `batch_layout.rows_of`): the LM head streamed over the valid
        tokens with the model's output transform and the sampling temperature, as TRL's forward scores them."""
        policy = self._policy()
        valid_BT = valid_mask(batch)
        statistics_BT = TokenStatistics(
            *(torch.zeros(valid_BT.shape, device=valid_BT.device) for _ in TokenStatistics._fields)
        )
        step = self._forward_batch_size()
        # Only the head: the hidden states are given, so under FSDP2 the root's embeddings stay sharded.
        with full_lm_head(policy) as (weight_VH, bias_V):
            # The valid tokens' hidden states are copied a row chunk at a time: for a whole generation batch of long
            # completions, one copy would be as large as the recorded states themselves.
            for start in range(0, valid_BT.size(0), step):
                rows = slice(start, start + step)
                rows_valid_bT = valid_BT[rows]
                streamed_n = token_statistics(
                    rows_of(hidden_chunks, rows)[rows_valid_bT],
                    weight_VH,
                    batch["completion_ids"][rows][rows_valid_bT],
                    bias_V,
                    temperature=self.temperature,
                    token_chunk_size=self.args.statistics_token_chunk_size,
                    vocab_chunk_size=self.args.statistics_vocab_chunk_size,
                    transform=logit_transform(policy),
                )
                for values_BT, values_n in zip(statistics_BT, streamed_n):
                    values_BT[rows][rows_valid_bT] = values_n
        return statistics_BT

    def _recorded_policy_hidden(self, batch, generation, scoring):
        """`(entropy_BT or None, hidden states or None)` from the records of TRL's generation of `batch`: TRL's
        scoring forward first, else `generate`'s hidden states; a record counts only where every process has one. The
        hidden states are `(b, T, H)` row chunks (`batch_layout.rows_of`)."""
        device = batch["completion_ids"].device
        if scoring is not None:
            scored = scoring.statistics(batch)
            if self._on_every_process(scored is not None, device):
                return scored
        if generation is not None:
            hidden_BTH = generation.completion_hidden(batch)
            if self._on_every_process(hidden_BTH is not None, device):
                return None, [hidden_BTH]
        return None, None

    def _generation_batch_statistics(self, batch, names, generation=None, scoring=None) -> dict[str, torch.Tensor]:
        """The requested generation-batch statistics, `(B, T)` float32 each, zero at masked positions.

        `scoring`: the `ScoringForward` recorded while TRL generated and scored `batch`, if any; `generation`: the
        `GenerationHidden` recorded while TRL generated it, if any. Recorded or not on every process alike: both
        follow the config.
        """
        scored_entropy_BT, policy_hidden = self._recorded_policy_hidden(batch, generation, scoring)
        statistics = {}
        deviation = next((name for name in names if name in (REFERENCE_DEVIATION, PREVIOUS_POLICY_DEVIATION)), None)
        if deviation is not None:  # at most one reference per run; the same pass gives the policy's entropy
            statistics[deviation], statistics[ROLLOUT_ENTROPY] = self._deviation_and_entropy(batch, policy_hidden)
        if ROLLOUT_LOGPS in names and "old_per_token_logps" in batch:
            statistics[ROLLOUT_LOGPS] = batch["old_per_token_logps"].float()  # TRL's own old-log-prob forward
        # The batch's mean entropy is taken from the per-token entropies.
        needed = {*names, ROLLOUT_ENTROPY} if ROLLOUT_MEAN_ENTROPY in names else set(names)
        if ROLLOUT_ENTROPY in needed and scored_entropy_BT is not None:
            statistics.setdefault(ROLLOUT_ENTROPY, scored_entropy_BT)
        streamed_names = (ROLLOUT_LOGPS, ROLLOUT_ENTROPY, *ROLLOUT_UNSAMPLED)
        if any(n in needed and n not in statistics for n in streamed_names):
            if policy_hidden is None:
                # The other tokens' mass and squares are streamed from the final hidden states of TRL's forward,
                # recorded as it runs.
                with recorded_final_hidden(self._policy(), any(n in needed for n in ROLLOUT_UNSAMPLED)) as hidden:
                    logps_BT, entropy_BT = self.policy_logps_and_entropy(batch, self._forward_batch_size())
                statistics.setdefault(ROLLOUT_LOGPS, logps_BT)
                statistics.setdefault(ROLLOUT_ENTROPY, entropy_BT)
                if hidden:
                    policy_hidden = [completion_positions(batch, hidden_bLH) for hidden_bLH in hidden]
            if policy_hidden is not None:
                streamed = self._streamed_policy_statistics(batch, policy_hidden)
                statistics.setdefault(ROLLOUT_LOGPS, streamed.logps)
                statistics.setdefault(ROLLOUT_ENTROPY, streamed.entropy)
                statistics.setdefault(ROLLOUT_UNSAMPLED_MASS, streamed.unsampled_mass)
                statistics.setdefault(ROLLOUT_UNSAMPLED_SUM_SQ_PROBS, streamed.unsampled_sum_sq_probs)
        mask_BT = valid_mask(batch)
        if ROLLOUT_MEAN_ENTROPY in names:  # over every valid token of every process (a collective)
            entropy_BT = statistics[ROLLOUT_ENTROPY]
            totals = torch.stack([torch.where(mask_BT, entropy_BT, 0.0).sum(), mask_BT.sum().float()])
            total, count = self.accelerator.reduce(totals, reduction="sum").tolist()
            statistics[ROLLOUT_MEAN_ENTROPY] = torch.full_like(entropy_BT, total / count if count else 0.0)
        return {name: torch.where(mask_BT, statistics[name], 0.0) for name in names}

    @torch.no_grad()
    def _deviation_and_entropy(self, batch, policy_hidden=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token squared Hellinger distance from `deviation_reference` and policy entropy, `(B, T)` each.

        `policy_hidden`: the policy's final hidden states at the completion positions (`(b, T, H)` row chunks,
        `batch_layout.rows_of`), when TRL's scoring forward or generation recorded them; otherwise the policy's
        backbone runs here.
        """
        policy = self._policy()
        reference_model, reference_context = self.deviation_reference.model_and_context(policy)
        multimodal = {key: value for key, value in sequence_inputs(batch)[2].items() if key not in _ROW_COUNTS}
        valid_BT = valid_mask(batch)
        deviation_BT = torch.zeros(valid_BT.shape, device=valid_BT.device)
        entropy_BT = torch.zeros(valid_BT.shape, device=valid_BT.device)
        # Image inputs are not laid out per row (TRL slices them by image counts), so they go in one chunk.
        step = valid_BT.size(0) if multimodal else self._forward_batch_size()
        self._count_forward(EXTRA_REFERENCE_FORWARDS)
        if policy_hidden is None:
            self._count_forward(EXTRA_FORWARDS)
        with (
            disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs),
            unsharded_root(policy),
            unsharded_root(reference_model) if reference_model is not policy else nullcontext(),
        ):
            # Every chunk runs on every process, even one without a valid token: the forwards and head gathers are
            # collective under ZeRO-3 and FSDP2.
            for start in range(0, valid_BT.size(0), step):
                rows = slice(start, start + step)
                chunk = [
                    batch[key][rows] for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")
                ]
                rows_valid_bT = valid_BT[rows]
                if policy_hidden is None:
                    hidden_nH = completion_hidden(policy, *chunk, **multimodal)[rows_valid_bT]
                else:
                    hidden_nH = rows_of(policy_hidden, rows)[rows_valid_bT]
                with reference_context:
                    ref_hidden_nH = completion_hidden(reference_model, *chunk, **multimodal)[rows_valid_bT]
                deviation_BT[rows][rows_valid_bT], entropy_BT[rows][rows_valid_bT] = self._hellinger_and_entropy(
                    policy, reference_model, hidden_nH, ref_hidden_nH
                )
        return deviation_BT, entropy_BT

    def _hellinger_and_entropy(self, policy, reference_model, hidden_nH, ref_hidden_nH):
        """`(deviation_n, entropy_n)` of the valid tokens of one chunk, both LM heads streamed."""
        with (
            full_lm_head(policy) as (weight_VH, bias_V),
            full_lm_head(reference_model) as (ref_weight_VH, ref_bias_V),
        ):
            return hellinger_and_entropy(
                hidden_nH,
                ref_hidden_nH,
                weight_VH,
                ref_weight_VH,
                bias_V,
                ref_bias_V,
                temperature=self.temperature,
                token_chunk_size=self.args.statistics_token_chunk_size,
                vocab_chunk_size=self.args.statistics_vocab_chunk_size,
                transform=logit_transform(policy),
                ref_transform=logit_transform(reference_model),
            )
