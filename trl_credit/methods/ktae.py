"""KTAE: Key-token Advantage Estimation.

"KTAE: A Model-Free Algorithm to Key-Tokens Advantage Estimation in Mathematical Reasoning" (NeurIPS 2025),
https://huggingface.co/papers/2505.16826. Rule and defaults as in the official code (https://github.com/xiaolizh1/KTAE,
`ComputeKeyTokens` in `verl/workers/actor/compute_key_tokens.py`, run once per prompt group by
`compute_ktae_outcome_advantage_and_keytokens` in `verl/trainer/ppo/core_algos.py`). Per prompt group, whose `n_T`
correct completions are those with a reward above `ktae_correct_threshold` (officially `> 0`) and whose `n_F` others
are wrong, each token id `v` of the group gets a key-token value from a 2 x 2 table:

    a, b    = how many correct, wrong completions hold v at a valid position;  c = n_T - a,  d = n_F - b
    p       = two-sided Fisher exact p-value of [[a, b], [c, d]];  F = exp(-2 p) if p < 1, else 0
    IG      = H(correct) - H(correct | holds v), in bits
    h       = asin sqrt(a / n_T) - asin sqrt(b / n_F)          Cohen's h, as officially without its factor 2
    tf_T    = f (k1 + 1) / (f + k1 (1 - b1 + b1 L_T / L))      BM25's term frequency, k1 = 2, b1 = 0.5 (official);
              f = (occurrences of v in the correct completions) / L_T, L_T their valid tokens, L = (L_T + L_F) / 2;
              tf_F the same over the wrong completions
    x       = h + tf_T / (tf_F + 1e-5) - tf_F / (tf_T + 1e-5)  (h alone without `ktae_term_frequency`)
    k(v)    = scale * (2 sigmoid((alpha F + beta IG) x / (alpha + beta)) - 1)
    Â_t     = A_t + k(v_t)                                       on every valid token t, v_t its id

A group without a correct or without a wrong completion (a group of one among them) adds nothing. The official code
runs it with alpha = beta = scale = 1 and the term frequency on (`core_algos.py` hard-codes them: the recipes'
`beta_ig=2.0` never reaches the function); those are the defaults. `A_t` is the incoming advantage (GRPO's, officially
`(r - mean) / (std + 1e-6)`).

Departures from the official code, each where it is wrong or cannot run:
- The id that gets no value is the tokenizer's pad id (`ktae_unscored_id` to choose another), where the official code
  hard-codes Qwen's `<|endoftext|>` (151643, the pad token of every Qwen2.5 tokenizer and the EOS of the base models)
  and fails on a vocabulary without that id.
- The p-value is exact: the hypergeometric terms from log-factorials in float64, a term counted when it is at most
  the observed one's (1 + 1e-7), R's and SciPy's tolerance for ties, and p = 1 exactly when every term is. The
  official float32 sum decides `p != 1` by rounding: of the 1,472 tables with p = 1 at G <= 16, each computed alone,
  it gives exactly 1 (F = 0) for 230, the 120 whose support is one point among them, and F ~ exp(-2) = 0.135 for the
  others; and 18 tables with tied terms lose half their p-value (docs/methods.md).
- A side with no valid token (L_T = 0) has term frequency 0, where the official code divides 0 by 0.
- Groups may span processes: the counts of a group are summed over every process (the official code sees a whole
  group in one process).
- The official loop over the token ids of each group (and a vocabulary-sized table per group) becomes one pass over
  the distinct (group, id) pairs of the batch.

Statistics: none from the model; the completion ids and the raw rewards, at generation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .batch import CreditBatch, CreditResult
from .registry import get_credit_method, paper, register_credit_method
from .settings import FINITE_NON_NEGATIVE, FINITE_POSITIVE, SettingError, check_fields, hyperparameter

KTAE_PAPER = paper(
    "KTAE: A Model-Free Algorithm to Key-Tokens Advantage Estimation in Mathematical Reasoning",
    "2505.16826",
    "sun2025ktae",
    "Sun, Wei and Yang, Wen and Jian, Pu and Du, Qianlong and Cui, Fuwei and Ren, Shuo and Zhang, Jiajun",
    year=2025,
)

# BM25's constants in the official `compute_tf`, and the official code's smoothing of the frequency ratios.
BM25_K1, BM25_B = 2.0, 0.5
_TF_EPS = 1e-5
# A hypergeometric term counts towards the p-value when it is at most the observed one's (1 + this): ties are ties.
_TIE_RTOL = 1e-7
# Token ids and counts travel through the float32 gather: exact below 2**24.
_MAX_EXACT = 2**24
# The largest count of a 2 x 2 table keyed as four digits of one int64: (_MAX_COUNT + 1)**4 < 2**63.
_MAX_COUNT = 55_107


@dataclass
class KTAEArguments:
    """KTAE's hyperparameters (the official code's values)."""

    ktae_alpha: float = hyperparameter(
        1.0, "KTAE weight alpha of the Fisher exact test's score exp(-2 p). Finite and >= 0."
    )
    ktae_beta: float = hyperparameter(
        1.0, "KTAE weight beta of the information gain. Finite and >= 0; alpha + beta > 0."
    )
    ktae_term_frequency: bool = hyperparameter(
        True, "KTAE: add the BM25 term-frequency ratio to Cohen's h in the direction score (official)."
    )
    ktae_scale: float = hyperparameter(
        1.0, "KTAE bound of the key-token value added to each advantage (official `top`). Finite and > 0."
    )
    ktae_correct_threshold: float = hyperparameter(
        0.0, "KTAE: a completion is correct when its raw reward exceeds this (official: > 0). Finite."
    )
    ktae_unscored_id: int | None = hyperparameter(
        None,
        "KTAE: token id that gets no key-token value (the official code hard-codes Qwen's pad and base "
        "EOS id, 151643). Default: the tokenizer's pad token id.",
    )

    def __post_init__(self):
        check_fields(
            self,
            ktae_alpha=FINITE_NON_NEGATIVE,
            ktae_beta=FINITE_NON_NEGATIVE,
            ktae_scale=FINITE_POSITIVE,
            ktae_correct_threshold=(math.isfinite, "finite"),
            ktae_unscored_id=(
                lambda value: value is None or value >= 0,
                "None (the tokenizer's pad id) or an id >= 0",
            ),
        )
        if not self.ktae_alpha + self.ktae_beta > 0:
            raise SettingError(
                "ktae_beta", f"must be > 0 when ktae_alpha is 0, got {self.ktae_beta!r}", ("ktae_alpha",)
            )


def _log_choose(n: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return torch.lgamma(n + 1) - torch.lgamma(k + 1) - torch.lgamma(n - k + 1)


def fisher_exact_p(a, b, c, d) -> tuple[torch.Tensor, torch.Tensor]:
    """The two-sided Fisher exact p-value of each table `[[a, b], [c, d]]` (`(N,)` float64 counts), and whether it is
    exactly 1: every hypergeometric term of the table's margins is at most the observed table's."""
    holders_N1, correct_N1, total_N1 = (a + b).unsqueeze(1), (a + c).unsqueeze(1), (a + b + c + d).unsqueeze(1)
    low_N1 = (holders_N1 + correct_N1 - total_N1).clamp(min=0)
    high_N1 = torch.minimum(holders_N1, correct_N1)
    width = int((high_N1 - low_N1).max()) + 1 if a.numel() else 1
    k_NK = low_N1 + torch.arange(width, device=a.device)  # the support, padded to the widest one
    inside_NK = k_NK <= high_N1
    k_NK = torch.minimum(k_NK, high_N1)

    def log_term(k):  # log P(k) = log [C(correct, k) C(total - correct, holders - k) / C(total, holders)]
        log_ways = _log_choose(correct_N1, k) + _log_choose(total_N1 - correct_N1, holders_N1 - k)
        return log_ways - _log_choose(total_N1, holders_N1)

    log_terms_NK = log_term(k_NK)
    counted_NK = inside_NK & (log_terms_NK <= log_term(a.unsqueeze(1)) + math.log1p(_TIE_RTOL))
    p = torch.where(counted_NK, log_terms_NK.exp(), 0.0).sum(dim=1)
    return p, (counted_NK == inside_NK).all(dim=1)


def _entropy_bits(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The entropy in bits of the split `(x, y)` of `x + y` items; 0 for no items."""
    total = (x + y).clamp(min=1)
    nats = -(torch.special.xlogy(x / total, x / total) + torch.special.xlogy(y / total, y / total))
    return nats / math.log(2)


def information_gain(a, b, c, d) -> torch.Tensor:
    """`H(correct) - H(correct | holds the id)` in bits, for tables `[[a, b], [c, d]]` (rows: holds it or not; columns:
    correct or wrong)."""
    total = (a + b + c + d).clamp(min=1)
    conditional = (a + b) / total * _entropy_bits(a, b) + (c + d) / total * _entropy_bits(c, d)
    return _entropy_bits(a + c, b + d) - conditional


def bm25_term_frequency(occurrences, length, mean_length) -> torch.Tensor:
    """BM25's saturated term frequency of an id with `occurrences` among `length` tokens, `mean_length` the mean
    length of the two sides (official `compute_tf`); 0 where `length` is 0."""
    frequency = occurrences / length.clamp(min=1)
    saturation = BM25_K1 * (1 - BM25_B + BM25_B * length / mean_length)  # a pair's group has a valid token: > 0
    return frequency * (BM25_K1 + 1) / (frequency + saturation)


def ktae_key_values(tables, alpha: float, beta: float, scale: float, term_frequency: bool) -> torch.Tensor:
    """The key-token value `k` of each (group, id) pair, from `tables`: float64 `(N,)` tensors `a`, `b` (correct and
    wrong completions holding the id), `n_T`, `n_F` (the group's correct and wrong completions), `o_T`, `o_F` (the
    id's occurrences in them) and `L_T`, `L_F` (their valid tokens). 0 in a group without both kinds."""
    a, b, n_T, n_F = tables["a"], tables["b"], tables["n_T"], tables["n_F"]
    # The association scores depend on the 2 x 2 table alone: computed once per distinct table (a few hundred), each
    # table keyed by its four counts as the digits of one integer.
    counts_N4 = torch.stack([a, b, n_T - a, n_F - b], dim=1).long()
    base = int(counts_N4.max()) + 1 if counts_N4.numel() else 1
    if base - 1 > _MAX_COUNT:
        raise ValueError(
            f"KTAE: {base - 1} completions of one kind in a prompt group; at most {_MAX_COUNT} (int64 keys)"
        )
    digits = base ** torch.arange(3, -1, -1, device=counts_N4.device)
    distinct_U, table_N = torch.unique((counts_N4 * digits).sum(dim=1), return_inverse=True)
    distinct_U4 = (distinct_U.unsqueeze(1) // digits % base).double().unbind(1)
    p, p_is_one = fisher_exact_p(*distinct_U4)
    association_U = alpha * torch.where(p_is_one, 0.0, torch.exp(-2 * p)) + beta * information_gain(*distinct_U4)
    cohen_h = torch.asin((a / n_T.clamp(min=1)).sqrt()) - torch.asin((b / n_F.clamp(min=1)).sqrt())
    direction = cohen_h
    if term_frequency:
        mean_length = (tables["L_T"] + tables["L_F"]) / 2
        tf_T = bm25_term_frequency(tables["o_T"], tables["L_T"], mean_length)
        tf_F = bm25_term_frequency(tables["o_F"], tables["L_F"], mean_length)
        direction = direction + tf_T / (tf_F + _TF_EPS) - tf_F / (tf_T + _TF_EPS)
    score = association_U[table_N] * direction / (alpha + beta)
    # = scale * (2 sigmoid(score) - 1), without its cancellation near 0. A group without a correct or without a wrong
    # completion has one-point supports (p = 1, F = 0) and no information gain: k = 0 there.
    return scale * torch.tanh(score / 2)


def _exact_in_float32(name: str, values: torch.Tensor) -> torch.Tensor:
    if values.numel() and not 0 <= int(values.min()) <= int(values.max()) < _MAX_EXACT:
        raise ValueError(f"KTAE: {name} must be in [0, {_MAX_EXACT}), got {int(values.min())} to {int(values.max())}")
    return values


def _local_pairs(ids_BT, valid_BT, groups_B, correct_B) -> tuple[torch.Tensor, torch.Tensor]:
    """This process's distinct (group, id) pairs at valid positions, `(P, 6)` float64: group, id, how many correct and
    wrong completions hold the id, its occurrences in the correct and in the wrong ones; and each valid token's pair
    (in `valid_BT`'s row-major order)."""
    rows_N = valid_BT.nonzero(as_tuple=True)[0]
    ids_N = _exact_in_float32("token ids", ids_BT[valid_BT])
    width = int(ids_N.max()) + 1 if ids_N.numel() else 1
    # Each completion's distinct ids with their occurrences, then the distinct (group, id) pairs.
    row_ids_M, row_id_N, occurrences_M = torch.unique(rows_N * width + ids_N, return_inverse=True, return_counts=True)
    rows_M, ids_M = row_ids_M // width, row_ids_M % width
    pairs_P, pair_M = torch.unique(groups_B[rows_M] * width + ids_M, return_inverse=True)
    correct_M = correct_B[rows_M].double()
    holders_M2 = torch.stack([correct_M, 1 - correct_M], dim=1)
    counts_P4 = torch.zeros(pairs_P.numel(), 4, dtype=torch.float64, device=ids_N.device).index_add_(
        0, pair_M, torch.cat([holders_M2, holders_M2 * occurrences_M.unsqueeze(1)], dim=1)
    )
    pairs_P6 = torch.cat([torch.stack([pairs_P // width, pairs_P % width], dim=1).double(), counts_P4], dim=1)
    return pairs_P6, pair_M[row_id_N]


def ktae_tables(ids_BT, valid_BT, group_index_B, correct_B, gather=None) -> tuple[dict, torch.Tensor]:
    """The [`ktae_key_values`] `tables` of every distinct (group, id) pair at a valid position of the batch (every
    process's), and the pair of each of this process's valid tokens (an index into the tables, `valid_BT`'s
    row-major order).

    `gather` concatenates every process's values (a collective, called twice on every process whatever its mask): a
    group's counts are summed over all its rows, wherever they are. Without it, the rows passed in are the whole batch.
    """
    gather = gather or (lambda values_N: values_N)
    valid_BT = valid_BT.bool()
    groups_B = _exact_in_float32("prompt group indices", group_index_B.long())
    local_P6, local_pair_N = _local_pairs(ids_BT.long(), valid_BT, groups_B, correct_B)
    rows_B3 = torch.stack([groups_B.double(), correct_B.double(), valid_BT.sum(dim=1).double()], dim=1)
    all_P6 = gather(local_P6.float().flatten()).view(-1, 6).double()
    all_R3 = gather(rows_B3.float().flatten()).view(-1, 3).double()
    width = int(all_P6[:, 1].max()) + 1 if all_P6.numel() else 1
    keys_K, pair_P = torch.unique(all_P6[:, 0].long() * width + all_P6[:, 1].long(), return_inverse=True)
    counts_K4 = all_P6.new_zeros(keys_K.numel(), 4).index_add_(0, pair_P, all_P6[:, 2:])
    # Each group's completions and valid tokens, correct and wrong, on each of its pairs.
    groups_G, group_R = torch.unique(all_R3[:, 0].long(), return_inverse=True)
    correct_R, lengths_R = all_R3[:, 1], all_R3[:, 2]
    sides_R4 = torch.stack([correct_R, 1 - correct_R, lengths_R * correct_R, lengths_R * (1 - correct_R)], dim=1)
    sides_G4 = all_R3.new_zeros(groups_G.numel(), 4).index_add_(0, group_R, sides_R4)
    sides_K4 = sides_G4[torch.searchsorted(groups_G, keys_K // width)] if keys_K.numel() else all_R3.new_zeros(0, 4)
    tables = dict(zip(("a", "b", "o_T", "o_F"), counts_K4.unbind(1)))
    tables.update(zip(("n_T", "n_F", "L_T", "L_F"), sides_K4.unbind(1)))
    local_keys_P = local_P6[:, 0].long() * width + local_P6[:, 1].long()
    return tables, torch.searchsorted(keys_K, local_keys_P)[local_pair_N]


def _unscored_id(batch: CreditBatch, ktae_unscored_id: int | None) -> int:
    unscored_id = ktae_unscored_id if ktae_unscored_id is not None else batch.pad_token_id
    if unscored_id is None:
        raise ValueError("credit method 'ktae' needs a pad token id: give the tokenizer one, or set ktae_unscored_id")
    return int(unscored_id)


@register_credit_method("ktae", display_name="KTAE", statistics=(), arguments=KTAEArguments, paper=KTAE_PAPER)
def ktae(
    batch: CreditBatch,
    ktae_alpha: float,
    ktae_beta: float,
    ktae_term_frequency: bool,
    ktae_scale: float,
    ktae_correct_threshold: float,
    ktae_unscored_id: int | None,
) -> CreditResult:
    """Adds to each token's advantage its id's key-token value in its prompt group: how strongly holding the id goes
    with a correct completion (Fisher exact test, information gain), signed by Cohen's h and BM25 frequencies.

    Metrics:
        mean_key_value: mean key-token value k added to the valid tokens' advantages
        mean_abs_key_value: mean |k| over the valid tokens
        scored_fraction: fraction of valid tokens in groups with both correct and wrong completions (the others get
            no key-token value)

    Token statistic:
        key_value: k, the key-token value of the token's id in its prompt group, added to its advantage
    """
    inputs = {
        "completion ids": batch.completion_ids_BT,
        "prompt groups": batch.group_index_B,
        "rewards": batch.rewards_B,
    }
    missing = [name for name, given in inputs.items() if given is None]
    if missing:
        raise ValueError(
            "credit method 'ktae' reads the completion ids, the prompt groups and the rewards; "
            f"not given: {', '.join(missing)}"
        )
    mask_BT, ids_BT = batch.mask_BT, batch.completion_ids_BT.long()
    correct_B = batch.rewards_B > ktae_correct_threshold
    tables, pair_N = ktae_tables(ids_BT, mask_BT, batch.group_index_B, correct_B, batch.gather)
    values_K = ktae_key_values(tables, ktae_alpha, ktae_beta, ktae_scale, ktae_term_frequency)
    key_BT = torch.zeros(mask_BT.shape, device=mask_BT.device).masked_scatter(mask_BT, values_K[pair_N].float())
    scored_K = (tables["n_T"] > 0) & (tables["n_F"] > 0)
    scored_BT = torch.zeros_like(mask_BT).masked_scatter(mask_BT, scored_K[pair_N])
    key_BT = key_BT.masked_fill(ids_BT == _unscored_id(batch, ktae_unscored_id), 0.0)
    return CreditResult(
        advantages_BT=batch.advantages_BT + key_BT,
        metrics={"mean_key_value": key_BT, "mean_abs_key_value": key_BT.abs(), "scored_fraction": scored_BT.float()},
        statistic_BT=key_BT,
    )


# KTAE on plain tensors (every row of every group): `ktae_advantages(advantages_B, mask_BT, completion_ids_BT=...,
# group_index_B=..., rewards_B=..., pad_token_id=...)`.
ktae_advantages = get_credit_method("ktae").on_tensors
