"""The independent reference of every registered credit method, behind one interface keyed by the method's name.

`REFERENCE_RULES[name](batch, hyperparameters)` recomputes a method's token advantages (and loss mask) from a
[`ReferenceBatch`] of plain float64 tensors, token by token with Python loops, from its paper's or official code's rule
(the loops of `reference_formulas.py` where they exist). Nothing here calls the package's credit code: the registry is
read only for the names of the methods and their hyperparameters' defaults. `reference_stack` applies the spec's
stacking rule, `credit_moved_share` and `assert_credit_moved` say whether a comparison can notice a wrong method, and
`MOVING_SETTINGS` holds, per method, settings under which it moves credit on `random_reference_batch`'s inputs.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
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
