"""Training-curve PNGs from `trainer_state.json`, one run or several overlaid."""

from __future__ import annotations

import json

import matplotlib.image
from fake_runs import write_fake_trainer_state

from trl_credit import plots
from trl_credit.cli.plot import main as plot_main


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
