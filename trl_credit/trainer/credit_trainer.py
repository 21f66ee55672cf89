"""`CreditGRPOTrainer`: TRL's GRPOTrainer with per-token advantages from a stack of credit methods.

The trainer never re-implements the GRPO loss. It replaces the `(B,)` sequence advantages with `(B, T)` token
advantages, which TRL's `_compute_loss` accepts as they are (it only unsqueezes a 1-D tensor), so every
`loss_type`, clipping rule, importance-sampling correction and normaliser keeps working. It holds no method
names: each method (`trl_credit/methods/`) declares the statistics it reads, and where they come from decides
where it runs.

* Methods that read only generation-batch statistics run in `_generate_and_score_completions`, before TRL
  shuffles and splits the batch; their statistics travel as batch keys (`credit_<statistic>`), so the shuffle and
  split keep them aligned, and batch-global reductions gather over every process.
* Methods that read the current policy run in each training forward: TRL reads `inputs["advantages"]` only after
  the forward of its loss, so they reshape the advantages from that very forward (no extra forward). A method
  there that drops tokens from the loss removes them from TRL's loss mask after that forward; only with a tool mask
  (TRL then builds its loss mask before its forward) does it get one no-grad forward of the micro-batch first.
"""

from __future__ import annotations

import os
import warnings
from collections import Counter
from contextlib import contextmanager

import torch
from trl import GRPOTrainer
from trl.trainer.utils import get_config_model_id

from ..methods.registry import (
    GENERATION_STATISTICS,
    LOSS_FORWARD_STATISTICS,
    POLICY_ENTROPY,
    POLICY_LOGIT_GAP,
    POLICY_LOGPS,
    PREVIOUS_POLICY_DEVIATION,
    REFERENCE_DEVIATION,
    ROLLOUT_ENTROPY,
    ROLLOUT_MEAN_ENTROPY,
    ROLLOUT_SUM_SQ_PROBS,
    CreditBatch,
    CreditResult,
)
from .config import CreditGRPOConfig
from .diagnostics import advantage_magnitude, credit_metrics
from .engines import vocab_size
from .reference import DeviationReference, copy_initial_model
from .sources import (
    generates_in_one_call,
    generation_statistics,
    loss_weights,
    policy_logit_gap,
    policy_logps_and_entropy,
    recorded_final_hidden,
    recorded_generation_hidden,
    recorded_scoring_forward,
    valid_mask,
)
from .trl_compat import (
    MULTIMODAL_KEYS,
    NORMALISER_AT_GENERATION,
    check_trainer_attributes,
    check_trl_surfaces,
    fused_statistics,
    runs_scoring_forward,
    trl_loss_mask,
    weigh_trl_loss_mask,
)

SEQUENCE_ADVANTAGES = "credit_sequence_advantages"  # batch key: GRPO's A_i, kept once the advantages are (B, T)
GROUP_INDEX = "credit_group_index"  # batch key: each row's prompt group (global over processes)
REWARDS = "credit_rewards"  # batch key: each row's raw reward (TRL's weighted sum over reward functions)
# Generation statistics of the rollout policy's full next-token distribution (beyond the sampled token's log-prob).
ROLLOUT_DISTRIBUTION = (
    ROLLOUT_ENTROPY,
    ROLLOUT_SUM_SQ_PROBS,
    ROLLOUT_MEAN_ENTROPY,
    REFERENCE_DEVIATION,
    PREVIOUS_POLICY_DEVIATION,
)


def statistic_key(name: str) -> str:
    """The batch key a generation-batch statistic travels under."""
    return f"credit_{name}"


class CreditGRPOTrainer(GRPOTrainer):
    """[`~trl.GRPOTrainer`] whose advantage is reshaped per token by the methods of `args.credit_method`.

    Overrides `_generate_and_score_completions` (methods that read the generation batch) and `_compute_loss`
    (methods that read the training forward). Use it exactly like `GRPOTrainer`, with a [`CreditGRPOConfig`].
    """

    config_class = CreditGRPOConfig
    _credit_method: str | None = None  # set by the single-method subclasses
    # The statistics this trainer computes; a subclass that knows more (the credit lab's ground truth) extends it.
    supplied_statistics: tuple[str, ...] = LOSS_FORWARD_STATISTICS + GENERATION_STATISTICS
    _tag_names = ["trl", "grpo", "trl-credit"]

    def __init__(self, model, reward_funcs=None, args: CreditGRPOConfig | None = None, *pos_args, **kwargs):
        check_trl_surfaces()
        if args is None:
            model_name = model if isinstance(model, str) else get_config_model_id(model.config)
            args = self.config_class(output_dir=f"{model_name.split('/')[-1]}-{self._name}")
        if not isinstance(args, CreditGRPOConfig):
            raise TypeError(
                f"{type(self).__name__} needs a CreditGRPOConfig (or TACOConfig, EAPOConfig, TIDEConfig), "
                f"got {type(args).__name__}"
            )
        if self._credit_method is not None and args.credit_method != self._credit_method:
            raise ValueError(
                f"{type(self).__name__} trains with credit_method={self._credit_method!r}, but args.credit_method is "
                f"{args.credit_method!r}; use CreditGRPOTrainer to choose the method from the config"
            )
        if args.hub_token:
            warnings.warn(
                "hub_token is pickled into training_args.bin, which push_to_hub uploads; log in with `hf auth login` "
                "or set HF_TOKEN instead",
                stacklevel=2,
            )
        args.validate_credit_fields()  # again: attributes may have been set since the config was built
        self.credit_method = args.credit_method
        stack = [(method, args.method_hyperparameters(method)) for method in args.credit_methods]
        self._generation_methods = [(m, hp) for m, hp in stack if not m.reads_training_forward(hp)]
        self._training_forward_methods = [(m, hp) for m, hp in stack if m.reads_training_forward(hp)]
        self._drops_tokens_in_forward = any(m.drops_tokens for m, _ in self._training_forward_methods)
        if self._drops_tokens_in_forward and args.loss_type in NORMALISER_AT_GENERATION:
            dropping = [m.name for m, _ in self._training_forward_methods if m.drops_tokens]
            warnings.warn(
                f"credit_method {args.credit_method!r}: the tokens that {', '.join(dropping)} drop from the loss in the "
                f"training forward still count in the normaliser of loss_type={args.loss_type!r}, which TRL counts "
                "when the batch is generated. Use loss_type='bnpo' to reproduce the official per-micro-batch token mean.",
                stacklevel=2,
            )
        requested = {name for m, hp in stack for name in m.statistics_for(hp)}
        for method, hp in stack:
            missing = [name for name in method.statistics_for(hp) if name not in self.supplied_statistics]
            if missing:
                raise ValueError(
                    f"credit method {method.name!r} reads {missing}, which {type(self).__name__} does not compute "
                    f"(it supplies {list(self.supplied_statistics)})"
                )
        self._generation_statistics = tuple(name for name in GENERATION_STATISTICS if name in requested)
        self._records_hidden = POLICY_LOGIT_GAP in requested  # from the final hidden states of the forward
        # Statistics of the rollout policy's full distribution (not just the sampled token's log-prob, which TRL keeps).
        self._reads_rollout_distribution = any(s in ROLLOUT_DISTRIBUTION for s in self._generation_statistics)
        # sum_v p_v^2 is streamed from the final hidden states of the forward that scored the batch.
        self._keeps_scoring_hidden = ROLLOUT_SUM_SQ_PROBS in self._generation_statistics
        deviations = [s for s in self._generation_statistics if s in (REFERENCE_DEVIATION, PREVIOUS_POLICY_DEVIATION)]
        if len(deviations) > 1:
            raise ValueError(f"credit_method {args.credit_method!r} needs two deviation references: {deviations}")
        initial_copy = copy_initial_model(model, args, kwargs.get("peft_config"), self._generation_statistics)
        super().__init__(model, reward_funcs, args, *pos_args, **kwargs)
        check_trainer_attributes(self)
        self.deviation_reference = DeviationReference(self, initial_copy, deviations[0]) if deviations else None

    # ------------------------------------------------------------------------------------- generation batch

    def _generate_and_score_completions(self, inputs):
        # Generation-batch statistics take the policy's entropies and hidden states from TRL's old-log-prob forward where
        # it runs one, else from `generate` where TRL generates in one call (see `sources`).
        record = bool(self._generation_statistics) and generates_in_one_call(self)
        score = self._reads_rollout_distribution and runs_scoring_forward(self)
        with (
            recorded_generation_hidden(self, record) as generation,
            recorded_scoring_forward(
                self, score, keep_hidden=self.deviation_reference is not None or self._keeps_scoring_hidden
            ) as scoring,
        ):
            batch = super()._generate_and_score_completions(inputs)
        batch.update(self._groups_and_rewards(batch))
        if self._generation_statistics:
            statistics = generation_statistics(
                self, batch, self._generation_statistics, self.deviation_reference, generation, scoring
            )
            batch.update({statistic_key(name): value for name, value in statistics.items()})
            if self.deviation_reference is not None:
                self.deviation_reference.after_batch(training=self.model.training)
        statistic_BT = None  # the last method's per-token statistic, for the token-credit log
        if self._generation_methods:
            updates, statistic_BT = self._apply_credit(batch, self._generation_methods, self._batch_statistics(batch))
            batch.update(updates)
        if self.args.log_token_credit and self.model.training:
            # Steps are TRL's (1-based): the first optimizer step trained on this batch, and the step whose log entry
            # reports its rewards (TRL's next logging step); the batch is recorded when that entry falls within it.
            first_step = self.state.global_step + 1
            generate_every = self.args.steps_per_generation * self.num_iterations
            steps_served = max(1, generate_every // self.args.gradient_accumulation_steps)
            logging_steps = self.state.logging_steps
            logged_step = (
                1
                if first_step == 1 and self.args.logging_first_step
                else int(-(-first_step // logging_steps) * logging_steps)  # the next multiple: ceiling division
            )
            if logged_step < first_step + steps_served:
                self._log_token_credit(batch, statistic_BT, logged_step)
        return batch

    def _groups_and_rewards(self, batch) -> dict[str, torch.Tensor]:
        """Batch keys for advantage estimators: each row's prompt group and raw reward, as TRL laid them out.

        TRL's generation batch holds every process's rows in process order, each prompt's completions consecutive;
        the rows of this process are its slice, and `_calculate_rewards` returned every process's rewards.
        """
        num_rows = batch["completion_ids"].size(0)
        num_generations = self.num_generations if self.model.training else self.num_generations_eval
        rows = self.accelerator.process_index * num_rows + torch.arange(
            num_rows, device=batch["completion_ids"].device
        )
        rewards_per_func = self._last_rewards_per_func[rows.to(self._last_rewards_per_func.device)]
        rewards = (rewards_per_func * self.reward_weights.to(rewards_per_func.device)).nansum(dim=1)  # TRL's sum
        return {GROUP_INDEX: rows // num_generations, REWARDS: rewards.float().to(rows.device)}

    def _batch_statistics(self, batch) -> dict[str, torch.Tensor]:
        return {name: batch[statistic_key(name)] for name in self._generation_statistics}

    def _forward_batch_size(self) -> int:
        return self.args.per_device_train_batch_size if self.model.training else self.args.per_device_eval_batch_size

    def _gather_all(self, values_N: torch.Tensor) -> torch.Tensor:
        """The values of every process, concatenated in process order (a collective)."""
        # One padding element keeps every process's tensor non-empty, whatever its mask.
        padded_N = torch.cat([values_N.float().flatten(), values_N.new_zeros(1, dtype=torch.float32)])
        sizes = self.accelerator.gather(torch.tensor([values_N.numel()], device=values_N.device))
        gathered = self.accelerator.gather(self.accelerator.pad_across_processes(padded_N, dim=0))
        rows = gathered.view(len(sizes), -1)
        return torch.cat([row[:size] for row, size in zip(rows, sizes.tolist())])

    def _apply_credit(self, batch, methods, statistics, record_metrics: bool = True):
        """Run `methods` in order on `batch`; return the batch keys to update and the last per-token statistic.

        Each method sees the advantages and the loss mask the methods before it produced (`CreditBatch.followed_by`),
        starting from TRL's loss mask (completion mask x tool mask, soft where an earlier stage weighed tokens).
        """
        weights_BT = loss_weights(batch)
        mask_BT = weights_BT.bool()
        sequence_B = batch.get(SEQUENCE_ADVANTAGES, batch["advantages"]).float()
        advantages_BT = batch["advantages"].float()
        if advantages_BT.dim() == 1:
            advantages_BT = sequence_B.unsqueeze(1) * mask_BT
        credit_batch = CreditBatch(
            advantages_BT,
            sequence_B,
            mask_BT,
            statistics=statistics,
            vocab_size=vocab_size(self.accelerator.unwrap_model(self.model)),
            step=self.state.global_step,
            gather=self._gather_all,
            clip_range=(self.epsilon_low, self.epsilon_high),
            loss_weights_BT=weights_BT,
            group_index_B=batch.get(GROUP_INDEX),
            rewards_B=batch.get(REWARDS),
        )
        loss_mask_BT, statistic_BT = None, None
        mode = "train" if self.model.training else "eval"
        for method, hyperparameters in methods:
            result: CreditResult = method(credit_batch, hyperparameters)  # validates its inputs and its result
            result.advantages_BT = torch.where(credit_batch.mask_BT, result.advantages_BT.float(), 0.0)
            if record_metrics:
                for name, value in credit_metrics(
                    self.accelerator, method.name, credit_batch.advantages_BT, result, credit_batch.mask_BT
                ).items():
                    self._metrics[mode][name].append(value)
            if result.loss_mask_BT is not None:
                loss_mask_BT = result.loss_mask_BT if loss_mask_BT is None else loss_mask_BT * result.loss_mask_BT
            statistic_BT = result.statistic_BT if result.statistic_BT is not None else statistic_BT
            credit_batch = credit_batch.followed_by(result)
        advantages_BT = credit_batch.advantages_BT
        is_last_stage = methods is self._training_forward_methods or not self._training_forward_methods
        if record_metrics and is_last_stage:
            self._metrics[mode]["credit/adv_abs_mean"].append(
                advantage_magnitude(self.accelerator, advantages_BT, mask_BT)
            )
        updates = {"advantages": advantages_BT, SEQUENCE_ADVANTAGES: sequence_B}
        if loss_mask_BT is not None:
            # TRL's loss masks tokens with completion_mask * tool_mask, and every normaliser counts that mask.
            tool_mask_BT = batch["tool_mask"] if "tool_mask" in batch else torch.ones_like(loss_mask_BT)
            updates["tool_mask"] = tool_mask_BT * loss_mask_BT
            if "num_items_in_batch" in batch and methods is self._generation_methods:
                kept = (batch["completion_mask"] * updates["tool_mask"]).sum()
                updates["num_items_in_batch"] = self.accelerator.gather(kept).sum()
        return updates, statistic_BT

    # ------------------------------------------------------------------------------------- training forward

    def _compute_loss(self, model, inputs):
        if not self._training_forward_methods:
            return super()._compute_loss(model, inputs)
        # The buffered micro-batch is reused across `num_iterations`: TRL gets a shallow copy whose advantages
        # (and loss mask) are filled in, never the shared dict.
        inputs = dict(inputs)
        if self._drops_tokens_in_forward and trl_loss_mask(inputs) is not None:
            # The dropped tokens leave TRL's loss mask in place after its forward (the buffered one is not touched).
            inputs["completion_mask"] = inputs["completion_mask"].clone()
        elif self._drops_tokens_in_forward:  # a tool mask: TRL's loss mask is fixed before its forward
            with recorded_final_hidden(self, self._records_hidden) as hidden:
                logps_BT, entropy_BT = policy_logps_and_entropy(self, inputs)
            statistics = self._forward_statistics(inputs, logps_BT, entropy_BT, hidden)
            inputs.update(self._apply_credit(inputs, self._training_forward_methods, statistics)[0])
            return super()._compute_loss(model, inputs)
        with (
            recorded_final_hidden(self, self._records_hidden) as hidden,
            self._credit_from_training_forward(model, inputs, hidden),
        ):
            return super()._compute_loss(model, inputs)

    @contextmanager
    def _credit_from_training_forward(self, model, inputs, hidden=None):
        """Reshape `inputs["advantages"]` with the statistics of the next forward of `model` (TRL's loss forward).

        TRL's `_compute_loss` runs one forward of the policy and reads `inputs["advantages"]` after it;
        `tests/test_trainer.py` checks that the advantages it consumed are the ones computed here. Tokens a method
        drops leave TRL's loss mask (`trl_loss_mask`, a clone) in place, after that forward and before the loss reads
        it; `tests/test_baselines.py` checks TRL's loss against one computed with the dropped tokens masked out.
        """

        def after_forward(module, args, kwargs, output):
            handle.remove()  # only the policy forward of this loss
            logps_BT, entropy_BT = fused_statistics(output, inputs["completion_ids"].size(1))
            statistics = self._forward_statistics(
                inputs, logps_BT.detach().float(), entropy_BT.detach().float(), hidden
            )
            updates = self._apply_credit(inputs, self._training_forward_methods, statistics)[0]
            loss_mask_BT = updates.pop("tool_mask", None)
            inputs.update(updates)
            if loss_mask_BT is not None:  # TRL's forward has read the attention mask; its loss reads this one next
                weigh_trl_loss_mask(inputs, loss_mask_BT)  # (a method returns one only with drops_tokens=True)

        handle = model.register_forward_hook(after_forward, with_kwargs=True)
        try:
            yield
        finally:
            handle.remove()

    def _forward_statistics(self, batch, logps_BT, entropy_BT, hidden=None) -> dict[str, torch.Tensor]:
        """Statistics of the training forward; `hidden`: the final hidden states recorded from that forward."""
        mask_BT = valid_mask(batch)
        statistics = {
            POLICY_LOGPS: torch.where(mask_BT, logps_BT, 0.0),
            POLICY_ENTROPY: torch.where(mask_BT, entropy_BT, 0.0),
        }
        if self._records_hidden:
            statistics[POLICY_LOGIT_GAP] = policy_logit_gap(self, batch, torch.cat(hidden))
        statistics.update(self._batch_statistics(batch))
        return statistics

    # ------------------------------------------------------------------------------------------ checkpoints

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self.deviation_reference is not None and self.args.should_save:
            folder = f"checkpoint-{self.state.global_step}"
            self.deviation_reference.save(os.path.join(self._get_output_dir(trial=trial), folder))

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None and self.deviation_reference is not None:
            self.deviation_reference.load(checkpoint)

    # ---------------------------------------------------------------------------------------------- logging

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        from ..rewards import RewardStats

        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._last_rewards_per_func = rewards_per_func  # (all processes' rows, reward funcs): for the token log
        # Answers the reward functions that count them could not score (timeouts, unparseable LaTeX), summed over
        # processes; every process holds the same reward functions, so all or none run the reduction.
        counters = [f.unscored for f in self.reward_funcs if isinstance(getattr(f, "unscored", None), RewardStats)]
        if not counters:
            return rewards_per_func
        counts = Counter()
        for counter in counters:
            counts.update(counter.snapshot_and_reset())
        totals = self.accelerator.reduce(torch.tensor(list(counts.values()), device=self.accelerator.device), "sum")
        mode = "train" if self.model.training else "eval"
        for name, total in zip(counts, totals.tolist()):
            self._metrics[mode][name].append(float(total))
        return rewards_per_func

    @torch.no_grad()
    def _log_token_credit(self, batch, statistic_BT, step: int) -> None:
        """Append per-token credit of a few completions to `output_dir/token_credit.jsonl`, labelled `step`.

        Rows are spread over the local batch so that several prompt groups appear; methods of the training
        forward are applied to them as the first training forward will (the policy has not moved yet). Every
        process runs the small forward (ZeRO-3 forwards are collective); only the main process writes.
        """
        from ..reports.token_view import append_token_credit, token_credit_records_from_batch

        num_rows = batch["completion_ids"].size(0)
        rows = torch.linspace(0, num_rows - 1, min(self.args.token_credit_samples, num_rows)).round().long().unique()
        sub = {
            key: value[rows]
            for key, value in batch.items()
            if isinstance(value, torch.Tensor)
            and value.dim() >= 1
            and value.size(0) == num_rows
            and key not in MULTIMODAL_KEYS
        }
        # Image inputs are not laid out per row: then every row is scored and the sampled ones kept.
        has_images = any(key in batch for key in MULTIMODAL_KEYS)
        with recorded_final_hidden(self, self._records_hidden) as hidden:
            logps_bT, entropy_bT = policy_logps_and_entropy(
                self, batch if has_images else sub, self._forward_batch_size()
            )
        if has_images:
            logps_bT, entropy_bT = logps_bT[rows], entropy_bT[rows]
            hidden = [torch.cat(hidden)[rows]] if hidden else hidden
        if statistic_BT is not None:
            statistic_BT = statistic_BT[rows]
        if self._training_forward_methods:
            forward_statistics = self._forward_statistics(sub, logps_bT, entropy_bT, hidden)
            updates, forward_statistic = self._apply_credit(
                sub, self._training_forward_methods, forward_statistics, record_metrics=False
            )
            sub.update(updates)
            statistic_BT = forward_statistic if forward_statistic is not None else statistic_BT
        mask_bT = valid_mask(sub)
        advantages_b = sub.get(SEQUENCE_ADVANTAGES, sub["advantages"])
        token_advantages = sub["advantages"] if sub["advantages"].dim() == 2 else advantages_b.unsqueeze(1) * mask_bT
        if not self.accelerator.is_main_process:
            return
        first_row = self.accelerator.process_index * num_rows
        rewards_per_func = self._last_rewards_per_func[first_row + rows.to(self._last_rewards_per_func.device)]
        rewards_b = (rewards_per_func * self.reward_weights.to(rewards_per_func.device)).nansum(dim=1)
        decode = lambda ids_bT, m_bT: [  # noqa: E731
            self.processing_class.decode(ids[m.bool()], skip_special_tokens=True) for ids, m in zip(ids_bT, m_bT)
        ]
        records = token_credit_records_from_batch(
            step=step,
            method=self.credit_method,
            prompts=decode(sub["prompt_ids"], sub["prompt_mask"]),
            completions=decode(sub["completion_ids"], sub["completion_mask"]),
            rewards_B=rewards_b.cpu(),
            advantages_B=advantages_b.cpu(),
            completion_ids_BT=sub["completion_ids"].cpu(),
            token_advantages_BT=token_advantages.cpu(),
            logps_BT=logps_bT.cpu(),
            entropies_BT=entropy_bT.cpu(),
            mask_BT=mask_bT.cpu(),
            tokenizer=self.processing_class,
            statistic_BT=None if statistic_BT is None else statistic_BT.cpu(),
        )
        append_token_credit(self.args.output_dir, records)

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        """TRL's card, extended with what trained (`trl_credit.reports.model_card.trainer_model_card`): the base model, the
        set-up, each method with its hyperparameters and paper, the reward and evaluation results, training plots."""
        if not self.is_world_process_zero():
            return
        from huggingface_hub import ModelCard

        from ..reports.model_card import trainer_model_card

        # TRL's own card first, for the tags TRL derives (`unsloth`, `hf_jobs`, Trackio's), whatever its version.
        path = os.path.join(self.args.output_dir, "README.md")
        super().create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags)
        trl_tags = ModelCard.load(path).data.tags or []
        card = trainer_model_card(self, model_name=model_name, dataset_name=dataset_name, tags=trl_tags)
        card.save(path)
