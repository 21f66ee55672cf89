"""`CreditGRPOTrainer`: TRL's GRPOTrainer with per-token advantages from a stack of credit methods.

It never re-implements the GRPO loss: it replaces the `(B,)` sequence advantages with `(B, T)` token advantages, which
TRL's `_compute_loss` accepts as they are, so every `loss_type`, clipping rule and normaliser keeps working. Each
method declares the statistics it reads, and where they come from decides its stage; each stage is a method that
writes its outputs into the batch TRL reads next, running the methods through `_run_stack`:

* `_credit_generation_batch(batch)`: methods of generation-batch statistics, in `_generate_and_score_completions`,
  before TRL shuffles and splits the batch (statistics travel as batch keys `credit_<statistic>`).
* `_credit_training_forward(inputs, logps_BT, entropy_BT, hidden)`: methods of the current policy, on the log-probs
  and entropies of TRL's own forward of each loss (no extra forward), handed over by `credit_in_loss_forward`. Only
  with a tool mask does a method that drops tokens get a no-grad forward of the micro-batch first.

The forwards the methods add are logged per step (`credit/extra_forwards`, see `statistics_sources`). With
`log_token_credit=True` the trainer publishes `token_credit_preview`, which its `TokenCreditLog` callback writes.
"""

from __future__ import annotations

import os
import warnings
from collections import Counter
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from trl import GRPOTrainer
from trl.trainer.utils import get_config_model_id

from ..methods import (
    GENERATION_STATISTICS,
    LOSS_FORWARD_STATISTICS,
    POLICY_LOGIT_GAP,
    PREVIOUS_POLICY_DEVIATION,
    REFERENCE_DEVIATION,
    CreditBatch,
    CreditResult,
    get_credit_method,
)
from ..methods.validation import check_result, checked_batch
from .batch_layout import (
    GROUP_INDEX,
    REWARDS,
    SEQUENCE_ADVANTAGES,
    groups_and_rewards,
    loss_weights,
    statistic_key,
)
from .config import CreditGRPOConfig
from .diagnostics import advantage_magnitude, credit_metrics, gather_all, unscored_answers, unscored_counters
from .model_parts import vocab_size
from .recorders import recorded_final_hidden
from .reference import DeviationReference, copy_initial_model
from .run_safety import RunSafety
from .statistics_sources import EXTRA_FORWARDS, EXTRA_REFERENCE_FORWARDS, TOKEN_CREDIT_LOG_FORWARDS, StatisticsSources
from .token_credit_log import TokenCreditLog, TokenCreditPreview, TokenCreditPreviews, token_credit_step
from .token_texts import TokenTexts
from .trl_compat import (
    NORMALISER_AT_GENERATION,
    check_trainer_attributes,
    check_trl_surfaces,
    torch_fused_head,
)


@dataclass
class StackCredit:
    """What a stage's methods gave a batch: `(B, T)` advantages, the `(B,)` sequence advantages they started from,
    the product of the loss weights of the methods that drop tokens (None if none did), and the last method's
    per-token statistic (None if none returned one)."""

    advantages_BT: torch.Tensor
    sequence_B: torch.Tensor
    loss_weights_BT: torch.Tensor | None
    statistic_BT: torch.Tensor | None


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


class CreditGRPOTrainer(RunSafety, StatisticsSources, TokenCreditPreviews, GRPOTrainer):
    """[`~trl.GRPOTrainer`] whose advantage is reshaped per token by the methods of `args.credit_method`.

    Overrides `_generate_and_score_completions` (methods that read the generation batch), and `_compute_loss` with
    `_get_per_token_logps_and_entropies` (methods that read the training forward). Use it exactly like
    `GRPOTrainer`, with a [`CreditGRPOConfig`]. Its model card is TRL's, tagged and cited as `trl_card_attributes`
    says. It stops at the first non-finite step and holds its output folder while it trains (`run_safety`).
    """

    config_class = CreditGRPOConfig
    _credit_method: str | None = None  # set by the single-method subclasses: see `__init_subclass__`
    # The statistics this trainer computes; a subclass that knows more (the credit lab's ground truth) extends it.
    supplied_statistics: tuple[str, ...] = LOSS_FORWARD_STATISTICS + GENERATION_STATISTICS
    _tag_names = list(TRL_CARD_TAGS)
    # The rows of the last training generation batch the token-credit log records, as the training forward credits
    # them (with `log_token_credit=True`, for the batches it logs); None before the first.
    token_credit_preview: TokenCreditPreview | None = None
    # The micro-batch of the loss TRL is computing, and the dtype of the attention mask TRL would build from it, while
    # `credit_in_loss_forward` hands it to TRL's scoring forward; else None.
    _loss_forward: tuple[dict, torch.dtype] | None = None

    def __init_subclass__(cls, credit_method: str | None = None, **kwargs):
        """`class TACOTrainer(CreditGRPOTrainer, credit_method="taco")` pins the trainer to one method and takes its
        display name, paper and Hub tag from the method's registration."""
        super().__init_subclass__(**kwargs)
        if credit_method is not None:
            cls._credit_method = credit_method
            for attribute, value in trl_card_attributes([get_credit_method(credit_method)]).items():
                setattr(cls, attribute, value)

    def __init__(self, model, reward_funcs=None, args: CreditGRPOConfig | None = None, *pos_args, **kwargs):
        check_trl_surfaces()
        if args is None:
            model_name = model if isinstance(model, str) else get_config_model_id(model.config)
            args = self.config_class(output_dir=f"{model_name.split('/')[-1]}-{self._name}")
        self._check_args(args)
        self.credit_method = args.credit_method
        for attribute, value in trl_card_attributes(args.credit_methods).items():  # what TRL's card says
            setattr(self, attribute, value)
        self._plan_stages(args)
        deviations = [s for s in self._generation_statistics if s in (REFERENCE_DEVIATION, PREVIOUS_POLICY_DEVIATION)]
        if len(deviations) > 1:
            raise ValueError(f"credit_method {args.credit_method!r} needs two deviation references: {deviations}")
        initial_copy = copy_initial_model(model, args, kwargs.get("peft_config"), self._generation_statistics)
        super().__init__(model, reward_funcs, args, *pos_args, **kwargs)
        check_trainer_attributes(self)
        self.deviation_reference = DeviationReference(self, initial_copy, deviations[0]) if deviations else None
        self._vocab_size = vocab_size(self.accelerator.unwrap_model(self.model))
        self._token_texts = TokenTexts(self.processing_class)  # completion ids -> token texts (HICRA's grams)
        self._unscored_counters = unscored_counters(self.reward_funcs)
        # Forwards the credit methods run, counted where they run (`_count_forward`), logged once per step.
        self.forward_counts = Counter({EXTRA_FORWARDS: 0})
        if self.deviation_reference is not None:
            self.forward_counts[EXTRA_REFERENCE_FORWARDS] = 0
        if args.log_token_credit:
            self.forward_counts[TOKEN_CREDIT_LOG_FORWARDS] = 0
            self.add_callback(TokenCreditLog(self))

    def _check_args(self, args) -> None:
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
                stacklevel=3,
            )
        args.validate_credit_fields()  # again: attributes may have been set since the config was built

    def _plan_stages(self, args) -> None:
        """Each method of the stack with its hyperparameters, in the stage its statistics decide, and the
        statistics the stages read."""
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
                stacklevel=3,
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

    # ------------------------------------------------------------------------------------- generation batch

    def _generate_and_score_completions(self, inputs):
        # Generation-batch statistics take the policy's entropies and hidden states from TRL's old-log-prob forward where
        # it runs one, else from `generate` where TRL generates in one call (see `statistics_sources`).
        with self._recorded_rollout() as (generation, scoring):
            batch = super()._generate_and_score_completions(inputs)
        num_generations = self.num_generations if self.model.training else self.num_generations_eval
        rewards = (self._last_rewards_per_func * self.reward_weights.to(self._last_rewards_per_func.device)).nansum(1)
        batch.update(groups_and_rewards(batch, rewards, self.accelerator.process_index, num_generations))
        if self._generation_statistics:
            statistics = self._generation_batch_statistics(batch, self._generation_statistics, generation, scoring)
            batch.update({statistic_key(name): value for name, value in statistics.items()})
            if self.deviation_reference is not None:
                self.deviation_reference.after_batch(training=self.model.training)
        statistic_BT = self._credit_generation_batch(batch) if self._generation_methods else None
        if self.args.log_token_credit and self.model.training:
            step = token_credit_step(self.args, self.state, self.num_iterations)
            if step is not None:
                self.token_credit_preview = self._preview_token_credit(batch, statistic_BT, step)
        return batch

    def _credit_generation_batch(self, batch) -> torch.Tensor | None:
        """The generation stage: write the batch's `(B, T)` advantages and sequence advantages and, where a method
        drops tokens, its loss weights into `tool_mask` (which TRL's loss and its normaliser multiply in) with the
        normaliser recounted. Returns the last method's per-token statistic."""
        last_stage = not self._training_forward_methods
        credit = self._run_stack(batch, self._generation_methods, self._batch_statistics(batch), last_stage)
        batch.update({"advantages": credit.advantages_BT, SEQUENCE_ADVANTAGES: credit.sequence_B})
        if credit.loss_weights_BT is not None:
            batch["tool_mask"] = batch.get("tool_mask", 1.0) * credit.loss_weights_BT
            if "num_items_in_batch" in batch:
                kept = (batch["completion_mask"] * batch["tool_mask"]).sum()
                batch["num_items_in_batch"] = self.accelerator.gather(kept).sum()
        return credit.statistic_BT

    # ----------------------------------------------------------------------------------------- the stack

    def _run_stack(self, batch, methods, statistics, last_stage: bool, record_metrics: bool = True) -> StackCredit:
        """Run `methods` in order on `batch`: each method's function between the registry's checks of its batch and
        its result, each seeing the advantages and loss mask the methods before it produced
        (`CreditBatch.followed_by`), starting from the batch's advantages and TRL's loss mask (completion mask x
        tool mask, soft where an earlier stage weighed tokens). Logs each method's metrics (and, at the
        `last_stage`, `credit/adv_abs_mean`) when `record_metrics`."""
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
            vocab_size=self._vocab_size,
            step=self.state.global_step,
            gather=partial(gather_all, self.accelerator),
            clip_range=(self.epsilon_low, self.epsilon_high),
            loss_weights_BT=weights_BT,
            group_index_B=batch.get(GROUP_INDEX),
            rewards_B=batch.get(REWARDS),
            # GTPO's conflict tokens, HICRA's planning tokens: the sampled ids, padded with the tokenizer's pad id.
            completion_ids_BT=batch["completion_ids"],
            pad_token_id=self._token_texts.pad_token_id,
            token_texts=self._token_texts,
        )
        loss_weights_BT, statistic_BT = None, None
        mode = "train" if self.model.training else "eval"
        for method, hyperparameters in methods:
            checked = checked_batch(method, credit_batch, hyperparameters)
            result = method.function(checked, **hyperparameters)
            result = result if isinstance(result, CreditResult) else CreditResult(advantages_BT=result)
            check_result(method, checked, result)
            result.advantages_BT = torch.where(checked.mask_BT, result.advantages_BT.float(), 0.0)
            if record_metrics:
                for name, value in credit_metrics(
                    self.accelerator, method.name, checked.advantages_BT, result, checked.mask_BT
                ).items():
                    self._metrics[mode][name].append(value)
            if result.loss_mask_BT is not None:
                loss_weights_BT = result.loss_mask_BT * (1.0 if loss_weights_BT is None else loss_weights_BT)
            statistic_BT = result.statistic_BT if result.statistic_BT is not None else statistic_BT
            credit_batch = credit_batch.followed_by(result)
        if record_metrics and last_stage:
            magnitude = advantage_magnitude(self.accelerator, credit_batch.advantages_BT, mask_BT)
            self._metrics[mode]["credit/adv_abs_mean"].append(magnitude)
        return StackCredit(credit_batch.advantages_BT, sequence_B, loss_weights_BT, statistic_BT)

    # ------------------------------------------------------------------------------------- training forward

    def _compute_loss(self, model, inputs):
        if not self._training_forward_methods:
            loss = super()._compute_loss(model, inputs)
        else:
            # The buffered micro-batch is reused across `num_iterations`: TRL gets a shallow copy whose advantages
            # (and loss mask) are filled in, never the shared dict.
            inputs = dict(inputs)
            if "tool_mask" in inputs and self._drops_tokens_in_forward:
                # TRL folds the tool mask into its loss mask before its forward: the weights must be in it first.
                with recorded_final_hidden(self._policy(), self._records_hidden) as hidden:
                    logps_BT, entropy_BT = self.policy_logps_and_entropy(inputs)
                self._credit_training_forward(inputs, logps_BT, entropy_BT, hidden)
                loss = super()._compute_loss(model, inputs)
            else:
                with self.credit_in_loss_forward(inputs):
                    loss = super()._compute_loss(model, inputs)
        if not self.model.training or self.accelerator.sync_gradients:  # once per optimizer step, or eval batch
            mode = "train" if self.model.training else "eval"
            for name, count in self.forward_counts.items():
                self._metrics[mode][name].append(float(count))
            self.forward_counts = Counter(dict.fromkeys(self.forward_counts, 0))
        return loss

    @contextmanager
    def credit_in_loss_forward(self, inputs):
        """Inside the block, TRL's next scoring call (`_get_per_token_logps_and_entropies`) is the forward of the loss
        of `inputs`, and the training-forward stage runs on its log-probs and entropies.

        The one hand-over from `_compute_loss` to TRL's scoring method, which receives no batch: TRL's
        `_compute_loss` makes that call once, for its policy forward, and reads the advantages and its loss mask after
        it (`tests/test_trl_compat.py` checks TRL's order; `tests/test_trainer.py` and `tests/test_baselines.py` what
        its loss consumed). The slot is taken by that first call and cleared when the block ends.
        """
        mask_dtype = torch.promote_types(inputs["prompt_mask"].dtype, inputs["completion_mask"].dtype)
        if self._drops_tokens_in_forward:
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
        in the forward of a loss (`credit_in_loss_forward`), followed by the training-forward stage."""
        loss_forward, self._loss_forward = self._loss_forward, None  # the first call of the loss is its forward
        if loss_forward is not None:
            # TRL built the attention mask from the float copy of the completion mask: scored as TRL would score the
            # buffered micro-batch, in its own dtype (the values are 0 and 1 either way).
            attention_mask = attention_mask.to(loss_forward[1])
        # TRL's fused head returns no maximum logit: min-p's logit gap is streamed from the final hidden states of this
        # very forward, recorded from the backbone around it (no second backbone forward).
        records_hidden = loss_forward is not None and self._records_hidden
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

    def _credit_training_forward(self, inputs, logps_BT, entropy_BT, hidden) -> None:
        """The training-forward stage: write the micro-batch's `(B, T)` advantages and, where a method drops tokens,
        its loss weights into TRL's loss mask (`tool_mask` when the batch has one, which TRL multiplies in before its
        forward; else the float copy of `completion_mask` TRL holds as its loss mask, in place)."""
        statistics = self._forward_statistics(inputs, logps_BT, entropy_BT, hidden)
        credit = self._run_stack(inputs, self._training_forward_methods, statistics, last_stage=True)
        inputs.update({"advantages": credit.advantages_BT, SEQUENCE_ADVANTAGES: credit.sequence_B})
        if credit.loss_weights_BT is not None:
            if "tool_mask" in inputs:
                inputs["tool_mask"] = inputs["tool_mask"] * credit.loss_weights_BT
            else:
                inputs["completion_mask"].mul_(credit.loss_weights_BT)

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
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._last_rewards_per_func = rewards_per_func  # (all processes' rows, reward funcs): for `REWARDS`
        if self._unscored_counters:
            mode = "train" if self.model.training else "eval"
            for name, total in unscored_answers(self._unscored_counters, self.accelerator).items():
                self._metrics[mode][name].append(total)
        return rewards_per_func
