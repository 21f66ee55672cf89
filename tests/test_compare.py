"""`trl-credit compare`: statistics, plan and resume logic, the report, and one real end-to-end comparison."""

from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path

import pytest
import yaml
from conftest import make_tiny_model, tiny_config, tiny_trainer
from headless_chromium import CHROMIUM, needs_chromium, read_png, run_chromium

from trl_credit.cli import main as cli_main
from trl_credit.cli.grpo_arguments import parse_arguments
from trl_credit.experiments.compare.compare_report import (
    RunResult,
    collect_results,
    final_table,
    mean_band,
    paired_table,
    portable_command,
    write_report,
)
from trl_credit.experiments.compare.cost import estimate_disk, parameter_count
from trl_credit.experiments.compare.plan import (
    CompareConfig,
    CompareUsageError,
    RunSpec,
    build_runs,
    check_passthrough,
    check_recorded_arguments,
    check_same_settings,
    latest_checkpoint,
    run_name,
    run_state,
)
from trl_credit.experiments.compare.runner import remove_checkpoints
from trl_credit.experiments.compare.stats import SCIPY_MISSING, paired_difference, scipy_stats, t_interval

# Two-sided 95 % critical values t_{0.975, df} from a printed t table.
T_TABLE_975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    9: 2.262,
    10: 2.228,
    20: 2.086,
    30: 2.042,
    120: 1.980,
}


# ---------------------------------------------------------------------------------------------- statistics


@pytest.mark.parametrize("df,expected", sorted(T_TABLE_975.items()))
def test_t_interval_uses_the_printed_tables_critical_value(df, expected):
    values = [float(i % 3) for i in range(df + 1)]  # df + 1 seeds, not all equal
    interval = t_interval(values)
    standard_error = statistics.stdev(values) / math.sqrt(len(values))
    assert interval.half_width / standard_error == pytest.approx(expected, abs=6e-4)


def test_a_missing_scipy_is_named_with_its_install_command(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "scipy", None)  # `import scipy` now raises ImportError
    with pytest.raises(ImportError, match=re.escape(SCIPY_MISSING)):
        t_interval([0.1, 0.2, 0.4])
    with pytest.raises(ImportError, match=r"pip install 'trl-credit\[experiments\]'"):
        scipy_stats()


def test_t_interval_by_hand():
    values = [0.2, 0.5, 0.35, 0.4]
    interval = t_interval(values)
    half_width = 3.182446305284263 * statistics.stdev(values) / 2  # t_{0.975, 3} * s / sqrt(4)
    assert interval.mean == pytest.approx(0.3625) and interval.n == 4
    assert interval.half_width == pytest.approx(half_width, rel=1e-9)
    assert interval.low == pytest.approx(0.3625 - half_width) and interval.excludes_zero()
    assert interval.format() == f"0.362 ± {half_width:.3g}"
    one = t_interval([0.7, float("nan")])  # NaN dropped, one value left: no interval
    assert one.n == 1 and one.half_width is None and one.format() == "0.7 (CI n/a, n=1)" and not one.excludes_zero()
    assert t_interval([]).format() == "–"


def test_paired_difference_uses_common_seeds_only():
    method = {0: 0.50, 1: 0.62, 2: 0.55, 3: 0.9}
    baseline = {0: 0.40, 1: 0.50, 2: 0.46, 4: 0.1}
    interval = paired_difference(method, baseline)
    differences = [0.10, 0.12, 0.09]
    assert interval.n == 3 and interval.mean == pytest.approx(statistics.fmean(differences))
    assert interval.half_width == pytest.approx(4.302652729749464 * statistics.stdev(differences) / math.sqrt(3))
    # Pairing removes the seed effect: the unpaired intervals overlap, the paired one excludes 0.
    unpaired_method, unpaired_baseline = t_interval([0.50, 0.62, 0.55]), t_interval([0.40, 0.50, 0.46])
    assert unpaired_method.low < unpaired_baseline.high
    assert interval.excludes_zero()


# ---------------------------------------------------------------------------------------------- plan


def test_runs_seeds_outermost_and_commands(tmp_path):
    config = CompareConfig(methods=["grpo", "eapo+taco"], seeds=[3, 1], output_dir=str(tmp_path), config="r.yaml")
    runs = build_runs(config, ["--max_steps", "5", "--accelerate_config", "zero3"])
    assert [run.name for run in runs] == ["grpo-seed3", "eapo+taco-seed3", "grpo-seed1", "eapo+taco-seed1"]
    command = runs[1].command()
    assert command[1:3] == ["-m", "trl_credit.cli.grpo"]
    assert command[3:] == [
        "--config",
        "r.yaml",
        "--method",
        "eapo+taco",
        "--seed",
        "3",
        "--output_dir",
        str(tmp_path / "runs" / "eapo+taco-seed3"),
        "--epsilon_high",  # the recipe `r.yaml` does not set it: compare's common value
        "0.28",
        "--max_steps",
        "5",
        "--accelerate_config",
        "zero3",
    ]
    assert run_name("a/b c", 0) == "a_b_c-seed0"


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"methods": []}, "--methods needs at least one value"),
        ({"seeds": [0, 1, 0]}, "--seeds lists 0 more than once"),
        ({"methods": ["taco", "taco"]}, "--methods lists taco more than once"),
        ({"eval_n": 0}, "must be >= 1"),
    ],
)
def test_config_refuses_bad_values(kwargs, message):
    with pytest.raises(CompareUsageError, match=re.escape(message)):
        CompareConfig(**kwargs)


@pytest.mark.parametrize(
    "flag", ["--seed", "--method", "--output_dir=x", "--resume_from_checkpoint", "--resume-from-checkpoint"]
)
def test_flags_owned_by_compare_are_refused(flag):
    with pytest.raises(CompareUsageError, match="is set by compare"):
        check_passthrough(["--max_steps", "3", flag, "1"])
    with pytest.raises(CompareUsageError, match="unknown evaluation option --eval_nn"):
        check_passthrough(["--eval_nn", "3"])


def _parsed_runs(config: CompareConfig, passthrough: list[str]) -> dict[str, tuple]:
    """Each method's first run, parsed by `trl-credit grpo`'s own parser as the run will parse it."""
    return {
        spec.method: parse_arguments(spec.grpo_argv())
        for spec in build_runs(config, passthrough)[: len(config.methods)]
    }


def test_every_run_gets_the_same_clipping(tmp_path):
    """`trl-credit grpo --method grpo` clips at 0.2 / 0.2 and the single-method recipes at 0.2 / 0.28: in a comparison
    every run gets one upper bound, the user's when given (as a flag or in the recipe), else compare's 0.28."""
    methods = ["grpo", "taco", "eapo", "eapo+taco"]
    config = CompareConfig(methods=methods, seeds=[0], output_dir=str(tmp_path))
    parsed = _parsed_runs(config, ["--max_steps", "3"])
    assert {method: args[1].epsilon_high for method, args in parsed.items()} == dict.fromkeys(methods, 0.28)
    assert {args[1].epsilon for args in parsed.values()} == {0.2}
    check_same_settings(parsed)

    parsed = _parsed_runs(config, ["--epsilon_high", "0.25", "--epsilon=0.15"])
    assert {(args[1].epsilon, args[1].epsilon_high) for args in parsed.values()} == {(0.15, 0.25)}
    assert all(
        spec.grpo_argv().count("--epsilon_high") == 1 for spec in build_runs(config, ["--epsilon_high", "0.25"])
    )
    # A checkpoint setting given as a flag replaces compare's own resume point, which keeps the others: each once
    # (`trl-credit grpo` refuses an option given twice).
    [argv] = {tuple(spec.grpo_argv()) for spec in build_runs(config, ["--save_steps", "5"])[:1]}
    assert argv.count("--save_steps") == 1 and argv[argv.index("--save_steps") + 1] == "5"
    assert argv.count("--save_strategy") == 1 and argv.count("--save_total_limit") == 1

    recipe = tmp_path / "recipe.yaml"
    settings = {"model_name_or_path": "smollm2-135m-instruct", "use_cpu": True, "bf16": False, "epsilon_high": 0.3}
    recipe.write_text(yaml.safe_dump(settings))
    config = CompareConfig(methods=methods, seeds=[0], output_dir=str(tmp_path), config=str(recipe))
    assert {args[1].epsilon_high for args in _parsed_runs(config, []).values()} == {0.3}


def test_runs_that_would_differ_in_more_than_the_method_are_refused(tmp_path):
    config = CompareConfig(methods=["grpo", "taco"], seeds=[0], output_dir=str(tmp_path))
    parsed = _parsed_runs(config, [])
    parsed["taco"] = parse_arguments([*build_runs(config, [])[1].grpo_argv(), "--temperature", "0.7"])
    with pytest.raises(CompareUsageError, match=r"the grpo and taco runs would differ in temperature \(1.0 and 0.7\)"):
        check_same_settings(parsed)


def test_method_settings_go_to_their_methods_runs_only(tmp_path):
    config = CompareConfig(methods=["grpo", "taco", "eapo+taco"], seeds=[0], output_dir=str(tmp_path))
    parsed = _parsed_runs(config, ["--taco-alpha", "0.05", "--max_steps", "3"])
    assert parsed["taco"][1].credit_kwargs["taco_alpha"] == 0.05
    assert parsed["eapo+taco"][1].credit_kwargs["taco_alpha"] == 0.05
    assert parsed["grpo"][1].credit_kwargs in (None, {}) and "taco_alpha" not in str(parsed["grpo"][3])
    assert {args[1].max_steps for args in parsed.values()} == {3}

    parsed = _parsed_runs(config, ["--credit_kwargs", json.dumps({"taco_alpha": 0.03, "eapo_kappa": 0.5})])
    assert parsed["taco"][1].credit_stack[0].hyperparameters == {
        "taco_alpha": 0.03,
        "taco_lambda": 0.9,
    }
    assert {k: parsed["eapo+taco"][1].credit_kwargs[k] for k in ("taco_alpha", "eapo_kappa")} == {
        "taco_alpha": 0.03,
        "eapo_kappa": 0.5,
    }
    assert parsed["grpo"][1].credit_kwargs in (None, {})

    # A stack's boolean option, negated: `--no_x` goes where x does.
    config = CompareConfig(methods=["grpo", "otb"], seeds=[0], output_dir=str(tmp_path))
    runs = build_runs(config, ["--no_otb_handle_zero_tail"])
    assert (
        "--no_otb_handle_zero_tail" in runs[1].grpo_argv() and "--no_otb_handle_zero_tail" not in runs[0].grpo_argv()
    )


@pytest.mark.parametrize(
    "passthrough,message",
    [
        (
            ["--eapo_kappa", "0.5"],
            "--eapo_kappa is an option of eapo, which none of the compared methods (grpo, taco) has",
        ),
        (
            ["--credit_kwargs", '{"eapo_kappa": 0.5}'],
            "--credit_kwargs: 'eapo_kappa' is not a hyperparameter of the compared methods (grpo, taco)",
        ),
        (["--credit_kwargs", '{"taco_alpha": 5}'], "--credit_kwargs: taco_alpha must be in (0, 1], got 5"),
        (["--credit_kwargs", "[1]"], "--credit_kwargs: credit_kwargs must be a mapping"),
    ],
)
def test_method_settings_no_compared_method_owns_are_refused(tmp_path, passthrough, message):
    config = CompareConfig(methods=["grpo", "taco"], seeds=[0], output_dir=str(tmp_path))
    with pytest.raises(CompareUsageError) as error:
        build_runs(config, passthrough)
    assert message in str(error.value)


def test_disk_estimate_against_a_real_checkpoint(tmp_path, tiny_tokenizer):
    """The plan's figures against what a trainer writes: the parameters counted without loading the weights, the
    model file, and a checkpoint of weights and AdamW state (three times the model)."""

    model = make_tiny_model(tiny_tokenizer, hidden_size=64)
    model_dir = tmp_path / "model"
    model.save_pretrained(model_dir)
    tiny_tokenizer.save_pretrained(model_dir)
    count, _ = parameter_count(str(model_dir))
    assert count == sum(p.numel() for p in model.parameters())

    args = tiny_config("grpo", tmp_path / "run", max_steps=1, save_strategy="steps", save_steps=1)
    trainer = tiny_trainer(args, model=str(model_dir), tokenizer=tiny_tokenizer)
    trainer.train()
    checkpoint = tmp_path / "run" / "checkpoint-1"
    weights = (checkpoint / "model.safetensors").stat().st_size
    optimizer = (checkpoint / "optimizer.pt").stat().st_size
    assert weights == pytest.approx(4 * count, rel=0.02)
    assert weights + optimizer == pytest.approx(3 * 4 * count, rel=0.05)

    _, training_args, model_args, _ = parse_arguments(
        ["--model_name_or_path", str(model_dir), "--use_cpu", "true", "--bf16", "false", "--save_strategy", "steps"]
    )
    runs = build_runs(CompareConfig(methods=["grpo", "taco"], seeds=[0, 1], output_dir=str(tmp_path)), [])
    line = estimate_disk(runs, training_args, model_args)
    found = re.fullmatch(
        r"disk: (.+) for the 4 final models \(([\d,]+) parameters x 4 bytes = (.+) each\); while a run trains, its "
        r"checkpoint \(weights and AdamW state: (.+) each\), deleted once the run is done: at most about (.+) at once",
        line,
    )
    assert found is not None, line
    assert int(found[2].replace(",", "")) == count
    # No --save_total_limit, and 30 steps with a checkpoint every 500: one checkpoint per run exists at once.
    expected = [4 * 4 * count, 4 * count, 3 * 4 * count, 3 * 4 * count + 3 * 4 * count]
    shown = [_bytes(found[i]) for i in (1, 3, 4, 5)]
    assert shown == pytest.approx(expected, rel=0.01)


def _bytes(size: str) -> float:
    number, unit = size.split()
    return float(number) * {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}[unit]


def test_run_state_done_resume_fresh(tmp_path):
    spec = RunSpec("taco", 0, tmp_path / "taco-seed0", None, ("--max_steps", "20"))
    assert run_state(spec.output_dir) == ("fresh", None)
    for name in ("checkpoint-3", "checkpoint-10", "checkpoint-9", "checkpoint-final"):
        (spec.output_dir / name).mkdir(parents=True)
    (spec.output_dir / "checkpoint-12").write_text("a file, not a checkpoint")
    state, checkpoint = run_state(spec.output_dir)
    assert state == "resume" and checkpoint.name == "checkpoint-10"  # numeric order, folders only
    assert spec.command(checkpoint)[-2:] == ["--resume_from_checkpoint", str(spec.output_dir / "checkpoint-10")]
    (spec.output_dir / ".done").write_text("{}")
    assert run_state(spec.output_dir) == ("done", None)


def test_checkpoints_are_removed_only_once_the_final_model_is_saved(tmp_path):
    run_dir = tmp_path / "taco-seed0"
    for name in ("checkpoint-5", "checkpoint-10"):
        (run_dir / name).mkdir(parents=True)
        (run_dir / name / "optimizer.pt").write_text("state")
    (run_dir / "trainer_state.json").write_text("{}")
    assert remove_checkpoints(run_dir) == []  # no final model: the checkpoints may still resume the run
    assert latest_checkpoint(run_dir).name == "checkpoint-10"
    (run_dir / "config.json").write_text("{}")
    assert remove_checkpoints(run_dir) == ["checkpoint-10", "checkpoint-5"]
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.json", "trainer_state.json"]


def test_run_started_with_other_arguments_is_not_resumed(tmp_path):
    spec = RunSpec("taco", 0, tmp_path / "taco-seed0", None, ("--max_steps", "20"))
    spec.output_dir.mkdir()
    (spec.output_dir / "run.json").write_text(json.dumps({"grpo_argv": spec.grpo_argv()}))
    check_recorded_arguments(spec)  # the same arguments: fine
    other = RunSpec("taco", 0, spec.output_dir, None, ("--max_steps", "40"))
    with pytest.raises(CompareUsageError, match="was started with other arguments"):
        check_recorded_arguments(other)


def _problems(path: Path, numbers) -> str:
    rows = [{"question": f"what is {a} + 1 ?", "answer": str(a + 1)} for a in numbers]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def _assert_usage_error(capsys, argv, message, output_dir):
    capsys.readouterr()  # drop what fixtures printed
    assert cli_main(["compare", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("trl-credit compare: error:"), err
    assert message in err[0]
    assert not (output_dir / "runs").exists()


def test_bad_input_exits_2_before_any_training(tmp_path, capsys, tiny_model_dir):
    out = tmp_path / "out"
    train = _problems(tmp_path / "train.jsonl", range(8))
    base = [
        "--output_dir",
        str(out),
        "--model_name_or_path",
        tiny_model_dir,
        "--dataset_name",
        train,
        "--use_cpu",
        "true",
        "--bf16",
        "false",
    ]
    _assert_usage_error(capsys, ["--methods", *base], "expected at least one argument", out)
    _assert_usage_error(capsys, ["--seeds", "0", "0", *base], "--seeds lists 0 more than once", out)
    _assert_usage_error(capsys, ["--eval_bogus", "1", *base], "unknown evaluation option --eval_bogus", out)
    _assert_usage_error(capsys, ["--seed", "1", *base], "--seed is set by compare", out)
    _assert_usage_error(capsys, ["--methods", "grpo", "ppo", *base], "the ppo runs would fail: --method 'ppo'", out)
    _assert_usage_error(capsys, ["--bogus_flag", "1", *base], "unknown option --bogus_flag", out)
    _assert_usage_error(
        capsys,
        ["--methods", "grpo", "taco", "--eapo_kappa", "0.5", *base],
        "--eapo_kappa is an option of eapo, which none of the compared methods (grpo, taco) has",
        out,
    )
    _assert_usage_error(
        capsys,
        ["--methods", "grpo", "taco", "--taco_alpha", "2", *base],
        "the taco runs would fail: --taco_alpha",
        out,
    )
    # The training file has one split: evaluating on it would not be held out.
    _assert_usage_error(capsys, base, "no held-out split", out)
    _assert_usage_error(capsys, [*base, "--eval_dataset_name", str(tmp_path / "none.jsonl")], "does not exist", out)


def test_dry_run_prints_plan_and_measured_cost(tmp_path, capsys, tiny_model_dir):
    out = tmp_path / "out"
    # A finished run whose checkpoint logged 0.5 s steps: skipped, and the basis of the time estimate.
    finished = out / "runs" / "grpo-seed0"
    (finished / "checkpoint-4").mkdir(parents=True)
    (finished / "checkpoint-4" / "trainer_state.json").write_text(
        json.dumps(
            {"global_step": 4, "log_history": [{"step": s, "step_time": 0.5, "reward": 0.1} for s in (1, 2, 3, 4)]}
        )
    )
    (finished / ".done").write_text("{}")
    argv = [
        "compare",
        "--methods",
        "grpo",
        "taco",
        "--seeds",
        "0",
        "1",
        "--output_dir",
        str(out),
        "--dry_run",
        "--model_name_or_path",
        tiny_model_dir,
        "--dataset_name",
        "chain_sum",
        "--max_train_samples",
        "8",
        "--max_steps",
        "4",
        "--per_device_train_batch_size",
        "4",
        "--num_generations",
        "4",
        "--use_cpu",
        "true",
        "--bf16",
        "false",
        "--eval_num_problems",
        "3",
        "--eval_n",
        "2",
        "--save_strategy",
        "no",
    ]
    assert cli_main(argv) == 0
    out_text = capsys.readouterr().out
    assert re.search(r"grpo-seed0\s+done, skipped", out_text)
    assert re.search(r"taco-seed1\s+train\s+\S+ -m trl_credit.cli.grpo --method taco --seed 1 --output_dir", out_text)
    assert "optimizer steps: 4 per run x 4 runs = 16; 12 left" in out_text
    assert "evaluation: 6 sampled completions per run" in out_text
    assert "0.50 s/step x 12 steps" in out_text and "rough" in out_text
    assert (
        "warning: --save_strategy no: runs save no checkpoint, so an interrupted run restarts from scratch" in out_text
    )
    assert "no learning curves" not in out_text  # `trl-credit grpo` saves trainer_state.json at the end anyway
    assert re.search(
        r"disk: \S+ \S+ for the 4 final models \([\d,]+ parameters x 4 bytes = \S+ \S+ each\); no checkpoints",
        out_text,
    )
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["grpo-seed0"]  # nothing was trained


def test_dry_run_of_the_default_comparison_uses_the_quickstart_measurement(tmp_path, capsys):
    assert cli_main(["compare", "--output_dir", str(tmp_path), "--dry_run", "--eval_num_problems", "2"]) == 0
    out_text = capsys.readouterr().out
    assert "optimizer steps: 30 per run x 12 runs = 360" in out_text  # 4 methods x 3 seeds of the quick start
    assert "7.60 s/step x 360 steps" in out_text and "the quick start's measurement (7.6 s/step" in out_text
    assert "warning" not in out_text  # the quick start saves checkpoints


# ---------------------------------------------------------------------------------------------- report


def _history(rewards, step_time=0.2, method="grpo"):
    history = [
        {"step": i + 1, "reward": r, "entropy": 1.0 - 0.1 * i, "step_time": step_time} for i, r in enumerate(rewards)
    ]
    if method == "taco":
        for entry in history:
            entry["taco/tail_fraction"] = 0.05
            entry["taco/mean_weight"] = 0.99  # the trainer logs it for every method
    return history


FAKE = {  # (method, seed): (training rewards, avg@4)
    ("grpo", 0): ([0.1, 0.2, 0.3], 0.30),
    ("grpo", 1): ([0.2, 0.2, 0.4], 0.40),
    ("grpo", 2): ([0.0, 0.1, 0.2], 0.20),
    ("taco", 0): ([0.1, 0.3, 0.5], 0.45),
    ("taco", 1): ([0.2, 0.4, 0.4], 0.50),
    ("taco", 2): ([0.1, 0.2, 0.3], 0.40),
}


def _fake_results():
    return [
        RunResult(
            m,
            s,
            _history(r, method=m),
            {"avg@4": a, "pass@4": min(1.0, 2 * a)},
            {"wall_seconds": 10.0, "peak_rss_mib": 500.0 + s},
        )
        for (m, s), (r, a) in FAKE.items()
    ]


def test_tables_and_bands_by_hand():
    results = _fake_results()
    finals = final_table(results, ["grpo", "taco"])
    assert finals["taco"]["avg@4"].mean == pytest.approx(0.45)
    assert finals["taco"]["avg@4"].half_width == pytest.approx(4.302652729749464 * 0.05 / math.sqrt(3))
    assert finals["grpo"]["train reward (last 10 steps)"].mean == pytest.approx(statistics.fmean([0.2, 0.8 / 3, 0.1]))
    difference = paired_table(results, ["grpo", "taco"])["taco"]["avg@4"]
    assert difference.mean == pytest.approx(0.15) and difference.n == 3
    assert difference.half_width == pytest.approx(
        4.302652729749464 * statistics.stdev([0.15, 0.1, 0.2]) / math.sqrt(3)
    )
    steps, mean, low, high = mean_band(results, "taco", "reward")
    assert steps == [1, 2, 3] and mean[1] == pytest.approx(0.3) and (low[1], high[1]) == (0.2, 0.4)
    assert paired_table(results, ["taco"]) == {}  # no grpo baseline: no paired differences


def _write_fake_runs(output_dir: Path) -> list[RunSpec]:
    runs = build_runs(CompareConfig(methods=["grpo", "taco"], seeds=[0, 1, 2], output_dir=str(output_dir)), [])
    for spec, result in zip(sorted(runs, key=lambda r: (r.method, r.seed)), _fake_results()):
        state = spec.output_dir / "checkpoint-3" / "trainer_state.json"
        state.parent.mkdir(parents=True)
        state.write_text(json.dumps({"global_step": 3, "log_history": result.log_history}))
        (spec.output_dir / "eval.json").write_text(json.dumps(result.eval_summary))
        (spec.output_dir / ".done").write_text(json.dumps(result.done))
    return runs


def _write_state(path: Path, rewards: list[float]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"global_step": len(rewards), "log_history": _history(rewards)}))


def test_curves_come_from_the_run_folder_else_its_latest_checkpoint(tmp_path):
    finished_no_checkpoint, interrupted, finished = build_runs(
        CompareConfig(methods=["grpo"], seeds=[0, 1, 2], output_dir=str(tmp_path)), []
    )
    # `trl-credit grpo --save_strategy no` leaves only the run folder's trainer_state.json (`save_state`).
    _write_state(finished_no_checkpoint.output_dir / "trainer_state.json", [0.1, 0.2, 0.3])
    # An interrupted run has checkpoints only: the latest one, in numeric order.
    _write_state(interrupted.output_dir / "checkpoint-2" / "trainer_state.json", [0.5, 0.6])
    _write_state(interrupted.output_dir / "checkpoint-10" / "trainer_state.json", [0.5, 0.6] + [0.7] * 8)
    # A finished run with checkpoints: the run folder's complete history, not an earlier checkpoint's.
    _write_state(finished.output_dir / "checkpoint-2" / "trainer_state.json", [0.9, 0.9])
    _write_state(finished.output_dir / "trainer_state.json", [0.0, 0.1, 0.2, 0.4])
    rewards = {r.seed: r.series("reward")[1] for r in collect_results([finished_no_checkpoint, interrupted, finished])}
    assert rewards == {0: [0.1, 0.2, 0.3], 1: [0.5, 0.6] + [0.7] * 8, 2: [0.0, 0.1, 0.2, 0.4]}


def test_report_markdown_and_self_contained_html(tmp_path):
    runs = _write_fake_runs(tmp_path)
    notes = ["A note <b>escaped</b>."]
    md_path, html_path = write_report(tmp_path, runs, ["grpo", "taco"], notes, "trl-credit compare")
    markdown = md_path.read_text()
    assert "6 of 6 runs finished" in markdown
    assert "| taco | 0, 1, 2 | 0.45 ± 0.124 |" in markdown  # 4.303 * 0.05 / sqrt(3) = 0.124
    assert "| taco − grpo | 3 | 0.15 ± 0.124 * |" in markdown
    assert "| grpo | 0.2 ± 0 | 10 ± 0 | 502 |" in markdown
    assert {p.name for p in (tmp_path / "plots").iterdir()} == {
        "reward.svg",
        "entropy.svg",
        "taco_tail_fraction.svg",
        "taco_mean_weight.svg",
    }
    page = html_path.read_text()
    assert page.count("<svg") == 4 and "<script" not in page and "<link" not in page
    command = "trl-credit compare --output_dir /work/runs/cmp --model_name_or_path=/models/SmolLM2 --seeds 0"
    assert portable_command(command) == "trl-credit compare --output_dir cmp --model_name_or_path=SmolLM2 --seeds 0"
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", page), "the report must not load external assets"
    assert "A note &lt;b&gt;escaped&lt;/b&gt;." in page


@needs_chromium
def test_report_renders_inrun_chromium(tmp_path):

    runs = _write_fake_runs(tmp_path)
    _, html_path = write_report(tmp_path, runs, ["grpo", "taco"], [], "trl-credit compare")
    dom = run_chromium(tmp_path, html_path.as_uri(), "--dump-dom")
    assert dom.count("<svg") == 4 and "taco − grpo" in dom
    screenshot = tmp_path / "report.png"
    run_chromium(tmp_path, html_path.as_uri(), f"--screenshot={screenshot}")
    image = read_png(screenshot)
    assert image.std() > 10, "blank screenshot"
    # tab10's first two colours: the grpo and taco curves were drawn.
    for rgb in ([31, 119, 180], [255, 127, 14]):
        assert (abs(image - rgb).max(-1) <= 40).sum() > 20, f"no curve drawn in {rgb}"


# ---------------------------------------------------------------------------------------------- end to end


def _token_credit_prompts(run_dir: Path) -> list[tuple[int, str]]:
    lines = (run_dir / "token_credit.jsonl").read_text().splitlines()
    return [(record["step"], record["prompt"]) for record in map(json.loads, lines)]


def test_compare_end_to_end(tmp_path, capsys, tiny_model_dir):
    """2 methods x 2 seeds of 2 steps with the tiny model, evaluated on held-out problems, reported, then resumed."""
    out = tmp_path / "out"
    argv = [
        "compare",
        "--methods",
        "grpo",
        "taco",
        "--seeds",
        "0",
        "1",
        "--output_dir",
        str(out),
        "--model_name_or_path",
        tiny_model_dir,
        "--dataset_name",
        _problems(tmp_path / "train.jsonl", range(16)),
        "--reward_funcs",
        "accuracy",
        "format",
        "--max_steps",
        "2",
        "--per_device_train_batch_size",
        "4",
        "--num_generations",
        "4",
        "--max_completion_length",
        "6",
        "--learning_rate",
        "5e-2",
        "--use_cpu",
        "true",
        "--bf16",
        "false",
        "--save_steps",
        "2",
        "--eval_dataset_name",
        _problems(tmp_path / "heldout.jsonl", range(20, 24)),
        "--eval_num_problems",
        "2",
        "--eval_n",
        "2",
        "--eval_max_new_tokens",
        "4",
        "--taco_alpha",
        "0.05",
    ]
    assert cli_main(argv) == 0
    plan = capsys.readouterr().out
    assert "Clipping: epsilon 0.2, epsilon_high 0.28 in every run (epsilon_high 0.28 is compare's common value" in plan
    assert "taco runs only: --taco_alpha 0.05" in plan
    runs = out / "runs"
    for name in ("grpo-seed0", "taco-seed0", "grpo-seed1", "taco-seed1"):
        done = json.loads((runs / name / ".done").read_text())
        assert done["peak_rss_mib"] > 100 and done["wall_seconds"] > 0
        summary = json.loads((runs / name / "eval.json").read_text())
        assert summary["num_problems"] == 2 and "avg@2" in summary and "pass@2" in summary
        assert summary["train_overlap"] == 0
        # The run's model card was rendered again after its evaluation: the same numbers in its YAML.
        [index] = yaml.safe_load((runs / name / "README.md").read_text().split("---\n")[1])["model-index"]
        metrics = {m["type"]: m["value"] for result in index["results"] for m in result["metrics"]}
        assert metrics == {key: summary[key] for key in summary if key.startswith(("avg@", "pass@"))}
        assert json.loads((runs / name / "trainer_state.json").read_text())["global_step"] == 2
        # The run is done: its checkpoint-2 (saved at step 2, with optimizer state) is gone, its final model stays.
        assert not list((runs / name).glob("checkpoint-*")) and (runs / name / "model.safetensors").is_file()
        setup = (runs / name / "README.md").read_text().split("### Training set-up")[1]
        assert "| `epsilon` | `0.2` |" in setup and "| `epsilon_high` | `0.28` |" in setup
        assert ("| `taco_alpha` | `0.05` |" in (runs / name / "README.md").read_text()) == name.startswith("taco")
    # Same seed, same prompts in the same order, whatever the method; another seed, another order.
    assert _token_credit_prompts(runs / "grpo-seed0") == _token_credit_prompts(runs / "taco-seed0")
    assert _token_credit_prompts(runs / "grpo-seed1") == _token_credit_prompts(runs / "taco-seed1")
    assert _token_credit_prompts(runs / "grpo-seed0") != _token_credit_prompts(runs / "grpo-seed1")

    markdown = (out / "report.md").read_text()
    assert "4 of 4 runs finished" in markdown and "| taco − grpo | 2 |" in markdown
    assert "Clipping: epsilon 0.2, epsilon_high 0.28 in every run" in markdown
    assert "taco runs only: --taco_alpha 0.05" in markdown
    assert re.search(r"\| grpo \| 0, 1 \| [0-9.]+ ± [0-9.]+ \|", markdown)
    page = (out / "report.html").read_text()
    assert page.count("<svg") >= 4 and 'data-metric="taco/tail_fraction"' in page

    # Run the same command again: every run is done, nothing is trained again.
    capsys.readouterr()
    assert cli_main(argv) == 0
    out_text = capsys.readouterr().out
    assert out_text.count("done, skipped") == 4
    for name in ("grpo-seed0", "taco-seed1"):
        assert len(json.loads((runs / name / "run.json").read_text())["attempts"]) == 1

    if CHROMIUM is not None:
        dom = run_chromium(tmp_path, (out / "report.html").as_uri(), "--dump-dom")
        assert dom.count("<svg") >= 4 and "taco − grpo" in dom
