"""Training-curve PNGs from `trainer_state.json`, one run or several overlaid."""

from __future__ import annotations

import json

import matplotlib.image
import pytest
from fake_runs import fake_token_credit_records, write_fake_trainer_state

from trl_credit.cli.plot import main as plot_main
from trl_credit.reports import plots, token_view


def _assert_png(path):
    image = matplotlib.image.imread(path)
    assert image.shape[0] > 100 and image.shape[1] > 100
    assert image[..., :3].std() > 0.05, f"{path} looks blank"


def test_find_trainer_state_prefers_most_advanced(tmp_path):
    write_fake_trainer_state(tmp_path / "trainer_state.json", steps=4)
    write_fake_trainer_state(tmp_path / "checkpoint-2" / "trainer_state.json", steps=2)
    write_fake_trainer_state(tmp_path / "checkpoint-10" / "trainer_state.json", steps=10)
    write_fake_trainer_state(tmp_path / "checkpoint-9" / "trainer_state.json", steps=9)
    # checkpoint-10 is newer than checkpoint-9 (numeric, not lexical order) and than the folder's copy.
    assert plots.find_trainer_state(tmp_path) == tmp_path / "checkpoint-10" / "trainer_state.json"
    run = plots.load_run(tmp_path / "checkpoint-10")
    assert run.name == tmp_path.name and run.method == "taco"


def test_metric_series_skips_summary_and_missing_values():
    history = [
        {"step": 1, "reward": 0.5},
        {"step": 2, "loss": 0.1},
        {"step": 3, "reward": float("nan")},
        {"step": 3, "reward": 0.7},
        {"train_runtime": 1.0, "reward": 9.0},
    ]
    assert plots.metric_series(history, "reward") == ([1, 3], [0.5, 0.7])
    assert plots.infer_method(history) == "grpo"


def test_diagnostics_grouped_by_prefix(tmp_path):
    history = json.loads(write_fake_trainer_state(tmp_path / "s.json", method="eapo").read_text())["log_history"]
    history[0]["eapo/new_metric"] = 1.0  # a diagnostic added later shows up without code changes
    groups = plots.diagnostic_metrics(history)
    assert groups == {
        "credit": ["credit/adv_abs_mean"],
        "eapo": ["eapo/kappa", "eapo/mean_weight", "eapo/new_metric", "eapo/q_hi", "eapo/q_lo"],
    }


def test_save_training_plots_returns_card_relative_paths(tmp_path):
    history = json.loads(write_fake_trainer_state(tmp_path / "s.json", method="taco").read_text())["log_history"]
    written = plots.save_training_plots(history, tmp_path / "out")
    assert written == [
        "plots/reward.png",
        "plots/entropy.png",
        "plots/completion_length.png",
        "plots/credit_diagnostics.png",
        "plots/taco_diagnostics.png",
    ]
    for relative in written:
        _assert_png(tmp_path / "out" / relative)


def test_plot_cli_overlays_runs(tmp_path, capsys):
    for seed, (name, method) in enumerate([("taco-run", "taco"), ("eapo-run", "eapo"), ("grpo-run", "grpo")]):
        write_fake_trainer_state(tmp_path / name / "checkpoint-10" / "trainer_state.json", method=method, seed=seed)
    out = tmp_path / "figures"
    argv = [
        str(tmp_path / "taco-run"),
        "--compare",
        str(tmp_path / "eapo-run"),
        str(tmp_path / "grpo-run"),
        "--output",
        str(out),
    ]
    assert plot_main(argv) == 0
    names = sorted(path.name for path in out.glob("*.png"))
    assert names == [
        "completion_length.png",
        "credit_diagnostics.png",
        "eapo_diagnostics.png",
        "entropy.png",
        "reward.png",
        "taco_diagnostics.png",
    ]
    for path in out.glob("*.png"):
        _assert_png(path)
    assert capsys.readouterr().out.count("wrote ") == 6


def test_plot_cli_missing_run_exits_2(tmp_path, capsys):
    assert plot_main([str(tmp_path / "missing")]) == 2
    assert plot_main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "does not exist" in err[0] and "trainer_state.json" in err[1]


def _history(rewards, stds, function_means, reward_name="accuracy_reward"):
    """Log entries as TRL writes them: `reward`, `reward_std` and one reward function's mean."""
    return [
        {"step": step, "reward": reward, "reward_std": std, f"rewards/{reward_name}/mean": mean}
        for step, (reward, std, mean) in enumerate(zip(rewards, stds, function_means), start=1)
    ]


def _band_bounds(ax):
    """(lowest, highest) y of the filled band."""
    [band] = ax.collections
    ys = [y for path in band.get_paths() for _, y in path.vertices]
    return min(ys), max(ys)


def test_reward_panel_has_one_legend_entry_per_run_and_a_clipped_band(tmp_path):
    rewards, stds = [0.125, 0.9, 0.5], [0.35, 0.3, 0.2]
    run = plots.Run("quick", _history(rewards, stds, rewards))  # one function of weight 1: its mean is the reward
    assert run.reward_range == (0.0, 1.0)  # accuracy scores 0 or 1
    fig = plots.core_panel_figure(plots.CORE_PANELS[0], [run])
    [ax] = fig.axes
    assert [text.get_text() for text in ax.get_legend().get_texts()] == ["quick (grpo)"]
    assert len(ax.lines) == 1  # the function's mean, equal to the reward, is not drawn again
    # Unclipped, the band would run from 0.125 - 0.35 < 0 to 0.9 + 0.3 > 1.
    low, high = _band_bounds(ax)
    assert low == pytest.approx(max(0.0, min(r - s for r, s in zip(rewards, stds))))
    assert high == pytest.approx(min(1.0, max(r + s for r, s in zip(rewards, stds))))
    assert (low, high) == (0.0, 1.0)
    assert any("± 1 std" in text.get_text() and "[0, 1]" in text.get_text() for text in ax.texts)


def test_reward_range_is_unknown_unless_the_log_establishes_it():
    rewards, stds = [0.2, 0.8], [0.5, 0.5]
    # Weight 2: the logged reward is twice the function's mean, so [0, 1] does not bound it.
    assert plots.reward_range(_history(rewards, stds, [r / 2 for r in rewards])) is None
    # A function the package does not declare a range for.
    assert plots.reward_range(_history(rewards, stds, rewards, reward_name="my_reward")) is None
    run = plots.Run("custom", _history(rewards, stds, rewards, reward_name="my_reward"))
    fig = plots.core_panel_figure(plots.CORE_PANELS[0], [run])
    low, high = _band_bounds(fig.axes[0])
    assert (low, high) == pytest.approx((0.2 - 0.5, 0.8 + 0.5))  # drawn as logged, not clipped to a guess


def test_reward_functions_that_differ_from_the_reward_get_their_own_labels(tmp_path):
    history = json.loads(write_fake_trainer_state(tmp_path / "s.json", method="taco").read_text())["log_history"]
    runs = [plots.Run("a", history), plots.Run("b", history)]
    fig = plots.core_panel_figure(plots.CORE_PANELS[0], runs)
    labels = [text.get_text() for text in fig.axes[0].get_legend().get_texts()]
    assert labels == [
        "a (taco)",
        "a (taco): accuracy",
        "a (taco): format",
        "b (taco)",
        "b (taco): accuracy",
        "b (taco): format",
    ]


def test_plotting_leaves_pyplot_alone(tmp_path):
    """A library changes no global state: a caller's pyplot backend and open figures stay as they were."""
    import matplotlib
    import matplotlib.pyplot as plt

    previous = matplotlib.get_backend()
    plt.switch_backend("pdf")  # a caller's backend other than the Agg the plots render with
    try:
        figure = plt.figure()
        history = json.loads(write_fake_trainer_state(tmp_path / "s.json", method="eapo").read_text())["log_history"]
        assert plots.save_training_plots(history, tmp_path / "out")
        assert token_view.render_token_credit_png(fake_token_credit_records("taco", steps=1), tmp_path / "credit.png")
        assert (matplotlib.get_backend(), plt.get_fignums()) == ("pdf", [figure.number])
    finally:
        plt.close("all")
        plt.switch_backend(previous)
