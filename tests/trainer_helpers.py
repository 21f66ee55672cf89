"""Helpers shared by the trainer tests (test_trainer, test_engines, test_resume, test_architectures, ...).

- `AdvantageRecorder` wraps TRL's `GRPOTrainer` methods (which `CreditGRPOTrainer` reaches through `super()`). For the
  trainer's stack (`args.credit_stack`, each method's `statistics_for`), it recomputes every declared statistic the
  plain way (full logits of the generating policy, of the reference model, of the policy in the loss), runs the
  reference rules of `tests/reference_credit.py` in the stage the specification puts each method (the generation
  batch for methods of rollout statistics, each micro-batch for methods of the current policy), and checks the
  advantages and the loss mask TRL's `_compute_loss` consumed against them. Nothing in it names a method.
  `TwoProcessRecorder` does the same on each of several processes, the generation stage over every process's rows.
- `DOCUMENTED_STACKS`, `path_cases`: the stacks the docs name, and every registered method plus those stacks, with
  the settings (`MOVING_SETTINGS`) under which each moves credit.
- `assert_all_params_changed`: TRL's own check that a short run trained every trainable parameter.
- `on_vllm_branch` (with `FakeVLLMGeneration`) and `make_rollout_func`: TRL's vLLM path on a CPU, a `rollout_func` sampling from the policy
  with log-probs perturbed like an inference engine's, and a stand-in for the weight sync.
"""

import dataclasses

import pytest
import torch
from conftest import PACKAGE_METHODS, naive_logprobs, sampled
from reference_credit import (
    MOVING_SETTINGS,
    TINY_MODEL_MOVING_SETTINGS,
    ReferenceBatch,
    assert_credit_moved,
    credit_moved_share,
    documented_stacks,
    reference_stack,
)
from reference_formulas import unsampled_statistics
from trl import GRPOTrainer

from trl_credit.methods import ROLLOUT_UNSAMPLED

# The statistics of the current policy, which put a method in the training forward (the specification's stages).
TRAINING_FORWARD_STATISTICS = ("policy_logps", "policy_entropy", "policy_logit_gap")
FLOAT32_EPSILON = torch.finfo(torch.float32).eps
# The stacks README.md and docs/ name, and the official actor's variants (read from the pages).
DOCUMENTED_STACKS = tuple(documented_stacks())


def moving_settings(credit_method: str) -> dict:
    """The settings under which every method of `credit_method` (a name or a `+` stack) moves credit on the tiny
    model: `MOVING_SETTINGS`, with `TINY_MODEL_MOVING_SETTINGS` on top."""
    settings = {}
    for name in credit_method.split("+"):
        settings.update(MOVING_SETTINGS.get(name, {}))
        settings.update(TINY_MODEL_MOVING_SETTINGS.get(name, {}))
    return settings


def path_cases(excluded: dict[str, str] | None = None) -> list:
    """`pytest.param(credit_method)` for GRPO, every registered method and every documented stack; a case in
    `excluded` (name -> reason) is skipped with its reason, so that `--collect-only` names it."""
    cases = []
    for name in ["grpo", *PACKAGE_METHODS, *DOCUMENTED_STACKS]:
        reason = (excluded or {}).get(name)
        marks = [pytest.mark.skip(reason=reason)] if reason else []
        cases.append(pytest.param(name, marks=marks, id=name))
    return cases


def _row_key(prompt_ids, completion_ids):
    return tuple(prompt_ids.tolist()) + (-1,) + tuple(completion_ids.tolist())


def _inputs(batch):
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    mask = batch["completion_mask"] * batch["tool_mask"] if "tool_mask" in batch else batch["completion_mask"]
    return input_ids, attention_mask, mask


def token_texts_of(tokenizer):
    """`texts(ids) -> [text of each id]`: each token decoded after the letter `a` (a word-level or SentencePiece
    tokenizer drops the space in front of a token decoded alone), that letter cut off."""
    anchor = tokenizer.encode("a", add_special_tokens=False)
    anchor_text = tokenizer.decode(anchor, clean_up_tokenization_spaces=False)

    def texts(ids):
        decoded = [tokenizer.decode(anchor + [i], clean_up_tokenization_spaces=False) for i in ids]
        return [text[len(anchor_text) :] if text.startswith(anchor_text) else text for text in decoded]

    return texts


@torch.no_grad()
def frozen_copy(model):
    """A new model of `model`'s class and config holding a copy of its weights, in eval mode. Not `copy.deepcopy`:
    accelerate wraps a prepared model's `forward` in a closure over the original, which a deep copy would share."""
    with torch.random.fork_rng(devices=[]):  # its random initialisation must not move the run's random stream
        copied = type(model)._from_config(model.config, torch_dtype=model.dtype)
    copied.load_state_dict(model.state_dict())
    return copied.eval()


@torch.no_grad()
def policy_statistics(model, batch, temperature, mask_BT):
    """Every per-token statistic of `model` on `batch`, from its full float64 log-probs: sampled-token log-prob,
    entropy, the other tokens' probability mass and sum of squares, and logit gap to the largest logit, zero where
    masked; and the `(B, T, V)` log-probs."""
    logp_BTV = naive_logprobs(model, batch, temperature, torch.float64)
    logps_BT = sampled(logp_BTV, batch["completion_ids"])
    probs_BTV = logp_BTV.exp()
    unsampled_mass_BT, unsampled_sum_sq_BT = unsampled_statistics(logp_BTV, batch["completion_ids"])
    values = {
        "logps": logps_BT,
        "entropy": -(probs_BTV * logp_BTV).sum(-1),
        "unsampled_mass": unsampled_mass_BT,
        "unsampled_sum_sq_probs": unsampled_sum_sq_BT,
        "logit_gap": logps_BT - logp_BTV.max(-1).values,  # z_y - max z at the temperature: log-softmax shifts both
    }
    return {name: torch.where(mask_BT, value, 0.0) for name, value in values.items()}, logp_BTV


def float32_slack(stage, credit, hyperparameters, draws=4):
    """The reference stack on `credit`, and how far its advantages and loss weights move when every statistic moves
    by float32 rounding: eps32 * max(1, |x|) for a statistic with an absolute rounding error (a log-prob carries the
    rounding of its log-normaliser), eps32 * |x| for one summed from non-negative terms (`ROLLOUT_UNSAMPLED`: OTB's
    `1 - p` and `sum_{v != y} p_v^2`, exact as p -> 1); with signs drawn at random (seeded), and with each row's sign
    the k-th bit of its index, then its opposite, for every bit. The trainer's statistics come from TRL's float32
    forward, so where a rule is ill-conditioned (a top-k or quantile cut between two near-equal tokens) the trainer and
    the float64 reference may part by more than the tolerance; the comparison allows that much there, and only there.
    Tokens of two rows that share a prefix have equal statistics, and float32 may order them either way at a cut: the
    bit draws move every such pair apart in both orders (random signs miss one order of a given pair with probability
    0.57 in 4 draws)."""
    exact = reference_stack(stage, credit, hyperparameters)
    generator = torch.Generator().manual_seed(0)
    rows = credit.mask_BT.size(0)
    bits_BK = (torch.arange(rows).unsqueeze(1) >> torch.arange(max(rows - 1, 1).bit_length())) & 1
    row_signs = [side * (2.0 * bits_BK[:, k : k + 1] - 1) for k in range(bits_BK.size(1)) for side in (1, -1)]
    slack_BT = torch.zeros_like(exact.advantages_BT)
    slack_weights_BT = torch.zeros_like(exact.loss_weights_BT)
    for row_signs_B1 in [None] * draws + row_signs:
        nudged = {}
        for name, value_BT in credit.statistics.items():
            if row_signs_B1 is None:
                signs_BT = torch.randint(0, 2, value_BT.shape, generator=generator).double() * 2 - 1
            else:
                signs_BT = row_signs_B1.double().expand_as(value_BT)
            scale_BT = value_BT.abs() if name in ROLLOUT_UNSAMPLED else value_BT.abs().clamp(min=1.0)
            step_BT = FLOAT32_EPSILON * scale_BT * credit.mask_BT
            nudged[name] = value_BT + signs_BT * step_BT
        other = reference_stack(stage, dataclasses.replace(credit, statistics=nudged), hyperparameters)
        slack_BT = torch.maximum(slack_BT, (other.advantages_BT - exact.advantages_BT).abs())
        slack_weights_BT = torch.maximum(slack_weights_BT, (other.loss_weights_BT - exact.loss_weights_BT).abs())
    return exact, slack_BT, slack_weights_BT


def assert_within(got_BT, want_BT, slack_BT, atol, what):
    """|got - want| <= atol + atol |want| + slack at every position (`torch.testing.assert_close` with a per-token
    allowance)."""
    excess_BT = (got_BT - want_BT).abs() - (atol + atol * want_BT.abs() + slack_BT)
    if (excess_BT > 0).any():
        worst = (got_BT - want_BT).abs().max().item()
        raise AssertionError(
            f"{what}: {int((excess_BT > 0).sum())} positions differ beyond the tolerance (largest |difference| "
            f"{worst:.3e}, first at flat index {int((excess_BT > 0).flatten().nonzero()[0])}); got {got_BT}, want {want_BT}"
        )


class AdvantageRecorder:
    """Expected token advantages and loss mask of the trainer's stack, computed outside the trainer, checked where
    TRL's `_compute_loss` consumes them. Keeps `checked_batches`, `max_difference` (largest |consumed - expected| of
    an advantage or a loss-mask weight) and `moved_share()` (the share of valid tokens whose credit differs from
    GRPO's broadcast advantage, over every checked micro-batch). `atol`: the tolerance of the comparison, widened
    only where float32 rounding of the statistics moves the reference (`float32_slack`; counted in `ill_conditioned`)."""

    def __init__(self, monkeypatch, trainer, atol=1e-5):
        self.trainer, self.atol = trainer, atol
        args = trainer.args
        methods = [step.method for step in args.credit_stack]
        self.hyperparameters = {m.name: args.method_hyperparameters(m) for m in methods}
        stages = {
            m.name: any(s in TRAINING_FORWARD_STATISTICS for s in m.statistics_for(self.hyperparameters[m.name]))
            for m in methods
        }
        self.generation_stage = [name for name, forward in stages.items() if not forward]
        self.forward_stage = [name for name, forward in stages.items() if forward]
        self.statistics = {s for m in methods for s in m.statistics_for(self.hyperparameters[m.name])}
        policy = trainer.accelerator.unwrap_model(trainer.model)
        # The frozen initial model, and the policy of the previous generation batch (the initial one at first).
        deviations = self.statistics & {"reference_deviation", "previous_policy_deviation"}
        self.reference_model = frozen_copy(policy) if deviations else None
        self.token_texts = token_texts_of(trainer.processing_class)
        self.expected = {}
        self.checked_batches, self.max_difference, self.tie_swaps = 0, 0.0, 0
        self.ill_conditioned = 0  # checked tokens where float32 rounding of the statistics moves the reference
        self.moved_tokens, self.valid_tokens = 0.0, 0
        self._rewards_B, self._forward_expected = None, None
        original_generate = GRPOTrainer._generate_and_score_completions
        original_rewards = GRPOTrainer._calculate_rewards
        original_compute_loss = GRPOTrainer.compute_loss
        original_loss = GRPOTrainer._compute_loss

        def rewards(trainer_self, *a, **kw):
            rewards_per_func = original_rewards(trainer_self, *a, **kw)
            weights = trainer_self.reward_weights.to(rewards_per_func.device)
            self._rewards_B = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)  # TRL's reward of each row
            return rewards_per_func

        def generate(trainer_self, inputs):
            batch = original_generate(trainer_self, inputs)
            self._expect_generation(batch)
            return batch

        def compute_loss(trainer_self, model, inputs, *args, **kwargs):
            # Before the trainer's `_compute_loss` starts: its training forward is the only one TRL's loss sees.
            self._forward_expected = self._expect_training_forward(inputs)
            return original_compute_loss(trainer_self, model, inputs, *args, **kwargs)

        def inner_loss(trainer_self, model, inputs):
            loss = original_loss(trainer_self, model, inputs)
            self._check(inputs, self._forward_expected)
            return loss

        monkeypatch.setattr(GRPOTrainer, "_calculate_rewards", rewards)
        monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", generate)
        monkeypatch.setattr(GRPOTrainer, "compute_loss", compute_loss)
        monkeypatch.setattr(GRPOTrainer, "_compute_loss", inner_loss)

    def moved_share(self) -> float:
        return self.moved_tokens / max(self.valid_tokens, 1)

    def assert_credit_moved(self):
        """The stack moved credit (the shared rule of `reference_credit`); GRPO, an empty stack, moved none."""
        if self.trainer.args.credit_stack:
            assert_credit_moved(self.trainer.args.credit_method, self.moved_share())
        else:
            assert self.moved_share() == 0.0, "GRPO's advantages differ from its own broadcast A_i"

    def _reference_batch(self, advantages_BT, sequence_B, mask_BT, loss_weights_BT, statistics, **fields):
        trainer = self.trainer
        return ReferenceBatch(
            advantages_BT=advantages_BT,
            sequence_advantages_B=sequence_B,
            mask_BT=mask_BT,
            loss_weights_BT=loss_weights_BT,
            statistics=statistics,
            vocab_size=self._vocab_size,
            step=trainer.state.global_step,
            clip_range=(trainer.epsilon_low, trainer.epsilon_high),
            pad_token_id=trainer.processing_class.pad_token_id,
            token_texts=self.token_texts,
            **fields,
        )

    @torch.no_grad()
    def _expect_generation(self, batch):
        """The generation stage over the whole generation batch (every process's rows, `gather_rows`), from the
        generating policy, keyed by this process's rows."""
        trainer = self.trainer
        _, _, base_mask = _inputs(batch)
        mask_BT = base_mask.bool()
        policy = trainer.accelerator.unwrap_model(trainer.model)
        values, logp_BTV = policy_statistics(policy, batch, trainer.temperature, mask_BT)
        self._vocab_size = logp_BTV.size(-1)
        self.on_generation(batch, values["logps"], mask_BT)
        local = {
            "base_mask": base_mask.double(),
            "sequence_B": batch["advantages"].double(),
            "completion_ids_BT": batch["completion_ids"],
            "rollout_logps": values["logps"],
            "rollout_entropy": values["entropy"],
            "rollout_unsampled_mass": values["unsampled_mass"],
            "rollout_unsampled_sum_sq_probs": values["unsampled_sum_sq_probs"],
        }
        if self.reference_model is not None:
            logq_BTV = naive_logprobs(self.reference_model, batch, trainer.temperature, torch.float64)
            deviation_BT = (1 - torch.exp(0.5 * (logp_BTV + logq_BTV)).sum(-1)).clamp(0, 1)  # squared Hellinger
            for name in ("reference_deviation", "previous_policy_deviation"):
                local[name] = torch.where(mask_BT, deviation_BT, 0.0)
            if "previous_policy_deviation" in self.statistics and trainer.model.training:
                self.reference_model = frozen_copy(policy)
        rows_all = self.gather_rows(local)
        mask_all_BT = rows_all["base_mask"].bool()
        entropy_BT = rows_all["rollout_entropy"]
        mean_entropy = entropy_BT[mask_all_BT].mean() if mask_all_BT.any() else torch.tensor(0.0, dtype=torch.float64)
        rows_all["rollout_mean_entropy"] = torch.where(mask_all_BT, mean_entropy, 0.0)
        statistics = {name: value for name, value in rows_all.items() if name in self.statistics}
        sequence_B = rows_all["sequence_B"]
        # TRL samples a group in a row, of `num_generations_eval` completions in an evaluation.
        group_size = trainer.num_generations if trainer.model.training else trainer.num_generations_eval
        group_index_B = torch.arange(sequence_B.size(0)) // group_size
        credit = self._reference_batch(
            sequence_B.unsqueeze(1) * mask_all_BT,
            sequence_B,
            mask_all_BT,
            mask_all_BT.double(),
            statistics,
            group_index_B=group_index_B,
            rewards_B=self._rewards_B.double().cpu(),  # TRL gathers the rewards of every process
            completion_ids_BT=rows_all["completion_ids_BT"],
        )
        slack_BT, slack_weights_BT = torch.zeros_like(credit.advantages_BT), torch.zeros_like(credit.loss_weights_BT)
        if self.generation_stage:
            handed = credit
            credit, slack_BT, slack_weights_BT = float32_slack(self.generation_stage, credit, self.hyperparameters)
            self.on_stage(self.generation_stage, handed, credit, slack_BT, slack_weights_BT)
        self.expected = {}  # TRL buffers the micro-batches of the latest generation batch only
        rows, width = mask_BT.shape
        first = self.first_local_row(rows)
        for i in range(rows):
            at = (first + i, slice(0, width))  # this process's row in the whole batch, at its own width
            row = {name: getattr(credit, name)[at] for name in ("advantages_BT", "mask_BT", "loss_weights_BT")}
            for name in ("sequence_advantages_B", "group_index_B", "rewards_B"):
                row[name] = getattr(credit, name)[first + i]
            row["statistics"] = {name: value[at] for name, value in credit.statistics.items()}
            row["slack_BT"], row["slack_weights_BT"] = slack_BT[at], slack_weights_BT[at]
            row["base_mask"] = base_mask[i].double()
            self.expected.setdefault(_row_key(batch["prompt_ids"][i], batch["completion_ids"][i]), []).append(row)

    def gather_rows(self, rows: dict) -> dict:
        """Every process's rows of each `(B, ...)` tensor, in process order, completions padded on the right to one
        width (ids with the pad token). One process: `rows` itself."""
        return rows

    def first_local_row(self, rows: int) -> int:
        """Where this process's `rows` rows start among `gather_rows`' rows."""
        return 0

    def on_generation(self, batch, rollout_logps_BT, mask_BT):
        """A subclass's checks of the generation batch (the policy's sampled-token log-probs given, float64)."""

    def on_stage(self, stage, handed, expected, slack_BT, slack_weights_BT):
        """A subclass's look at one stage of the reference stack: the methods `stage`, the batch `handed` to it, the
        batch it `expected` back and the float32 allowance of the comparison (`float32_slack`)."""

    def _rows(self, inputs):
        rows = []
        for i in range(inputs["completion_ids"].size(0)):
            candidates = self.expected[_row_key(inputs["prompt_ids"][i], inputs["completion_ids"][i])]
            rows.append(candidates)
        return rows

    @torch.no_grad()
    def _expect_training_forward(self, inputs):
        """Each row's candidates (rows repeated in a generation batch may differ in batch-wide methods), after the
        training-forward stage run on the policy as TRL's loss sees it (no optimizer step runs before its forward)."""
        candidates = self._rows(inputs)
        if not self.forward_stage:
            return candidates
        trainer = self.trainer
        # A completion sampled twice has one candidate per copy, and the copies' rewards (so their advantages) may
        # differ: each row's is the candidate with the sequence advantage TRL carries for it.
        carried_B = inputs.get("credit_sequence_advantages", inputs["advantages"]).double().cpu()
        first = [
            min(rows, key=lambda row, a=carried_B[i]: abs(float(row["sequence_advantages_B"]) - float(a)))
            for i, rows in enumerate(candidates)
        ]
        stack = {name: torch.stack([row[name] for row in first]) for name in first[0] if name != "statistics"}
        mask_BT = stack["mask_BT"]
        incoming_BT = stack["advantages_BT"]
        # The policy's forward (a collective under ZeRO-3) before any check that may raise: a process whose check
        # fails (`TwoProcessRecorder` keeps the failure and goes on) must still run every collective the others run.
        values, _ = policy_statistics(trainer.model, inputs, trainer.temperature, stack["base_mask"].bool())
        if self.generation_stage:
            # The generation stage's output, as the batch carries it (float32), once it equals the reference's: a
            # selection of the next stage (STAPO's positive tokens) must see the same numbers as the trainer's, and
            # an advantage of 1e-9 in float64 may be 0 in float32.
            carried_BT = inputs["advantages"].double().cpu() * mask_BT
            assert_within(carried_BT, incoming_BT, stack["slack_BT"], self.atol, "the generation stage's advantages")
            self.max_difference = max(self.max_difference, (carried_BT - incoming_BT).abs().max().item())
            incoming_BT = carried_BT
        statistics = {name: torch.stack([row["statistics"][name] for row in first]) for name in first[0]["statistics"]}
        statistics.update(
            {f"policy_{name}": torch.where(mask_BT, values[name], 0.0) for name in ("logps", "entropy", "logit_gap")}
        )
        statistics = {name: value for name, value in statistics.items() if name in self.statistics}
        credit = self._reference_batch(
            incoming_BT,
            stack["sequence_advantages_B"],
            mask_BT,
            stack["loss_weights_BT"],
            statistics,
            group_index_B=stack["group_index_B"],
            rewards_B=stack["rewards_B"],
            completion_ids_BT=inputs["completion_ids"],
        )
        handed = credit
        credit, slack_BT, slack_weights_BT = float32_slack(self.forward_stage, credit, self.hyperparameters)
        self.on_stage(self.forward_stage, handed, credit, slack_BT, slack_weights_BT)
        ranked_BTS = torch.stack([credit.statistics[name] for name in sorted(credit.statistics)], dim=-1)
        return [
            [
                {
                    **row,
                    "advantages_BT": credit.advantages_BT[i],
                    "loss_weights_BT": credit.loss_weights_BT[i],
                    "slack_BT": slack_BT[i],
                    "slack_weights_BT": slack_weights_BT[i],
                    "incoming": incoming_BT[i],
                    "ranked": ranked_BTS[i],
                }
            ]
            for i, row in enumerate(first)
        ]

    @torch.no_grad()
    def _check(self, inputs, expected_rows):
        """TRL's loss consumed the expected advantages and loss mask (completion mask x tool mask, as TRL reads it)."""
        base_BT = torch.stack([rows[0]["base_mask"] for rows in expected_rows])
        consumed = inputs["advantages"].double().cpu()
        if consumed.dim() == 1:  # GRPO: TRL broadcasts its sequence advantage
            consumed = consumed.unsqueeze(1) * base_BT
        loss_mask = inputs["completion_mask"].double().cpu()
        if "tool_mask" in inputs:
            loss_mask = loss_mask * inputs["tool_mask"].double().cpu()
        chosen = []
        for i, rows in enumerate(expected_rows):
            row_differences = []
            for row in rows:
                want_adv = row["advantages_BT"] * base_BT[i]
                want_mask = row["loss_weights_BT"] * base_BT[i]
                row_differences.append(
                    max(
                        ((consumed[i] - want_adv) * base_BT[i]).abs().max().item(),
                        (loss_mask[i] - want_mask).abs().max().item(),
                    )
                )
            chosen.append(rows[row_differences.index(min(row_differences))])
        want_BT = torch.stack([row["advantages_BT"] for row in chosen]) * base_BT
        weights_BT = torch.stack([row["loss_weights_BT"] for row in chosen]) * base_BT
        if "ranked" in chosen[0]:
            want_BT, weights_BT = self._tie_swaps(chosen, consumed * base_BT, loss_mask, want_BT, weights_BT)
        slack_BT = torch.stack([row["slack_BT"] for row in chosen]) * base_BT
        slack_weights_BT = torch.stack([row["slack_weights_BT"] for row in chosen]) * base_BT
        for i in range(base_BT.size(0)):
            assert_within(consumed[i] * base_BT[i], want_BT[i], slack_BT[i], self.atol, f"row {i} advantages")
            assert_within(loss_mask[i], weights_BT[i], slack_weights_BT[i], self.atol, f"row {i} loss mask")
        self.ill_conditioned += int(((slack_BT > self.atol) | (slack_weights_BT > self.atol)).sum())
        difference = max(
            ((consumed * base_BT - want_BT).abs().max().item(), (loss_mask - weights_BT).abs().max().item())
        )
        self.max_difference = max(self.max_difference, difference)
        sequence_B = torch.stack([rows[0]["sequence_advantages_B"] for rows in expected_rows])
        valid = int(base_BT.sum())
        share = credit_moved_share(consumed, sequence_B, base_BT.bool(), loss_mask)
        self.moved_tokens += share * valid
        self.valid_tokens += valid
        self.checked_batches += 1

    def _tie_swaps(self, chosen, consumed_BT, loss_mask_BT, want_BT, weights_BT):
        """A rule that ranks tokens (STARE's top-k surprisals) may take either of two tokens whose statistics are
        equal (rows sharing a prefix): where the trainer and the reference took different members of such a tie, the
        two tokens' factors (advantage / incoming advantage) and loss weights are swapped. Those pairs take the
        trainer's values, counted in `tie_swaps`; any other difference stays one."""
        incoming_BT = torch.stack([row["incoming"] for row in chosen])
        ranked_BTS = torch.stack([row["ranked"] for row in chosen])
        tol = 10 * self.atol
        differs = ((consumed_BT - want_BT).abs() > tol) | ((loss_mask_BT - weights_BT).abs() > tol)
        positions = [tuple(p) for p in differs.nonzero().tolist()]
        if not positions or (incoming_BT[differs] == 0).any():
            return want_BT, weights_BT

        def factor(values_BT, p):
            return values_BT[p] / incoming_BT[p]

        unpaired = set(positions)
        for p in positions:
            if p not in unpaired:
                continue
            for q in unpaired - {p}:
                same = (ranked_BTS[p] - ranked_BTS[q]).abs().max() <= 1e-9  # the package's float32 ties exactly
                tied = same and incoming_BT[p].sign() == incoming_BT[q].sign()
                if tied and all(
                    abs(factor(consumed_BT, a) - factor(want_BT, b)) <= tol
                    and abs(loss_mask_BT[a] - weights_BT[b]) <= tol
                    for a, b in ((p, q), (q, p))
                ):
                    unpaired -= {p, q}
                    break
        swapped = set(positions) - unpaired
        want_BT, weights_BT = want_BT.clone(), weights_BT.clone()
        for p in swapped:
            want_BT[p], weights_BT[p] = consumed_BT[p], loss_mask_BT[p]
        self.tie_swaps += len(swapped) // 2
        return want_BT, weights_BT


class TwoProcessRecorder(AdvantageRecorder):
    """`AdvantageRecorder` on one of several processes (`tests/multiproc_worker.py`, the multi-node test): the
    generation stage's reference over every process's rows, and each difference kept in `failures` instead of raised
    (a process that stopped would leave the others waiting in a collective)."""

    def __init__(self, monkeypatch, trainer):
        super().__init__(monkeypatch, trainer)
        self.failures = []

    def gather_rows(self, rows):
        accelerator, pad_id = self.trainer.accelerator, self.trainer.processing_class.pad_token_id
        gathered = {}
        for name, value in rows.items():  # the same names in the same order on every process: collectives
            if value.dim() == 2:
                value = accelerator.pad_across_processes(value, dim=1, pad_index=pad_id if "ids" in name else 0)
            gathered[name] = accelerator.gather(value.contiguous()).cpu()
        return gathered

    def first_local_row(self, rows):
        return self.trainer.accelerator.process_index * rows  # TRL gives every process as many rows

    def _keep(self, error):
        self.failures.append(f"step {self.trainer.state.global_step}: {type(error).__name__}: {error}"[:2000])

    def _expect_training_forward(self, inputs):
        try:
            return super()._expect_training_forward(inputs)
        except (AssertionError, KeyError) as error:
            self._keep(error)
            return None

    def _check(self, inputs, expected_rows):
        if expected_rows is not None:
            try:
                super()._check(inputs, expected_rows)
            except AssertionError as error:
                self._keep(error)


class LossRecorder:
    """Checks, where TRL's loss consumes them, the token advantages and the loss mask TRL's loss read against
    `expected(trainer, micro_batch) -> (advantages_BT, loss_mask_BT or None)`, worked out (after TRL's loss, by then the
    micro-batch holds GRPO's sequence advantages) on the micro-batch with its buffered completion mask, and TRL's own
    loss on that micro-batch with those advantages and the dropped tokens in its tool mask (the documented semantics)
    against the loss the trainer returned. `moved_share`: the largest share of tokens whose credit moved
    (`credit_moved_share`), for `assert_credit_moved`."""

    def __init__(self, monkeypatch, expected, atol):
        self.checked, self.moved_share = 0, 0.0
        original_compute_loss, original_loss = GRPOTrainer.compute_loss, GRPOTrainer._compute_loss

        def compute_loss(trainer, model, inputs, *args, **kwargs):
            self.batch = dict(inputs)  # the micro-batch as buffered (the trainer may drop tokens from its loss mask)
            return original_compute_loss(trainer, model, inputs, *args, **kwargs)

        def inner_loss(trainer, model, inputs):
            loss = original_loss(trainer, model, inputs)  # the loss forward fills in inputs["advantages"]
            with torch.no_grad():  # the policy has not moved: the optimizer steps after the backward pass
                advantages, loss_mask = expected(trainer, dict(inputs, completion_mask=self.batch["completion_mask"]))
            torch.testing.assert_close(inputs["advantages"], advantages, atol=atol, rtol=atol)
            buffered_mask = self.batch["completion_mask"]
            share = credit_moved_share(advantages, inputs["credit_sequence_advantages"], buffered_mask, loss_mask)
            self.moved_share = max(self.moved_share, share)
            # TRL's loss mask, completion_mask x tool_mask, as its loss read it: the buffered one minus the drops.
            consumed_mask = (inputs["completion_mask"] * inputs.get("tool_mask", 1)).float()
            want_mask = buffered_mask.float() * (1 if loss_mask is None else loss_mask)
            torch.testing.assert_close(consumed_mask, want_mask, atol=1e-4, rtol=1e-4)
            with torch.no_grad():
                want_loss = original_loss(trainer, model, dict(self.batch, advantages=advantages, tool_mask=want_mask))
            torch.testing.assert_close(loss.detach(), want_loss, atol=1e-6, rtol=1e-5)
            self.checked += 1
            return loss

        monkeypatch.setattr(GRPOTrainer, "compute_loss", compute_loss)
        monkeypatch.setattr(GRPOTrainer, "_compute_loss", inner_loss)


def assert_all_params_changed(before, after):
    unchanged = [name for name, param in before.items() if torch.equal(param, after[name].detach())]
    assert not unchanged, f"parameters that did not change: {unchanged}"


class FakeVLLMGeneration:
    """Stands in for TRL's `VLLMGeneration`; only `sync_weights` is reached when a `rollout_func` generates."""

    def __init__(self):
        self.syncs = 0

    def sync_weights(self):
        self.syncs += 1


def on_vllm_branch(trainer) -> FakeVLLMGeneration:
    """Switch a trainer built with a `rollout_func` onto TRL's vLLM branch, as `use_vllm=True` would set it up minus
    the engine: TRL's generation-batch and loss code then take that branch (old-log-prob forward, importance
    sampling). Returns the stand-in, which counts the weight syncs."""
    trainer.use_vllm, trainer._last_loaded_step, trainer.vllm_generation = True, -1, FakeVLLMGeneration()
    return trainer.vllm_generation


def engine_rollout(prompts, trainer):
    """Completions from outside `generate`, as an inference engine returns them: drawn without calling the policy, so
    TRL has no decode to record and its scoring forward is the policy's first forward of the batch."""
    tokenizer, generator = trainer.processing_class, torch.Generator().manual_seed(len(prompts))
    prompt_ids = [
        tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False)
        for prompt in prompts
    ]
    completion_ids = [torch.randint(7, len(tokenizer), (5,), generator=generator).tolist() for _ in prompts]
    return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": [[0.0] * 5 for _ in prompts]}


def make_rollout_func(max_tokens=6, noise=0.3, vary_lengths=False):
    """Completions sampled from the policy, with log-probs perturbed like an inference engine's (bf16 kernels...).

    `vary_lengths`: row i stops after `max_tokens - i % 3` tokens, so TRL right-pads the completions."""
    generator = torch.Generator().manual_seed(0)

    @torch.no_grad()
    def rollout(prompts, trainer):
        tokenizer, model = trainer.processing_class, trainer.accelerator.unwrap_model(trainer.model)
        prompt_ids, completion_ids, logprobs = [], [], []
        for row, prompt in enumerate(prompts):
            ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False)
            completion, token_logps = [], []
            for _ in range(max_tokens - row % 3 if vary_lengths else max_tokens):
                logits = model(input_ids=torch.tensor([ids + completion])).logits[0, -1].float() / trainer.temperature
                logp = torch.log_softmax(logits, dim=-1)
                token = torch.multinomial(logp.exp(), 1, generator=generator).item()
                completion.append(token)
                token_logps.append(logp[token].item() + noise * torch.randn(1, generator=generator).item())
            prompt_ids.append(ids)
            completion_ids.append(completion)
            logprobs.append(token_logps)
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs}

    return rollout
