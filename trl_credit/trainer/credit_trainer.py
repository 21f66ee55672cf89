"""`CreditGRPOTrainer`: TRL's GRPOTrainer with per-token advantages from a stack of credit methods.

It never re-implements the GRPO loss: it replaces the `(B,)` sequence advantages with `(B, T)` token advantages, which
TRL's `_compute_loss` accepts as they are, so every `loss_type`, clipping rule and normaliser keeps working. Where each
method runs is decided once (`config.StagePlan`): in `_generate_and_score_completions`, before TRL shuffles and splits
the batch, for methods of generation-batch statistics; in `_credit_training_forward`, on the log-probs and entropies of
TRL's own forward of each loss, for methods of the current policy. Both stages run `_credit_stage` (the stack runner
`methods.stack.run_stack` on TRL's inputs) and write the credit back with `write_credit`. See docs/layout.md.
"""

from __future__ import annotations

import os
import warnings
from collections import Counter
from contextlib import contextmanager, nullcontext
from functools import partial
from typing import Any

import torch
from transformers.trainer_utils import get_last_checkpoint
from trl import GRPOTrainer
from trl.trainer.utils import get_config_model_id

from ..methods import (
    GENERATION_STATISTICS,
    LOSS_FORWARD_STATISTICS,
    POLICY_ENTROPY,
    POLICY_LOGIT_GAP,
    POLICY_LOGPS,
    CreditBatch,
    get_credit_method,
)
from ..methods.stack import StackCredit, StackStep, run_stack
from .batch_layout import GROUP_INDEX, REWARDS, SEQUENCE_ADVANTAGES, groups_and_rewards, loss_weights, statistic_key
from .config import CreditGRPOConfig, unsupplied_statistics
from .construction import check_trainer_inputs, deepspeed_cpu_guess_hidden
from .diagnostics import (
    EXTRA_FORWARDS,
    EXTRA_REFERENCE_FORWARDS,
    TOKEN_CREDIT_LOG_FORWARDS,
    credit_metrics,
    gather_all,
    unscored_answers,
    unscored_counters,
)
from .model_parts import vocab_size
from .recorders import recorded_final_hidden
from .reference import copy_initial_model, same_mode_as_training_args
from .run_folder import run_folder_lock
from .run_record import NothingToTrainCheck, start_run, write_run_record
from .run_safety import NonFiniteGuard
from .statistics_sources import StatisticsSources
from .token_credit_log import TokenCreditLog, preview_token_credit, token_credit_step
from .token_texts import TokenTexts
from .trl_compat import (
    NORMALISER_AT_GENERATION,
    check_trainer_attributes,
    check_trl_surfaces,
    torch_fused_head,
)


def write_credit(batch, credit: StackCredit) -> None:
    """Write a stack's credit into TRL's `batch`: the `(B, T)` advantages, GRPO's sequence advantages, and the loss
    mask the methods returned multiplied into TRL's loss mask. That is `tool_mask` (which TRL's loss and normaliser
    multiply in) where the batch has one or its completion mask is TRL's integer one; in the loss forward of a stack
    that drops tokens, the float copy of `completion_mask` that TRL holds as its loss mask (`_credit_in_loss_forward`),
    in place."""
    batch["advantages"] = credit.batch.advantages_BT
    batch[SEQUENCE_ADVANTAGES] = credit.batch.sequence_advantages_B
    if credit.loss_mask_BT is None:
        return
    if "tool_mask" not in batch and batch["completion_mask"].is_floating_point():
        batch["completion_mask"].mul_(credit.loss_mask_BT)
    else:
        batch["tool_mask"] = batch.get("tool_mask", 1.0) * credit.loss_mask_BT


TRL_CARD_TAGS = ("trl", "grpo", "trl-credit")  # the Hub tags of every card, before the methods' names


def trl_card_attributes(methods) -> dict[str, Any]:
    """The attributes TRL's `create_model_card` reads, for a run of `methods`: each method's name is a Hub tag
    (`_tag_names`). TRL's card names one trainer (`_name`) and cites one paper (`_paper`): methods that share one paper
    (a single method, or TACO with its min-p support) give their names and that paper (none for a method without one);
    any other stack keeps `GRPOTrainer`'s name and citation, GRPO's, since the stack reshapes GRPO's advantage and no
    one of its papers stands for it."""
    attributes: dict[str, Any] = {"_tag_names": [*TRL_CARD_TAGS, *(method.name for method in methods)]}
    if len({method.paper["id"] if method.paper else None for method in methods}) == 1:
        attributes["_name"] = " + ".join(method.display_name for method in methods)
        attributes["_paper"] = dict(methods[0].paper or {})
    return attributes


class CreditGRPOTrainer(StatisticsSources, GRPOTrainer):
    """[`~trl.GRPOTrainer`] whose advantage is reshaped per token by the methods of `args.credit_method`.

    Use it exactly like `GRPOTrainer`, with a [`CreditGRPOConfig`]. Where each method runs is `stage_plan` (the
    config's `StagePlan`). Its model card is TRL's, tagged and cited as `trl_card_attributes` says. It stops at the
    first non-finite step (`run_safety.NonFiniteGuard`, a callback) and holds its output folder while it trains; each
    checkpoint records its run, and a resume that would mix two runs is refused (`run_record`). The statistics
    sources are `StatisticsSources`. It overrides these methods of TRL's trainer:

    - `__init__`: checks the config and inputs before TRL loads the model, and sets up the stages and callbacks;
    - `_generate_and_score_completions`: the generation-batch stage, before TRL shuffles and splits the batch, and the
      token-credit log's preview;
    - `_calculate_rewards`: keeps the rewards of every process's rows (the advantage estimators' raw rewards, the
      guard's check) and logs the unscored answers;
    - `_compute_loss`: the training-forward stage around TRL's loss, the forward counts, the loss handed to the guard;
    - `_get_per_token_logps_and_entropies`: the log-probs and entropies of the loss's own forward for that stage, and
      TRL 1.15's torch fused head (`trl_compat.torch_fused_head`);
    - `train`: the output folder's lock, the resume's checks and the run's record, before TRL's `train`;
    - `_save_checkpoint`, `_save`, `_load_optimizer_and_scheduler`: the run record and the deviation reference in
      each checkpoint, saved files with the mode of `training_args.bin`.
    """

    config_class = CreditGRPOConfig
    _pinned_method: str | None = None  # set by the single-method subclasses: see `__init_subclass__`
    # The statistics this trainer computes; a subclass that knows more (the credit lab's ground truth) extends it and
    # puts its statistic in the batch under `statistic_key(name)`.
    supplied_statistics: tuple[str, ...] = LOSS_FORWARD_STATISTICS + GENERATION_STATISTICS
    _tag_names = list(TRL_CARD_TAGS)
    run_record: dict | None = None  # the record of the run `train()` trains (the research card reads it)
    # The micro-batch of the loss TRL is computing, and the dtype of the attention mask TRL would build from it, while
    # `_credit_in_loss_forward` hands it to TRL's scoring forward; else None.
    _loss_forward: tuple[dict, torch.dtype] | None = None

    def __init_subclass__(cls, credit_method: str | None = None, **kwargs):
        """`class TACOTrainer(CreditGRPOTrainer, credit_method="taco")` pins the trainer to one method and takes its
        display name, paper and Hub tag from the method's registration."""
        super().__init_subclass__(**kwargs)
        if credit_method is not None:
            cls._pinned_method = credit_method
            for attribute, value in trl_card_attributes([get_credit_method(credit_method)]).items():
                setattr(cls, attribute, value)

    def __init__(self, model, reward_funcs=None, args: CreditGRPOConfig | None = None, *pos_args, **kwargs):
        check_trl_surfaces()
        if args is None:
            model_name = model if isinstance(model, str) else get_config_model_id(model.config)
            args = self.config_class(output_dir=f"{model_name.split('/')[-1]}-{self._name}")
        self._check_args(args)
        check_trainer_inputs(args, reward_funcs, pos_args, kwargs)  # before TRL loads the model
        self.stage_plan = args.stage_plan
        for name, missing in unsupplied_statistics(self.stage_plan.steps, self.supplied_statistics).items():
            raise ValueError(
                f"credit method {name!r} reads {missing}, which {type(self).__name__} does not compute (it supplies "
                f"{list(self.supplied_statistics)})"
            )
        if self.stage_plan.drops_tokens_in_forward and args.loss_type in NORMALISER_AT_GENERATION:
            dropping = [step.method.name for step in self.stage_plan.training_forward if step.method.drops_tokens]
            warnings.warn(
                f"credit_method {args.credit_method!r}: the tokens that {', '.join(dropping)} drop from the loss in the "
                f"training forward still count in the normaliser of loss_type={args.loss_type!r}, which TRL counts "
                "when the batch is generated. Use loss_type='bnpo' to reproduce the official per-micro-batch token mean.",
                stacklevel=2,
            )
        for attribute, value in trl_card_attributes([step.method for step in self.stage_plan.steps]).items():
            setattr(self, attribute, value)  # what TRL's card says
        with deepspeed_cpu_guess_hidden(args):
            initial_copy = copy_initial_model(
                model, args, kwargs.get("peft_config"), self.stage_plan.generation_statistics
            )
            super().__init__(model, reward_funcs, args, *pos_args, **kwargs)
        check_trainer_attributes(self)
        self.deviation_reference = self._deviation_reference(initial_copy)
        self._vocab_size = vocab_size(self._policy())
        self._token_texts = TokenTexts(self.processing_class)  # completion ids -> token texts (HICRA's grams)
        self._unscored_counters = unscored_counters(self.reward_funcs)
        # Forwards the credit methods run, counted where they run (`_count_forward`), logged once per step.
        self.forward_counts = Counter({EXTRA_FORWARDS: 0})
        if self.deviation_reference is not None:
            self.forward_counts[EXTRA_REFERENCE_FORWARDS] = 0
        self.token_credit_log = TokenCreditLog(self.processing_class) if args.log_token_credit else None
        if self.token_credit_log is not None:
            self.forward_counts[TOKEN_CREDIT_LOG_FORWARDS] = 0
            self.add_callback(self.token_credit_log)
        self._nothing_to_train = NothingToTrainCheck()
        self.non_finite_guard = NonFiniteGuard(self.accelerator)
        for callback in (self._nothing_to_train, self.non_finite_guard):
            self.add_callback(callback)

    def _check_args(self, args) -> None:
        if not isinstance(args, CreditGRPOConfig):
            raise TypeError(
                f"{type(self).__name__} needs a CreditGRPOConfig (or TACOConfig, EAPOConfig, TIDEConfig), "
                f"got {type(args).__name__}"
            )
        if self._pinned_method is not None and args.credit_method != self._pinned_method:
            raise ValueError(
                f"{type(self).__name__} trains with credit_method={self._pinned_method!r}, but args.credit_method is "
                f"{args.credit_method!r}; use CreditGRPOTrainer to choose the method from the config"
            )
        if args.hub_token:
            warnings.warn(
                "hub_token is pickled into training_args.bin, which push_to_hub uploads; log in with `hf auth login` "
                "or set HF_TOKEN instead",
                stacklevel=3,
            )
        args.validate_credit_fields()  # again: attributes may have been set since the config was built

    # ------------------------------------------------------------------------------------- generation batch

    def _generate_and_score_completions(self, inputs):
        # Generation-batch statistics take the policy's entropies and hidden states from TRL's old-log-prob forward where
        # it runs one, else from `generate` where TRL generates in one call (see `statistics_sources`).
        with self._recorded_rollout() as (generation, scoring):
            batch = super()._generate_and_score_completions(inputs)
        num_generations = self.num_generations if self.model.training else self.num_generations_eval
        rewards = (self._last_rewards_per_func * self.reward_weights.to(self._last_rewards_per_func.device)).nansum(1)
        batch.update(groups_and_rewards(batch, rewards, self.accelerator.process_index, num_generations))
        names = self.stage_plan.generation_statistics
        if names:
            statistics = self._generation_batch_statistics(batch, names, generation, scoring)
            batch.update({statistic_key(name): value for name, value in statistics.items()})
            if self.deviation_reference is not None:
                self.deviation_reference.after_batch(self._policy(), training=self.model.training)
        statistic_BT = None
        if self.stage_plan.generation:
            last_stage = not self.stage_plan.training_forward
            credit = self._credit_stage(batch, self.stage_plan.generation, {}, last_stage)
            write_credit(batch, credit)
            if credit.loss_mask_BT is not None and "num_items_in_batch" in batch:  # TRL's normaliser, recounted
                kept = loss_weights(batch).sum()
                batch["num_items_in_batch"] = self.accelerator.gather(kept).sum()
            statistic_BT = credit.statistic_BT
        if self.token_credit_log is not None and self.model.training:
            step = token_credit_step(self.args, self.state, self.num_iterations)
            if step is not None:
                score = partial(
                    self._scored, batch_size=self._forward_batch_size(), counted_as=TOKEN_CREDIT_LOG_FORWARDS
                )
                stage = partial(self._credit_training_forward, record_metrics=False)
                samples = self.args.token_credit_samples
                self.token_credit_log.preview = preview_token_credit(
                    batch, statistic_BT, step, samples, score, stage if self.stage_plan.training_forward else None
                )
        return batch

    # ----------------------------------------------------------------------------------------- the stack

    def _credit_stage(
        self, inputs, steps: tuple[StackStep, ...], statistics, last_stage: bool, record_metrics: bool = True
    ) -> StackCredit:
        """Run `steps` on TRL's `inputs` (`run_stack`), from their advantages and TRL's loss mask (completion mask x
        tool mask, soft where an earlier stage weighed tokens), with `statistics` and those that travel with the batch.
        Logs each method's metrics (and, at the `last_stage`, `credit/adv_abs_mean`) when `record_metrics`."""
        # `loss_weights` and `token_advantages` written out: two calls would widen the seam (`tests/test_seam.py`).
        weights_BT = (inputs["completion_mask"] * inputs.get("tool_mask", 1.0)).float()
        mask_BT = weights_BT.bool()
        advantages = inputs["advantages"].float()
        batch = CreditBatch(
            advantages if advantages.dim() == 2 else advantages.unsqueeze(1) * mask_BT,
            inputs.get(SEQUENCE_ADVANTAGES, inputs["advantages"]).float(),
            mask_BT,
            statistics={**{name: inputs[key] for name, key in self.stage_plan.batch_statistics.items()}, **statistics},
            vocab_size=self._vocab_size,
            step=self.state.global_step,
            gather=partial(gather_all, self.accelerator),
            clip_range=(self.epsilon_low, self.epsilon_high),
            loss_weights_BT=weights_BT,
            group_index_B=inputs.get(GROUP_INDEX),
            rewards_B=inputs.get(REWARDS),
            # GTPO's conflict tokens, HICRA's planning tokens: the sampled ids, padded with the tokenizer's pad id.
            completion_ids_BT=inputs["completion_ids"],
            pad_token_id=self._token_texts.pad_token_id,
            token_texts=self._token_texts,
        )
        credit = run_stack(steps, batch)
        if record_metrics:
            metrics = self._metrics["train" if self.model.training else "eval"]
            for metric, value in credit_metrics(self.accelerator, credit, mask_BT if last_stage else None).items():
                metrics[metric].append(value)
        return credit

    # ------------------------------------------------------------------------------------- training forward

    def _compute_loss(self, model, inputs):
        if not self.stage_plan.training_forward:
            loss = super()._compute_loss(model, inputs)
        else:
            # The buffered micro-batch is reused across `num_iterations`: TRL gets a shallow copy whose advantages
            # (and loss mask) are filled in, never the shared dict.
            inputs = dict(inputs)
            if "tool_mask" in inputs and self.stage_plan.drops_tokens_in_forward:
                # TRL folds the tool mask into its loss mask before its forward: the weights must be in it first.
                self._credit_training_forward(inputs, *self._scored(inputs))
                loss = super()._compute_loss(model, inputs)
            else:
                with self._credit_in_loss_forward(inputs):
                    loss = super()._compute_loss(model, inputs)
        if self.model.training:
            self.non_finite_guard.saw_loss(loss)
        if not self.model.training or self.accelerator.sync_gradients:  # once per optimizer step, or eval batch
            mode = "train" if self.model.training else "eval"
            for name, count in self.forward_counts.items():
                self._metrics[mode][name].append(float(count))
            self.forward_counts = Counter(dict.fromkeys(self.forward_counts, 0))
        return loss

    @contextmanager
    def _credit_in_loss_forward(self, inputs):
        """Inside the block, TRL's next scoring call is the forward of the loss of `inputs`, and the training-forward
        stage runs on its log-probs and entropies: TRL's `_get_per_token_logps_and_entropies` receives no batch, and
        `_compute_loss` reads the advantages and its loss mask only after that call (`tests/test_trl_compat.py`
        checks TRL's order). The first scoring call takes the slot; the block's end clears it."""
        mask_dtype = torch.promote_types(inputs["prompt_mask"].dtype, inputs["completion_mask"].dtype)
        if self.stage_plan.drops_tokens_in_forward:
            # Without a tool mask, TRL's loss mask is this very tensor, read after its forward: a float copy takes the
            # methods' (possibly soft) weights in place there.
            inputs["completion_mask"] = inputs["completion_mask"].to(torch.float32, copy=True)
        self._loss_forward = (inputs, mask_dtype)
        try:
            yield
        finally:
            self._loss_forward = None

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, *args, **kwargs):
        """TRL's scoring forward, with TRL 1.15's torch fused head where it needs one (`trl_compat.torch_fused_head`);
        in the forward of a loss (`_credit_in_loss_forward`), followed by the training-forward stage."""
        loss_forward, self._loss_forward = self._loss_forward, None  # the first call of the loss is its forward
        if loss_forward is not None:
            # TRL built the attention mask from the float copy of the completion mask: scored as TRL would score the
            # buffered micro-batch, in its own dtype (the values are 0 and 1 either way).
            attention_mask = attention_mask.to(loss_forward[1])
        # TRL's fused head returns no maximum logit: min-p's logit gap is streamed from the final hidden states of this
        # very forward, recorded from the backbone around it (no second backbone forward).
        records_hidden = loss_forward is not None and self.stage_plan.records_hidden
        recording = recorded_final_hidden(self._policy()) if records_hidden else nullcontext([])
        with torch_fused_head(), recording as hidden:
            logps_BT, entropy_BT, aux_loss = super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, *args, **kwargs
            )
        if loss_forward is not None:
            self._credit_training_forward(
                loss_forward[0], logps_BT.detach().float(), entropy_BT.detach().float(), hidden
            )
        return logps_BT, entropy_BT, aux_loss

    def _credit_training_forward(self, inputs, logps_BT, entropy_BT, hidden, record_metrics=True) -> StackCredit:
        """The training-forward stage on the micro-batch `inputs`, from the policy's log-probs and entropies (and the
        final hidden states `hidden` recorded from that forward), written into `inputs` (`write_credit`)."""
        statistics = {POLICY_LOGPS: logps_BT, POLICY_ENTROPY: entropy_BT}
        if self.stage_plan.records_hidden:
            statistics[POLICY_LOGIT_GAP] = self._policy_logit_gap(inputs, torch.cat(hidden))
        credit = self._credit_stage(inputs, self.stage_plan.training_forward, statistics, True, record_metrics)
        write_credit(inputs, credit)
        return credit

    def _scored(self, inputs, batch_size: int | None = None, counted_as: str = EXTRA_FORWARDS):
        """The policy's no-grad forward over `inputs` (`policy_logps_and_entropy`): its log-probs and entropies, and the
        final hidden states recorded from it where the training forward reads the logit gap."""
        with recorded_final_hidden(self._policy(), self.stage_plan.records_hidden) as hidden:
            logps_BT, entropy_BT = self.policy_logps_and_entropy(inputs, batch_size, counted_as)
        return logps_BT, entropy_BT, hidden

    # ------------------------------------------------------------------------------------------ checkpoints

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        with run_folder_lock(self.args.output_dir) if self.args.should_save else nullcontext():
            if resume_from_checkpoint is True:  # transformers' "the last checkpoint of output_dir"
                resume_from_checkpoint = get_last_checkpoint(self.args.output_dir) or resume_from_checkpoint
            checkpoint = resume_from_checkpoint if isinstance(resume_from_checkpoint, (str, os.PathLike)) else None
            self.run_record = start_run(self.args, checkpoint)
            self._nothing_to_train.checkpoint = None if checkpoint is None else str(checkpoint)
            return super().train(resume_from_checkpoint, *args, **kwargs)

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if not self.args.should_save:
            return
        folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
        if self.run_record is not None:
            write_run_record(folder, self.run_record, self.state.global_step)
        if self.deviation_reference is not None:
            self.deviation_reference.save(folder)
            same_mode_as_training_args(folder)

    def _save(self, output_dir: str | None = None, state_dict=None):
        super()._save(output_dir, state_dict)
        same_mode_as_training_args(output_dir or self.args.output_dir)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None and self.deviation_reference is not None:
            self.deviation_reference.load(checkpoint, self._policy())

    # ---------------------------------------------------------------------------------------------- logging

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._last_rewards_per_func = rewards_per_func  # (all processes' rows, reward funcs): for `REWARDS`
        self.non_finite_guard.saw_rewards(rewards_per_func, self.reward_func_names)
        if self._unscored_counters:
            mode = "train" if self.model.training else "eval"
            for name, total in unscored_answers(self._unscored_counters, self.accelerator).items():
                self._metrics[mode][name].append(total)
        return rewards_per_func
