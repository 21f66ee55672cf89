"""GTPO against its official rules (winstonsmith1897/GTPO `gtpo/gtpo_training.py`: `build_conflict_mask` and the
entropy step of `UnslothEfficientGTPO.forward`) and HICRA against its paper's rule (arXiv 2509.03646), each worked out
by loops per group and per token (`gtpo_loop`, `hicra_loop` in `reference_formulas.py`), on fixed tensors and in
training through `CreditGRPOTrainer`.
"""

import re

import pytest
import torch
from conftest import (
    VOCAB_WORDS,
    make_tiny_tokenizer,
    naive_logprobs,
    on_threads_as_processes,
    train_changing_every_parameter,
)
from reference_formulas import gtpo_loop, hicra_loop
from trainer_helpers import LossRecorder

from trl_credit.methods import CREDIT_METHODS
from trl_credit.methods.gtpo import gtpo_advantages, gtpo_conflict_runs
from trl_credit.methods.hicra import HICRA_PAPER_GRAMS, hicra_advantages
from trl_credit.trainer.token_texts import TokenTexts
from trl_credit.trainer.trl_compat import LOSS_TYPES

PAD = 0


def gtpo(adv, ids, mask, entropy, groups, pad_id=PAD, **hyperparameters):
    return gtpo_advantages(
        adv,
        mask,
        rollout_entropy=entropy,
        completion_ids_BT=ids,
        group_index_B=groups,
        pad_token_id=pad_id,
        **hyperparameters,
    )


def gtpo_batch(seed, groups=3, size=4, cols=7, vocab=4, left_pad=False, eos=False):
    """Groups of completions over a few token ids (so that conflicts are common), padded with PAD. With `eos`, most
    completions end with PAD as their EOS (a tokenizer whose pad token is its EOS), and every third one is its
    predecessor cut short just before that EOS: where the official keys read TRL's padding."""
    g = torch.Generator().manual_seed(seed)
    rows = groups * size
    ids = torch.randint(1, vocab + 1, (rows, cols), generator=g)
    for r in range(1, rows, 3):  # completions of one group often share their start or end
        ids[r, :3] = ids[r - 1, :3]
    lengths = torch.randint(1, cols + 1, (rows,), generator=g)
    lengths[0] = cols
    positions = torch.arange(cols).unsqueeze(0)
    if eos:
        ends = torch.rand(rows, generator=g) < 0.7
        for r in range(1, rows, 3):
            ids[r], lengths[r], ends[r - 1], ends[r] = ids[r - 1], max(int(lengths[r - 1]) - 1, 1), True, False
        ids[ends] = torch.where(positions == lengths[ends].unsqueeze(1) - 1, PAD, ids[ends])
    if left_pad:  # the same completions, shifted to the end of their rows
        shift = cols - lengths.unsqueeze(1)
        ids = ids.gather(1, (positions - shift) % cols)
    mask = positions >= cols - lengths.unsqueeze(1) if left_pad else positions < lengths.unsqueeze(1)
    ids = torch.where(mask, ids, PAD)
    adv = torch.randint(-2, 3, (rows,), generator=g).float() * 0.5  # ties and zeros among them
    if eos:  # each cut-short completion is the opposite of the one it was cut from
        adv[1::3] = torch.where(adv[0::3][: len(adv[1::3])] != 0, -adv[0::3][: len(adv[1::3])], 1.0)
    entropy = torch.rand(rows, cols, generator=g) * 1.4
    group_index = torch.arange(groups).repeat_interleave(size)
    return adv, ids, mask, entropy, group_index


CONFIGS = [
    {},
    {"gtpo_conflict_weight": 3.0, "gtpo_entropy_threshold": 0.5, "gtpo_entropy_scale": 0.3},
    {"gtpo_conflict_normalization": False, "gtpo_entropy_threshold": float("inf")},
]


def _loop_kwargs(config):
    return {
        "weight": config.get("gtpo_conflict_weight", 2.0),
        "threshold": config.get("gtpo_entropy_threshold", 0.7),
        "scale": config.get("gtpo_entropy_scale", 0.1),
        "normalize": config.get("gtpo_conflict_normalization", True),
    }


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("config", CONFIGS, ids=["official", "other", "unnormalised"])
def test_gtpo_random_groups_match_the_official_rules(seed, config):
    adv, ids, mask, entropy, groups = gtpo_batch(seed, groups=1 + seed % 3, size=2 + seed % 4, left_pad=seed % 2 == 1)
    got = gtpo(adv, ids, mask, entropy, groups, **config).advantages_BT
    want = gtpo_loop(adv, ids, mask, entropy, groups, PAD, **_loop_kwargs(config))
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("left_pad", [False, True], ids=["right-padded", "left-padded"])
def test_gtpo_long_completions_match_the_official_rules(left_pad):
    """Rows of 40 positions, the lengths of real completions: the keys read each row's tokens in their order (a sort
    of 17 or more equal keys that is not stable would shuffle them)."""
    adv, ids, mask, entropy, groups = gtpo_batch(3, groups=2, size=4, cols=40, left_pad=left_pad)
    got = gtpo(adv, ids, mask, entropy, groups).advantages_BT
    want = gtpo_loop(adv, ids, mask, entropy, groups, PAD, **_loop_kwargs(CONFIGS[0]))
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


def test_gtpo_one_signed_token_beside_a_completion_without_advantage():
    """One-token completions, only one of them signed: the conflict table holds a single key, and the zero-advantage
    completion's token sorts after it and matches nothing (a reward equal to its group's mean gives A = 0)."""
    ids = torch.tensor([[3], [5]])
    mask = ids != PAD
    adv, groups, entropy = torch.tensor([1.0, 0.0]), torch.zeros(2, dtype=torch.long), torch.full((2, 1), 0.1)
    got = gtpo(adv, ids, mask, entropy, groups).advantages_BT
    torch.testing.assert_close(got, gtpo_loop(adv, ids, mask, entropy, groups, PAD, **_loop_kwargs(CONFIGS[0])))


def test_gtpo_from_the_end_a_shorter_completion_reads_its_padding_past_its_start():
    """A run of conflicts from the end that outlasts a shorter completion: past its start, the shorter one offers the
    ids TRL padded it with (read backwards), not its own tokens again nor the row before it. Here the positive
    completion's run holds for its last two tokens (the long negative one shares them); at its third-last, the short
    negative one's own last token is the same id, which must not count."""
    u, v, w, y, a, b, z, q = range(1, 9)
    ids = torch.tensor([[u, v, w, y, a, b], [z, z, z, z, a, b], [q, y, PAD, PAD, PAD, PAD]])
    mask = ids != PAD
    adv, groups, entropy = torch.tensor([1.0, -1.0, -1.0]), torch.zeros(3, dtype=torch.long), torch.full((3, 6), 0.1)
    got = gtpo(adv, ids, mask, entropy, groups).advantages_BT
    want = gtpo_loop(adv, ids, mask, entropy, groups, PAD, **_loop_kwargs(CONFIGS[0]))
    torch.testing.assert_close(got, want)
    assert got[0, 3] == got[0, 0] != got[0, 4]  # the run from the end stops before the positive one's y


def test_gtpo_pad_id_stands_in_for_a_tokenizer_without_one():
    """No pad id from the tokenizer: `gtpo_pad_id` both excludes its tokens and fills past a row's width."""
    adv, ids, mask, entropy, groups = gtpo_batch(4, eos=True)
    got = gtpo_advantages(
        adv,
        mask,
        rollout_entropy=entropy,
        completion_ids_BT=ids,
        group_index_B=groups,
        pad_token_id=None,
        gtpo_pad_id=PAD,
    ).advantages_BT
    torch.testing.assert_close(got, gtpo_loop(adv, ids, mask, entropy, groups, PAD, **_loop_kwargs(CONFIGS[0])))


# (EOS is the pad id, gtpo_pad_id): the official PAD_ID apart from the tokenizer's pad id only excludes tokens (5 is
# no token of the batches, 2 is one of them), and the conflicts still read TRL's padding (issue 38).
PAD_VARIANTS = [(True, None), (True, 5), (True, 2), (False, 2)]


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("eos,gtpo_pad_id", PAD_VARIANTS, ids=["eos", "eos-pad5", "eos-pad2", "pad2"])
def test_gtpo_pad_id_only_excludes_tokens_as_officially(seed, eos, gtpo_pad_id):
    adv, ids, mask, entropy, groups = gtpo_batch(
        seed, groups=1 + seed % 3, size=2 + seed % 4, left_pad=seed % 2 == 1, eos=eos
    )
    got = gtpo(adv, ids, mask, entropy, groups, gtpo_pad_id=gtpo_pad_id).advantages_BT
    excluded = PAD if gtpo_pad_id is None else gtpo_pad_id
    torch.testing.assert_close(got, gtpo_loop(adv, ids, mask, entropy, groups, excluded), atol=1e-6, rtol=1e-6)


def test_gtpo_reproduction_of_issue_38_matches_the_official_code():
    """Tokenizer pad id 0, which is also the EOS; gtpo_pad_id 4; a positive completion [5] (cut short) and a negative
    one [5, EOS] in one group, as TRL pads them: [5, 0] and [5, 0], masks [1, 0] and [1, 1].

    The official `build_conflict_mask` worked by hand: its keys (rank, id) read the padded rows, so both ranks conflict
    from the start (the negative's EOS against the positive's padding); from the end its rotation reads [5, 0] and
    [0, 5], no conflict; PAD_ID 4 excludes nothing. `delta_final` = [[2, 0], [0, 0]] (the positive's padding masked)
    and `n_conflict` = [1, 2]. Filling ranks past an end with gtpo_pad_id instead gave [[2, 0], [0, -1]]."""
    ids = torch.tensor([[5, 0], [5, 0]])
    mask = torch.tensor([[1, 0], [1, 1]], dtype=torch.bool)
    adv, groups, entropy = torch.tensor([1.0, -1.0]), torch.zeros(2, dtype=torch.long), torch.zeros(2, 2)
    result = gtpo(adv, ids, mask, entropy, groups, gtpo_pad_id=4)
    torch.testing.assert_close(result.statistic_BT, torch.tensor([[2.0, 0.0], [0.0, 0.0]]))
    _, _, counts = gtpo_conflict_runs(ids, mask, groups, torch.sign(adv), excluded_id=4, fill_id=0)
    assert counts.tolist() == [1, 2]
    # A = +-1, no entropy: Â = delta * A / n_conflict.
    torch.testing.assert_close(result.advantages_BT, torch.tensor([[2.0, 0.0], [0.0, 0.0]]))
    torch.testing.assert_close(result.advantages_BT, gtpo_loop(adv, ids, mask, entropy, groups, 4))
    # With PAD_ID = the pad id (the default) the EOS leaves the run: the negative keeps its update there.
    default = gtpo(adv, ids, mask, entropy, groups)
    torch.testing.assert_close(default.advantages_BT, torch.tensor([[2.0, 0.0], [0.0, -1.0]]))
    torch.testing.assert_close(default.advantages_BT, gtpo_loop(adv, ids, mask, entropy, groups, PAD))


def test_gtpo_a_masked_completion_is_keyed_on_its_own_ids():
    """A completion out of the loss (TRL's `mask_truncated_completions`) keeps its ids in the row; the official keys
    read them whatever the mask: here they conflict with the whole positive completion, from both ends."""
    ids = torch.tensor([[3, 1], [3, 1]])
    mask = torch.tensor([[1, 1], [0, 0]], dtype=torch.bool)
    adv, groups, entropy = torch.tensor([1.0, -1.0]), torch.zeros(2, dtype=torch.long), torch.zeros(2, 2)
    got = gtpo(adv, ids, mask, entropy, groups).advantages_BT
    torch.testing.assert_close(got, torch.tensor([[2.0, 2.0], [0.0, 0.0]]))  # d = W^2 = 4, n = 2
    torch.testing.assert_close(got, gtpo_loop(adv, ids, mask, entropy, groups, PAD))


def test_gtpo_groups_its_conflicts_by_prompt_where_the_official_code_pools_a_micro_batch():
    """The documented departure: officially a micro-batch is one conflict group (`GTPO_accumulated_loss` views its
    rewards as one row); here each prompt's completions form their own. Prompt 0's success and prompt 1's failure
    are the same text: a conflict only when pooled."""
    ids = torch.tensor([[1, 2], [3, 4], [3, 4], [1, 2]])
    mask = torch.ones(4, 2, dtype=torch.bool)
    adv, entropy = torch.tensor([1.0, -1.0, 1.0, -1.0]), torch.zeros(4, 2)
    by_prompt = torch.tensor([0, 0, 1, 1])
    got = gtpo(adv, ids, mask, entropy, by_prompt).advantages_BT
    torch.testing.assert_close(got, adv.view(-1, 1).expand(4, 2))  # no conflict within a prompt
    torch.testing.assert_close(got, gtpo_loop(adv, ids, mask, entropy, by_prompt, PAD))
    pooled = gtpo_loop(adv, ids, mask, entropy, torch.zeros(4, dtype=torch.long), PAD)
    torch.testing.assert_close(pooled, torch.tensor([[2.0, 2.0], [0.0, 0.0], [2.0, 2.0], [0.0, 0.0]]))


def test_gtpo_padding_side_changes_nothing():
    for seed in range(6):
        right = gtpo_batch(seed, left_pad=False)
        adv, ids, mask, entropy, groups = right
        # The same completions, left-padded: each row's valid tokens shifted to the end.
        shift = (~mask).sum(dim=1)
        index = (torch.arange(mask.size(1)).unsqueeze(0) - shift.unsqueeze(1)) % mask.size(1)
        left = [t.gather(1, index) for t in (ids, mask, entropy)]
        got_right = gtpo(adv, ids, mask, entropy, groups).advantages_BT
        got_left = gtpo(adv, left[0], left[1], left[2], groups).advantages_BT
        torch.testing.assert_close(got_left, got_right.gather(1, index))


def test_gtpo_no_conflict_is_entropy_shaped_grpo():
    ids = torch.tensor([[1, 2, 3], [4, 5, 6], [1, 2, 0]])  # the negative completion shares no token with the others
    mask = ids != PAD
    adv, groups = torch.tensor([1.0, -1.0, 0.5]), torch.zeros(3, dtype=torch.long)
    entropy = torch.tensor([[0.2, 0.4, 0.6], [0.1, 0.1, 0.1], [0.9, 0.9, 0.0]])
    result = gtpo(adv, ids, mask, entropy, groups)
    mean_entropy = torch.tensor([0.4, 0.1, 0.9])
    want = torch.where(mean_entropy <= 0.7, adv - 0.1 * mean_entropy, 0.0).view(-1, 1) * mask
    torch.testing.assert_close(result.advantages_BT, want)
    assert float(result.metrics["conflict_fraction"].sum()) == 0.0


def test_gtpo_all_conflict():
    """Identical completions of both signs: every token is in both runs; positives get W^2 / n, negatives 0."""
    ids = torch.tensor([[3, 1, 2], [3, 1, 2], [3, 1, 2]])
    mask = torch.ones(3, 3, dtype=torch.bool)
    adv, groups, entropy = torch.tensor([1.0, -0.5, -0.5]), torch.zeros(3, dtype=torch.long), torch.zeros(3, 3)
    got = gtpo(adv, ids, mask, entropy, groups).advantages_BT
    torch.testing.assert_close(got, torch.tensor([[4 / 3] * 3, [0.0] * 3, [0.0] * 3]))
    torch.testing.assert_close(got, gtpo_loop(adv, ids, mask, entropy, groups, PAD))


def test_gtpo_ties_and_edges():
    # All rewards tied: no sign, no conflict; the entropy shaping still applies (A = 0 gives -gamma * H).
    ids = torch.tensor([[1, 2], [1, 2]])
    mask = torch.ones(2, 2, dtype=torch.bool)
    entropy = torch.full((2, 2), 0.7)  # exactly at the threshold: kept, as the official `<=`
    got = gtpo(torch.zeros(2), ids, mask, entropy, torch.zeros(2, dtype=torch.long)).advantages_BT
    torch.testing.assert_close(got, torch.full((2, 2), -0.07))
    # One-token completions; a group of one; an all-masked row; the pad id inside a completion never conflicts.
    ids = torch.tensor([[5, 0, 0], [5, 0, 0], [7, 7, 0], [0, 0, 0], [5, PAD, 6]])
    mask = torch.tensor([[1, 0, 0], [1, 0, 0], [1, 1, 0], [0, 0, 0], [1, 1, 1]], dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0, 2.0, 1.0, -1.0])
    groups = torch.tensor([0, 0, 1, 0, 0])
    entropy = torch.rand(5, 3)
    got = gtpo(adv, ids, mask, entropy, groups).advantages_BT
    want = gtpo_loop(adv, ids, mask, entropy, groups, PAD)
    torch.testing.assert_close(got, want)
    assert got[1, 0] == 0.0 and got[4, 0] == 0.0  # negative conflicts at the start skipped
    assert torch.isfinite(got).all() and (got[3] == 0).all()


def gtpo_on_two_processes(adv, ids, mask, entropy, groups, cut, **hyperparameters):
    """GTPO's advantages of the rows `cut[0]` and `cut[1]` on two threads that gather from each other, as two
    processes do; each half pads to its own longest completion."""

    def run(rank, gather):
        rows = cut[rank]
        width = int(mask[rows].sum(dim=1).max())
        return gtpo(
            adv[rows],
            ids[rows, :width],
            mask[rows, :width],
            entropy[rows, :width],
            groups[rows],
            gather=gather,
            **hyperparameters,
        ).advantages_BT

    return on_threads_as_processes(run)


@pytest.mark.parametrize("eos,gtpo_pad_id", [(False, None), (True, 5)], ids=["plain", "eos-pad5"])
def test_gtpo_groups_split_over_processes_give_the_same_advantages(eos, gtpo_pad_id):
    adv, ids, mask, entropy, groups = gtpo_batch(3, groups=3, size=4, eos=eos)
    whole = gtpo(adv, ids, mask, entropy, groups, gtpo_pad_id=gtpo_pad_id).advantages_BT
    cut = [slice(0, 5), slice(5, 12)]  # groups 0 and 1 straddle the cut
    halves = gtpo_on_two_processes(adv, ids, mask, entropy, groups, cut, gtpo_pad_id=gtpo_pad_id)
    for rank, rows in enumerate(cut):
        width = halves[rank].size(1)
        torch.testing.assert_close(halves[rank], whole[rows, :width])


@pytest.mark.parametrize("narrow_rank", [0, 1], ids=["narrow-first", "narrow-last"])
def test_gtpo_rows_of_a_narrower_process_read_the_pad_id_past_their_width(narrow_rank):
    """Issue 38's reproduction with its two completions on two processes: the cut-short [5] alone pads to width 1,
    and the other process's EOS at rank 1 still meets the tokenizer's pad id there, as in one padded batch. Where the
    narrower process gathers last, its rows' ranks past their width point past the end of the gathered ids."""
    positive, negative = narrow_rank, 1 - narrow_rank
    ids = torch.tensor([[5, 0], [5, 0]])
    mask = torch.tensor([[1, 1], [1, 1]], dtype=torch.bool)
    mask[positive, 1] = False
    adv, groups, entropy = torch.zeros(2), torch.zeros(2, dtype=torch.long), torch.zeros(2, 2)
    adv[positive], adv[negative] = 1.0, -1.0
    halves = gtpo_on_two_processes(adv, ids, mask, entropy, groups, [slice(0, 1), slice(1, 2)], gtpo_pad_id=4)
    assert halves[positive].shape == (1, 1)
    torch.testing.assert_close(halves[positive], torch.tensor([[2.0]]))
    torch.testing.assert_close(halves[negative], torch.tensor([[0.0, 0.0]]))


def test_gtpo_beside_a_process_whose_completions_have_no_tokens():
    """A process whose batch is zero tokens wide gathers rows but no ids; the other process's completion is then
    scored as in one batch where that completion is all padding."""
    ids, adv = torch.tensor([[5], [PAD]]), torch.tensor([1.0, -1.0])
    mask, groups, entropy = ids != PAD, torch.zeros(2, dtype=torch.long), torch.zeros(2, 1)
    halves = gtpo_on_two_processes(adv, ids, mask, entropy, groups, [slice(0, 1), slice(1, 2)])
    assert halves[1].shape == (1, 0)
    want = gtpo_loop(adv, ids, mask, entropy, groups, PAD, **_loop_kwargs(CONFIGS[0]))
    torch.testing.assert_close(halves[0], want[:1])


def test_gtpo_registration_and_errors():
    method = CREDIT_METHODS["gtpo"]
    assert method.hyperparameters() == {
        "gtpo_conflict_weight": 2.0,
        "gtpo_entropy_threshold": 0.7,
        "gtpo_entropy_scale": 0.1,
        "gtpo_conflict_normalization": True,
        "gtpo_pad_id": None,
    }
    assert method.paper["id"] == "2508.03772" and not method.reads_training_forward(method.hyperparameters())
    with pytest.raises(ValueError, match="gtpo_conflict_weight must be finite and > 0, got 0.0"):
        method.hyperparameters({"gtpo_conflict_weight": 0})
    with pytest.raises(ValueError, match="gtpo_entropy_threshold must be >= 0"):
        method.hyperparameters({"gtpo_entropy_threshold": -1})
    mask = torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="completion ids and the prompt groups"):
        gtpo_advantages(torch.ones(1), mask, rollout_entropy=torch.zeros(1, 2))
    message = "credit method 'gtpo' needs a pad token id: give the tokenizer one, or set gtpo_pad_id"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        gtpo_advantages(
            torch.ones(1),
            mask,
            rollout_entropy=torch.zeros(1, 2),
            completion_ids_BT=torch.ones(1, 2, dtype=torch.long),
            group_index_B=torch.zeros(1, dtype=torch.long),
        )
    # The ids travel through a float gather and key the conflicts, padding included: each must be an exact id.
    for bad, shown in ((2**24, "1 to 16777216"), (-100, "-100 to 1")):
        with pytest.raises(ValueError, match=rf"token ids must be in \[0, 16777216\), got {shown}"):
            gtpo(torch.tensor([1.0]), torch.tensor([[1, bad]]), torch.tensor([[1, 0]]).bool(), torch.zeros(1, 2), [0])
    # gtpo_pad_id overrides the tokenizer's pad id. With 1 as the pad id, the run from the start skips token 1; the run
    # from the end, as officially, skips the token whose rank from the start is that of token 1 from the end (token 3).
    ids, mask = torch.tensor([[1, 2, 3], [1, 2, 3]]), torch.ones(2, 3, dtype=torch.bool)
    plain = gtpo(torch.tensor([1.0, -1.0]), ids, mask, torch.zeros(2, 3), torch.zeros(2)).advantages_BT
    torch.testing.assert_close(plain, torch.tensor([[4 / 3] * 3, [0.0] * 3]))
    overridden = gtpo_advantages(
        torch.tensor([1.0, -1.0]),
        mask,
        rollout_entropy=torch.zeros(2, 3),
        completion_ids_BT=ids,
        group_index_B=torch.zeros(2),
        pad_token_id=PAD,
        gtpo_pad_id=1,
    ).advantages_BT
    torch.testing.assert_close(overridden, torch.tensor([[1.0, 2.0, 1.0], [0.0, 0.0, 0.0]]))


# -------------------------------------------------------------------------------------------------------- HICRA

# Token texts as a byte-level tokenizer decodes them one by one: leading spaces, words split across tokens.
TEXTS = [
    "",
    " we",
    " can",
    " use",
    " the",
    " fact",
    " that",
    " Let",
    "'s",
    " try",
    " a",
    " different",
    " approach",
    " But",
    " problem",
    " mentions",
    " x",
    "=2",
    ".",
    " us",
    "er",
    "\n",
    "We can",
    " u",
    "se the fact that",
]


def hicra(adv, ids, mask, **hyperparameters):
    return hicra_advantages(
        adv, mask, completion_ids_BT=ids, token_texts=lambda row: [TEXTS[i] for i in row], **hyperparameters
    )


def hicra_batch(seed, rows=6, cols=14, left_pad=False):
    g = torch.Generator().manual_seed(seed)
    phrases = [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12], [13, 4, 14, 15, 6], [22, 23, 24], [1, 2, 3, 19, 20]]
    ids = torch.randint(1, len(TEXTS), (rows, cols), generator=g)
    for r in range(rows):  # plant a phrase (whole or cut) at a random place
        phrase = phrases[int(torch.randint(len(phrases), (1,), generator=g))]
        start = int(torch.randint(0, cols - 2, (1,), generator=g))
        piece = phrase[: cols - start]
        ids[r, start : start + len(piece)] = torch.tensor(piece)
    lengths = torch.randint(1, cols + 1, (rows,), generator=g)
    lengths[0] = cols
    positions = torch.arange(cols).unsqueeze(0)
    mask = positions >= cols - lengths.unsqueeze(1) if left_pad else positions < lengths.unsqueeze(1)
    adv = torch.randn(rows, generator=g)
    adv[1] = 0.0
    return adv, torch.where(mask, ids, 0), mask


GRAMS = [list(HICRA_PAPER_GRAMS), ["can use", "use the fact", "different approach"], ["x=2", "that"]]


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("grams", GRAMS, ids=["paper", "overlapping", "short"])
def test_hicra_random_completions_match_the_paper_rule(seed, grams):
    adv, ids, mask = hicra_batch(seed, left_pad=seed % 2 == 1)
    alpha = 0.2 if seed % 3 else 0.5
    got = hicra(adv, ids, mask, hicra_grams=grams, hicra_alpha=alpha).advantages_BT
    torch.testing.assert_close(got, hicra_loop(adv, ids, mask, TEXTS, grams, alpha))


def test_hicra_grams_at_the_edges_and_word_boundaries():
    ids = torch.tensor(
        [
            [1, 2, 3, 4, 5, 6, 0],  # the whole completion is a gram
            [16, 17, 1, 2, 3, 4, 5],  # a gram cut by the completion's end: no match
            [22, 23, 24, 18, 0, 0, 0],  # "We can use the fact that", split inside words, other case
            [1, 2, 19, 20, 4, 5, 6],  # "we can user": not the word "use"
            [25 - 1, 0, 0, 0, 0, 0, 0],  # one token holding most of a gram: no match alone
        ]
    )
    mask = ids != 0
    adv = torch.tensor([1.0, 1.0, -1.0, 1.0, 1.0])
    result = hicra(adv, ids, mask)
    planning = result.statistic_BT.bool()
    assert planning[0, :6].all() and not planning[1].any() and planning[2, :3].all() and not planning[2, 3]
    assert not planning[3].any() and not planning[4].any()
    torch.testing.assert_close(result.advantages_BT, hicra_loop(adv, ids, mask, TEXTS, list(HICRA_PAPER_GRAMS)))
    torch.testing.assert_close(result.advantages_BT[2, :3], torch.full((3,), -0.8))  # 1 - alpha on a failure


def test_hicra_marks_the_longest_gram_at_a_start_only_the_match_and_reads_every_row():
    """Three edges the random cases miss, against the paper rule worked character by character (`hicra_loop`): at one
    start the longest gram wins whatever the grams' order and case ("Let me think" over "let me"); a token that ends
    where a match begins is not in it; a row with no valid token leaves the rows after it to be read."""
    texts = ["", "let", " me", " think", "x ", " so"]
    ids = torch.tensor([[1, 2, 3, 5], [4, 1, 2, 5], [1, 2, 3, 0], [4, 1, 2, 3]])
    mask = ids != 0
    mask[2] = False  # no valid token: the next row must still be matched
    adv = torch.tensor([1.0, -1.0, 1.0, 0.5])
    grams = ["Let me think", "let me"]
    result = hicra_advantages(
        adv, mask, completion_ids_BT=ids, token_texts=lambda row: [texts[i] for i in row], hicra_grams=grams
    )
    planning = result.statistic_BT.bool()
    assert planning[0].tolist() == [True, True, True, False]  # " think" is in the longest gram's match
    assert planning[1].tolist() == [False, True, True, False]  # "x " ends where "let" begins: not in the match
    assert not planning[2].any() and planning[3].tolist() == [False, True, True, True]
    torch.testing.assert_close(result.advantages_BT, hicra_loop(adv, ids, mask, texts, grams))


def test_hicra_a_token_that_decodes_to_nothing_is_no_planning_token():
    """A valid token with no text (a byte piece, a special token decoded away) inside a gram's match overlaps none of
    its characters, so the paper rule leaves it alone (`hicra_loop`: no character of it is marked)."""
    texts = ["", "let", " me", "", " think"]
    ids = torch.tensor([[1, 3, 2, 4]])  # "let" + "" + " me" + " think"
    adv = torch.tensor([1.0])
    result = hicra_advantages(
        adv, ids != 0, completion_ids_BT=ids, token_texts=lambda row: [texts[i] for i in row], hicra_grams=["let me"]
    )
    assert result.statistic_BT.bool().tolist() == [[True, False, True, False]]
    torch.testing.assert_close(result.advantages_BT, hicra_loop(adv, ids, ids != 0, texts, ["let me"]))


def test_hicra_alpha_zero_is_grpo_and_signs_are_kept():
    adv, ids, mask = hicra_batch(0)
    same = hicra(adv, ids, mask, hicra_alpha=0.0).advantages_BT
    torch.testing.assert_close(same, adv.view(-1, 1) * mask)
    reshaped = hicra(adv, ids, mask, hicra_alpha=0.9).advantages_BT
    assert (torch.sign(reshaped) == torch.sign(same)).all()


def test_hicra_registration_and_errors():
    method = CREDIT_METHODS["hicra"]
    assert method.hyperparameters() == {"hicra_alpha": 0.2, "hicra_grams": list(HICRA_PAPER_GRAMS)}
    assert method.paper["id"] == "2509.03646" and not method.reads_training_forward(method.hyperparameters())
    with pytest.raises(ValueError, match=r"hicra_alpha must be in \[0, 1\), got 1.0"):
        method.hyperparameters({"hicra_alpha": 1})
    with pytest.raises(ValueError, match="hicra_grams must be a non-empty list of non-blank phrases"):
        method.hyperparameters({"hicra_grams": ["  "]})
    assert method.hyperparameters({"hicra_grams": ("notice that", "wait")})["hicra_grams"] == ["notice that", "wait"]
    with pytest.raises(ValueError, match="hicra_grams must be a list, got 'notice that'"):
        method.hyperparameters({"hicra_grams": "notice that"})  # a string is no list of one phrase
    with pytest.raises(ValueError, match="decoded texts"):
        hicra_advantages(torch.ones(1), torch.ones(1, 2), completion_ids_BT=torch.ones(1, 2, dtype=torch.long))


# ----------------------------------------------------------------------------------------------------- training

# GTPO's default threshold (0.7 nats) filters every completion of a random tiny model (entropy ~5): raise it.
TRAINING = {
    "gtpo": {"gtpo_entropy_threshold": 10.0, "scale_rewards": "none"},
    "hicra": {"hicra_grams": [w for w in VOCAB_WORDS[::2] if w.isalpha()] + ["so then", "the answer"]},
}


def _expected(method, trainer, inputs):
    """The rule's token advantages on this micro-batch (here the whole generation batch, on-policy), from the model's
    own float64 logits and the tokenizer's vocabulary: no trainer code."""
    mask = inputs["completion_mask"].bool()
    ids, adv = inputs["completion_ids"], inputs["credit_sequence_advantages"].float()
    hp = trainer.args.credit_hyperparameters()
    tokenizer = trainer.processing_class
    if method == "gtpo":
        logp = naive_logprobs(trainer.model, inputs, trainer.temperature, torch.float64)
        entropy = -(logp.exp() * logp).sum(-1).float()
        groups = inputs["credit_group_index"]
        return gtpo_loop(adv, ids, mask, entropy, groups, tokenizer.pad_token_id, 2.0, hp["gtpo_entropy_threshold"])
    texts = {i: " " + token for token, i in tokenizer.get_vocab().items()}  # a word-level tokenizer
    return hicra_loop(adv, ids, mask, texts, hp["hicra_grams"], hp["hicra_alpha"])


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("method", ["gtpo", "hicra"])
def test_trains_under_every_loss_type_and_trl_consumes_the_rule(monkeypatch, make_trainer, method, loss_type):
    extra = {"epsilon_high": 5.0} if loss_type == "cispo" else {}
    trainer = make_trainer(
        method, loss_type=loss_type, max_steps=2, per_device_train_batch_size=8, **TRAINING[method], **extra
    )
    recorder = LossRecorder(monkeypatch, lambda trainer, batch: (_expected(method, trainer, batch), None), atol=1e-5)
    train_changing_every_parameter(trainer)
    assert recorder.checked == 2
    logged = trainer.state.log_history[0]
    share = logged["gtpo/conflict_fraction" if method == "gtpo" else "hicra/planning_fraction"]
    assert 0.0 <= share <= 1.0
    if method == "hicra":
        assert share > 0.0


def test_token_texts_keep_the_space_before_each_word_and_decode_each_id_once(monkeypatch):
    tokenizer = make_tiny_tokenizer()
    texts = TokenTexts(tokenizer)
    ids = tokenizer.encode("so then the answer is 3", add_special_tokens=False)
    assert "".join(texts(ids)) == " " + tokenizer.decode(ids)  # decoded alone, a word-level token loses its space
    calls = []
    original = type(tokenizer).batch_decode
    monkeypatch.setattr(
        type(tokenizer), "batch_decode", lambda self, *a, **k: calls.append(a) or original(self, *a, **k)
    )
    assert texts(ids + ids[:2]) == texts(ids) + texts(ids[:2]) and calls == []  # every id cached
    assert texts.pad_token_id == tokenizer.pad_token_id
