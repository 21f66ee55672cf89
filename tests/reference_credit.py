"""The independent reference of every registered credit method, behind one interface keyed by the method's name.

`REFERENCE_RULES[name](batch, hyperparameters)` recomputes a method's token advantages (and loss mask) from a
[`ReferenceBatch`] of plain float64 tensors, token by token with Python loops, from its paper's or official code's rule
(the loops of `reference_formulas.py` where they exist). Nothing here calls the package's credit code: the registry is
read only for the names of the methods and their hyperparameters' defaults. `reference_stack` applies the spec's
stacking rule, `credit_moved_share` and `assert_credit_moved` say whether a comparison can notice a wrong method, and
`MOVING_SETTINGS` holds, per method, settings under which it moves credit on `random_reference_batch`'s inputs.
Besides its advantages: `TOKEN_STATISTICS` and `METRICS` give, per method, its token statistic and its metrics by the
definitions its docstring states, and `RANGES` the allowed values of each bounded hyperparameter. A new method's
references all live here.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import torch
from reference_formulas import (
    eapo_loop,
    gtpo_loop,
    hicra_loop,
    otb_loop,
    stare_token_loop,
    taco_loop,
    tide_loop,
    unsampled_statistics,
)
from torch import Tensor

from trl_credit.methods import CREDIT_METHODS

Rule = Callable[["ReferenceBatch", dict], tuple[Tensor, Tensor | None]]


@dataclass
class ReferenceBatch:
    """What a credit method sees of a batch, as plain float64 tensors (the fields of the package's `CreditBatch`).

    `statistics` is keyed by the package's statistic names as strings (`"policy_logps"`, ...); `token_texts` maps a
    list of token ids to the text of each token, as the package's does."""

    advantages_BT: Tensor  # incoming token advantages, 0 at masked positions
    sequence_advantages_B: Tensor
    mask_BT: Tensor  # bool: positions still in the loss
    loss_weights_BT: Tensor  # product of the earlier methods' loss masks (mask_BT as float at the start)
    statistics: dict[str, Tensor] = field(default_factory=dict)
    vocab_size: int | None = None
    step: int = 0
    clip_range: tuple[float, float] = (0.2, 0.2)
    group_index_B: Tensor | None = None
    rewards_B: Tensor | None = None
    completion_ids_BT: Tensor | None = None
    pad_token_id: int | None = None
    token_texts: Callable[[list[int]], list[str]] | None = None

    @classmethod
    def start(cls, sequence_advantages_B: Tensor, mask_BT: Tensor, **fields) -> ReferenceBatch:
        """The batch a stack starts from: GRPO's `A_i` on every valid token, full loss weights."""
        mask_BT = mask_BT.bool()
        sequence_advantages_B = sequence_advantages_B.double()
        statistics = {name: values.double() for name, values in fields.pop("statistics", {}).items()}
        return cls(
            advantages_BT=torch.where(mask_BT, sequence_advantages_B.view(-1, 1), 0.0),
            sequence_advantages_B=sequence_advantages_B,
            mask_BT=mask_BT,
            loss_weights_BT=mask_BT.double(),
            statistics=statistics,
            **fields,
        )

    def __getitem__(self, name: str) -> Tensor:
        return self.statistics[name]

    def package_inputs(self) -> tuple[Tensor, Tensor, dict]:
        """`(advantages_B, mask_BT, named)` for `apply_credit_method(name, advantages_B, mask_BT, **named,
        **hyperparameters)`: the same batch as the package's plain-tensor call takes it (float32)."""
        named = {name: values.float() for name, values in self.statistics.items()}
        named.update(advantages_BT=self.advantages_BT.float(), loss_weights_BT=self.loss_weights_BT.float())
        for name in ("vocab_size", "step", "clip_range", "group_index_B", "rewards_B", "completion_ids_BT"):
            if getattr(self, name) is not None:
                named[name] = getattr(self, name)
        named.update(pad_token_id=self.pad_token_id, token_texts=self.token_texts)
        return self.sequence_advantages_B.float(), self.mask_BT, named


def resolved_hyperparameters(name: str, settings: dict | None = None) -> dict:
    """Every hyperparameter of method `name`: `settings` by field name, the rest the registered defaults."""
    return CREDIT_METHODS[name].hyperparameters(settings or {})


# ------------------------------------------------------------------------------------------- the rules


def _valid_positions(mask_BT: Tensor, row: int) -> list[int]:
    return [t for t in range(mask_BT.size(1)) if mask_BT[row, t]]


def _per_row_factor(out_BT: Tensor, advantages_B: Tensor, mask_BT: Tensor, neutral: float = 1.0) -> Tensor:
    """A loop's output for sequence advantages `A_i`, divided by `A_i` (`neutral` where `A_i = 0`): the factor by which
    its rule multiplies each token's advantage."""
    factor_BT = torch.zeros(mask_BT.shape, dtype=torch.float64)
    for i in range(mask_BT.size(0)):
        for t in _valid_positions(mask_BT, i):
            a = float(advantages_B[i])
            factor_BT[i, t] = float(out_BT[i, t]) / a if a != 0 else neutral
    return factor_BT


def grpo_rule(batch: ReferenceBatch, hp: dict) -> tuple[Tensor, Tensor | None]:
    """GRPO: the incoming advantages unchanged."""
    return batch.advantages_BT.clone(), None


def taco_rule(batch: ReferenceBatch, hp: dict) -> tuple[Tensor, Tensor | None]:
    """TACO (`taco_loop`) on token advantages: the weight `w` of a unit positive advantage, applied where `A_t > 0`."""
    ones_B = torch.ones(batch.mask_BT.size(0), dtype=torch.float64)
    weight_BT = taco_loop(
        ones_B, batch["policy_logps"], batch["policy_entropy"], batch.mask_BT, hp["taco_alpha"], hp["taco_lambda"]
    )
    out = torch.zeros(batch.mask_BT.shape, dtype=torch.float64)
    for i in range(out.size(0)):
        for t in _valid_positions(batch.mask_BT, i):
            a = float(batch.advantages_BT[i, t])
            out[i, t] = a * float(weight_BT[i, t]) if a > 0 else a
    return out, None


def eapo_rule(batch: ReferenceBatch, hp: dict) -> tuple[Tensor, Tensor | None]:
    """EAPO (`eapo_loop`, whose weight has the sign of GRPO's `A_i`), with its linear kappa decay, on token
    advantages."""
    kappa, decay_steps = hp["eapo_kappa"], hp["eapo_kappa_decay_steps"]
    if decay_steps > 0:  # EAPO's optional schedule: kappa falls linearly to 0 over `decay_steps` optimizer steps
        kappa = kappa * max(0.0, 1.0 - batch.step / decay_steps)
    if not batch.mask_BT.any():
        return torch.zeros(batch.mask_BT.shape, dtype=torch.float64), None
    sequence_B = batch.sequence_advantages_B
    out_BT = eapo_loop(sequence_B, batch["rollout_entropy"], batch.mask_BT, kappa, hp["eapo_quantiles"])
    weight_BT = _per_row_factor(out_BT, sequence_B, batch.mask_BT)  # sign(A_i) = 0: r = 1, w = 1
    return batch.advantages_BT * weight_BT, None


def tide_rule(batch: ReferenceBatch, hp: dict) -> tuple[Tensor, Tensor | None]:
    """TIDE (`tide_loop`): the per-response softmax weights of a unit advantage, times the token advantages."""
    name = "previous_policy_deviation" if hp["tide_reference"] == "old" else "reference_deviation"
    deviation_BT = batch[name].clamp(0.0, 1.0)
    if hp["tide_distance"] == "hellinger":
        deviation_BT = deviation_BT.sqrt()
    ones_B = torch.ones(batch.mask_BT.size(0), dtype=torch.float64)
    weight_BT = tide_loop(
        ones_B,
        deviation_BT,
        batch["rollout_entropy"],
        batch.mask_BT,
        batch.vocab_size,
        hp["tide_tau"],
        hp["tide_kappa"],
    )
    return batch.advantages_BT * weight_BT.double(), None


def otb_rule(batch: ReferenceBatch, hp: dict) -> tuple[Tensor, Tensor | None]:
    """OTB (`otb_loop`): an advantage estimator, from the raw rewards and groups; it ignores the incoming advantages."""
    out_BT = otb_loop(
        batch.rewards_B,
        batch.group_index_B,
        batch["rollout_unsampled_mass"] ** 2 + batch["rollout_unsampled_sum_sq_probs"],
        batch.mask_BT,
        hp["otb_handle_zero_tail"],
    )
    return out_BT, None


def stare_rule(batch: ReferenceBatch, hp: dict) -> tuple[Tensor, Tensor | None]:
    """STARE (`stare_token_loop`): the gate reads the generation batch's mean entropy, the same at every valid token."""
    mask_BT = batch.mask_BT
    if not mask_BT.any():
        return torch.zeros(mask_BT.shape, dtype=torch.float64), None
    batch_entropy = float(batch["rollout_mean_entropy"][mask_BT][0])
    out_BT = stare_token_loop(
        batch.advantages_BT.tolist(),
        batch["policy_logps"],
        mask_BT,
        batch_entropy,
        hp["stare_variant"],
        hp["stare_top_p_ratio"],
        hp["stare_reweight_w"],
        hp["stare_reweight_m"],
        hp["stare_target_entropy"],
    )
    return out_BT, None


def gtpo_rule(batch: ReferenceBatch, hp: dict) -> tuple[Tensor, Tensor | None]:
    """GTPO (`gtpo_loop`) on token advantages: the loop gives each token's conflict factor `d / n` (its output for
    `A_i` with no entropy filter or shaping, over `A_i`); a response whose mean entropy is above the threshold gets 0,
    the others `d / n * (A_t - gamma H_i)`."""
    mask_BT, sequence_B = batch.mask_BT, batch.sequence_advantages_B
    pad_id = hp["gtpo_pad_id"] if hp["gtpo_pad_id"] is not None else batch.pad_token_id
    entropy_BT = batch["rollout_entropy"]
    unshaped_BT = gtpo_loop(
        sequence_B,
        batch.completion_ids_BT,
        mask_BT,
        entropy_BT,
        batch.group_index_B.tolist(),
        pad_id,
        weight=hp["gtpo_conflict_weight"],
        threshold=math.inf,
        scale=0.0,
        normalize=hp["gtpo_conflict_normalization"],
    )
    factor_BT = _per_row_factor(unshaped_BT, sequence_B, mask_BT)  # A_i = 0: no conflict, n = 1
    out = torch.zeros(mask_BT.shape, dtype=torch.float64)
    for i in range(out.size(0)):
        positions = _valid_positions(mask_BT, i)
        mean_entropy = sum(float(entropy_BT[i, t]) for t in positions) / max(len(positions), 1)
        if mean_entropy > hp["gtpo_entropy_threshold"]:
            continue
        for t in positions:
            shaped = float(batch.advantages_BT[i, t]) - hp["gtpo_entropy_scale"] * mean_entropy
            out[i, t] = float(factor_BT[i, t]) * shaped
    return out, None


def hicra_rule(batch: ReferenceBatch, hp: dict) -> tuple[Tensor, Tensor | None]:
    """HICRA (`hicra_loop`): its planning tokens are where a unit advantage grows; there `A + alpha |A|`."""
    ids_BT, mask_BT = batch.completion_ids_BT, batch.mask_BT
    ids = sorted({int(ids_BT[i, t]) for i in range(ids_BT.size(0)) for t in _valid_positions(mask_BT, i)})
    texts = dict(zip(ids, batch.token_texts(ids)))
    ones_B = torch.ones(mask_BT.size(0), dtype=torch.float64)
    unit_BT = hicra_loop(ones_B, ids_BT, mask_BT, texts, hp["hicra_grams"], alpha=1.0)  # 2 on planning tokens
    out = torch.zeros(mask_BT.shape, dtype=torch.float64)
    for i in range(out.size(0)):
        for t in _valid_positions(mask_BT, i):
            a = float(batch.advantages_BT[i, t])
            out[i, t] = a + hp["hicra_alpha"] * abs(a) if float(unit_BT[i, t]) > 1.5 else a
    return out, None


# The baselines. Each rule is its official code's (or paper's) rule on one micro-batch, token by token; the module
# docstrings of trl_credit/methods/ name the code. Candidates and quantiles span `mask_BT`, the positions still in the
# loss (verl's `response_mask > 0` after the earlier methods of a stack).


def _quantile(values: list[float], q: float) -> float:
    """`torch.quantile`'s default: linear interpolation between the order statistics."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


def _cells(mask_BT: Tensor) -> list[tuple[int, int]]:
    """The valid positions in row-major order (the order of `torch.nonzero` and of a flattened mask)."""
    return [(i, t) for i in range(mask_BT.size(0)) for t in _valid_positions(mask_BT, i)]


def _dropping(batch: ReferenceBatch, dropped: set[tuple[int, int]]) -> tuple[Tensor, Tensor]:
    """The incoming advantages and a loss mask that is 0 on `dropped` (the official code multiplies `response_mask`)."""
    loss_mask_BT = torch.ones(batch.mask_BT.shape, dtype=torch.float64)
    for i, t in dropped:
        loss_mask_BT[i, t] = 0.0
    return batch.advantages_BT.clone(), loss_mask_BT


def ar_lopti_rule(batch: ReferenceBatch, hp: dict) -> tuple[Tensor, Tensor | None]:
    """AR-Lopti (TACO's `dp_actor.py`, "AR-Lopti style advantage reweighting"): A * ((1 - alpha) + alpha * p_old)."""
    alpha, out = hp["ar_lopti_alpha"], torch.zeros(batch.mask_BT.shape, dtype=torch.float64)
    for i, t in _cells(batch.mask_BT):
        p_old = math.exp(float(batch["rollout_logps"][i, t]))
        out[i, t] = float(batch.advantages_BT[i, t]) * ((1 - alpha) + alpha * p_old)
    return out, None


def stapo_rule(batch: ReferenceBatch, hp: dict) -> tuple[Tensor, Tensor | None]:
    """STAPO (TACO's `dp_actor.py`, "STAPO-style hard masking"): a candidate (A > 0, or any valid token) with
    p < threshold and H below the candidates' entropy quantile leaves the loss; with no candidate the quantile spans
    every valid token, as the official code falls back."""
    cells, advantages_BT = _cells(batch.mask_BT), batch.advantages_BT
    entropy_BT, logps_BT = batch["policy_entropy"], batch["policy_logps"]
    only_positive = hp["stapo_only_positive_advantage"]
    candidates = [(i, t) for i, t in cells if not only_positive or float(advantages_BT[i, t]) > 0]
    source = [float(entropy_BT[i, t]) for i, t in (candidates or cells)]
    threshold = _quantile(source, hp["stapo_entropy_quantile"]) if source else 0.0
    dropped = {
        (i, t)
        for i, t in candidates
        if math.exp(float(logps_BT[i, t])) < hp["stapo_prob_threshold"] and float(entropy_BT[i, t]) < threshold
    }
    return _dropping(batch, dropped)


def tampo_rule(batch: ReferenceBatch, hp: dict) -> tuple[Tensor, Tensor | None]:
    """TAMPO (TACO's `dp_actor.py`, "TAMPO-style hard truncation"): a positive token with p <= p_max and H <= H_max
    leaves the loss."""
    dropped = {
        (i, t)
        for i, t in _cells(batch.mask_BT)
        if float(batch.advantages_BT[i, t]) > 0
        and math.exp(float(batch["policy_logps"][i, t])) <= hp["tampo_prob_threshold"]
        and float(batch["policy_entropy"][i, t]) <= hp["tampo_entropy_threshold"]
    }
    return _dropping(batch, dropped)


def minp_support_rule(batch: ReferenceBatch, hp: dict) -> tuple[Tensor, Tensor | None]:
    """Min-p support weighting (TACO's `dp_actor.py`, "Min-p inspired support weighting"): margin
    m = gap - log(min_p), weight w_min + (1 - w_min) exp(min(m, 0) / tau) on positive tokens (every token without
    `only_positive_advantage`), 1 elsewhere; the weight is the loss mask, the advantages stay."""
    # The official code takes log(min_p) as a float32 tensor, in the dtype of the logit gap.
    log_min_p = float(torch.tensor(hp["minp_support_min_p"], dtype=torch.float32).log())
    w_min, tau = hp["minp_support_min_weight"], hp["minp_support_tau"]
    loss_mask_BT = torch.ones(batch.mask_BT.shape, dtype=torch.float64)
    for i, t in _cells(batch.mask_BT):
        if hp["minp_support_only_positive_advantage"] and not float(batch.advantages_BT[i, t]) > 0:
            continue
        margin = float(batch["policy_logit_gap"][i, t]) - log_min_p
        loss_mask_BT[i, t] = w_min + (1 - w_min) * math.exp(min(margin, 0.0) / tau)
    return batch.advantages_BT.clone(), loss_mask_BT


def clip_cov_seed(seed: int, step: int, mask_BT: Tensor) -> int:
    """The documented seeding rule of `clip_cov.py`: the key (seed, step, B, T, valid-token count) folded base
    1_000_003 modulo 2**63 - 1 seeds a fresh CPU `torch.Generator`."""
    mixed = 0
    for part in (seed, step, mask_BT.size(0), mask_BT.size(1), int(mask_BT.sum())):
        mixed = (mixed * 1_000_003 + part) % (2**63 - 1)
    return mixed


def clip_cov_rule(batch: ReferenceBatch, hp: dict) -> tuple[Tensor, Tensor | None]:
    """Clip-Cov (verl's `compute_policy_loss_clip_cov`): weighted means over the loss weights w (verl's masked_mean,
    its 1e-8 included), cov = (A - mean A)(log p - mean log p); candidates: w > 0, not already clipped by PPO,
    lb < cov < ub; n = max(int(ratio * sum w), 1) of them, drawn by a permutation of the row-major candidates, lose
    their policy-gradient term (advantage 0; verl multiplies their loss term by 0)."""
    weights_BT, advantages_BT = batch.loss_weights_BT, batch.advantages_BT
    logps_BT, old_logps_BT = batch["policy_logps"], batch["rollout_logps"]
    in_loss = [(i, t) for i, t in _cells(batch.mask_BT) if float(weights_BT[i, t]) > 0]
    total = sum(float(weights_BT[i, t]) for i, t in in_loss)
    mean_advantage = sum(float(weights_BT[i, t] * advantages_BT[i, t]) for i, t in in_loss) / (total + 1e-8)
    mean_logp = sum(float(weights_BT[i, t] * logps_BT[i, t]) for i, t in in_loss) / (total + 1e-8)
    low, high = batch.clip_range
    candidates = []
    for i, t in in_loss:
        a, ratio = float(advantages_BT[i, t]), math.exp(float(logps_BT[i, t]) - float(old_logps_BT[i, t]))
        clipped = -a * min(max(ratio, 1 - low), 1 + high) > -a * ratio  # PPO's max keeps the clipped term
        covariance = (a - mean_advantage) * (float(logps_BT[i, t]) - mean_logp)
        if not clipped and hp["clip_cov_lb"] < covariance < hp["clip_cov_ub"]:
            candidates.append((i, t))
    count = max(int(hp["clip_cov_ratio"] * total), 1)
    generator = torch.Generator().manual_seed(clip_cov_seed(hp["clip_cov_seed"], batch.step, batch.mask_BT))
    order = torch.randperm(len(candidates), generator=generator).tolist()
    out = advantages_BT.clone()
    for index in order[:count]:
        out[candidates[index]] = 0.0
    return out, None


def high_entropy_rule(batch: ReferenceBatch, hp: dict) -> tuple[Tensor, Tensor | None]:
    """80/20 (`get_global_entropy_top_mask` of the paper's code): only the k = max(1, int(rho N + 0.9999)) valid tokens
    of highest entropy stay in the loss. Ties at the cut keep the earlier token (`torch.topk`'s order among ties is
    unspecified; the random inputs have none)."""
    cells, entropy_BT = _cells(batch.mask_BT), batch["policy_entropy"]
    if not cells:
        return batch.advantages_BT.clone(), torch.zeros(batch.mask_BT.shape, dtype=torch.float64)
    k = max(1, int(len(cells) * hp["high_entropy_top_ratio"] + 0.9999))
    ranked = sorted(range(len(cells)), key=lambda n: (-float(entropy_BT[cells[n]]), n))
    kept = {cells[n] for n in ranked[:k]}
    return _dropping(batch, set(cells) - kept)


def entropy_adv_rule(batch: ReferenceBatch, hp: dict) -> tuple[Tensor, Tensor | None]:
    """EntropyAdv (arXiv 2506.14758): A + min(alpha H, |A| / kappa), H the current policy's entropy, detached."""
    out = torch.zeros(batch.mask_BT.shape, dtype=torch.float64)
    for i, t in _cells(batch.mask_BT):
        a = float(batch.advantages_BT[i, t])
        bonus = min(hp["entropy_adv_alpha"] * float(batch["policy_entropy"][i, t]), abs(a) / hp["entropy_adv_kappa"])
        out[i, t] = a + bonus
    return out, None


def _fisher_exact_p(a: int, b: int, c: int, d: int) -> Fraction:
    """The two-sided Fisher exact p-value of `[[a, b], [c, d]]`, as a fraction: the sum of the hypergeometric
    probabilities, at the table's margins, of every table no more probable than the observed one."""
    row, column, total = a + b, a + c, a + b + c + d

    def probability(k):
        return Fraction(math.comb(column, k) * math.comb(total - column, row - k), math.comb(total, row))

    observed = probability(a)
    support = range(max(0, row + column - total), min(row, column) + 1)
    return sum((probability(k) for k in support if probability(k) <= observed), Fraction(0))


def _bits(*counts: int) -> float:
    total = sum(counts)
    return -sum(n / total * math.log2(n / total) for n in counts if n) if total else 0.0


def _ktae_value(a, b, correct, wrong, occurrences, lengths, hp) -> float:
    """The key-token value of one id of one group (official `ComputeKeyTokens.compute_key_tokens`, k1 = 2, b = 0.5):
    `a`, `b` the correct and wrong completions holding it among `correct` and `wrong`, `occurrences` and `lengths` its
    occurrences and the valid tokens on either side."""
    c, d = correct - a, wrong - b
    p = _fisher_exact_p(a, b, c, d)
    fisher = 0.0 if p == 1 else math.exp(-2 * float(p))
    total = correct + wrong
    gain = _bits(correct, wrong) - (a + b) / total * _bits(a, b) - (c + d) / total * _bits(c, d)
    direction = math.asin(math.sqrt(a / correct)) - math.asin(math.sqrt(b / wrong))
    if hp["ktae_term_frequency"]:
        mean_length, tf = sum(lengths) / 2, []
        for count, length in zip(occurrences, lengths):
            frequency = count / length if length else 0.0
            tf.append(frequency * 3.0 / (frequency + 2.0 * (0.5 + 0.5 * length / mean_length)))
        direction += tf[0] / (tf[1] + 1e-5) - tf[1] / (tf[0] + 1e-5)
    alpha, beta = hp["ktae_alpha"], hp["ktae_beta"]
    score = (alpha * fisher + beta * gain) * direction / (alpha + beta)
    sigmoid = 1 / (1 + math.exp(-score)) if score >= 0 else math.exp(score) / (1 + math.exp(score))
    return (sigmoid - 0.5) * 2 * hp["ktae_scale"]


def ktae_rule(batch: ReferenceBatch, hp: dict) -> tuple[Tensor, Tensor | None]:
    """KTAE (xiaolizh1/KTAE `compute_key_tokens.py`, per prompt group as `core_algos.py` calls it): each valid token
    gains the key-token value of its id in its group; a group without a correct (reward above the threshold) or without
    a wrong completion gains nothing, nor does the unscored id (the pad id by default). Fisher's p-value is exact."""
    mask_BT, ids_BT, out = batch.mask_BT, batch.completion_ids_BT, batch.advantages_BT.clone()
    unscored = hp["ktae_unscored_id"] if hp["ktae_unscored_id"] is not None else batch.pad_token_id
    tokens = {i: [int(ids_BT[i, t]) for t in _valid_positions(mask_BT, i)] for i in range(mask_BT.size(0))}
    for group in sorted(set(batch.group_index_B.tolist())):
        rows = [i for i in tokens if int(batch.group_index_B[i]) == group]
        correct = [i for i in rows if float(batch.rewards_B[i]) > hp["ktae_correct_threshold"]]
        wrong = [i for i in rows if i not in correct]
        if not correct or not wrong:
            continue
        lengths = (sum(len(tokens[i]) for i in correct), sum(len(tokens[i]) for i in wrong))
        for v in {v for i in rows for v in tokens[i]} - {unscored}:
            a, b = sum(v in tokens[i] for i in correct), sum(v in tokens[i] for i in wrong)
            occurrences = (sum(tokens[i].count(v) for i in correct), sum(tokens[i].count(v) for i in wrong))
            value = _ktae_value(a, b, len(correct), len(wrong), occurrences, lengths, hp)
            for i in rows:
                for t in _valid_positions(mask_BT, i):
                    if int(ids_BT[i, t]) == v:
                        out[i, t] += value
    return out, None


REFERENCE_RULES: dict[str, Rule] = {
    "grpo": grpo_rule,
    "taco": taco_rule,
    "eapo": eapo_rule,
    "tide": tide_rule,
    "otb": otb_rule,
    "stare": stare_rule,
    "gtpo": gtpo_rule,
    "hicra": hicra_rule,
    "ar_lopti": ar_lopti_rule,
    "stapo": stapo_rule,
    "tampo": tampo_rule,
    "minp_support": minp_support_rule,
    "clip_cov": clip_cov_rule,
    "high_entropy": high_entropy_rule,
    "entropy_adv": entropy_adv_rule,
    "ktae": ktae_rule,
}


# ------------------------------------------------------------------------------------------- stacks


def reference_stack(
    names: str | list[str] | tuple[str, ...], batch: ReferenceBatch, hyperparameters_by_method: dict | None = None
) -> ReferenceBatch:
    """The batch after the stack `names` (`"ar_lopti+taco+stapo"` or a list), by the spec's stacking rule: each method
    sees the previous one's output; a returned loss mask multiplies into the loss weights, a token whose weight reaches
    0 leaves the mask, and masked advantages are 0. `hyperparameters_by_method`: `{method: settings}` (the rest the
    defaults)."""
    names = names.split("+") if isinstance(names, str) else list(names)
    settings = hyperparameters_by_method or {}
    for name in names:
        if name == "grpo":
            continue
        advantages_BT, loss_mask_BT = REFERENCE_RULES[name](batch, resolved_hyperparameters(name, settings.get(name)))
        weights_BT = batch.loss_weights_BT
        if loss_mask_BT is not None:
            weights_BT = weights_BT * loss_mask_BT.double()
        mask_BT = batch.mask_BT & (weights_BT > 0)
        batch = dataclasses.replace(
            batch,
            advantages_BT=torch.where(mask_BT, advantages_BT.double(), 0.0),
            mask_BT=mask_BT,
            loss_weights_BT=torch.where(mask_BT, weights_BT, 0.0),
        )
    return batch


ROOT = Path(__file__).resolve().parent.parent
# The official actor's order with each of its three droppers (docs/methods.md names them: "ar_lopti+taco+stapo+clip_cov
# and its TAMPO and min-p variants"), besides the stacks the docs spell out.
OFFICIAL_ACTOR_STACKS = ("ar_lopti+taco+tampo+clip_cov", "ar_lopti+taco+minp_support+clip_cov")


def documented_stacks() -> list[str]:
    """Every stack of registered methods that README.md or a page of docs/ names (`eapo+taco`, `otb+stapo`, ...), and
    the official actor's variants, sorted."""
    found = set(OFFICIAL_ACTOR_STACKS)
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for spec in re.findall(r"(?<![\w.:/])[a-z_]+(?:\+[a-z_]+)+(?![\w.:/])", page.read_text()):
            if all(name in CREDIT_METHODS for name in spec.split("+")):
                found.add(spec)
    return sorted(found)


def stack_settings(spec: str) -> dict[str, dict]:
    """`MOVING_SETTINGS` of each method of the stack `spec`, `{method: settings}`."""
    return {name: MOVING_SETTINGS[name] for name in spec.split("+")}


# ------------------------------------------------------------------------------------------- moved credit


def credit_moved_share(
    advantages_BT: Tensor,
    sequence_advantages_B: Tensor,
    mask_BT: Tensor,
    loss_weights_BT: Tensor | None = None,
    atol: float = 1e-6,
) -> float:
    """The share of valid tokens (`mask_BT`, before the method) whose advantage differs from GRPO's broadcast `A_i` by
    more than `atol`, or whose loss weight fell below 1."""
    mask_BT = mask_BT.bool()
    valid = int(mask_BT.sum())
    if valid == 0:
        return 0.0
    moved_BT = (advantages_BT.double() - sequence_advantages_B.double().view(-1, 1)).abs() > atol
    if loss_weights_BT is not None:
        moved_BT = moved_BT | (loss_weights_BT.double() < 1.0 - atol)
    return int((moved_BT & mask_BT).sum()) / valid


def assert_credit_moved(name: str, share: float) -> None:
    """Fail, naming the method, when it moved no credit: a comparison counts only where the method moved credit."""
    assert share > 0, (
        f"credit method {name!r} moved no credit (share of valid tokens whose credit differs from GRPO's: {share}): a "
        "comparison counts only where the method moved credit; use settings under which it does (MOVING_SETTINGS)"
    )


# ------------------------------------------------------------------------------------------- inputs

# Settings under which each method moves credit on `random_reference_batch`'s inputs (the defaults where they do).
MOVING_SETTINGS: dict[str, dict] = {
    "grpo": {},
    "taco": {"taco_alpha": 0.5},
    "eapo": {},
    "tide": {},
    "otb": {},
    "stare": {"stare_target_entropy": 100.0, "stare_variant": "C2", "stare_top_p_ratio": 0.3},
    "gtpo": {"gtpo_entropy_threshold": 1.6},  # filters some responses, not all
    "hicra": {"hicra_grams": ["let me", "wait", "check the", "so", "the"]},
    "ar_lopti": {},
    "stapo": {"stapo_prob_threshold": 0.2, "stapo_entropy_quantile": 0.6},
    "tampo": {"tampo_prob_threshold": 0.2, "tampo_entropy_threshold": 1.5},
    "minp_support": {},
    "clip_cov": {"clip_cov_ratio": 0.2, "clip_cov_lb": -1.0, "clip_cov_ub": 1.0, "clip_cov_seed": 3},
    "high_entropy": {},
    "entropy_adv": {},
    "ktae": {},
}

# Where the tiny model of the trainer tests (`moving_settings` of tests/trainer_helpers.py) needs other settings than
# `MOVING_SETTINGS` to move credit: HICRA's grams from its vocabulary (the numbers: two thirds of it), GTPO's entropy
# threshold above its mean entropy (~3.3 nats), which otherwise filters every completion, TAMPO's above the entropy of
# some of its tokens, and a min-p support threshold that its flat distributions reach (a token below half the top
# token's probability).
TINY_MODEL_MOVING_SETTINGS = {
    "hicra": {"hicra_grams": [str(n) for n in range(100)]},
    "gtpo": {"gtpo_entropy_threshold": 10.0},
    "tampo": {"tampo_entropy_threshold": 4.0},  # TAMPO truncates low-entropy tokens only: below log(139) = 4.9
    "minp_support": {"minp_support_min_p": 0.5},
    # The tiny model's rewards are small integers (a length modulo 4 or 5): "correct" above 1.5 splits more groups.
    "ktae": {"ktae_correct_threshold": 1.5},
}


# Token texts of `random_reference_batch`: words that HICRA's moving grams match, several ids per word.
WORDS = (" let", " me", " wait", " check", " the", " so", " x", " =", " 1", "2", ",", ".")


EOS_ID = 11  # "." ends every completion of `random_reference_batch`


def word_texts(ids: list[int]) -> list[str]:
    return [WORDS[i % len(WORDS)] for i in ids]


def _hellinger(logp_BTV: Tensor, logq_BTV: Tensor) -> Tensor:
    return (1.0 - torch.exp(0.5 * (logp_BTV + logq_BTV)).sum(-1)).clamp(0.0, 1.0)


def random_reference_batch(seed: int = 0, groups: int = 2, size: int = 4, tokens: int = 10, vocab: int = 24):
    """A batch every registered method can read: `groups` prompt groups of `size` rows (in shuffled order), padded
    completions (one row of a single token), GRPO advantages of random rewards, and every statistic from real
    distributions: a policy, a slightly different rollout policy, a reference and a previous policy over `vocab`
    tokens (the last id is the pad id, never sampled)."""
    g = torch.Generator().manual_seed(seed)
    rows = groups * size
    group_index_B = torch.arange(groups).repeat_interleave(size)[torch.randperm(rows, generator=g)]
    rewards_B = torch.randn(rows, generator=g).double()
    means = {int(k): rewards_B[group_index_B == k].mean() for k in group_index_B.unique()}
    advantages_B = rewards_B - torch.stack([means[int(k)] for k in group_index_B])
    lengths_B = torch.randint(1, tokens + 1, (rows,), generator=g)
    lengths_B[1] = 1
    mask_BT = torch.arange(tokens).unsqueeze(0) < lengths_B.unsqueeze(1)

    def distribution(base=None, noise=1.0):
        logits = torch.randn(rows, tokens, vocab, generator=g, dtype=torch.float64) * 2.5
        logits[..., vocab - 1] = -1e9  # the pad id
        if base is not None:
            logits = base + noise * logits / 2.5
            logits[..., vocab - 1] = -1e9
        return logits

    rollout_logits = distribution()
    policy_logits = distribution(rollout_logits, 0.3)
    rollout_logp = torch.log_softmax(rollout_logits, -1)
    policy_logp = torch.log_softmax(policy_logits, -1)
    reference_logp = torch.log_softmax(distribution(rollout_logits, 1.0), -1)
    previous_logp = torch.log_softmax(distribution(rollout_logits, 0.5), -1)
    pad_id = vocab - 1
    ids_BT = torch.multinomial(rollout_logp.exp().view(-1, vocab), 1, generator=g).view(rows, tokens)
    # Responses to one prompt often open alike and all end on the same token: GTPO's conflicts from both ends.
    for k in range(groups):
        members = (group_index_B == k).nonzero().squeeze(1)
        ids_BT[members, 0] = ids_BT[members[0], 0]
    ids_BT[torch.arange(rows), lengths_B - 1] = EOS_ID
    ids_BT = torch.where(mask_BT, ids_BT, pad_id)

    def sampled(logp_BTV):
        return logp_BTV.gather(-1, ids_BT.unsqueeze(-1)).squeeze(-1)

    def entropy(logp_BTV):
        return -(logp_BTV.exp() * logp_BTV).sum(-1)

    rollout_entropy_BT = entropy(rollout_logp)
    mean_entropy = float(rollout_entropy_BT[mask_BT].mean())
    statistics = {
        "policy_logps": sampled(policy_logp),
        "policy_entropy": entropy(policy_logp),
        "policy_logit_gap": sampled(policy_logp) - policy_logp.amax(-1),
        "rollout_logps": sampled(rollout_logp),
        "rollout_entropy": rollout_entropy_BT,
        "rollout_unsampled_mass": unsampled_statistics(rollout_logp, ids_BT)[0],
        "rollout_unsampled_sum_sq_probs": unsampled_statistics(rollout_logp, ids_BT)[1],
        "rollout_mean_entropy": torch.full((rows, tokens), mean_entropy, dtype=torch.float64),
        "reference_deviation": _hellinger(policy_logp, reference_logp),
        "previous_policy_deviation": _hellinger(policy_logp, previous_logp),
    }
    # Every value through float32 first: the package computes in float32, and a selection (a quantile, a top-k) must
    # see the same numbers in both.
    statistics = {name: torch.where(mask_BT, values, 0.0).float().double() for name, values in statistics.items()}
    rewards_B, advantages_B = rewards_B.float().double(), advantages_B.float().double()
    return ReferenceBatch.start(
        advantages_B,
        mask_BT,
        statistics=statistics,
        vocab_size=vocab,
        group_index_B=group_index_B,
        rewards_B=rewards_B,
        completion_ids_BT=ids_BT,
        pad_token_id=pad_id,
        token_texts=word_texts,
    )


# ------------------------------------------------------------------------------------------- besides the advantages
# What each method returns besides its advantages, by the definitions its docstring gives (its "Token statistic:" and
# "Metrics:"), worked from the batch's statistics and the reference rules: `TOKEN_STATISTICS` and `METRICS`.


def restarted(batch: ReferenceBatch, advantages_B: torch.Tensor) -> ReferenceBatch:
    """`batch` started again from the sequence advantages `advantages_B` (every other field kept)."""
    return ReferenceBatch.start(
        advantages_B,
        batch.mask_BT,
        statistics=batch.statistics,
        vocab_size=batch.vocab_size,
        group_index_B=batch.group_index_B,
        rewards_B=batch.rewards_B,
        completion_ids_BT=batch.completion_ids_BT,
        pad_token_id=batch.pad_token_id,
        token_texts=batch.token_texts,
    )


def _eapo_normalized_entropy(b, hp):
    entropy_BT = b["rollout_entropy"]
    valid = entropy_BT[b.mask_BT].tolist()
    low, high = (_quantile(valid, q) for q in hp["eapo_quantiles"])
    return ((entropy_BT - low) / (high - low)).clamp(0.0, 1.0)


def _clip_cov_covariance(b, hp):
    weights_BT = b.loss_weights_BT
    logps_BT = b["policy_logps"]
    mean_a = (b.advantages_BT * weights_BT).sum() / weights_BT.sum()
    mean_logp = (logps_BT * weights_BT).sum() / weights_BT.sum()
    return (b.advantages_BT - mean_a) * (logps_BT - mean_logp)


def _gtpo_conflict_factor(b, hp):
    """d: GTPO's loop without normalisation, entropy filter or shaping, over `A_i` (1 where `A_i = 0`)."""
    pad_id = hp["gtpo_pad_id"] if hp["gtpo_pad_id"] is not None else b.pad_token_id
    unshaped_BT = gtpo_loop(
        b.sequence_advantages_B,
        b.completion_ids_BT,
        b.mask_BT,
        b["rollout_entropy"],
        b.group_index_B.tolist(),
        pad_id,
        weight=hp["gtpo_conflict_weight"],
        threshold=math.inf,
        scale=0.0,
        normalize=False,
    )
    a_B = b.sequence_advantages_B.view(-1, 1)
    return torch.where(a_B != 0, unshaped_BT / torch.where(a_B != 0, a_B, 1.0), 1.0)


def _otb_baseline(b, hp):
    advantages_BT, _ = REFERENCE_RULES["otb"](b, hp)
    return b.rewards_B.view(-1, 1) - advantages_BT


def _hicra_planning(b, hp):
    """1 where a unit advantage grows under HICRA's rule."""
    grown_BT, _ = REFERENCE_RULES["hicra"](restarted(b, torch.ones_like(b.sequence_advantages_B)), hp)
    return (grown_BT > 1.0).double()


# method: its token statistic at the valid positions of a batch, by the definition its docstring gives.
TOKEN_STATISTICS = {
    "ar_lopti": lambda b, hp: b["rollout_logps"].exp(),
    "clip_cov": _clip_cov_covariance,
    "eapo": _eapo_normalized_entropy,
    "entropy_adv": lambda b, hp: torch.minimum(
        hp["entropy_adv_alpha"] * b["policy_entropy"], b.advantages_BT.abs() / hp["entropy_adv_kappa"]
    ),
    "gtpo": _gtpo_conflict_factor,
    "hicra": _hicra_planning,
    "high_entropy": lambda b, hp: b["policy_entropy"],
    "minp_support": lambda b, hp: b["policy_logit_gap"] - math.log(hp["minp_support_min_p"]),
    "otb": _otb_baseline,
    "stapo": lambda b, hp: b["policy_entropy"],
    "stare": lambda b, hp: -b["policy_logps"],
    "taco": lambda b, hp: -b["policy_logps"] - b["policy_entropy"] + math.log(hp["taco_alpha"]),
    "tampo": lambda b, hp: b["policy_entropy"],
    "tide": lambda b, hp: b["reference_deviation"],
    "ktae": lambda b, hp: REFERENCE_RULES["ktae"](b, hp)[0] - b.advantages_BT,
}


def _share(selected_BT, among_BT) -> float:
    return float((selected_BT & among_BT).sum()) / float(among_BT.sum())


def _mean(values_BT, mask_BT) -> float:
    return float(values_BT[mask_BT].mean())


def _reference(name, b, hp):
    """The reference rule's advantages and loss weights (the incoming weights where it drops nothing)."""
    advantages_BT, loss_mask_BT = REFERENCE_RULES[name](b, hp)
    return advantages_BT, b.loss_weights_BT if loss_mask_BT is None else loss_mask_BT


def _positive(b):
    return b.mask_BT & (b.advantages_BT > 0)


def _dropped_metrics(name, b, hp):
    _, weights_BT = _reference(name, b, hp)
    dropped_BT = b.mask_BT & (weights_BT == 0)
    return {
        "dropped_fraction": _share(dropped_BT, b.mask_BT),
        "dropped_fraction_pos": _share(dropped_BT, _positive(b)),
    }


def _stapo_metrics(b, hp):
    source = _positive(b) if hp["stapo_only_positive_advantage"] else b.mask_BT
    threshold = _quantile(b["policy_entropy"][source].tolist(), hp["stapo_entropy_quantile"])
    return {**_dropped_metrics("stapo", b, hp), "entropy_threshold": threshold}


def _clip_cov_metrics(b, hp):
    """verl draws max(int(ratio x the loss weights' sum), 1) of the candidates (all of them if fewer) and zeroes them."""
    ratio_BT = (b["policy_logps"] - b["rollout_logps"]).exp()
    low, high = b.clip_range
    clipped_BT = -b.advantages_BT * ratio_BT.clamp(1 - low, 1 + high) > -b.advantages_BT * ratio_BT
    covariance_BT = _clip_cov_covariance(b, hp)
    candidates_BT = b.mask_BT & ~clipped_BT & (covariance_BT > hp["clip_cov_lb"]) & (covariance_BT < hp["clip_cov_ub"])
    drawn = min(max(int(hp["clip_cov_ratio"] * float(b.loss_weights_BT.sum())), 1), int(candidates_BT.sum()))
    return {
        "detached_fraction": drawn / float(b.mask_BT.sum()),
        "candidate_fraction": _share(candidates_BT, b.mask_BT),
    }


def _entropy_adv_metrics(b, hp):
    bonus_BT = hp["entropy_adv_alpha"] * b["policy_entropy"]
    bound_BT = b.advantages_BT.abs() / hp["entropy_adv_kappa"]
    return {
        "mean_bonus": _mean(torch.minimum(bonus_BT, bound_BT), b.mask_BT),
        "bounded_fraction": _share(bound_BT < bonus_BT, b.mask_BT),
    }


def _gtpo_metrics(b, hp):
    d_BT = _gtpo_conflict_factor(b, hp)
    a_B = b.sequence_advantages_B.view(-1, 1)
    positive_BT, negative_BT = (a_B > 0).expand_as(d_BT), (a_B < 0).expand_as(d_BT)
    # d is W (W^2 where both runs meet) on a positive conflict and 0 on a negative one: W = 2 here, never 1.
    assert hp["gtpo_conflict_weight"] != 1.0
    conflict_BT = (positive_BT & (d_BT != 1)) | (negative_BT & (d_BT == 0))
    row_entropy_B = torch.stack(
        [b["rollout_entropy"][i][b.mask_BT[i]].mean() for i in range(b.mask_BT.size(0))]
    ).nan_to_num(0.0)
    row_entropy_BT = row_entropy_B.view(-1, 1).expand_as(d_BT)
    return {
        "conflict_fraction": _share(conflict_BT, b.mask_BT),
        "skipped_fraction": _share(conflict_BT & ~positive_BT, b.mask_BT),
        "amplified_fraction": _share(conflict_BT & positive_BT, b.mask_BT),
        "filtered_fraction": _share(row_entropy_BT > hp["gtpo_entropy_threshold"], b.mask_BT),
        "mean_entropy": _mean(row_entropy_BT, b.mask_BT),
    }


def _hicra_metrics(b, hp):
    planning_BT = _hicra_planning(b, hp).bool()
    rows = [i for i in range(b.mask_BT.size(0)) if b.mask_BT[i].any()]
    return {
        "planning_fraction": _share(planning_BT, b.mask_BT),
        "planning_fraction_pos": _share(planning_BT, _positive(b)),
        "completions_with_planning": sum(bool((planning_BT[i] & b.mask_BT[i]).any()) for i in rows) / len(rows),
    }


def _high_entropy_metrics(b, hp):
    _, weights_BT = _reference("high_entropy", b, hp)
    return {"entropy_threshold": float(b["policy_entropy"][b.mask_BT & (weights_BT > 0)].min())}


def _minp_metrics(b, hp):
    _, weights_BT = _reference("minp_support", b, hp)
    margin_BT = b["policy_logit_gap"] - math.log(hp["minp_support_min_p"])
    return {
        "support_weight": _mean(weights_BT, b.mask_BT),
        "in_support_fraction_pos": _share(margin_BT >= 0, _positive(b)),
        "margin_mean_pos": _mean(margin_BT, _positive(b)),
    }


def _otb_metrics(b, hp):
    w_BT = (b["rollout_unsampled_mass"] ** 2 + b["rollout_unsampled_sum_sq_probs"]) * b.mask_BT
    lengths = b.mask_BT.sum(dim=1).tolist()
    zero_tail_BT = torch.zeros_like(b.mask_BT)
    for group in b.group_index_B.unique().tolist():
        rows = [i for i in range(len(lengths)) if b.group_index_B[i] == group]
        ranked = sorted(lengths[i] for i in rows)
        if len(rows) > 1 and hp["otb_handle_zero_tail"] and ranked[-1] > ranked[-2]:
            longest = next(i for i in rows if lengths[i] == ranked[-1])
            zero_tail_BT[longest, ranked[-2] :] = True
    return {
        "mean_baseline": _mean(_otb_baseline(b, hp), b.mask_BT),
        "mean_path_variance": _mean(w_BT.cumsum(dim=1), b.mask_BT),
        "zero_tail_fraction": _share(zero_tail_BT, b.mask_BT),
    }


def _stare_metrics(b, hp):
    advantages_BT, _ = _reference("stare", b, hp)
    batch_entropy = float(b["rollout_mean_entropy"][b.mask_BT][0])
    gate_on = batch_entropy < hp["stare_target_entropy"]
    surprisal_BT = -b["policy_logps"]

    def highest(sign_BT):
        """The ceil(ratio x count) highest surprisals among `sign_BT` (STARE's top-p of each sign)."""
        values = sorted(surprisal_BT[sign_BT].tolist(), reverse=True)
        count = math.ceil(hp["stare_top_p_ratio"] * len(values))
        return sign_BT & (surprisal_BT >= values[count - 1]) if count else torch.zeros_like(sign_BT)

    l_plus_BT = highest(_positive(b))
    l_minus_BT = (
        highest(b.mask_BT & (b.advantages_BT < 0)) if hp["stare_variant"] == "C2" else torch.zeros_like(l_plus_BT)
    )
    reweighted_BT = (advantages_BT != b.advantages_BT) & b.mask_BT
    return {
        "gate_on": float(gate_on),
        "batch_entropy": batch_entropy,
        "target_entropy": hp["stare_target_entropy"],
        "reweighted_fraction": _share(reweighted_BT, b.mask_BT),
        "positive_selected_fraction": _share(l_plus_BT, b.mask_BT),
        "negative_selected_fraction": _share(l_minus_BT, b.mask_BT),
    }


def _taco_metrics(b, hp):
    risk_BT = TOKEN_STATISTICS["taco"](b, hp)
    return {
        "tail_fraction": _share(risk_BT > 0, b.mask_BT),
        "tail_fraction_pos": _share(risk_BT > 0, _positive(b)),
        "mean_tail_risk": _mean(risk_BT, b.mask_BT),
        "pos_adv_fraction": _share(_positive(b), b.mask_BT),
    }


def _tide_metrics(b, hp):
    deviation_BT = b["reference_deviation"]
    gate_BT = (b["rollout_entropy"] / math.log(b.vocab_size)).clamp(0, 1)
    return {
        "mean_deviation": _mean(deviation_BT, b.mask_BT),
        "mean_gate": _mean(gate_BT, b.mask_BT),
        "mean_score": _mean(deviation_BT * gate_BT ** hp["tide_kappa"], b.mask_BT),
    }


def _ktae_metrics(b, hp):
    key_BT = TOKEN_STATISTICS["ktae"](b, hp)
    scored_BT = torch.zeros_like(b.mask_BT)
    for group in b.group_index_B.unique():
        rows = b.group_index_B == group
        correct = b.rewards_B[rows] > hp["ktae_correct_threshold"]
        scored_BT[rows] = bool(correct.any() and not correct.all())
    return {
        "mean_key_value": _mean(key_BT, b.mask_BT),
        "mean_abs_key_value": _mean(key_BT.abs(), b.mask_BT),
        "scored_fraction": _share(scored_BT, b.mask_BT),
    }


# method: the value of each metric it logs, by the definition its docstring gives.
METRICS = {
    "ar_lopti": lambda b, hp: {"prob_mean": _mean(b["rollout_logps"].exp(), b.mask_BT)},
    "clip_cov": _clip_cov_metrics,
    "eapo": lambda b, hp: {
        "q_lo": _quantile(b["rollout_entropy"][b.mask_BT].tolist(), hp["eapo_quantiles"][0]),
        "q_hi": _quantile(b["rollout_entropy"][b.mask_BT].tolist(), hp["eapo_quantiles"][1]),
        "kappa": hp["eapo_kappa"],  # step 0: no decay yet
    },
    "entropy_adv": _entropy_adv_metrics,
    "gtpo": _gtpo_metrics,
    "hicra": _hicra_metrics,
    "high_entropy": _high_entropy_metrics,
    "minp_support": _minp_metrics,
    "otb": _otb_metrics,
    "stapo": _stapo_metrics,
    "stare": _stare_metrics,
    "taco": _taco_metrics,
    "tampo": lambda b, hp: _dropped_metrics("tampo", b, hp),
    "tide": _tide_metrics,
    "ktae": _ktae_metrics,
}


# ------------------------------------------------------------------------------------------- hyperparameter ranges

INF, NAN = math.inf, math.nan

# Each bounded hyperparameter, field: (the allowed values in the words of its error, values accepted, values refused). The ranges are the ones the
# fields' help and docs/methods.md state; the edges sit on both sides of each bound.
RANGES = {
    "ar_lopti_alpha": ("in [0, 1]", [0.0, 1.0], [-0.01, 1.01, NAN]),
    "clip_cov_ratio": ("in (0, 1]", [1e-6, 1.0], [0.0, 1.01, NAN]),
    "clip_cov_lb": ("finite", [-1e9, 4.0], [-INF, NAN]),
    "clip_cov_ub": ("finite", [1e9, 1.5], [INF, NAN]),
    "eapo_kappa": ("finite and >= 0", [0.0, 18.0], [-0.1, INF, NAN]),
    "eapo_kappa_decay_steps": (">= 0", [0, 5], [-1]),
    "eapo_quantiles": (
        "two values lo, hi with 0 <= lo < hi <= 1",
        [[0.0, 1.0], [0.2, 0.3]],
        [[0.5, 0.5], [0.1, 1.01], [-0.1, 0.5], [0.1], [0.1, 0.5, 0.9]],
    ),
    "entropy_adv_alpha": ("finite and >= 0", [0.0, 3.0], [-0.1, INF]),
    "entropy_adv_kappa": ("finite and > 1", [1.0001, 50.0], [1.0, 0.5, INF]),
    "gtpo_conflict_weight": ("finite and > 0", [1e-3, 2.0], [0.0, -1.0, INF]),
    "gtpo_entropy_threshold": (">= 0 (inf filters no completion)", [0.0, INF], [-0.1]),
    "gtpo_entropy_scale": ("finite and >= 0", [0.0, 0.5], [-0.1, INF]),
    "gtpo_pad_id": ("None (the tokenizer's pad id) or an id >= 0", [None, 0, 7], [-1]),
    "hicra_alpha": ("in [0, 1)", [0.0, 0.99], [1.0, -0.1]),
    "hicra_grams": ("a non-empty list of non-blank phrases", [["a b"]], [[], ["  "]]),
    "ktae_alpha": ("finite and >= 0", [0.0, 4.0], [-0.1, INF, NAN]),
    "ktae_beta": ("finite and >= 0", [0.0, 4.0], [-0.1, INF, NAN]),
    "ktae_scale": ("finite and > 0", [1e-3, 2.0], [0.0, -1.0, INF]),
    "ktae_correct_threshold": ("finite", [-1e9, 0.5], [-INF, INF, NAN]),
    "ktae_unscored_id": ("None (the tokenizer's pad id) or an id >= 0", [None, 0, 151643], [-1]),
    "high_entropy_top_ratio": ("in [0, 1]", [0.0, 1.0], [-0.1, 1.01]),
    "minp_support_min_p": ("in (0, 1)", [1e-6, 0.999], [0.0, 1.0]),
    "minp_support_tau": ("finite and > 0", [1e-3], [0.0, INF]),
    "minp_support_min_weight": ("in [0, 1]", [0.0, 1.0], [-0.1, 1.01]),
    "stapo_prob_threshold": ("in (0, 1)", [1e-6, 0.999], [0.0, 1.0]),
    "stapo_entropy_quantile": ("in (0, 1)", [1e-6, 0.999], [0.0, 1.0]),
    "stare_top_p_ratio": ("in [0, 1]", [0.0, 1.0], [-0.1, 1.01]),
    "stare_reweight_w": ("finite and > 0", [1e-3], [0.0, INF]),
    "stare_reweight_m": ("finite and > 0", [1e-3], [0.0, INF]),
    "stare_target_entropy": (">= 0 (inf: always on)", [0.0, INF], [-0.1]),
    "taco_alpha": ("in (0, 1]", [1e-6, 1.0], [0.0, 1.01]),
    "taco_lambda": ("in [0, 1]", [0.0, 1.0], [-0.1, 1.01]),
    "tampo_prob_threshold": ("in (0, 1]", [1e-6, 1.0], [0.0, 1.01]),
    "tampo_entropy_threshold": ("finite and >= 0", [0.0], [-0.1, INF]),
    "tide_tau": ("finite and > 0", [1e-3], [0.0, INF]),
    "tide_kappa": ("finite and >= 0", [0.0], [-0.1, INF]),
    "tide_distance": ("one of ('squared_hellinger', 'hellinger')", ["squared_hellinger", "hellinger"], ["kl"]),
    "tide_reference": ("one of ('ref', 'old')", ["ref", "old"], ["base"]),
}
# Fields any value of their type fits (flags and Literal choices apart, which their type refuses): a seed.
UNBOUNDED = {"clip_cov_seed"}
