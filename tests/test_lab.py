"""The credit lab: task labels, the oracle, metrics on hand-made tensors, the warm-up, and tiny lab runs."""

from __future__ import annotations

import itertools
import json
import math
import random
import statistics

import pytest
import torch

from trl_credit.cli import main as cli_main
from trl_credit.experiments.lab.metrics import (
    add_sums,
    collapsed,
    credit_mass,
    effect_size,
    gap_fraction,
    holm,
    mean_of_edges,
    paired_t_p_value,
    precision,
    steps_until_solved,
    welch_difference,
    within_step_spread,
)
from trl_credit.experiments.lab.statistics import TASK_DECISIVE
from trl_credit.experiments.lab.tasks import COMPLETION_LENGTH, FORK_POSITION, RARE_TOKEN, TASKS, VOCABULARY, get_task
from trl_credit.methods import CreditBatch

# ---------------------------------------------------------------------------------------------- tasks


def test_needle_labels_the_key_occurrences():
    task, prompt = get_task("needle"), ["find", "k2"]
    completion = ["f0", "k2", "f1", "k1", "k2", "f3", RARE_TOKEN, "f4"]
    assert task.reward(prompt, completion) == 1.0
    assert task.decisive(prompt, completion) == [False, True, False, False, True, False, False, False]
    assert task.implausible(prompt, completion) == [False] * 6 + [True, False]
    assert task.reward(prompt, ["k1"] * 8) == 0.0 and not any(task.decisive(prompt, ["k1"] * 8))
    with pytest.raises(ValueError, match="exactly one key"):
        task.reward(["find"], completion)


def _flipping_positions(task, prompt, completion) -> set[int]:
    """Positions where replacing the token by some other word changes the reward."""
    words = [w for w in VOCABULARY if w not in ("<pad>", "<eos>", "<unk>")]
    base = task.reward(prompt, completion)
    return {
        t
        for t, w in itertools.product(range(len(completion)), words)
        if task.reward(prompt, completion[:t] + [w] + completion[t + 1 :]) != base
    }


@pytest.mark.parametrize("name", ["needle", "rare"])
def test_decisive_tokens_are_the_ones_that_decide_a_success(name):
    """In a success with a single key, the key is the one token whose change can flip the reward."""
    from trl_credit.experiments.lab.model import sample_prior

    task, rng, checked = get_task(name), random.Random(0), 0
    while checked < 20:
        prompt = rng.choice(task.prompts())
        completion = sample_prior(task, prompt, rng)
        key = prompt.split()[1]
        if completion.count(key) != 1:
            continue
        decisive = {t for t, flag in enumerate(task.decisive(prompt.split(), completion)) if flag}
        assert decisive == _flipping_positions(task, prompt.split(), completion) == {completion.index(key)}
        checked += 1


def test_fork_decides_at_the_fork_only():
    from trl_credit.experiments.lab.model import sample_prior

    task, rng = get_task("fork"), random.Random(0)
    assert [task.correct_choice(p.split()) for p in task.prompts()] == ["L", "R", "L", "R"]
    for _ in range(10):
        prompt = rng.choice(task.prompts())
        completion = sample_prior(task, prompt, rng)
        # Success or failure, the fork is the only position that can change the outcome.
        assert _flipping_positions(task, prompt.split(), completion) == {FORK_POSITION}
        assert task.decisive(prompt.split(), completion) == [t == FORK_POSITION for t in range(COMPLETION_LENGTH)]


@pytest.mark.parametrize("name", sorted(TASKS))
def test_priors_are_distributions(name):
    task = get_task(name)
    for prompt, position in itertools.product(task.prompts(), range(COMPLETION_LENGTH)):
        distribution = task.prior(prompt.split(), position)
        assert set(distribution) <= set(VOCABULARY) and min(distribution.values()) > 0
        assert sum(distribution.values()) == pytest.approx(1.0)


@pytest.mark.parametrize("name", ["rare", "hitch"])
def test_rare_token_alone_is_in_tacos_tail_under_the_prior(name):
    """TACO's tail is p < alpha * exp(-H) (alpha = 0.01): z must be in it at every position, no other token."""
    task = get_task(name)
    for position, previous in itertools.product(range(COMPLETION_LENGTH), [None, "f1", "k0"]):
        distribution = task.prior(["find", "k0"], position, previous)
        entropy = -sum(p * math.log(p) for p in distribution.values())
        threshold = 0.01 * math.exp(-entropy)
        assert {w for w, p in distribution.items() if p < threshold} == {RARE_TOKEN}


def test_hitch_rare_token_leads_to_the_key_and_so_to_success():
    """After z the key follows with probability 0.9: completions with z succeed far more often (Monte Carlo)."""
    from trl_credit.experiments.lab.model import sample_prior

    task, rng = get_task("hitch", horizon=16), random.Random(0)
    assert task.prior(["find", "k2"], 5, RARE_TOKEN)["k2"] == pytest.approx(0.9)
    outcomes = {True: [], False: []}
    for _ in range(4000):
        prompt = rng.choice(task.prompts())
        completion = sample_prior(task, prompt, rng)
        outcomes[RARE_TOKEN in completion[:-1]].append(task.reward(prompt.split(), completion))
    with_z, without_z = statistics.fmean(outcomes[True]), statistics.fmean(outcomes[False])
    assert len(outcomes[True]) > 50 and with_z > 0.85 and without_z < 0.15


def test_unknown_task_is_named():
    with pytest.raises(ValueError, match="unknown lab task 'maze'; choose from needle, fork, mdp, rare, hitch"):
        get_task("maze")


@pytest.mark.parametrize("name", ["fork", "mdp"])
@pytest.mark.parametrize(("horizon", "decisive"), [(8, 1), (32, 1), (32, 2), (32, 4), (128, 1), (5, 5)])
def test_forks_are_the_positions_that_decide_a_success(name, horizon, decisive):
    """Knobs: H tokens, `decisive` forks. In a success every fork, and nothing else, can flip the reward; in a failure
    with one wrong fork, that fork alone. The prior succeeds about 30 % of the time whatever the number of forks
    (Monte Carlo, independent of the formula)."""
    from trl_credit.experiments.lab.model import sample_prior

    task, rng = get_task(name, horizon=horizon, decisive=decisive), random.Random(horizon + decisive)
    assert task.completion_length == horizon and len(task.fork_positions) == decisive
    assert task.fork_positions == tuple(sorted(set(task.fork_positions))) and task.fork_positions[-1] < horizon
    if (horizon, decisive) == (8, 1):
        assert task.fork_positions == (FORK_POSITION,)
    rewards, checked = [], {True: 0, False: 0}
    for _ in range(1500):
        prompt = rng.choice(task.prompts())
        completion = sample_prior(task, prompt, rng)
        assert len(completion) == horizon
        rewards.append(task.reward(prompt.split(), completion))
        wrong = [p for j, p in enumerate(task.fork_positions) if completion[p] != task.right_choice(prompt.split(), j)]
        success = bool(rewards[-1])
        if (success or len(wrong) == 1) and checked[success] < 3 and horizon <= 32:
            labelled = {t for t, flag in enumerate(task.decisive(prompt.split(), completion)) if flag}
            flipping = _flipping_positions(task, prompt.split(), completion)
            assert labelled == flipping == (set(task.fork_positions) if success else set(wrong))
            checked[success] += 1
    assert checked[True] > 0 and checked[False] > 0 or horizon > 32
    assert abs(statistics.fmean(rewards) - 0.3) < 0.05


def test_mdp_right_choices_ignore_the_prompt_and_fork_ones_do_not():
    mdp, fork = get_task("mdp", 32, 4), get_task("fork", 32, 4)
    assert {tuple(mdp.right_choice(p.split(), j) for j in range(4)) for p in mdp.prompts()} == {("L", "R", "L", "R")}
    assert len({tuple(fork.right_choice(p.split(), j) for j in range(4)) for p in fork.prompts()}) == 2


@pytest.mark.parametrize(
    ("name", "horizon", "decisive", "message"),
    [
        ("mdp", 0, 1, "horizon of mdp must be between 1 and 512"),
        ("needle", 600, 1, "horizon of needle must be between 1 and 512"),
        ("mdp", 32, 40, "decisive of mdp must be between 1 and the horizon \\(32\\)"),
        ("mdp", 32, 0, "decisive of mdp must be between 1"),
        ("needle", 32, 2, "decisive sets the number of forks of fork and mdp; needle takes 1"),
    ],
)
def test_task_knobs_are_checked(name, horizon, decisive, message):
    with pytest.raises(ValueError, match=message):
        get_task(name, horizon, decisive)


# ---------------------------------------------------------------------------------------------- the oracle


def test_oracle_credit_falls_exactly_on_the_decisive_positions():
    """Labels from flipping tokens (not from the task's `decisive`): A_i there, 0 (or the floor) elsewhere."""
    # Imported here, not at collection: registering `oracle` then would put it in other modules' method lists.
    from trl_credit.experiments.lab.model import sample_prior
    from trl_credit.experiments.lab.oracle import oracle_advantages

    task, rng = get_task("mdp", horizon=16, decisive=2), random.Random(3)
    prompt = task.prompts()[0]
    completions = [sample_prior(task, prompt, rng) for _ in range(400)]
    successes = [c for c in completions if task.reward(prompt.split(), c)][:6]
    labels = [[t in _flipping_positions(task, prompt.split(), c) for t in range(16)] for c in successes]
    decisive_BT = torch.tensor(labels + [[False] * 16])  # the last row: no decisive token
    advantages_B = torch.linspace(-1.5, 2.0, len(successes) + 1)
    mask_BT = torch.ones(len(labels) + 1, 16, dtype=torch.bool)
    mask_BT[0, 10:] = False  # padding: never credited, even on a decisive position
    assert decisive_BT[0, 10:].any() and decisive_BT[:-1].sum(1).eq(2).all()
    for floor in (0.0, 0.25):
        out_BT = oracle_advantages(advantages_B, decisive_BT, mask_BT, floor)
        for i in range(len(labels) + 1):
            for t in range(16):
                if not mask_BT[i, t]:
                    expected = 0.0
                elif decisive_BT[i, t] or not (decisive_BT[i] & mask_BT[i]).any():
                    expected = advantages_B[i].item()
                else:
                    expected = floor * advantages_B[i].item()
                assert out_BT[i, t].item() == pytest.approx(expected)
    # Through the registry, as the trainer calls it, and its refusal where no ground truth is supplied.
    from trl_credit.methods import get_credit_method, resolve_stack
    from trl_credit.methods.stack import run_stack

    method = get_credit_method("oracle")
    batch = CreditBatch.from_sequence_advantages(
        advantages_B, mask_BT, statistics={TASK_DECISIVE: decisive_BT.float()}
    )
    steps = resolve_stack([method], {})
    credit = run_stack(steps, batch)
    assert torch.equal(credit.batch.advantages_BT, oracle_advantages(advantages_B, decisive_BT, mask_BT))
    with pytest.raises(ValueError, match="'oracle' reads statistic 'task_decisive', which the batch does not have"):
        run_stack(steps, CreditBatch.from_sequence_advantages(advantages_B, mask_BT))
    with pytest.raises(ValueError, match="oracle_floor must be in \\[0, 1\\]"):
        method.hyperparameters({"oracle_floor": 1.5})


def test_the_default_oracle_leaves_no_token_of_a_response_without_credit():
    """Zero credit off the decisive tokens let them drift until the oracle collapsed (docs/evidence.md): by default
    every valid token of a response with A_i != 0 gets credit of A_i's sign, at least ORACLE_FLOOR * |A_i|."""
    from trl_credit.experiments.lab.oracle import ORACLE_FLOOR, oracle_advantages
    from trl_credit.methods import get_credit_method

    generator = torch.Generator().manual_seed(0)
    advantages_B = torch.randn(32, generator=generator)
    mask_BT = torch.rand(32, 24, generator=generator) > 0.1
    decisive_BT = torch.rand(32, 24, generator=generator) > 0.85
    assert get_credit_method("oracle").hyperparameters() == {"oracle_floor": ORACLE_FLOOR} and ORACLE_FLOOR > 0
    out_BT = oracle_advantages(advantages_B, decisive_BT, mask_BT)
    ratio_BT = out_BT / advantages_B.unsqueeze(1)
    assert (ratio_BT[mask_BT] >= ORACLE_FLOOR - 1e-6).all() and (out_BT[~mask_BT] == 0).all()


# ---------------------------------------------------------------------------------------------- metrics


def test_credit_mass_by_hand():
    advantages_BT = torch.tensor(
        [[2.0, 1.0, 1.0, 9.0], [-1.0, -1.0, -2.0, -1.0], [0.0, 0.0, 0.0, 0.0], [3.0, 3.0, 3.0, 3.0]]
    )
    mask_BT = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]])
    labels_BT = torch.tensor([[1, 0, 0, 1], [0, 0, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    sums = credit_mass(advantages_BT, mask_BT, labels_BT)
    # Row 0: |A| on valid tokens 4, on the label 2 (the masked label does not count); uniform 4 * 1/3.
    # Row 1: 5 in all, 2 on the label, uniform 5 * 1/4. Row 2 (zero advantage) and row 3 (no label) do not count.
    assert sums == pytest.approx(
        {
            "pos_labelled": 2.0,
            "pos_total": 4.0,
            "pos_uniform": 4 / 3,
            "pos_rows": 1,
            "neg_labelled": 2.0,
            "neg_total": 5.0,
            "neg_uniform": 1.25,
            "neg_rows": 1,
        }
    )
    assert precision(sums, "pos") == pytest.approx({"precision": 0.5, "uniform": 1 / 3, "lift": 1.5, "rows": 1})
    assert precision(sums, "neg") == pytest.approx({"precision": 0.4, "uniform": 0.25, "lift": 1.6, "rows": 1})
    total = add_sums(add_sums({}, sums), sums)
    assert precision(total, "pos")["lift"] == pytest.approx(1.5) and total["pos_rows"] == 2


def test_sequence_advantages_have_lift_one():
    """GRPO's (B,) advantages spread uniformly: its credit precision equals the uniform share exactly."""
    generator = torch.Generator().manual_seed(0)
    advantages_B = torch.randn(16, generator=generator)
    mask_BT = torch.rand(16, 8, generator=generator) > 0.2
    labels_BT = torch.rand(16, 8, generator=generator) > 0.7
    sums = credit_mass(advantages_B, mask_BT, labels_BT)
    for sign in ("pos", "neg"):
        assert precision(sums, sign)["lift"] == pytest.approx(1.0, abs=1e-6)
    assert math.isnan(precision({}, "pos")["precision"])
    with pytest.raises(ValueError, match="same \\(B, T\\) shape"):
        credit_mass(torch.ones(2, 3), torch.ones(2, 4), torch.ones(2, 4))


def test_gap_fraction_by_hand():
    grpo, oracle = {0: 0.2, 1: 0.5, 2: 0.4, 3: 0.1}, {0: 0.6, 1: 0.5, 2: 0.8, 3: 0.3}
    method = {0: 0.4, 1: 0.9, 2: 0.8, 3: math.nan}
    interval = gap_fraction(method, grpo, oracle)  # seed 1 has no gap, seed 3 a NaN: fractions 0.5 and 1.0
    assert interval.n == 2 and interval.mean == pytest.approx(0.75)
    assert gap_fraction(grpo, grpo, oracle).mean == 0 and gap_fraction(oracle, grpo, oracle).mean == 1


def test_steps_until_solved_and_edges():
    assert steps_until_solved([0.1, 0.9, 0.9, 0.95, 0.2], threshold=0.9, window=2) == 3
    assert steps_until_solved([0.1, 0.9, 0.5], threshold=0.9, window=2) is None
    assert steps_until_solved([0.95], threshold=0.9, window=1) == 1
    with pytest.raises(ValueError, match="window must be >= 1"):
        steps_until_solved([1.0], window=0)
    assert mean_of_edges([1.0, 2.0, 3.0, 4.0], count=2) == (1.5, 3.5)


def test_a_collapse_is_a_final_reward_or_accuracy_at_the_floor():
    assert collapsed(0.0, 0.9) and collapsed(0.9, 0.05) and collapsed(0.04, math.nan)
    assert not collapsed(0.06, 0.9) and not collapsed(math.nan, math.nan)
    assert collapsed(0.52, 0.9, floor=0.5) and not collapsed(0.56, 0.9, floor=0.5)
    from trl_credit.experiments.lab.lab_report import collapse_counts

    runs = [
        {"task": "mdp", "method": m, "seed": s, "metrics": {"final_reward": r, "avg@16": a}}
        for m, s, r, a in [("grpo", 0, 0.9, 0.9), ("grpo", 1, 0.0, 0.0), ("oracle", 0, 0.9, 0.01), ("oracle", 1, 1, 1)]
    ]
    counts = collapse_counts(runs, "mdp", ["grpo", "oracle", "taco"], eval_samples=16)
    assert counts["grpo"]["text"] == "1/2" and counts["oracle"]["mean"] == 0.5 and counts["taco"]["text"] == "–"


def test_paired_t_holm_and_effect_size_by_hand():
    # Differences 1, 2, 3: mean 2, sd 1, t = 2 * sqrt(3) = 3.464 on 2 df; two-sided p = 0.0742 (t tables).
    assert paired_t_p_value([1.0, 2.0, 3.0]) == pytest.approx(0.0742, abs=5e-4)
    assert effect_size([1.0, 2.0, 3.0]) == pytest.approx(2.0) and math.isnan(effect_size([1.0, 1.0]))
    assert paired_t_p_value([0.5, 0.5]) == 0.0 and paired_t_p_value([0.0, 0.0]) == 1.0 == paired_t_p_value([1.0])
    # Holm: sorted 0.01, 0.02, 0.04, 0.3 times 4, 3, 2, 1 -> 0.04, 0.06, 0.08, 0.3, made monotone, in input order.
    assert holm([0.04, 0.3, 0.01, 0.02]) == pytest.approx([0.08, 0.3, 0.04, 0.06])
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0]) and holm([]) == []


def _t_two_sided_p(t: float, df: float, intervals: int = 4000) -> float:
    """`P(|T| >= t)` for Student's t with real `df`: Simpson's rule on the density over [0, t] (no SciPy)."""
    scale = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))

    def density(x):
        return scale * (1 + x * x / df) ** (-(df + 1) / 2)

    width = t / intervals
    weights = [1 if i in (0, intervals) else 4 if i % 2 else 2 for i in range(intervals + 1)]
    return 1 - 2 * width / 3 * sum(w * density(i * width) for i, w in enumerate(weights))


def _t_quantile_975(df: float) -> float:
    low, high = 0.0, 20.0
    while high - low > 1e-9:  # bisection on the Simpson CDF
        middle = (low + high) / 2
        low, high = (middle, high) if _t_two_sided_p(middle, df) > 0.05 else (low, middle)
    return (low + high) / 2


def test_welch_difference_by_hand():
    # a = 0, 2 and b = 3, 5: difference 3, standard error sqrt(2/2 + 2/2) = sqrt(2), 2 df (Welch-Satterthwaite);
    # t = 2.1213, and with 2 df the two-sided p is 1 - t / sqrt(t^2 + 2) = 0.16795; t_0.975(2) = 4.3027.
    interval, p = welch_difference([0.0, 2.0], [3.0, 5.0])
    assert interval.mean == pytest.approx(3.0) and p == pytest.approx(0.16795, abs=1e-4)
    assert interval.half_width == pytest.approx(4.3027 * math.sqrt(2), abs=1e-3)
    assert welch_difference([1.0], [2.0, 3.0])[1] == 1.0 and welch_difference([1.0, 1.0], [2.0, 2.0])[1] == 0.0


def test_welch_difference_keeps_fractional_degrees_of_freedom():
    # a = 1, 2, 3 (s^2/n = 1/3) and b = 2, 4, 6, 8 (s^2/n = 5/3): standard error sqrt(2), t = 3 / sqrt(2), and
    # Welch-Satterthwaite df = 2^2 / ((1/3)^2 / 2 + (5/3)^2 / 3) = 216 / 53 = 4.075, not rounded down to 4.
    df, t = 216 / 53, 3 / math.sqrt(2)
    interval, p = welch_difference([1.0, 2.0, 3.0], [2.0, 4.0, 6.0, 8.0])
    assert interval.mean == pytest.approx(3.0) and p == pytest.approx(_t_two_sided_p(t, df), abs=1e-7)
    assert interval.half_width == pytest.approx(_t_quantile_975(df) * math.sqrt(2), abs=1e-6)
    assert abs(p - _t_two_sided_p(t, 4.0)) > 1e-3  # what rounding the df down to 4 would have given


def test_the_reward_reads_token_positions_as_the_labels_do():
    """A special token inside a completion must not shift the positions the reward reads (decoding drops it)."""
    from trl_credit.experiments.lab.lab_runs import token_reward
    from trl_credit.experiments.lab.model import make_tokenizer

    task, tokenizer = get_task("mdp", horizon=8, decisive=2), make_tokenizer()
    assert task.fork_positions == (1, 5)
    right = ["f0", "L", "f2", "f3", "f4", "R", "f6", "f7"]
    shifted = ["<pad>", "f1", "L", "f3", "f4", "f5", "R", "f7"]  # decoded: "f1 L f3 f4 f5 R f7", right at 1 and 5
    wrong_at_first_fork = ["f0", "<unk>", "f2", "f3", "f4", "R", "<eos>", "<pad>"]
    ids = [tokenizer.convert_tokens_to_ids(words) for words in (right, shifted, wrong_at_first_fork)]
    texts = [tokenizer.decode(i, skip_special_tokens=True) for i in ids]
    assert task.reward(["go", "k0"], texts[1].split()) == 1.0  # what scoring the text would have said
    rewards = token_reward(task, tokenizer)(["go k0"] * 3, texts, completion_ids=ids)
    assert rewards == [1.0, 0.0, 0.0]
    # The labeller judges success on the same token list (`ForkTask.decisive` calls `reward` on it).
    assert rewards == [task.reward(["go", "k0"], words) for words in (right, shifted, wrong_at_first_fork)]


def test_within_step_spread_by_hand():
    spread = within_step_spread([[1.0, 3.0], [2.0, 2.0, 2.0], [5.0], [0.0, 0.0]])
    # Variances 2, 0, 0 ([5] has one micro-batch); CVs sqrt(2)/2 and 0 ([0, 0] has no CV).
    assert spread["steps"] == 3 and spread["grad_norm_var"] == pytest.approx(2 / 3)
    assert spread["grad_norm_cv"] == pytest.approx(statistics.fmean([math.sqrt(2) / 2, 0.0]))


# ---------------------------------------------------------------------------------------------- model


def test_warm_up_reaches_the_prior_tail_included():
    from trl_credit.experiments.lab.model import make_model, make_tokenizer, sample_prior, token_probability, warm_up

    task, tokenizer = get_task("rare"), make_tokenizer()
    assert tokenizer.convert_ids_to_tokens(tokenizer("find k2 f3 z")["input_ids"]) == ["find", "k2", "f3", "z"]
    model = make_model(tokenizer, seed=0)
    rng = random.Random(1)
    probe = [p.split() + sample_prior(task, p, rng) for p in task.prompts() for _ in range(8)]
    before = token_probability(model, tokenizer, probe, 2, RARE_TOKEN)
    kl = warm_up(model, tokenizer, task, seed=0)
    after = token_probability(model, tokenizer, probe, 2, RARE_TOKEN)
    assert kl < 0.01 and abs(before - 1 / len(tokenizer)) < 0.03
    assert 0.0007 < after < 0.0014, f"p(z) = {after} after warm-up, prior 0.001"


# ---------------------------------------------------------------------------------------------- a lab run


def test_lab_cli_bad_input_exits_2(capsys):
    for argv, message in (
        (["--tasks", "maze"], "unknown lab task 'maze'"),
        (["--seeds", "0", "0"], "duplicates"),
        (["--pass_k", "64"], "pass_k"),
        (["--bogus", "1"], "unrecognized arguments"),
        (["--horizon", "0"], "horizon of needle must be between 1 and 512, got 0"),
        (["--horizon", "x"], "--horizon: invalid int value"),
        (["--tasks", "mdp", "--horizon", "8", "--decisive", "9"], "decisive of mdp must be between 1"),
        (["--decisive", "2"], "decisive sets the number of forks of fork and mdp; needle takes 1"),
        (["--num_generations", "1"], "num_generations must be >= 2"),
        (["--methods", "grpo", "tacoo"], "unknown credit method 'tacoo'"),
        (["--methods", "grpo", "eapo", "--credit_kwargs", '{"taco_alpha": 1}'], "credit_kwargs['taco_alpha'] is not"),
        (["--methods", "eapo", "--credit_kwargs", '{"eapo_kappa": -1}'], "eapo_kappa must be finite and >= 0"),
        (["--credit_kwargs", "[1]"], "credit_kwargs must be a mapping"),
    ):
        assert cli_main(["lab", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("trl-credit lab: error:") and message in err[0], err


def test_lab_help_describes_the_knobs(capsys):
    assert cli_main(["lab", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for option, words in (
        ("--horizon", "completion length in tokens"),
        ("--decisive", "number of decisive positions"),
        ("--num_generations", "Group size G"),
        ("--methods", "Credit methods"),
    ):
        assert option in text and words in text, option


def test_tiny_oracle_run_credits_the_forks(tmp_path):
    """The oracle through the real trainer: each response's forks take A_i, the rest a quarter; GRPO spreads 1/H."""
    from trl_credit.experiments.lab.oracle import ORACLE_FLOOR

    argv = [
        "lab",
        "--methods",
        "grpo",
        "oracle",
        "--tasks",
        "mdp",
        "--horizon",
        "16",
        "--decisive",
        "2",
        "--seeds",
        "0",
        "--max_steps",
        "3",
        "--warm_up_steps",
        "20",
        "--eval_samples",
        "2",
        "--pass_k",
        "1",
        "--output_dir",
        str(tmp_path),
    ]
    assert cli_main(argv) == 0
    grpo, oracle = (r["metrics"] for r in json.loads((tmp_path / "results.json").read_text())["runs"])
    # A success has both forks decisive: 2 of 16 tokens at A_i, 14 at ORACLE_FLOOR * A_i. A failure labels only its
    # wrong forks, so its share lies between the one-fork and the two-fork share.
    share = {d: d / (d + ORACLE_FLOOR * (16 - d)) for d in (1, 2)}
    if not math.isnan(oracle["decisive_precision_pos"]):
        assert oracle["decisive_precision_pos"] == pytest.approx(share[2], rel=1e-4)
        assert oracle["decisive_lift_pos"] == pytest.approx(share[2] * 8, rel=1e-4)  # uniform share 2/16
    if not math.isnan(oracle["decisive_precision_neg"]):
        assert share[1] - 1e-4 <= oracle["decisive_precision_neg"] <= share[2] + 1e-4
    for sign in ("pos", "neg"):
        if not math.isnan(grpo[f"decisive_precision_{sign}"]):
            assert grpo[f"decisive_precision_{sign}"] == pytest.approx(2 / 16)
    report = (tmp_path / "report.md").read_text()
    assert "completions of 16 tokens with 2 decisive forks" in report
    assert "| fraction of the grpo→oracle gap closed: train reward, mean over all steps |" in report


def test_lab_credit_kwargs_reach_their_method(tmp_path, monkeypatch):
    """`--credit_kwargs` sets the oracle's floor to 1, so its credit is GRPO's uniform spread; results record it, and
    the report re-rendered from the stored results is the one the run wrote."""
    import importlib
    import shlex
    from pathlib import Path

    argv = ["lab", "--methods", "grpo", "oracle", "--tasks", "mdp", "--horizon", "16", "--decisive", "2"]
    argv += ["--seeds", "0", "--max_steps", "2", "--warm_up_steps", "20", "--eval_samples", "2", "--pass_k", "1"]
    argv += ["--credit_kwargs", '{"oracle_floor": 1.0}', "--output_dir", str(tmp_path)]
    assert cli_main(argv) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["settings"]["credit_kwargs"] == {"oracle_floor": 1.0}
    grpo, oracle = (r["metrics"] for r in results["runs"])
    for sign in ("pos", "neg"):
        if not math.isnan(oracle[f"decisive_precision_{sign}"]):
            assert oracle[f"decisive_precision_{sign}"] == pytest.approx(2 / 16, abs=1e-5)
    assert grpo["decisive_precision_pos"] == pytest.approx(oracle["decisive_precision_pos"], nan_ok=True)
    # The page benchmarks/render_reports.py renders from these results, stored with their command, is this report.
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "benchmarks"))
    row = {"command": shlex.join(["trl-credit", *argv]), **results}
    assert importlib.import_module("_results").render_lab_page(row) == (tmp_path / "report.md").read_text()


def test_tiny_lab_run(tmp_path, capsys):
    """Two methods on the fork task, a few steps: records, GRPO's uniform spread, the report, no rerun of done runs."""
    argv = [
        "lab",
        "--methods",
        "grpo",
        "taco",
        "--tasks",
        "fork",
        "--seeds",
        "0",
        "--max_steps",
        "4",
        "--warm_up_steps",
        "50",
        "--eval_samples",
        "4",
        "--pass_k",
        "1",
        "2",
        "--output_dir",
        str(tmp_path),
    ]
    assert cli_main(argv) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert [(r["task"], r["method"], r["seed"], r["steps"]) for r in results["runs"]] == [
        ("fork", "grpo", 0, 4),
        ("fork", "taco", 0, 4),
    ]
    grpo, taco = (r["metrics"] for r in results["runs"])
    # The fork is one of 8 completion tokens: GRPO puts exactly 1/8 of each response's credit there.
    for sign in ("pos", "neg"):
        if not math.isnan(grpo[f"decisive_lift_{sign}"]):
            assert grpo[f"decisive_lift_{sign}"] == pytest.approx(1.0, abs=1e-6)
            assert grpo[f"decisive_precision_{sign}"] == pytest.approx(1 / 8, abs=1e-6)
    assert not math.isnan(grpo["decisive_lift_pos"]) or not math.isnan(grpo["decisive_lift_neg"])
    assert 0 <= taco["pass@1"] <= taco["pass@2"] <= 1 and taco["avg@4"] == pytest.approx(taco["pass@1"])
    assert taco["rare_prob_start"] > 0 and len(results["runs"][1]["rewards"]) == 4
    report = (tmp_path / "report.md").read_text()
    assert "## fork" in report and "| credit precision, positive responses |" in report and "Δ" in report
    assert "fork grpo seed 0" in capsys.readouterr().out
    assert cli_main(argv) == 0  # both runs are in results.json: nothing is trained again
    assert "lab: fork" not in capsys.readouterr().out


def test_a_trainer_without_the_ground_truth_refuses_the_oracle_at_init(tmp_path):
    from conftest import (
        make_tiny_tokenizer,
        tiny_config,
        tiny_trainer,
    )

    import trl_credit.experiments.lab.trainer  # noqa: F401  (registers the oracle)

    tokenizer = make_tiny_tokenizer()
    with pytest.raises(
        ValueError, match=r"'oracle' reads \['task_decisive'\], which CreditGRPOTrainer does not compute"
    ):
        tiny_trainer(tiny_config("oracle", tmp_path), tokenizer=tokenizer)


def test_every_committed_report_page_is_rendered_from_the_committed_results(tmp_path, monkeypatch):
    """`python benchmarks/render_reports.py` re-renders every page made from `results/` into a fresh folder, and
    each is the committed page byte for byte: no number in one is edited by hand or left behind by a later run."""
    import importlib
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    monkeypatch.syspath_prepend(str(root / "benchmarks"))
    importlib.import_module("render_reports").main(["--output", str(tmp_path)])
    rendered = sorted(path.relative_to(tmp_path).as_posix() for path in tmp_path.rglob("*.md"))
    expected = {"docs/lab/report.md", "docs/lab_evidence/report.md", "docs/lab_regimes/report.md"}
    assert expected <= set(rendered) and len(rendered) == 35  # 31 lab folders, 2 aggregates, 2 EAPO resamplings
    for page in rendered:
        assert (tmp_path / page).read_bytes() == (root / page).read_bytes(), f"{page} differs from its results"


@pytest.mark.parametrize("folder", ["eapo_template", "eapo_template96"])
def test_the_stored_trace_comparisons_are_what_the_stored_traces_give(folder, capsys, monkeypatch):
    """`oracle_collapse.py --compare eapo grpo` over the traces in results/lab_oracle.jsonl prints the stored
    `compare_eapo_grpo.txt` of that folder."""
    import importlib
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "benchmarks"))
    oracle_collapse = importlib.import_module("oracle_collapse")
    stored = {row["file"]: row for row in importlib.import_module("_results").read_lines("lab_oracle")}
    oracle_collapse.compare_traces(Path(folder), "eapo", "grpo")
    assert capsys.readouterr().out == stored[f"{folder}/compare_eapo_grpo.txt"]["text"]


def test_lab_trains_without_deepspeed_announcing_its_accelerator_guess(tmp_path):
    """DeepSpeed (a test dependency) is imported by accelerate whenever installed; on a CPU-only machine it would log
    'Setting accelerator to CPU...' once per process, although the lab never uses it and always trains on the CPU."""
    import os
    import subprocess
    import sys

    argv = ["lab", "--methods", "grpo", "--tasks", "mdp", "--horizon", "16", "--decisive", "2", "--seeds", "0"]
    argv += ["--max_steps", "1", "--warm_up_steps", "2", "--eval_samples", "2", "--pass_k", "1"]
    argv += ["--output_dir", str(tmp_path)]
    code = "import sys; from trl_credit.cli import main; sys.exit(main(sys.argv[1:]))"
    env = {key: value for key, value in os.environ.items() if key != "DS_ACCELERATOR"}  # as a user's shell has it
    result = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "results.json").is_file()
    assert "Setting accelerator to CPU" not in result.stdout + result.stderr
