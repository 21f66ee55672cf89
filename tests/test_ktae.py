"""KTAE against its official code (xiaolizh1/KTAE: `ComputeKeyTokens` in `verl/workers/actor/compute_key_tokens.py`,
run per prompt group by `compute_ktae_outcome_advantage_and_keytokens` in `verl/trainer/ppo/core_algos.py`) on random
groups and on each edge class, and its departures from it.

The official functions are taken out of a clone at test time, as `benchmarks/official.py` does (its `ktae_official`):
set TRL_CREDIT_OFFICIAL_ROOT to the folder of the clones (the benchmark's `--official_root`); without the KTAE clone
there, the parity tests skip. Nothing of the clone is vendored.

The official code decides "p-value == 1" (a table that gets no Fisher score) by the rounding of a float32 sum, and
ties between hypergeometric terms by their float32 rounding; ours is exact. Parity is asserted at 1e-5 on every token
whose table the official float32 p-value gets right (within 1e-6, and 1 exactly when it is 1); on the others, the
ill-conditioned tokens, ours equals the exact reference (`tests/reference_credit.py`) and the departure is counted.
"""

import os
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from conftest import on_threads_as_processes
from reference_credit import REFERENCE_RULES, ReferenceBatch, _fisher_exact_p, resolved_hyperparameters

from trl_credit.methods import CREDIT_METHODS, SettingError
from trl_credit.methods.ktae import fisher_exact_p, ktae_advantages, ktae_key_values

OFFICIAL_ROOT = Path(os.environ.get("TRL_CREDIT_OFFICIAL_ROOT", "official"))
BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
NEEDS_CLONE = "needs the official code: git clone https://github.com/xiaolizh1/KTAE $TRL_CREDIT_OFFICIAL_ROOT/KTAE"
needs_official = pytest.mark.skipif(
    not (OFFICIAL_ROOT / "KTAE" / "verl" / "workers" / "actor" / "compute_key_tokens.py").is_file(),
    reason=NEEDS_CLONE,
)
QWEN_PAD = 151643  # Qwen's <|endoftext|>, its pad id (and its base models' EOS): the id the official code leaves out
LARGER_ID = 151700  # in every batch: the official group-of-one path indexes a table of (largest id) entries


def make_batch(seed, sizes=(8, 8, 6, 4), length=12, distinct=10):
    """Groups of `sizes` completions in shuffled rows, 0/1 rewards, random lengths, ids from `distinct` values, each
    completion ending on the pad id as its EOS (Qwen's base models) and padded with it."""
    g = torch.Generator().manual_seed(seed)
    group_B = torch.arange(len(sizes)).repeat_interleave(torch.tensor(sizes))
    group_B = group_B[torch.randperm(group_B.numel(), generator=g)]
    rows = group_B.numel()
    rewards_B = (torch.rand(rows, generator=g) < 0.5).float()
    lengths_B = torch.randint(1, length + 1, (rows,), generator=g)
    mask_BT = torch.arange(length) < lengths_B.unsqueeze(1)
    ids_BT = torch.randint(100, 100 + distinct, (rows, length), generator=g)
    ids_BT[torch.arange(rows), lengths_B - 1] = QWEN_PAD
    ids_BT = torch.where(mask_BT, ids_BT, QWEN_PAD)
    ids_BT[0, 0] = LARGER_ID
    return {"group_B": group_B, "rewards_B": rewards_B, "mask_BT": mask_BT, "ids_BT": ids_BT}


def official_grpo_advantages(group_B, rewards_B):
    """The GRPO part of the official function: (r - mean) / (std + 1e-6) per group, a group of one r / (1 + 1e-6)."""
    advantages_B = torch.zeros_like(rewards_B)
    for group in group_B.unique():
        rows = group_B == group
        r = rewards_B[rows]
        mean, std = (r.mean(), r.std()) if r.numel() > 1 else (torch.tensor(0.0), torch.tensor(1.0))
        advantages_B[rows] = (r - mean) / (std + 1e-6)
    return advantages_B


def ours_result(b, gather=None, **named):
    """The package's KTAE on `b` (GRPO's advantages as the official code takes them, or `b["advantages_B"]`);
    `named`: settings, fields."""
    return ktae_advantages(
        b.get("advantages_B", official_grpo_advantages(b["group_B"], b["rewards_B"])),
        b["mask_BT"],
        completion_ids_BT=b["ids_BT"],
        group_index_B=b["group_B"],
        rewards_B=b["rewards_B"],
        gather=gather,
        **{"pad_token_id": QWEN_PAD, **named},
    )


def ours(b, gather=None, **settings):
    return ours_result(b, gather, **settings).advantages_BT


def reference(b, **settings):
    """The exact reference rule (`tests/reference_credit.py`) on `b`, float64."""
    batch = ReferenceBatch.start(
        official_grpo_advantages(b["group_B"], b["rewards_B"]).double(),
        b["mask_BT"],
        group_index_B=b["group_B"],
        rewards_B=b["rewards_B"].double(),
        completion_ids_BT=b["ids_BT"],
        pad_token_id=QWEN_PAD,
    )
    return REFERENCE_RULES["ktae"](batch, resolved_hyperparameters("ktae", settings))[0]


@pytest.fixture(scope="module")
def official():
    """`run(batch) -> (advantages_BT, ill_BT)`: the official function's advantages, and the tokens whose table its
    float32 Fisher p-value gets wrong (recorded from its own calls)."""
    import sys

    sys.path.insert(0, str(BENCHMARKS))
    try:
        import official as benchmark
    finally:
        sys.path.remove(str(BENCHMARKS))
    function = benchmark.ktae_official(OFFICIAL_ROOT, {"torch": torch, "defaultdict": defaultdict})
    fisher, calls = function.namespace["fisher_exact_test"], []

    def recording(table):
        p = fisher(table)
        calls.append((table.clone(), p.clone()))
        return p

    function.namespace["fisher_exact_test"] = recording

    def run(b):
        calls.clear()
        rewards_BT = torch.zeros(b["mask_BT"].shape)
        rewards_BT[:, 0] = b["rewards_B"]  # the official score is the sum over the row
        advantages_BT, _ = function(rewards_BT, b["ids_BT"], b["mask_BT"].float(), b["group_B"].numpy())
        return advantages_BT, _ill_conditioned(b, calls)

    return run


def _ill_conditioned(b, calls):
    """The tokens whose (group, id) table the official float32 p-value gets wrong. The official code tests the groups
    in order of first appearance, those with a correct and a wrong completion (reward > 0 or not)."""
    group_B, correct_B = b["group_B"], b["rewards_B"] > 0
    order = list(dict.fromkeys(group_B.tolist()))
    tested = [k for k in order if correct_B[group_B == k].any() and not correct_B[group_B == k].all()]
    assert len(tested) == len(calls)
    ill_BT = torch.zeros(b["mask_BT"].shape, dtype=torch.bool)
    for group, (table, p) in zip(tested, calls):
        for token_id in (table.sum(dim=1) > 0).nonzero().flatten().tolist():
            exact = _fisher_exact_p(*(int(count) for count in table[token_id]))
            got = float(p[token_id])
            if (got == 1.0) != (exact == 1) or abs(got - float(exact)) > 1e-6:
                ill_BT |= (group_B == group).unsqueeze(1) & (b["ids_BT"] == token_id)
    return ill_BT & b["mask_BT"]


def assert_official_parity(b, got_BT, official):
    """Ours equals the official code at 1e-5 on the well-conditioned tokens, the exact reference on all."""
    want_BT, ill_BT = official(b)
    well_BT = ~ill_BT
    torch.testing.assert_close(got_BT[well_BT], want_BT[well_BT], atol=1e-5, rtol=0)
    torch.testing.assert_close(got_BT.double(), reference(b), atol=1e-5, rtol=0)
    moved_BT = (got_BT - official_grpo_advantages(b["group_B"], b["rewards_B"]).unsqueeze(1)).abs() > 1e-3
    assert (moved_BT & well_BT & b["mask_BT"]).any()  # the comparison covers tokens whose credit moved


def _with(b, **changes):
    return {**b, **changes}


def _group_rewards(b, group, value):
    return torch.where(b["group_B"] == group, value, b["rewards_B"])


def _first_token_shared(b, group):
    ids_BT = b["ids_BT"].clone()
    ids_BT[b["group_B"] == group, 0] = 105  # every completion of the group holds it (all have a valid token 0)
    return ids_BT


def _masked_tokens_kept(b):
    """Masked positions holding the completion's own ids (a completion out of the loss, TRL's truncated ones), and a
    completion with no valid token at all."""
    g = torch.Generator().manual_seed(7)
    ids_BT = torch.where(b["mask_BT"], b["ids_BT"], torch.randint(100, 110, b["ids_BT"].shape, generator=g))
    mask_BT = b["mask_BT"].clone()
    mask_BT[3] = False
    return _with(b, ids_BT=ids_BT, mask_BT=mask_BT)


EDGE_CLASSES = {
    "no_correct_completion": lambda b: _with(b, rewards_B=_group_rewards(b, 0, 0.0)),
    "no_wrong_completion": lambda b: _with(b, rewards_B=_group_rewards(b, 1, 1.0)),
    "one_completion": lambda b: make_batch(3, sizes=(8, 1, 5, 1)),
    "id_in_every_completion": lambda b: _with(b, ids_BT=_first_token_shared(b, 2)),
    "padding": _masked_tokens_kept,
}


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"ktae_correct_threshold": 0.5},
        {"ktae_term_frequency": False},
        {"ktae_alpha": 0.0, "ktae_beta": 2.0},
        {"ktae_alpha": 3.0, "ktae_beta": 0.0, "ktae_scale": 0.5},
    ],
)
def test_every_setting_equals_the_reference(settings):
    b = make_batch(8)
    b["rewards_B"] = torch.linspace(-1.0, 1.0, b["rewards_B"].numel())[torch.randperm(b["rewards_B"].numel())]
    want = reference(b, **settings)
    torch.testing.assert_close(ours(b, **settings).double(), want, atol=1e-5, rtol=0)
    moved = (want - official_grpo_advantages(b["group_B"], b["rewards_B"]).unsqueeze(1).double()).abs() > 1e-3
    assert (moved & b["mask_BT"]).any()
    if settings:
        assert float((want - reference(b)).abs().max()) > 1e-3  # the setting changes the credit


@needs_official
@pytest.mark.parametrize("seed", range(4))
def test_random_groups_match_the_official_code(official, seed):
    b = make_batch(seed)
    assert_official_parity(b, ours(b), official)


@needs_official
@pytest.mark.parametrize("edge", sorted(EDGE_CLASSES))
def test_edge_class_matches_the_official_code(official, edge):
    b = EDGE_CLASSES[edge](make_batch(11))
    assert_official_parity(b, ours(b), official)


@needs_official
def test_a_group_split_across_processes_matches_the_official_code(official):
    """Each rank holds some of every group's completions, padded to its own longest one."""
    b = make_batch(5)
    whole = {**b, "advantages_B": official_grpo_advantages(b["group_B"], b["rewards_B"])}
    cut = [torch.arange(0, 9), torch.arange(9, b["group_B"].numel())]

    def run(rank, gather):
        rows = cut[rank]
        width = int(b["mask_BT"][rows].sum(dim=1).max())
        part = {key: value[rows] if value.dim() == 1 else value[rows, :width] for key, value in whole.items()}
        got = ours(part, gather)
        return torch.nn.functional.pad(got, (0, b["mask_BT"].size(1) - width))

    assert_official_parity(b, torch.cat(on_threads_as_processes(run)), official)


def test_a_group_split_across_processes_equals_the_whole_batch():
    b = make_batch(5)
    whole = {**b, "advantages_B": official_grpo_advantages(b["group_B"], b["rewards_B"])}
    cut = [torch.arange(0, 13), torch.arange(13, b["group_B"].numel())]

    def run(rank, gather):
        return ours({key: value[cut[rank]] for key, value in whole.items()}, gather)

    torch.testing.assert_close(torch.cat(on_threads_as_processes(run)), ours(b), atol=1e-6, rtol=0)


def test_the_fisher_p_value_is_exact_on_every_table_of_small_groups():
    """Every 2 x 2 table of groups of 2 to 16 completions with a correct and a wrong one, against the exact fractions
    of the reference (and SciPy's `fisher_exact` up to 8 completions); p = 1 exactly where it is 1 (the official
    float32 sum, each table alone, gives 1 for 230 of these 1,472 tables only)."""
    from scipy.stats import fisher_exact

    tables = [
        (a, b, correct - a, size - correct - b)
        for size in range(2, 17)
        for correct in range(1, size)
        for a in range(correct + 1)
        for b in range(size - correct + 1)
        if a + b
    ]
    p, p_is_one = fisher_exact_p(*torch.tensor(tables, dtype=torch.float64).unbind(1))
    exact = [_fisher_exact_p(*table) for table in tables]
    torch.testing.assert_close(
        p, torch.tensor([float(value) for value in exact], dtype=torch.float64), atol=1e-12, rtol=0
    )
    assert p_is_one.tolist() == [value == 1 for value in exact] and sum(value == 1 for value in exact) == 1472
    small = [n for n, table in enumerate(tables) if sum(table) <= 8]
    scipy_p = torch.tensor([fisher_exact([tables[n][:2], tables[n][2:]])[1] for n in small], dtype=torch.float64)
    torch.testing.assert_close(p[small], scipy_p, atol=1e-12, rtol=0)


def _one_group_with_a_short_side(side, lone_token=False):
    """One group of 2 correct and 4 wrong completions whose `side` ("correct" or "wrong") has no valid token, or with
    `lone_token` one: its first completion's first token, given the id of the other side's first token (so that the
    id's term frequency is finite on both sides and its key-token value short of the bound)."""
    b = make_batch(2, sizes=(6,))
    b["rewards_B"] = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    rows, other = (range(0, 2), 2) if side == "correct" else (range(2, 6), 0)
    b["mask_BT"][rows] = False
    if lone_token:
        b["mask_BT"][rows[0], 0] = True
        b["ids_BT"][rows[0], 0] = b["ids_BT"][other, 0]
    return b


def test_correct_completions_without_valid_tokens_have_no_term_frequency():
    """The official code divides 0 by 0 there (NaN advantages); ours gives the correct side a term frequency of 0."""
    b = _one_group_with_a_short_side("correct")
    got = ours(b)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), reference(b), atol=1e-5, rtol=0)


@pytest.mark.parametrize("side", ["correct", "wrong"])
def test_a_side_of_one_valid_token_has_that_tokens_frequency(side):
    """BM25's frequency on a side of one valid token is its id's count over that one token (the guard of a side with
    none leaves a length of 1 alone), as the reference computes it."""
    b = _one_group_with_a_short_side(side, lone_token=True)
    want = reference(b)
    torch.testing.assert_close(ours(b).double(), want, atol=1e-5, rtol=0)
    lone = (0, 0) if side == "correct" else (2, 0)
    moved = want[lone] - official_grpo_advantages(b["group_B"], b["rewards_B"]).double()[lone[0]]
    assert 0.1 < abs(float(moved)) < 0.99  # the lone token gets a key-token value short of its bound


def test_the_pad_id_or_the_chosen_id_gets_no_key_token_value():
    b = make_batch(4)
    by_pad = ours_result(b).statistic_BT
    assert (by_pad[b["ids_BT"] == QWEN_PAD] == 0).all() and (by_pad[b["ids_BT"] == 101] != 0).any()
    chosen = ours_result(b, ktae_unscored_id=101).statistic_BT
    assert (chosen[b["ids_BT"] == 101] == 0).all() and (chosen[b["ids_BT"] == QWEN_PAD] != 0).any()
    with pytest.raises(ValueError) as error:
        ours_result(b, pad_token_id=None)
    assert str(error.value) == (
        "credit method 'ktae' needs a pad token id: give the tokenizer one, or set ktae_unscored_id"
    )


def test_alpha_and_beta_may_not_both_be_zero():
    method = CREDIT_METHODS["ktae"]
    assert method.hyperparameters({"ktae_alpha": 0.0, "ktae_beta": 1e-9})["ktae_beta"] == 1e-9
    with pytest.raises(SettingError) as error:
        method.hyperparameters({"ktae_alpha": 0.0, "ktae_beta": 0.0})
    assert (error.value.name, error.value.mentions) == ("ktae_beta", ("ktae_alpha",))
    assert str(error.value) == "ktae_beta must be > 0 when ktae_alpha is 0, got 0.0"


def test_inputs_it_cannot_read_are_clear_errors():
    b = make_batch(1)
    fields = {"completion_ids_BT": b["ids_BT"], "group_index_B": b["group_B"], "rewards_B": b["rewards_B"]}
    # None of them given, or each one missing alone: the message names what is missing.
    names = {"completion_ids_BT": "completion ids", "group_index_B": "prompt groups", "rewards_B": "rewards"}
    for missing in [list(fields), *([name] for name in fields)]:
        given = {k: v for k, v in fields.items() if k not in missing}
        with pytest.raises(ValueError) as error:
            ktae_advantages(torch.zeros(b["rewards_B"].numel()), b["mask_BT"], pad_token_id=QWEN_PAD, **given)
        assert str(error.value) == (
            "credit method 'ktae' reads the completion ids, the prompt groups and the rewards; "
            f"not given: {', '.join(names[name] for name in missing)}"
        )
    for key, name in (("ids_BT", "token ids"), ("group_B", "prompt group indices")):
        with pytest.raises(ValueError) as error:
            ours({**b, key: torch.where(b[key] == b[key].max(), 2**24, 0 * b[key])})
        assert str(error.value) == f"KTAE: {name} must be in [0, {2**24}), got 0 to {2**24}"
    ours({**b, "ids_BT": b["ids_BT"].clamp(max=2**24 - 1)})  # the largest id that travels exactly
    huge = {name: torch.tensor([1.0]) for name in ("a", "b", "o_T", "o_F", "L_T", "L_F")}
    assert (55_107 + 1) ** 4 < 2**63 <= (55_108 + 1) ** 4
    with pytest.raises(ValueError, match="KTAE: 55108 completions of one kind in a prompt group; at most 55107"):
        ktae_key_values({**huge, "n_T": torch.tensor([55109.0]), "n_F": torch.tensor([1.0])}, 1.0, 1.0, 1.0, True)
    largest = {**huge, "n_T": torch.tensor([55108.0]), "n_F": torch.tensor([1.0])}  # c = 55107
    assert ktae_key_values(largest, 1.0, 1.0, 1.0, True).isfinite().all()
