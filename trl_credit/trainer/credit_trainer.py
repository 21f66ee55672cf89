"""`CreditGRPOTrainer`: TRL's GRPOTrainer with per-token advantages from TACO, EAPO or TIDE.

The trainer never re-implements the GRPO loss. It replaces the `(B,)` sequence advantages with `(B, T)`
token advantages, which TRL's `_compute_loss` accepts as they are (it only unsqueezes a 1-D tensor), so
every `loss_type`, clipping rule, importance-sampling correction and normaliser keeps working.

Where each statistic comes from (see the specification):

* TACO reads the current policy's log-probs and entropies from the training forward itself
  (`_compute_loss` -> `_get_per_token_logps_and_entropies`), so it costs no extra forward.
* EAPO reads the rollout policy's entropies once per generation batch, before TRL shuffles and splits
  it; the entropy quantiles are gathered over every process. No extra forward runs when TRL already
  produced them: its old-log-prob forward (off-policy steps, vLLM importance sampling) or, with
  transformers generation, the LM-head logits of each decoding step.
* TIDE streams the LM heads of the policy and a frozen reference over token and vocabulary chunks once
  per generation batch to get per-token squared Hellinger distances and entropies.
"""

from __future__ import annotations

import copy
import math
import os
import warnings
from contextlib import nullcontext

import torch
from accelerate.utils import is_peft_model
from safetensors.torch import load_model, save_model
from transformers import is_wandb_available
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from transformers.utils import logging
from trl import GRPOTrainer
from trl.models import prepare_deepspeed, prepare_fsdp
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import (
    create_model_from_path,
    disable_dropout_in_model,
    get_comet_experiment_url,
    get_config_model_id,
    get_trackio_space_url,
    use_adapter,
)

from ..methods import (
    eapo_advantages,
    eapo_kappa,
    eapo_normalized_entropy,
    quantile_linear,
    taco_advantages,
    taco_tail_risk,
    tide_advantages,
    tide_entropy_gate,
    tide_scores,
)
from ..statistics import hellinger_and_entropy
from .config import CreditGRPOConfig
from .engines import final_hidden, full_lm_head, unsharded_root, vocab_size

if is_wandb_available():
    import wandb

_ENTROPY_PAD = -1e9  # sentinel for padding gathered entropies; real entropies are >= 0
TIDE_OLD_REFERENCE_NAME = "tide_old_reference.safetensors"  # checkpoint file of TIDE's 'old' reference

logger = logging.get_logger(__name__)


class CreditGRPOTrainer(GRPOTrainer):
    """[`~trl.GRPOTrainer`] whose advantage is reshaped per token by `args.credit_method`.

    Overrides `_generate_and_score_completions` (EAPO, TIDE: statistics of the generation batch),
    `_compute_loss` and `_get_per_token_logps_and_entropies` (TACO: statistics of the training forward).
    Use it exactly like `GRPOTrainer`, with a [`CreditGRPOConfig`].
    """

    config_class = CreditGRPOConfig
    _credit_method: str | None = None  # set by the single-method subclasses
    _tag_names = ["trl", "grpo", "trl-credit"]

    def __init__(self, model, reward_funcs=None, args: CreditGRPOConfig | None = None, *pos_args, **kwargs):
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
        self.credit_method = args.credit_method
        self._taco_batch = None  # the micro-batch whose TACO advantages the next training forward fills in
        self._rollout_entropies = None  # EAPO: captures the first policy forward of a generation batch
        self._generation_entropies = None  # EAPO: captures the LM head's entropies while generating
        initial_copy = self._copy_initial_model(model, args, kwargs.get("peft_config"))
        super().__init__(model, reward_funcs, args, *pos_args, **kwargs)
        self._tide_reference = self._prepare_tide_reference(initial_copy) if self.credit_method == "tide" else None

    # ----------------------------------------------------------------------------------------- TIDE reference

    @staticmethod
    def _copy_initial_model(model, args, peft_config):
        """A copy of an in-memory policy, taken before TRL patches and wraps it, when TIDE needs its own reference.

        TIDE needs no copy when TRL keeps a reference anyway (`beta != 0`) or with PEFT (the adapter is
        disabled instead). A policy given by name is reloaded from it later, as TRL does.
        """
        if args.credit_method != "tide" or isinstance(model, str) or is_peft_model(model) or peft_config is not None:
            return None
        if args.tide_reference == "ref" and args.beta != 0.0:
            return None
        return copy.deepcopy(model)

    def _prepare_tide_reference(self, initial_copy):
        """The model TIDE measures deviation against, prepared like TRL prepares its reference model.

        Returns `None` when no separate model is needed: TRL's own reference (`beta != 0`) or, with PEFT,
        the policy with its adapter disabled.
        """
        policy = self.accelerator.unwrap_model(self.model)
        self._check_tide_support(policy)
        if self.args.tide_reference == "ref" and (self.ref_model is not None or is_peft_model(policy)):
            return None
        if self.args.tide_reference == "old" and (
            is_peft_model(policy) or self.is_deepspeed_enabled or self.is_fsdp_enabled
        ):
            raise ValueError(
                "tide_reference='old' keeps a full copy of the policy that is refreshed every generation batch; it "
                "is supported without PEFT, DeepSpeed and FSDP. Use tide_reference='ref' there."
            )
        reference = initial_copy
        if reference is None:  # the policy was given by name: load the initial weights again, like TRL's reference
            init_kwargs = dict(self.args.model_init_kwargs or {}, dtype=policy.dtype)
            if self.is_deepspeed_enabled or self.accelerator.num_processes > 1:
                init_kwargs["device_map"] = None
            reference = create_model_from_path(get_config_model_id(policy.config), **init_kwargs)
        reference.requires_grad_(False)
        disable_dropout_in_model(reference)
        if self.is_deepspeed_enabled:
            return prepare_deepspeed(reference, self.accelerator)
        if self.is_fsdp_enabled:
            return prepare_fsdp(reference, self.accelerator)
        return self.accelerator.prepare_model(reference, evaluation_mode=True)

    @staticmethod
    def _check_tide_support(policy) -> None:
        config = policy.config.get_text_config()
        for name in ("final_logit_softcapping", "logit_scale"):
            if getattr(config, name, None) not in (None, 1.0):
                raise ValueError(
                    f"credit_method='tide' streams logits = hidden @ lm_head.T; models with {name}="
                    f"{getattr(config, name)} transform their logits further and are not supported"
                )

    # ------------------------------------------------------------------------------------- generation batch

    def _generate_and_score_completions(self, inputs):
        statistic_BT = None  # the method's per-token statistic, kept for the token-credit log
        if self.credit_method != "eapo":
            batch = super()._generate_and_score_completions(inputs)
        else:
            self._rollout_entropies, self._generation_entropies = [], []
            try:
                batch = super()._generate_and_score_completions(inputs)
            finally:
                from_forward, self._rollout_entropies = self._rollout_entropies, None
                from_generation, self._generation_entropies = self._generation_entropies, None
            batch["advantages"], statistic_BT = self._eapo_advantages(
                batch, self._reusable_rollout_entropies(batch, from_forward, from_generation)
            )
        if self.credit_method == "tide":
            batch["advantages"], statistic_BT = self._tide_advantages(batch)
        if self.args.log_token_credit and self.model.training and self.state.global_step % self.args.logging_steps == 0:
            self._log_token_credit(batch, statistic_BT)
        return batch

    def _reusable_rollout_entropies(self, batch, from_forward, from_generation) -> torch.Tensor | None:
        """Rollout-policy entropies TRL's own passes already produced, or `None` when EAPO needs a forward.

        First choice: the old-log-prob forward. It is the first policy forward TRL runs, when it runs at all;
        otherwise the first captured forward may have been the reference one, so it only counts with
        `old_per_token_logps`. Second: the LM-head logits of a single transformers `generate` call (no tools,
        whose outputs would interleave the completion).
        """
        if from_forward and "old_per_token_logps" in batch:
            return from_forward[0]
        if len(from_generation) != 1 or from_generation[0] is None or self.tools:
            return None
        steps_BT, (num_rows, num_tokens) = from_generation[0], batch["completion_ids"].shape
        if steps_BT.size(0) != num_rows:
            return None
        # Completions were cut after EOS and re-padded; steps past a row's end are masked anyway.
        steps_BT = steps_BT[:, :num_tokens]
        return torch.nn.functional.pad(steps_BT, (0, num_tokens - steps_BT.size(1)))

    def _generate_single_turn(self, prompt_ids, *args, **kwargs):
        if self._generation_entropies is None or self.use_vllm or self.use_transformers_continuous_batching:
            return super()._generate_single_turn(prompt_ids, *args, **kwargs)
        steps = []

        def record_entropy(module, module_inputs, logits):
            # One call per decoding step; its last position's distribution sampled the next completion token.
            logps = torch.log_softmax(logits[:, -1].float() / self.temperature, dim=-1)
            steps.append(-(logps.exp() * logps).sum(dim=-1))

        head = self.accelerator.unwrap_model(self.model).get_output_embeddings()
        handle = head.register_forward_hook(record_entropy)
        try:
            result = super()._generate_single_turn(prompt_ids, *args, **kwargs)
        finally:
            handle.remove()
        self._generation_entropies.append(torch.stack(steps, dim=1) if steps else None)
        return result

    def _valid_mask(self, batch) -> torch.Tensor:
        mask_BT = batch["completion_mask"]
        return mask_BT * batch["tool_mask"] if "tool_mask" in batch else mask_BT

    @torch.no_grad()
    def _policy_entropies(self, batch) -> torch.Tensor:
        """One no-grad forward of the rollout policy over the generation batch."""
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        with disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            _, entropy_BT, _ = self._get_per_token_logps_and_entropies(
                self.model,
                input_ids,
                attention_mask,
                batch["completion_ids"].size(1),
                batch_size=self._forward_batch_size(),
                compute_entropy=True,
            )
        return entropy_BT

    def _forward_batch_size(self) -> int:
        return self.args.per_device_train_batch_size if self.model.training else self.args.per_device_eval_batch_size

    def _eapo_advantages(self, batch, entropy_BT: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """EAPO's `(B, T)` advantages and the normalised entropy `h` (for the token-credit log)."""
        mask_BT = self._valid_mask(batch)
        entropy_BT = (self._policy_entropies(batch) if entropy_BT is None else entropy_BT).detach().float()
        q_lo, q_hi = self._global_entropy_quantiles(entropy_BT, mask_BT, self.args.eapo_quantiles)
        kappa = eapo_kappa(self.args.eapo_kappa, self.state.global_step, self.args.eapo_kappa_decay_steps)
        advantages_BT = eapo_advantages(
            batch["advantages"], entropy_BT, mask_BT, kappa=kappa, entropy_bounds=(q_lo, q_hi)
        )
        self._log_credit_metrics(
            "eapo", batch["advantages"], advantages_BT, mask_BT, extra={"q_lo": q_lo, "q_hi": q_hi, "kappa": kappa}
        )
        return advantages_BT, eapo_normalized_entropy(entropy_BT, q_lo, q_hi)

    def _global_entropy_quantiles(self, entropy_BT, mask_BT, quantiles) -> tuple[float, float]:
        """Entropy quantiles over the valid tokens of the whole generation batch, on every process."""
        local_N = entropy_BT[mask_BT.bool()]
        padded_N = self.accelerator.pad_across_processes(local_N, dim=0, pad_index=_ENTROPY_PAD)
        gathered_N = self.accelerator.gather(padded_N)
        gathered_N = gathered_N[gathered_N != _ENTROPY_PAD]
        if gathered_N.numel() == 0:
            return 0.0, 0.0
        return quantile_linear(gathered_N, quantiles[0]).item(), quantile_linear(gathered_N, quantiles[1]).item()

    def _tide_advantages(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """TIDE's `(B, T)` advantages and the deviation `d` (for the token-credit log)."""
        mask_BT = self._valid_mask(batch)
        deviation_BT, entropy_BT = self._tide_statistics(batch, mask_BT)
        num_vocab = vocab_size(self.accelerator.unwrap_model(self.model))
        args = self.args
        advantages_BT = tide_advantages(
            batch["advantages"], deviation_BT, entropy_BT, mask_BT, num_vocab,
            tau=args.tide_tau, kappa=args.tide_kappa, distance=args.tide_distance,
        )
        valid_BT = mask_BT.bool()
        gate_BT = tide_entropy_gate(entropy_BT, num_vocab)
        score_BT = tide_scores(deviation_BT, entropy_BT, num_vocab, args.tide_kappa, args.tide_distance)
        self._log_credit_metrics(
            "tide", batch["advantages"], advantages_BT, mask_BT,
            sums={"mean_deviation": deviation_BT, "mean_gate": gate_BT, "mean_score": score_BT}, valid_BT=valid_BT,
        )
        if args.tide_reference == "old":
            # The next batch measures deviation from the policy as it is now.
            self._tide_reference.load_state_dict(self.accelerator.unwrap_model(self.model).state_dict())
        return advantages_BT, deviation_BT

    @torch.no_grad()
    def _tide_statistics(self, batch, mask_BT) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token squared Hellinger distance to the reference and policy entropy, `(B, T)` each."""
        policy = self.accelerator.unwrap_model(self.model)
        if self._tide_reference is not None:
            reference, reference_context = self.accelerator.unwrap_model(self._tide_reference), nullcontext()
        elif self.ref_model is not None:
            reference, reference_context = self.accelerator.unwrap_model(self.ref_model), nullcontext()
        else:  # PEFT: the initial model is the policy with its adapter disabled (or TRL's "ref" adapter)
            reference = policy
            reference_context = use_adapter(policy, adapter_name="ref" if "ref" in policy.peft_config else None)

        prompt_len, completion_len = batch["prompt_ids"].size(1), batch["completion_ids"].size(1)
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        valid_BT = mask_BT.bool()
        deviation_BT = torch.zeros(valid_BT.shape, device=input_ids.device)
        entropy_BT = torch.zeros(valid_BT.shape, device=input_ids.device)
        # The hidden state at position p predicts token p + 1: completion token t is scored at prompt_len - 1 + t.
        positions = slice(prompt_len - 1, prompt_len - 1 + completion_len)
        step = self._forward_batch_size()
        with (
            disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs),
            unsharded_root(policy),
            unsharded_root(reference) if reference is not policy else nullcontext(),
        ):
            for start in range(0, input_ids.size(0), step):
                rows = slice(start, start + step)
                rows_valid_bT = valid_BT[rows]
                if not rows_valid_bT.any():
                    continue
                hidden_nH = final_hidden(policy, input_ids[rows], attention_mask[rows])[:, positions][rows_valid_bT]
                with reference_context:
                    ref_hidden_nH = final_hidden(reference, input_ids[rows], attention_mask[rows])[:, positions]
                ref_hidden_nH = ref_hidden_nH[rows_valid_bT]
                with full_lm_head(policy) as (weight_VH, bias_V), full_lm_head(reference) as (ref_weight_VH, ref_bias_V):
                    deviation_n, entropy_n = hellinger_and_entropy(
                        hidden_nH, ref_hidden_nH, weight_VH, ref_weight_VH, bias_V, ref_bias_V,
                        temperature=self.temperature,
                        token_chunk_size=self.args.tide_token_chunk_size,
                        vocab_chunk_size=self.args.tide_vocab_chunk_size,
                    )
                deviation_BT[rows][rows_valid_bT] = deviation_n
                entropy_BT[rows][rows_valid_bT] = entropy_n
        return deviation_BT, entropy_BT

    # ------------------------------------------------------------------------------------------ checkpoints

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        # TIDE's 'old' reference is the policy of the previous generation batch, not the checkpoint's weights.
        if self.credit_method == "tide" and self.args.tide_reference == "old" and self.args.should_save:
            folder = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            path = os.path.join(self._get_output_dir(trial=trial), folder, TIDE_OLD_REFERENCE_NAME)
            save_model(self.accelerator.unwrap_model(self._tide_reference), path)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None or self.credit_method != "tide" or self.args.tide_reference != "old":
            return
        path = os.path.join(checkpoint, TIDE_OLD_REFERENCE_NAME)
        if os.path.exists(path):
            load_model(self.accelerator.unwrap_model(self._tide_reference), path, device=str(self.accelerator.device))
        else:
            logger.warning(
                f"{checkpoint} has no {TIDE_OLD_REFERENCE_NAME}: TIDE's 'old' reference starts from the resumed policy "
                "instead of the policy of the previous generation batch."
            )
            self._tide_reference.load_state_dict(self.accelerator.unwrap_model(self.model).state_dict())

    # ------------------------------------------------------------------------------------- training forward

    def _compute_loss(self, model, inputs):
        if self.credit_method != "taco":
            return super()._compute_loss(model, inputs)
        # The buffered micro-batch is reused across `num_iterations`: give TRL a shallow copy whose
        # "advantages" the training forward below replaces, never the shared dict.
        inputs = dict(inputs)
        self._taco_batch = inputs
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._taco_batch = None

    def _get_per_token_logps_and_entropies(self, model, *args, compute_entropy=False, **kwargs):
        # Only the policy's forward computes entropies (TRL patches the reference's head for log-probs only).
        capture_rollout = self._rollout_entropies is not None and not self._rollout_entropies and model is self.model
        fill_taco = self._taco_batch is not None
        logps_BT, entropy_BT, aux_loss = super()._get_per_token_logps_and_entropies(
            model, *args, compute_entropy=compute_entropy or capture_rollout or fill_taco, **kwargs
        )
        if capture_rollout:
            self._rollout_entropies.append(entropy_BT.detach())
        if fill_taco:
            batch, self._taco_batch = self._taco_batch, None  # only the first forward of _compute_loss
            batch["advantages"] = self._taco_advantages(batch, logps_BT.detach(), entropy_BT.detach())
        return logps_BT, entropy_BT if compute_entropy else None, aux_loss

    def _taco_advantages(self, batch, logps_BT, entropy_BT) -> torch.Tensor:
        mask_BT = self._valid_mask(batch)
        alpha, lam = self.args.taco_alpha, self.args.taco_lambda
        advantages_BT = taco_advantages(batch["advantages"], logps_BT, entropy_BT, mask_BT, alpha=alpha, lam=lam)
        valid_BT = mask_BT.bool()
        risk_BT = taco_tail_risk(logps_BT.float(), entropy_BT.float(), alpha)
        positive_BT = valid_BT & (batch["advantages"] > 0).unsqueeze(1)
        self._log_credit_metrics(
            "taco", batch["advantages"], advantages_BT, mask_BT, valid_BT=valid_BT,
            sums={"tail_fraction": (risk_BT > 0).float(), "mean_tail_risk": risk_BT,
                  "pos_adv_fraction": positive_BT.float()},
            ratios={"tail_fraction_pos": ((risk_BT > 0) & positive_BT, positive_BT)},
        )
        return advantages_BT

    # ---------------------------------------------------------------------------------------------- logging

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        from ..rewards import REWARD_STATS

        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._last_rewards_per_func = rewards_per_func  # (all processes' rows, reward funcs): for the token log
        # Answers our math rewards could not score (timeouts, unparseable LaTeX), summed over processes.
        counts = REWARD_STATS.snapshot_and_reset()
        totals = self.accelerator.reduce(torch.tensor(list(counts.values()), device=self.accelerator.device), "sum")
        mode = "train" if self.model.training else "eval"
        for name, total in zip(counts, totals.tolist()):
            self._metrics[mode][name].append(float(total))
        return rewards_per_func

    @torch.no_grad()
    def _log_token_credit(self, batch, statistic_BT) -> None:
        """Append per-token credit of a few completions to `output_dir/token_credit.jsonl`.

        Rows are spread over the local batch so that several prompt groups appear. Every process runs the
        small forward (ZeRO-3 forwards are collective); only the main process writes.
        """
        from ..viz import append_token_credit, token_credit_records_from_batch

        num_rows = batch["completion_ids"].size(0)
        rows = torch.linspace(0, num_rows - 1, min(self.args.token_credit_samples, num_rows)).round().long().unique()
        sub = {key: batch[key][rows] for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")}
        sub.update({key: batch[key][rows] for key in ("tool_mask",) if key in batch})
        mask_bT = self._valid_mask(sub)
        input_ids = torch.cat([sub["prompt_ids"], sub["completion_ids"]], dim=1)
        attention_mask = torch.cat([sub["prompt_mask"], sub["completion_mask"]], dim=1)
        with disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            logps_bT, entropy_bT, _ = self._get_per_token_logps_and_entropies(
                self.model, input_ids, attention_mask, sub["completion_ids"].size(1), compute_entropy=True
            )
        advantages = batch["advantages"][rows]
        advantages_b = advantages if advantages.dim() == 1 else self._sequence_advantages_B(advantages, mask_bT)
        if self.credit_method == "taco":
            # What the first training forward will compute on these rows: the policy has not moved yet.
            advantages = taco_advantages(advantages_b, logps_bT, entropy_bT, mask_bT, self.args.taco_alpha, self.args.taco_lambda)
            statistic_BT = taco_tail_risk(logps_bT.float(), entropy_bT.float(), self.args.taco_alpha)
        elif statistic_BT is not None:
            statistic_BT = statistic_BT[rows]
        if advantages.dim() == 1:
            advantages = advantages.unsqueeze(1) * mask_bT
        if not self.accelerator.is_main_process:
            return
        first_row = self.accelerator.process_index * num_rows
        rewards_per_func = self._last_rewards_per_func[first_row + rows.to(self._last_rewards_per_func.device)]
        rewards_b = (rewards_per_func * self.reward_weights.to(rewards_per_func.device)).nansum(dim=1)
        decode = lambda ids_bT, m_bT: [  # noqa: E731
            self.processing_class.decode(ids[m.bool()], skip_special_tokens=True) for ids, m in zip(ids_bT, m_bT)
        ]
        records = token_credit_records_from_batch(
            step=self.state.global_step, method=self.credit_method,
            prompts=decode(sub["prompt_ids"], sub["prompt_mask"]),
            completions=decode(sub["completion_ids"], sub["completion_mask"]),
            rewards_B=rewards_b.cpu(), advantages_B=advantages_b.cpu(), completion_ids_BT=sub["completion_ids"].cpu(),
            token_advantages_BT=advantages.cpu(), logps_BT=logps_bT.cpu(), entropies_BT=entropy_bT.cpu(),
            mask_BT=mask_bT.cpu(), tokenizer=self.processing_class,
            statistic_BT=None if statistic_BT is None else statistic_BT.cpu(),
        )
        append_token_credit(self.args.output_dir, records)

    @staticmethod
    def _sequence_advantages_B(advantages_BT, mask_BT) -> torch.Tensor:
        """Recover `A_i` from EAPO/TIDE token advantages, whose per-response mean over valid tokens is `A_i`."""
        return (advantages_BT * mask_BT).sum(1) / mask_BT.sum(1).clamp(min=1)

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        """TRL's card, extended with the credit method, its hyperparameters and paper, and training plots."""
        if not self.is_world_process_zero():
            return
        from ..model_card import generate_credit_model_card, load_eval_summaries
        from ..plots import save_training_plots

        policy = self.accelerator.unwrap_model(self.model)
        base_model = get_config_model_id(policy.config)
        plots = save_training_plots(self.state.log_history, self.args.output_dir) if self.state.log_history else []
        card = generate_credit_model_card(
            base_model=None if os.path.isdir(base_model) else base_model,
            model_name=model_name or os.path.basename(os.path.normpath(self.args.output_dir)),
            hub_model_id=self.hub_model_id,
            dataset_name=dataset_name,
            method=self.credit_method,
            hyperparameters=self.args.credit_hyperparameters(),
            tags=[*self._tag_names, self.credit_method, *(tags or [])],
            plots=plots,
            eval_summary=load_eval_summaries(self.args.output_dir) or None,
            wandb_url=wandb.run.url if is_wandb_available() and wandb.run is not None else None,
            trackio_url=get_trackio_space_url(),
            comet_url=get_comet_experiment_url(),
            trainer_name=self._name,
            paper=self._paper,
        )
        card.save(os.path.join(self.args.output_dir, "README.md"))

    @torch.no_grad()
    def _log_credit_metrics(self, prefix, advantages_B, advantages_BT, mask_BT, valid_BT=None, sums=None,
                            ratios=None, extra=None):
        """Log global (all-process) token statistics under `prefix/` and `credit/`.

        `sums` are per-token tensors averaged over valid tokens; `ratios` are `(numerator, denominator)`
        boolean masks; `extra` are scalars already equal on every process.
        """
        mode = "train" if self.model.training else "eval"
        valid_BT = mask_BT.bool() if valid_BT is None else valid_BT
        # Weights are defined where A != 0; there they are the method's multiplier of A.
        nonzero_BT = valid_BT & (advantages_B != 0).unsqueeze(1)
        safe_adv_B = torch.where(advantages_B != 0, advantages_B, torch.ones_like(advantages_B))
        weights_N = (advantages_BT / safe_adv_B.unsqueeze(1))[nonzero_BT]
        stats = {
            f"{prefix}/mean_weight": (weights_N.sum(), nonzero_BT.sum()),
            f"{prefix}/weight_sq": ((weights_N**2).sum(), nonzero_BT.sum()),
            "credit/adv_abs_mean": (advantages_BT[valid_BT].abs().sum(), valid_BT.sum()),
        }
        for name, values_BT in (sums or {}).items():
            stats[f"{prefix}/{name}"] = (values_BT.float()[valid_BT].sum(), valid_BT.sum())
        for name, (numerator_BT, denominator_BT) in (ratios or {}).items():
            stats[f"{prefix}/{name}"] = (numerator_BT.sum(), denominator_BT.sum())
        totals = torch.stack([torch.stack([s.float(), c.float()]) for s, c in stats.values()])
        totals = self.accelerator.reduce(totals.to(self.accelerator.device), reduction="sum")
        means = {name: s / c if c > 0 else float("nan") for name, (s, c) in zip(stats, totals.tolist())}
        mean_sq = means.pop(f"{prefix}/weight_sq")
        means[f"{prefix}/weight_std"] = math.sqrt(max(mean_sq - means[f"{prefix}/mean_weight"] ** 2, 0.0))
        local_max = weights_N.max() if weights_N.numel() else torch.tensor(float("nan"))
        means[f"{prefix}/weight_max"] = self._global_nanmax(local_max)
        means.update({f"{prefix}/{name}": float(value) for name, value in (extra or {}).items()})
        for name, value in means.items():
            self._metrics[mode][name].append(value)

    def _global_nanmax(self, value: torch.Tensor) -> float:
        gathered = self.accelerator.gather(value.reshape(1).float().to(self.accelerator.device))
        gathered = gathered[~torch.isnan(gathered)]
        return gathered.max().item() if gathered.numel() else float("nan")

