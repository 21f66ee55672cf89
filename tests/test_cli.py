"""`trl-credit` and `trl-credit grpo`: help, bad input (exit 2, one line, before any model) and a real run."""

import json

import pytest
import yaml

from trl_credit.cli import main as cli_main
from trl_credit.cli.grpo import parse_arguments, reward_summary
from trl_credit.resources import packaged_dir

RECIPES = sorted(p for p in packaged_dir("configs").glob("*.yaml"))


def test_top_level_help_and_unknown_command(capsys):
    assert cli_main(["--help"]) == 0
    assert "grpo" in capsys.readouterr().out
    assert cli_main(["fly"]) == 2
    assert "unknown command 'fly'" in capsys.readouterr().err


@pytest.mark.parametrize("method", ["taco", "stapo", "eapo+taco"])
def test_grpo_help_shows_the_stack_options_with_their_help_and_defaults(capsys, method):
    from trl_credit.methods import CREDIT_METHODS, get_credit_method, parse_credit_methods

    with pytest.raises(SystemExit) as exit_info:
        cli_main(["grpo", "--method", method, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    flat = "".join(out.split())  # argparse wraps the help text, also at hyphens
    assert "--accelerate_config" in out
    stack = {get_credit_method(name).name for name in parse_credit_methods(method)}
    for registered in CREDIT_METHODS.values():
        for field in registered.argument_fields():
            if registered.name in stack:
                assert f"--{field.name}" in out and "".join(field.metadata["help"].split()) in flat
            else:
                assert f"--{field.name} " not in out  # only the stack's options
        assert "".join(f"{registered.name} {registered.summary}".split()) in flat  # the methods list
    assert "(default:0.01)" in flat if "taco" in stack else True


@pytest.fixture
def no_model_loading(monkeypatch):
    """Any attempt to resolve or load a model fails the test: errors must come first."""
    import trl_credit.models

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the bad input was reported")

    monkeypatch.setattr(trl_credit.models, "resolve_model_path", refuse)


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--method", "ppo"], "--method 'ppo': unknown credit method 'ppo'; registered: grpo, "),
        (["--method", "taco+eapo"], "must come before methods that read the training forward"),
        (["--method", "no_such_module:probe"], "cannot import credit-method module 'no_such_module'"),
        (["--bogus_flag", "1"], "unknown arguments"),
        (["--method", "taco", "--taco_lambda", "3"], "taco_lambda must be in [0, 1]"),
        (
            ["--method", "eapo", "--tide_tau", "0.3"],
            "tide_tau is an option of tide, which is not in the method stack 'eapo'",
        ),
        (["--method", "eapo+stapo", "--stapo_prob_threshold", "3"], "stapo_prob_threshold must be in (0, 1), got 3.0"),
        (["--method", "taco", "--credit_kwargs", '{"taco_alpha": 0.3}'], "TACOConfig declares as fields"),
        (
            [
                "--method",
                "eapo+stapo",
                "--stapo_prob_threshold",
                "0.1",
                "--credit_kwargs",
                '{"stapo_prob_threshold": 0.2}',
            ],
            "stapo_prob_threshold is given both as an option (0.1) and in credit_kwargs (0.2)",
        ),
        (["--method", "eapo", "--config", "configs/taco_qwen3_1.7b_base.yaml"], "given with a config for method taco"),
        (["--dataset_name", "no-such-source"], "unknown dataset 'no-such-source'"),
        (["--dataset_name", "gsm8k", "--prompt_column", "nope"], "'nope'"),
        (["--reward_funcs", "telepathy"], "unknown reward 'telepathy'"),
        (["--config", "/nonexistent.yaml"], "cannot read --config"),
        (["--accelerate_config", "no-such-config"], "neither a file nor a packaged config"),
    ],
)
def test_bad_input_exits_2_with_one_line_before_any_model(capsys, no_model_loading, argv, message):
    assert cli_main(["grpo", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("trl-credit grpo: error:")
    assert message in err[0]


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_every_recipe_parses_into_the_config_classes(recipe):
    # GPU recipes ask for bf16, which TrainingArguments refuses on a CPU-only machine: override just that.
    script_args, training_args, model_args, _ = parse_arguments(
        ["--config", str(recipe), "--bf16", "false", "--use_cpu", "true"]
    )
    config = yaml.safe_load(recipe.read_text())
    assert training_args.credit_method == script_args.method == config.get("method", "grpo")
    for key in config:
        parsed = [getattr(args, key) for args in (script_args, training_args, model_args) if hasattr(args, key)]
        assert parsed, f"{recipe.name}: {key} did not reach any argument class"
    if script_args.accelerate_config:
        from trl_credit.resources import accelerate_config_path

        assert accelerate_config_path(script_args.accelerate_config).is_file()


def test_flags_override_yaml_defaults():
    _, training_args, _, _ = parse_arguments(["--method", "taco", "--learning_rate", "3e-4", "--taco_alpha", "0.05"])
    assert training_args.learning_rate == 3e-4 and training_args.credit_hyperparameters()["taco_alpha"] == 0.05
    assert training_args.max_completion_length == 48  # from the packaged quickstart recipe


def test_a_stack_method_options_reach_credit_kwargs_from_yaml_and_flags(tmp_path):
    recipe = tmp_path / "stack.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "method": "eapo+stapo",
                "stapo_entropy_quantile": 0.3,
                "use_cpu": True,
                "bf16": False,
                "model_name_or_path": "x",
            }
        )
    )
    _, training_args, _, _ = parse_arguments(["--config", str(recipe), "--stapo_prob_threshold", "0.01"])
    assert training_args.credit_kwargs == {"stapo_entropy_quantile": 0.3, "stapo_prob_threshold": 0.01}
    assert training_args.credit_hyperparameters()["stapo_only_positive_advantage"] is True  # not given: the default
    _, training_args, _, _ = parse_arguments(["--method", "eapo+stapo", "--no_stapo_only_positive_advantage"])
    assert training_args.credit_kwargs == {"stapo_only_positive_advantage": False}


def test_reward_summary_is_honest():
    history = [{"reward": r} for r in (0.1, 0.2, 0.1, 0.5, 0.6, 0.4)]
    assert reward_summary(history).startswith("reward improved: mean 0.150")
    assert reward_summary(list(reversed(history))).startswith("reward did not improve")


def test_grpo_runs_in_process_from_a_yaml_recipe(tmp_path, tiny_model_dir):
    data = tmp_path / "problems.jsonl"
    data.write_text(
        "".join(json.dumps({"question": f"what is {a} + 1 ?", "answer": str(a + 1)}) + "\n" for a in range(8))
    )
    recipe = tmp_path / "recipe.yaml"
    output_dir = tmp_path / "run"
    recipe.write_text(
        yaml.safe_dump(
            {
                "method": "taco",
                "model_name_or_path": tiny_model_dir,
                "dataset_name": str(data),
                "reward_funcs": ["accuracy", "format"],
                "output_dir": str(output_dir),
                "use_cpu": True,
                "bf16": False,
                "gradient_checkpointing": False,
                "per_device_train_batch_size": 4,
                "num_generations": 4,
                "max_completion_length": 6,
                "max_steps": 2,
                "logging_steps": 1,
                "report_to": "none",
                "save_strategy": "no",
                "log_token_credit": True,
            }
        )
    )
    assert cli_main(["grpo", "--config", str(recipe), "--taco_lambda", "0.5"]) == 0
    produced = {p.name for p in output_dir.iterdir()}
    assert {"model.safetensors", "README.md", "plots", "token_credit.jsonl", "trainer_state.json"} <= produced
    assert not [name for name in produced if name.startswith("checkpoint-")]  # save_strategy no, yet the curves:
    history = json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
    assert [entry["step"] for entry in history if "reward" in entry] == [1, 2]
    card = (output_dir / "README.md").read_text()
    assert "taco_lambda" in card and "0.5" in card and "2607.07976" in card
    assert "huggingface.co/datasets/" not in card  # a local file is named, not linked to the Hub

    # The quick start asks the first training prompt, as the trainer received it (the data set's first row).
    import ast

    from trl_credit.data import load_math_dataset

    code = card.split("## Quick start")[1].split("```python\n")[1].split("```")[0]
    [prompt] = [
        ast.literal_eval(node.value)
        for node in ast.parse(code).body
        if isinstance(node, ast.Assign) and node.targets[0].id == "prompt"
    ]
    assert prompt == load_math_dataset(str(data))[0]["prompt"]
    assert prompt[-1]["role"] == "user" and prompt[-1]["content"].startswith("what is 0 + 1 ?")
