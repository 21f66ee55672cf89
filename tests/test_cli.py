"""`trl-credit` and `trl-credit grpo`: help, bad input (exit 2, one line, before any model) and a real run."""

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import tiny_recipe
from fake_runs import fake_token_credit_records, folder_files, write_fake_trainer_state
from trainer_helpers import DOCUMENTED_STACKS, AdvantageRecorder, moving_settings

from trl_credit.cli import UsageError
from trl_credit.cli import main as cli_main
from trl_credit.cli.grpo import parse_arguments, reward_summary
from trl_credit.cli.grpo_launch import LAUNCHED_ENV
from trl_credit.resources import QUICK_START, accelerate_configs, recipes, yaml_names

ROOT = Path(__file__).resolve().parents[1]
RECIPES = yaml_names(recipes())  # packaged names: `taco_qwen3_1.7b_base` for configs/taco_qwen3_1.7b_base.yaml


def test_top_level_help_and_unknown_command(capsys):
    assert cli_main(["--help"]) == 0
    assert "grpo" in capsys.readouterr().out
    assert cli_main(["fly"]) == 2
    assert "unknown command 'fly'" in capsys.readouterr().err


def test_top_level_help_imports_neither_torch_nor_trl():
    # What the console script runs, in a fresh interpreter: `--help` must not wait seconds for torch to import.
    code = (
        "import sys; from trl_credit.cli import main; main(['--help']); "
        "print(sorted({'torch', 'transformers', 'trl'} & set(sys.modules)))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "commands:" in result.stdout and result.stdout.splitlines()[-1] == "[]"


@pytest.mark.parametrize("command", ["eval", "inspect", "plot", "compare", "lab"])
def test_every_subcommand_reports_a_bad_command_line_as_one_line_and_status_2(command, capsys):
    # eval's required options are named first; the others name the unknown flag.
    assert cli_main([command, "--no_such_flag", "1"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1
    assert captured.err.startswith(f"trl-credit {command}: error: ")
    assert ("required: --model_name_or_path" if command == "eval" else "--no_such_flag") in captured.err


@pytest.mark.parametrize("command", ["compare", "lab"])
def test_compare_and_lab_without_scipy_stop_before_training_and_say_how_to_install_it(
    command, tmp_path, capsys, monkeypatch
):
    monkeypatch.setitem(sys.modules, "scipy", None)  # `import scipy` raises ImportError
    argv = ["--methods", "grpo", "--seeds", "0", "--max_steps", "1"] if command == "compare" else ["--seeds", "0"]
    assert cli_main([command, *argv, "--output_dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"trl-credit {command}: error: ") and "pip install 'trl-credit[experiments]'" in err
    assert not (tmp_path / "out").exists()  # nothing trained, nothing written


@pytest.mark.parametrize("method", ["taco", "stapo", "eapo+taco", "stare", "otb+stare"])
def test_grpo_help_shows_the_stack_options_with_their_help_and_defaults(capsys, method):
    from trl_credit.methods import CREDIT_METHODS, get_credit_method, parse_credit_methods
    from trl_credit.methods.names import label as method_label

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
        # The methods list: each with its paper's arXiv id beside its name.
        assert "".join(f"{registered.name} {method_label(registered)}: {registered.summary}".split()) in flat
    assert "(default:0.01)" in flat if "taco" in stack else True


def _yaml(tmp_path, **values) -> str:
    path = tmp_path / "recipe.yaml"
    recipe = {"model_name_or_path": "smollm2-135m-instruct", "use_cpu": True, "bf16": False, **values}
    path.write_text(yaml.safe_dump(recipe))
    return str(path)


# Every kind of bad input the command can be given, with the first line it answers. `{yaml}` is a recipe written by
# `_yaml` with the case's YAML values.
BAD_INPUT = [
    (["--method", "ppo"], {}, "--method 'ppo': unknown credit method 'ppo'; registered: grpo, "),
    (["--method", "taco+eapo"], {}, "must come before methods that read the training forward"),
    (["--method", "no_such_module:probe"], {}, "cannot import credit-method module 'no_such_module'"),
    (["--bogus_flag", "1"], {}, "unknown option --bogus_flag (`--method grpo --help` lists the options)"),
    (["--method", "taco", "--taco_lambda", "3"], {}, "--taco_lambda must be in [0, 1], got 3.0"),
    # A stack's options, in dash or underscore form, are checked like a single method's.
    (["--method", "eapo+taco", "--taco-alpha", "5"], {}, "--taco_alpha must be in (0, 1], got 5.0"),
    (["--method", "eapo+taco", "--taco_alph", "0.05"], {}, "unknown option --taco_alph; did you mean --taco_alpha?"),
    (["--method", "eapo", "--tide_tau", "0.3"], {}, "--tide_tau: tide_tau is an option of tide, which is not in"),
    (["--method", "eapo+stapo", "--stapo_prob_threshold", "3"], {}, "--stapo_prob_threshold must be in (0, 1), got"),
    (
        [
            "--method",
            "eapo+stapo",
            "--stapo_prob_threshold",
            "0.1",
            "--credit_kwargs",
            '{"stapo_prob_threshold": 0.2}',
        ],
        {},
        "stapo_prob_threshold is given both as --stapo_prob_threshold and in --credit_kwargs",
    ),
    # Values are converted to the declared type, or refused naming where they came from.
    (
        ["--method", "eapo", "--credit_kwargs", '{"eapo_kappa": "one"}'],
        {},
        "eapo_kappa (in --credit_kwargs) must be a",
    ),
    (["--method", "eapo", "--credit_kwargs", '{"eapo_kapa": 1}'], {}, "did you mean 'eapo_kappa'?"),
    (["--method", "eapo+taco", "--config", "{yaml}"], {"taco_alpha": "a lot"}, "taco_alpha (in "),
    (["--method", "taco", "--config", "{yaml}"], {"learning_rat": 1e-5}, "did you mean --learning_rate?"),
    (["--method", "eapo", "--config", "configs/taco_qwen3_1.7b_base.yaml"], {}, "given with a config for method taco"),
    # Sizes and step counts TRL would fail on, or silently reinterpret.
    (["--max_completion_length", "0"], {}, "--max_completion_length must be an integer >= 1, got 0"),
    (["--per_device_train_batch_size", "0"], {}, "--per_device_train_batch_size must be an integer >= 1, got 0"),
    (["--max_steps", "-5"], {}, "--max_steps must be an integer >= 1, or -1 to train for num_train_epochs, got -5"),
    (["--max_steps", "0"], {}, "--max_steps must be an integer >= 1, or -1 to train for num_train_epochs, got 0"),
    (["--num_generations", "1"], {}, "--num_generations must be an integer >= 2"),
    (["--max_steps", "-1e1"], {}, "--max_steps: invalid int value: '-1e1'"),
    # Models, data and back ends that cannot be reached.
    (["--model_name_or_path", "/no/such/model"], {}, "--model_name_or_path: model path /no/such/model does not exist"),
    (
        ["--model_name_or_path", "nobody/no-such-model"],
        {},
        "nobody/no-such-model is neither a local folder nor in the",
    ),
    (["--dataset_name", "no-such-source"], {}, "unknown dataset 'no-such-source'"),
    (["--dataset_name", "nobody/no-such-data"], {}, "--dataset_name nobody/no-such-data: cannot"),
    (["--dataset_name", "gsm8k", "--prompt_column", "nope"], {}, "'nope'"),
    (["--reward_funcs", "telepathy"], {}, "unknown reward 'telepathy'"),
    (["--config", "/nonexistent.yaml"], {}, "--config '/nonexistent.yaml' is neither a file nor a packaged name; "),
    (
        ["--config", "taco"],
        {},
        "--config 'taco' is neither a file nor a packaged name; packaged: eapo_qwen3_4b_base_lora,",
    ),
    (["--accelerate_config", "no-such-config"], {}, "neither a file nor a packaged name; packaged: fsdp2, multi_gpu,"),
    # The method, by either name, from a flag or the YAML, named as given.
    (["--method", ""], {}, "--method '': credit_method must name one method or a '+'-separated stack, got ''"),
    (["--config", "{yaml}"], {"method": ""}, "error: method (in "),
    (["--config", "{yaml}"], {"method": 5}, "must be a method name, a '+'-separated stack or a list of names, got 5"),
    (["--credit_method", "eapo", "--method", "taco"], {}, "--method 'taco' and --credit_method 'eapo' differ"),
    (
        ["--credit-method", "eapo", "--config", "configs/taco_qwen3_1.7b_base.yaml"],
        {},
        "--credit_method eapo was given with a config for method taco",
    ),
    (
        ["--method", "{tmp}/syntax_error_method.py:m"],
        {},
        "SyntaxError: invalid syntax (syntax_error_method.py, line 1)",
    ),
    (["--method", "{tmp}/raising_method.py:m"], {}, "RuntimeError: refused at import"),
    # TRL's own fields with a domain, which TRL checks only after the model has loaded, or never.
    (
        ["--loss_type", "foo"],
        {},
        "--loss_type must be one of grpo, dr_grpo, dapo, bnpo, cispo, sapo, luspo, vespo (TRL",
    ),
    (["--scale_rewards", "foo"], {}, "--scale_rewards must be one of group, batch, none (TRL's values), got 'foo'"),
    (["--vllm_mode", "foo"], {}, "--vllm_mode must be one of server, colocate (TRL's values), got 'foo'"),
    (["--learning_rate", "nan"], {}, "--learning_rate must be a finite number, got nan"),
    (["--learning_rate", "inf"], {}, "--learning_rate must be a finite number, got inf"),
    (["--config", "{yaml}"], {"learning_rate": None}, "learning_rate (in "),
    (["--config", "{yaml}"], {"learning_rate": [1e-5, 2e-5]}, "must be a finite number, got [1e-05, 2e-05]"),
    (["--weight_decay", "nan"], {}, "--weight_decay must be a finite number, got nan"),
    (["--adam_beta1", "nan"], {}, "--adam_beta1 must be a finite number, got nan"),
    (["--max_grad_norm", "nan"], {}, "--max_grad_norm must be a finite number >= 0 (0 turns clipping off), got nan"),
    (["--max_grad_norm", "-1"], {}, "--max_grad_norm must be a finite number >= 0 (0 turns clipping off), got -1.0"),
    # Asked of the library that owns the setting, whose words follow: torch's optimizer, transformers' logits
    # processors and reporting callbacks, the Hub; a negative number in any notation is a value.
    (["--weight_decay=-1"], {}, "--weight_decay is -1.0, which the optimizer of optim 'adamw_torch_fused' refuses: "),
    (["--learning_rate", "-1e-5"], {}, "--learning_rate is -1e-05, which the optimizer of optim 'adamw_torch_fused' "),
    (["--adam_beta2", "1.5"], {}, "--adam_beta2 is 1.5, which the optimizer of optim 'adamw_torch_fused' refuses: I"),
    (["--repetition_penalty", "0"], {}, "--repetition_penalty is 0.0, which transformers' RepetitionPenaltyLogitsP"),
    (["--temperature", "-1"], {}, "--temperature is -1.0, which transformers' TemperatureLogitsWarper refuses: "),
    (["--config", "{yaml}"], {"temperature": 0}, "temperature (in "),
    (["--report_to", "wandb"], {}, "--report_to is ['wandb'], which transformers' WandbCallback refuses: "),
    (
        ["--report_to", "nothing"],
        {},
        "--report_to is ['nothing'], which transformers refuses: nothing is not supported",
    ),
    (["--push_to_hub", "true"], {}, "--push_to_hub is on, but the Hugging Face Hub is offline (HF_HUB_OFFLINE=1)"),
    (
        ["--vllm_gpu_memory_utilization", "1.5"],
        {},
        "--vllm_gpu_memory_utilization 1.5 has no effect: use_vllm is off",
    ),
    (
        ["--per_device_train_batch_size", "4", "--num_generations", "3"],
        {},
        "--per_device_train_batch_size 4 is not divisible by --num_generations 3: ",
    ),
    (["--save_steps", "1"], {}, "--save_steps 1 has no effect: save_strategy (in "),
    (["--save_steps", "-1", "--save_strategy", "steps"], {}, "--save_steps must be a number > 0 (an integer number"),
    (["--save_steps", "-1"], {}, "--save_steps must be a number > 0"),
    (["--config", "{tmp}/tab.yaml"], {}, "tab.yaml' is not valid YAML: line 2, column 1: found character '\\t' that "),
    (
        ["--method", "trl_credit.experiments.lab.oracle:oracle"],
        {},
        "oracle reads task_decisive, which CreditGRPOTrainer (the trainer of trl-credit grpo) does not compute",
    ),
    (["--config", "{yaml}"], {"max_steps": 3.7}, "-1 to train for num_train_epochs, got 3.7"),
    (["--config", "{yaml}"], {"max_completion_length": [48, 64]}, "must be an integer >= 1, got [48, 64]"),
    (["--beta", "-1"], {}, "--beta must be a finite number >= 0, got -1.0"),
    (["--epsilon", "-0.2"], {}, "--epsilon must be a finite number > 0, got -0.2"),
    (["--epsilon_high", "-0.2"], {}, "--epsilon_high must be a finite number > 0, or unset, got -0.2"),
    (["--num_iterations", "0"], {}, "--num_iterations must be an integer >= 1, got 0"),
    (["--top_p", "1.5"], {}, "--top_p is 1.5, which transformers' TopPLogitsWarper refuses: `top_p` has to be a "),
    (["--top_p", "nan"], {}, "--top_p must be a finite number, got nan"),
    (["--top_k", "-1"], {}, "--top_k is -1, which transformers' TopKLogitsWarper refuses: `top_k` has to be a "),
    (["--min_p", "1.5"], {}, "--min_p is 1.5, which transformers' MinPLogitsWarper refuses: `min_p` has to be a "),
    (["--seed", "-1"], {}, "--seed must be an integer in [0, 2**32 - 1], got -1"),
    (["--config", "{yaml}"], {"seed": None}, "must be an integer in [0, 2**32 - 1], got None"),
    # What depends on the rest of the run: the reward functions, the model's context, the folders.
    (["--reward_weights", "1", "2"], {}, "--reward_weights gives 2 weights for 1 reward functions (accuracy)"),
    (
        ["--model_name_or_path", "{tmp}/context-2048", "--max_completion_length", "1000000"],
        {},
        "--max_completion_length 1000000 leaves no room for the prompt in the model's context of 2048 positions",
    ),
    (["--output_dir", "{tmp}/a-file"], {}, "a-file is a file, not a folder"),
    (["--output_dir", "{tmp}/a-file/run"], {}, "a-file is a file, not a folder"),
    (["--output_dir", "/sys/trl-credit-run"], {}, "--output_dir /sys/trl-credit-run: cannot write in /sys"),
    (["--resume_from_checkpoint", "/no/such"], {}, "--resume_from_checkpoint /no/such: no such folder"),
    (
        ["--resume_from_checkpoint", "{tmp}/emptyckpt"],
        {},
        "emptyckpt: not a checkpoint: a checkpoint folder (checkpoint-N, saved by a run with save_strategy steps) holds "
        "trainer_state.json and the model's weights, and this one lacks trainer_state.json and the model's weights",
    ),
    (["--model_name_or_path", "{tmp}/no-model-type"], {}, "config.json has no model_type"),
    # Script arguments from YAML, and data, named as given.
    (["--config", "{yaml}"], {"dataset_name": None}, "dataset_name (in "),
    (["--config", "{yaml}"], {"reward_funcs": 7}, "reward_funcs (in "),
    (["--max_train_samples", "-3"], {}, "--max_train_samples must be a positive integer, got -3"),
    (["--max_train_samples", "100000000"], {}, "--max_train_samples must be at most 100,000 for chain_sum"),
    (["--dataset_name", "{tmp}/malformed.jsonl"], {}, "malformed.jsonl line 3: not valid JSON"),
    (["--dataset_name", "{tmp}/empty.jsonl"], {}, "empty.jsonl has no rows"),
    # Issue 49: TRL fields whose help states a domain, the run, and the data, refused before the model loads.
    (["--delta", "-1"], {}, "--delta must be a finite number > 1 (TRL recommends > 1 + epsilon), or unset, got -1.0"),
    (["--logging_steps", "-1"], {}, "--logging_steps must be a number > 0 (an integer number of steps, or below 1"),
    (["--top_entropy_quantile", "-0.5"], {}, "--top_entropy_quantile must be a number in [0, 1], got -0.5"),
    (["--top_entropy_quantile", "1.5"], {}, "--top_entropy_quantile must be a number in [0, 1], got 1.5"),
    (["--eval_strategy", "steps"], {}, "--eval_strategy steps: trl-credit grpo takes no evaluation data set, so it"),
    (["--use_peft", "true", "--lora_r", "0"], {}, "--lora_r 0: PEFT refuses it: `r` should be a positive integer"),
    (["--use_peft", "true", "--lora_dropout", "2"], {}, "--lora_dropout 2.0: PEFT refuses it: dropout probability"),
    (["--reward_funcs", "os:getcwd"], {}, "getcwd cannot take the arguments TRL calls it with (got an unexpected"),
    (["--model_name_or_path", "{tmp}/no-weights"], {}, "no-weights has config.json but no weights (none of model"),
    (["--reward_funcs", "accuracy", "accuracy"], {}, "--reward_funcs names accuracy more than once: give each"),
    (["--output_dir", "{tmp}/" + "x" * 300], {}, ": the folder name xxxxxxxxxx"),
    (["--dataset_name", "{tmp}/folder.jsonl"], {}, "dataset file {tmp}/folder.jsonl is a folder, not a .jsonl file"),
    (["--dataset_name", "{tmp}/no-answer.jsonl"], {}, "no-answer.jsonl line 4 has no 'answer' column (it has"),
    (["--method"], {}, "--method needs a value: grpo, ar_lopti, "),
    (["--learning_rate", "1e-5", "--learning-rate", "2e-5"], {}, "--learning_rate is given 2 times (1e-5, 2e-5): g"),
]
if importlib.util.find_spec("vllm") is None:
    BAD_INPUT.append(
        (
            ["--use_vllm", "true"],
            {},
            "--use_vllm true needs vLLM, which is not installed: pip install 'trl-credit[vllm]'",
        )
    )


def _bad_input_files(tmp_path) -> None:
    """The files `{tmp}` in BAD_INPUT names: models that are only a config.json, data, user method modules."""
    (tmp_path / "context-2048").mkdir()
    (tmp_path / "context-2048" / "config.json").write_text('{"model_type": "llama", "max_position_embeddings": 2048}')
    (tmp_path / "context-2048" / "model.safetensors").write_bytes(b"")
    (tmp_path / "no-weights").mkdir()
    (tmp_path / "no-weights" / "config.json").write_text('{"model_type": "llama"}')
    (tmp_path / "folder.jsonl").mkdir()
    rows = [{"question": "1 + 1?", "answer": "2"}, {"question": "2 + 2?", "answer": "4"}, {"question": "3 + 3?"}]
    (tmp_path / "no-answer.jsonl").write_text("\n".join([json.dumps(rows[0]), "", *map(json.dumps, rows[1:])]) + "\n")
    (tmp_path / "no-model-type").mkdir()
    (tmp_path / "no-model-type" / "config.json").write_text("{}")
    (tmp_path / "a-file").write_text("")
    (tmp_path / "emptyckpt").mkdir()
    rows = [json.dumps({"question": "1 + 1?", "answer": "2"}), "", '{"question": "2 + 2?" "answer": "4"}']
    (tmp_path / "malformed.jsonl").write_text("\n".join(rows) + "\n")  # line 2 is blank: line 3 is the bad one
    (tmp_path / "empty.jsonl").write_text("\n")
    (tmp_path / "syntax_error_method.py").write_text("def m(:\n")
    (tmp_path / "raising_method.py").write_text("raise RuntimeError('refused at import')\n")
    (tmp_path / "tab.yaml").write_text("max_steps: 3\n\tlearning_rate: 1e-5\n")


def _refused_before_any_model(capsys, monkeypatch, argv: list[str], message: str) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # as CI runs: no Hub
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"trl-credit {argv[0]}: error:")
    assert message in err[0]


@pytest.mark.parametrize("argv,yaml_values,message", BAD_INPUT)
def test_bad_input_exits_2_with_one_line_before_any_model(
    capsys, monkeypatch, tmp_path, no_model_loading, argv, yaml_values, message
):
    _bad_input_files(tmp_path)
    recipe = _yaml(tmp_path, **yaml_values)
    argv = [arg.replace("{yaml}", recipe).replace("{tmp}", str(tmp_path)) for arg in argv]
    _refused_before_any_model(capsys, monkeypatch, ["grpo", *argv], message.replace("{tmp}", str(tmp_path)))


def test_a_bad_omp_num_threads_is_refused_before_any_model(capsys, monkeypatch, no_model_loading):
    monkeypatch.setenv("OMP_NUM_THREADS", "abc")
    _refused_before_any_model(capsys, monkeypatch, ["grpo"], "OMP_NUM_THREADS='abc' must be a positive integer")


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--temperature", "nan"], "temperature must be a finite number >= 0, got nan"),
        (["--model_name_or_path", "{tmp}/no-model-type"], "config.json has no model_type"),
    ],
)
def test_eval_bad_input_exits_2_with_one_line_before_any_model(
    capsys, monkeypatch, tmp_path, no_model_loading, argv, message
):
    _bad_input_files(tmp_path)
    argv = [arg.replace("{tmp}", str(tmp_path)) for arg in argv]
    base = ["--dataset_name", "chain_sum"]  # and a model, where the case gives none (an option is given once)
    base += [] if "--model_name_or_path" in argv else ["--model_name_or_path", str(tmp_path / "context-2048")]
    _refused_before_any_model(capsys, monkeypatch, ["eval", *base, *argv], message)


@pytest.mark.parametrize(
    "argv",
    [
        ["--credit_method", "eapo"],
        ["--credit-method", "eapo"],
        ["--credit_method=eapo"],
        ["--method", "eapo", "--credit_method", "eapo"],
        ["--config", "{yaml}"],  # `credit_method: eapo` in the YAML
    ],
)
def test_credit_method_is_another_name_for_method(tmp_path, argv):
    argv = [arg.replace("{yaml}", _yaml(tmp_path, credit_method="eapo")) for arg in argv]
    script_args, training_args, _, _ = parse_arguments(argv)
    assert script_args.method == training_args.credit_method == "eapo"
    assert [step.method.name for step in training_args.credit_stack] == ["eapo"]
    assert "eapo_kappa" in training_args.credit_hyperparameters()


def test_grpo_help_says_what_credit_method_is(capsys):
    with pytest.raises(SystemExit):
        cli_main(["grpo", "--method", "eapo", "--help"])
    flat = "".join(capsys.readouterr().out.split("options:", 1)[1].split())  # argparse wraps, also at hyphens
    shown = flat.split("--credit-methodCREDIT_METHOD", 1)[1]
    assert shown.startswith("Anothernamefor--method(theconfigfielditsets);givingbothwithdifferentvaluesisanerror.")
    assert shown.split("(default:", 1)[1].startswith("eapo)")


@pytest.mark.parametrize("given", [["--output_dir", "trainer_output"], ["--config", "{yaml}"]])
def test_an_output_dir_given_is_obeyed_even_when_it_is_trls_default(tmp_path, given):
    argv = [arg.replace("{yaml}", _yaml(tmp_path, output_dir="trainer_output")) for arg in given]
    assert parse_arguments(argv)[1].output_dir == "trainer_output"
    assert parse_arguments([])[1].output_dir == "outputs/smollm2-135m-instruct-grpo"  # not given: one per run


def test_reward_funcs_as_one_yaml_string_is_that_one_function(tmp_path):
    script_args, _, _, _ = parse_arguments(["--config", _yaml(tmp_path, reward_funcs="format")])
    assert script_args.reward_funcs == ["format"]


def test_loss_types_are_those_trl_documents():
    """`LOSS_TYPES` is the list in the installed TRL's own help for `loss_type` (its one statement of them)."""
    import dataclasses
    import re

    from trl import GRPOConfig

    from trl_credit.trainer.trl_compat import LOSS_TYPES

    [loss_type] = [f for f in dataclasses.fields(GRPOConfig) if f.name == "loss_type"]
    supported = loss_type.metadata["help"].split("Supported values are ", 1)[1].split(". ", 1)[0]
    assert tuple(re.findall(r"'(\w+)'", supported)) == LOSS_TYPES


@pytest.mark.parametrize(
    "field,value,words",
    [
        ("loss_type", "foo", "must be one of grpo, "),
        ("scale_rewards", "foo", "must be one of group, batch, none"),
        ("temperature", 0.0, "is 0.0, which transformers' TemperatureLogitsWarper refuses"),
        ("repetition_penalty", 0.0, "is 0.0, which transformers' RepetitionPenaltyLogitsProcessor refuses"),
        ("learning_rate", float("nan"), "must be a finite number, got nan"),
        ("weight_decay", float("nan"), "must be a finite number, got nan"),
        ("weight_decay", -1.0, "is -1.0, which the optimizer of optim 'adamw_torch_fused' refuses"),
        ("adam_beta1", 1.0, "is 1.0, which the optimizer of optim 'adamw_torch_fused' refuses: Invalid beta"),
        ("beta", -1.0, "must be a finite number >= 0"),
        ("top_k", -1, "is -1, which transformers' TopKLogitsWarper refuses"),
        ("report_to", "wandb", "is ['wandb'], which transformers' WandbCallback refuses"),
        ("push_to_hub", True, "is on, but the Hugging Face Hub is offline"),
        ("vllm_mode", "foo", "must be one of server, colocate"),
    ],
)
def test_owner_checks_apply_to_python_configs(monkeypatch, field, value, words):
    """A config built in Python (a notebook) is checked as the command line is, when it is built."""
    import huggingface_hub.constants

    from trl_credit import CreditGRPOConfig

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    if field == "report_to" and importlib.util.find_spec("wandb") is not None:
        pytest.fail("wandb is installed: the case needs an integration that is not")
    with pytest.raises(ValueError, match=rf"^{field} {re.escape(words)}"):
        CreditGRPOConfig(**{"output_dir": "unused", "use_cpu": True, "bf16": False, "report_to": "none", field: value})


def _recipe_text(name: str) -> str:
    return recipes().joinpath(f"{name}.yaml").read_text()


def _named_extras(recipe: str) -> set[str]:
    """The extras a recipe's comments name (`# Needs: pip install 'trl-credit[vllm,tensorboard]'`)."""
    found = re.findall(r"trl-credit\[([\w,]+)\]", _recipe_text(recipe))
    return {extra for extras in found for extra in extras.split(",")}


def _extras() -> dict[str, list[str]]:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project["optional-dependencies"]


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_names_the_extras_it_needs(recipe):
    """What a recipe switches on, it names the extra of: vLLM, PEFT, DeepSpeed and its reporting integrations."""
    config, named, extras = yaml.safe_load(_recipe_text(recipe)), _named_extras(recipe), _extras()
    assert named <= set(extras), f"{recipe} names {sorted(named - set(extras))}, which pyproject.toml lacks"
    report_to = config.get("report_to", "none")
    needed = set([report_to] if isinstance(report_to, str) else report_to) - {"none"}
    needed |= {"vllm"} if config.get("use_vllm") else set()
    needed |= {"peft"} if config.get("use_peft") else set()
    needed |= {"deepspeed"} if str(config.get("accelerate_config", "")).startswith("zero") else set()
    installed_by_named = {re.split(r"[<>=\[ ]", req)[0] for extra in named for req in extras[extra]}
    assert needed <= installed_by_named, f"{recipe} needs {sorted(needed - installed_by_named)}: name the extra"


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_parses_into_the_config_classes(recipe):
    """Each packaged recipe, by its packaged name."""
    # GPU recipes ask for bf16, which TrainingArguments refuses on a CPU-only machine: override just that.
    argv = ["--config", recipe, "--bf16", "false", "--use_cpu", "true"]
    missing = [extra for extra in sorted(_named_extras(recipe)) if extra == "tensorboard" and not _importable(extra)]
    if missing:  # refused before load, saying which extra installs it; then everything else parses
        with pytest.raises(UsageError, match=re.escape(f"(pip install 'trl-credit[{missing[0]}]')")):
            parse_arguments(argv)
        argv += ["--report_to", "none"]
    script_args, training_args, model_args, _ = parse_arguments(argv)
    config = yaml.safe_load(_recipe_text(recipe))
    assert training_args.credit_method == script_args.method == config.get("method", "grpo")
    for key in config:  # a method's hyperparameter reaches credit_kwargs, with the value the recipe gives
        parsed = [getattr(args, key) for args in (script_args, training_args, model_args) if hasattr(args, key)]
        if key in (training_args.credit_kwargs or {}):
            assert training_args.credit_kwargs[key] == config[key], f"{recipe}: {key}"
        else:
            assert parsed, f"{recipe}: {key} did not reach any argument class"
    if script_args.accelerate_config:
        assert script_args.accelerate_config in yaml_names(accelerate_configs())


def _importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


@pytest.mark.parametrize("given", ["none", "None", ""])
def test_accelerate_config_none_keeps_a_recipe_in_one_process(given):
    recipe = "taco_qwen3_1.7b_base"  # names `accelerate_config: zero2`
    argv = ["--config", recipe, "--bf16", "false", "--use_cpu", "true", "--report_to", "none"]
    assert parse_arguments(argv)[0].accelerate_config == "zero2"
    assert parse_arguments([*argv, "--accelerate_config", given])[0].accelerate_config is None


def test_the_launcher_checks_the_generation_batch_of_the_processes_it_launches(monkeypatch, tmp_path):
    """TRL derives the generation batch from the world size: with an accelerate config of two processes, 6 rows a
    process make a batch of 12, three whole groups of 4, as `accelerate launch trl grpo` would train it; alone, 6 rows
    hold a partial group. A launched process checks its own world (here: one process)."""
    two_processes = yaml.safe_load(accelerate_configs().joinpath("multi_gpu.yaml").read_text())
    two_processes.update(num_processes=2, use_cpu=True, mixed_precision="no")
    (tmp_path / "two.yaml").write_text(yaml.safe_dump(two_processes))
    argv = ["--num_generations", "4", "--use_cpu", "true", "--bf16", "false", "--output_dir", str(tmp_path / "run")]
    launching = [*argv, "--accelerate_config", str(tmp_path / "two.yaml")]

    training_args = parse_arguments([*launching, "--per_device_train_batch_size", "6"])[1]
    assert (training_args.generation_batch_size, training_args.steps_per_generation) == (12, 1)
    with pytest.raises(UsageError) as refused:
        parse_arguments([*launching, "--per_device_train_batch_size", "5"])
    assert "x 2 processes = 10 completions) must hold whole groups" in str(refused.value)
    for alone in (argv, launching):
        if alone is launching:
            monkeypatch.setenv(LAUNCHED_ENV, "1")
        with pytest.raises(UsageError) as refused:
            parse_arguments([*alone, "--per_device_train_batch_size", "6"])
        assert "x 1 processes = 6 completions) must hold whole groups" in str(refused.value)


def test_an_accelerate_config_without_a_process_count_is_refused_before_launching(tmp_path):
    unset = yaml.safe_load(accelerate_configs().joinpath("multi_gpu.yaml").read_text())
    del unset["num_processes"]  # accelerate reads -1: `accelerate launch` would want `--num_processes`
    (tmp_path / "unset.yaml").write_text(yaml.safe_dump(unset))
    with pytest.raises(UsageError) as refused:
        parse_arguments(["--accelerate_config", str(tmp_path / "unset.yaml"), "--output_dir", str(tmp_path / "run")])
    assert str(refused.value) == (
        f"--accelerate_config {tmp_path / 'unset.yaml'}: num_processes is -1: set it in the file to the number of "
        "processes to launch in all (accelerate reads it from there)"
    )


def test_dry_run_checks_a_packaged_recipe_and_its_accelerate_config_and_loads_nothing(
    capsys, monkeypatch, tmp_path, no_model_loading
):
    """`--config NAME` reads the packaged recipe; `--dry_run` names the packaged accelerate config the recipe would
    launch with, and neither loads data nor launches nor writes anything."""
    import trl_credit.cli.grpo as grpo
    import trl_credit.cli.grpo_launch as grpo_launch

    def refuse(*args, **kwargs):
        raise AssertionError("a dry run went past the checks")

    monkeypatch.setattr(grpo, "load_training_data", refuse)
    monkeypatch.setattr(grpo_launch.subprocess, "Popen", refuse)
    monkeypatch.chdir(tmp_path)
    cpu = ["--bf16", "false", "--use_cpu", "true", "--report_to", "none"]
    assert cli_main(["grpo", "--config", "taco_qwen3_1.7b_base", "--dry_run", *cpu]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "trl-credit grpo: dry run: taco on dapo-math-17k, model Qwen/Qwen3-1.7B-Base, output outputs/taco-qwen3-1.7b-base",
        # zero2.yaml's 8 processes, 16 rows a micro-batch each, 4 micro-batches a generation (the recipe's)
        f"trl-credit grpo: would launch 8 processes through accelerate with zero2 "
        f"({accelerate_configs().joinpath('zero2.yaml')}), a generation batch of 512 completions",
    ]
    assert list(tmp_path.iterdir()) == []


def test_an_accelerate_launch_gets_the_packaged_config_file_and_the_recipe_as_given(monkeypatch, tmp_path):
    """The launcher opens the packaged accelerate config as a file; the workers get the command line as given, so they
    read the same packaged recipe by its name."""
    import trl_credit.cli.grpo_launch as grpo_launch

    launched = []

    class Launch:  # the launcher's process: it reads the config file while it exists, and ends at once
        def __init__(self, command, env):
            config_file = command[command.index("--config_file") + 1]
            launched.append((Path(config_file).read_text(), command[command.index("trl_credit.cli.grpo") + 1 :], env))

        def wait(self):
            return 0

    monkeypatch.setattr(grpo_launch.subprocess, "Popen", Launch)
    argv = ["--config", QUICK_START, "--accelerate_config", "zero3", "--output_dir", str(tmp_path / "run")]
    assert cli_main(["grpo", *argv]) == 0
    ((config_text, worker_argv, env),) = launched
    assert config_text == accelerate_configs().joinpath("zero3.yaml").read_text()
    assert worker_argv == argv and env["TRL_CREDIT_LAUNCHED"] == "1"


def test_flags_override_yaml_defaults():
    _, training_args, _, _ = parse_arguments(["--method", "taco", "--learning_rate", "3e-4", "--taco_alpha", "0.05"])
    assert training_args.learning_rate == 3e-4 and training_args.credit_hyperparameters()["taco_alpha"] == 0.05
    assert training_args.max_completion_length == 48  # from the packaged quickstart recipe


def test_a_stack_method_options_reach_credit_kwargs_from_yaml_and_flags(tmp_path):
    recipe = _yaml(tmp_path, method="eapo+stapo", stapo_entropy_quantile=0.3)
    _, training_args, _, _ = parse_arguments(["--config", recipe, "--stapo-prob-threshold", "0.01"])
    stapo = training_args.credit_hyperparameters()
    assert stapo["stapo_entropy_quantile"] == 0.3 and stapo["stapo_prob_threshold"] == 0.01
    assert stapo["stapo_only_positive_advantage"] is True  # not given: the default
    _, training_args, _, _ = parse_arguments(["--method", "eapo+stapo", "--no_stapo_only_positive_advantage"])
    assert training_args.credit_hyperparameters()["stapo_only_positive_advantage"] is False


@pytest.mark.parametrize("method", ["taco", "eapo+taco"])
@pytest.mark.parametrize(
    "how",
    [
        ["--taco_alpha", "0.05"],
        ["--taco-alpha", "0.05"],
        ["--taco-alpha=5e-2"],
        ["--credit_kwargs", '{"taco_alpha": 0.05}'],
        ["--credit_kwargs", '{"taco_alpha": "5e-2"}'],
        ["--config", "{yaml}"],
    ],
)
def test_every_way_in_sets_the_value_that_trains_and_is_recorded(tmp_path, method, how):
    """Flags in both spellings, credit_kwargs and YAML (where `5e-2` is a string) reach the method, single or
    stacked, as the declared type; the record (the hyperparameters and `to_dict()`) holds it."""
    argv = [arg.replace("{yaml}", _yaml(tmp_path, taco_alpha="5e-2")) for arg in how]
    _, training_args, _, _ = parse_arguments(["--method", method, *argv])
    [taco] = [step for step in training_args.credit_stack if step.method.name == "taco"]
    trained = taco.hyperparameters["taco_alpha"]
    assert trained == 0.05 and type(trained) is float
    record = training_args.to_dict()
    assert record.get("taco_alpha", (record["credit_kwargs"] or {}).get("taco_alpha")) == 0.05
    assert training_args.credit_hyperparameters()["taco_alpha"] == 0.05


def test_reward_summary_is_honest():
    history = [{"reward": r} for r in (0.1, 0.2, 0.1, 0.5, 0.6, 0.4)]
    assert reward_summary(history).startswith("reward improved: mean 0.150")
    assert reward_summary(list(reversed(history))).startswith("reward did not improve")


def test_grpo_runs_in_process_from_a_yaml_recipe(tmp_path, tiny_model_dir, process_group_of_one):
    data, output_dir = tmp_path / "problems.jsonl", tmp_path / "run"  # where `tiny_recipe` puts them
    recipe = tiny_recipe(
        tmp_path,
        tiny_model_dir,
        method="taco",
        reward_funcs=["accuracy", "format"],
        max_steps=2,
        log_token_credit=True,
    )
    assert cli_main(["grpo", "--config", str(recipe), "--taco_lambda", "0.5"]) == 0
    # The run ends its process group, as `trl grpo` does (`Trainer.end`): no gloo thread outlives it into interpreter
    # shutdown.
    assert not torch.distributed.is_initialized()
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


def test_grpo_help_lists_config_and_the_quick_start_defaults_that_apply_without_it(capsys):
    with pytest.raises(SystemExit):
        cli_main(["grpo", "--method", "taco", "--help"])
    flat = "".join(capsys.readouterr().out.split("options:", 1)[1].split())  # past the usage line
    quick_start = yaml.safe_load(recipes().joinpath(f"{QUICK_START}.yaml").read_text())
    assert "--configCONFIG" in flat
    for key in ("max_completion_length", "learning_rate", "max_steps", "per_device_train_batch_size"):
        shown_default = flat.split(f"--{key}", 1)[1].split("(default:", 1)[1].split(")", 1)[0]
        assert shown_default == str(quick_start[key])


def test_grpo_help_lists_the_stack_options_first_and_no_method_that_was_not_given(capsys):
    with pytest.raises(SystemExit):
        cli_main(["grpo", "--method", "eapo+taco", "--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: trl-credit grpo --method eapo+taco [--config CONFIG] [OPTIONS]\n\n")
    first = out.split("\n\n")[1]
    assert first.startswith("options of eapo+taco:\n") and "--taco_alpha" in first and "--eapo_kappa" in first
    assert "--learning_rate" not in first and "--learning_rate" in out
    with pytest.raises(SystemExit):
        cli_main(["grpo", "--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: trl-credit grpo [--method METHOD] [--config CONFIG] [OPTIONS]\n\noptions:\n")


def test_every_missing_reporting_integration_is_one_line_and_no_traceback_even_at_exit():
    """`--report_to NAME` for each integration transformers knows, in one interpreter: a missing package is one line
    naming --report_to, exit 2, and nothing more is printed, also when the interpreter exits (a refused
    `MLflowCallback` used to print a traceback from its `__del__` then)."""
    from transformers.integrations.integration_utils import (
        INTEGRATION_TO_CALLBACK,
        get_available_reporting_integrations,
    )

    code = (
        "import sys\nfrom trl_credit.cli import main\n"
        "for name in sys.argv[1:]:\n"
        "    status = main(['grpo', '--report_to', name, '--model_name_or_path', '/no/such/model'])\n"
        "    print(f'== {name} {status}', file=sys.stderr, flush=True)\n"
    )
    names = list(INTEGRATION_TO_CALLBACK)
    result = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, check=False)
    assert result.returncode == 0 and result.stdout == "", result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if not line.startswith("[transformers] ")]
    assert len(lines) == 2 * len(names), result.stderr[-3000:]  # one line and the status, then nothing at exit
    available = get_available_reporting_integrations()
    for name, (message, status) in zip(names, zip(lines[::2], lines[1::2])):
        assert status == f"== {name} 2" and message.startswith("trl-credit grpo: error: ")
        if name not in available:
            assert message.startswith(f"trl-credit grpo: error: --report_to is ['{name}'], which transformers' ")


def test_compare_refuses_a_method_its_runs_would_refuse_before_planning(capsys, monkeypatch, no_model_loading):
    import trl_credit.experiments.lab.trainer  # noqa: F401  (registers the lab's `oracle`, which grpo cannot train)
    from trl_credit.methods import CREDIT_METHODS

    assert "oracle" in CREDIT_METHODS
    _refused_before_any_model(
        capsys,
        monkeypatch,
        ["compare", "--methods", "oracle", "--seeds", "0", "--dry_run"],
        "the oracle runs would fail",
    )
    assert cli_main(["compare", "--methods", "grpo", "no_such_method", "--seeds", "0", "--dry_run"]) == 2
    err = capsys.readouterr().err
    assert "unknown credit method 'no_such_method'; trainable: grpo, " in err and "oracle" not in err


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--seeds", "0", "--seeds", "1"], "--seeds is given 2 times (0, 1): give it once, with all its values"),
        (["--seeds", "0", "--max_steps", "3", "--max-steps=5"], "--max_steps is given 2 times (3, 5)"),  # passed on
    ],
)
def test_compare_refuses_an_option_given_twice(capsys, monkeypatch, no_model_loading, argv, message):
    """argparse keeps the last value of a repeated option: `--seeds 0 --seeds 1` would plan seed 1 alone."""
    _refused_before_any_model(capsys, monkeypatch, ["compare", "--methods", "grpo", *argv, "--dry_run"], message)


def test_compare_and_lab_read_negative_numbers_as_values_and_lab_checks_its_threshold(
    capsys, monkeypatch, no_model_loading
):
    argv = ["compare", "--methods", "grpo", "--seeds", "0", "--dry_run", "--learning_rate", "-1e-5"]
    _refused_before_any_model(capsys, monkeypatch, argv, "the grpo runs would fail: --learning_rate is -1e-05, which")
    _refused_before_any_model(capsys, monkeypatch, ["lab", "--solved_threshold", "5"], "solved_threshold must be in")


def test_grpo_cli_trains_a_documented_stack_exactly(monkeypatch, tmp_path, tiny_model_dir):
    """`trl-credit grpo --method ar_lopti+taco+stapo+clip_cov` (the longest stack docs/baselines.md names) with each
    method's moving settings as flags and a reward that varies within groups: the advantages and loss mask TRL's loss
    consumed are the reference rules' (`AdvantageRecorder` on the trainer the command builds), and credit moved. The
    other stacks and methods take the same way from the command line to the trainer (`test_engines.py` trains each)."""
    from trl_credit import CreditGRPOTrainer

    method = "ar_lopti+taco+stapo+clip_cov"
    assert method in DOCUMENTED_STACKS
    recorders, original_init = [], CreditGRPOTrainer.__init__

    def recorded_init(trainer, *args, **kwargs):
        original_init(trainer, *args, **kwargs)
        recorders.append(AdvantageRecorder(monkeypatch, trainer))

    monkeypatch.setattr(CreditGRPOTrainer, "__init__", recorded_init)
    reward = ["real_vllm.helpers:text_length_reward"]  # characters, not words: it varies on the tiny model's text
    recipe = tiny_recipe(tmp_path, tiny_model_dir, max_steps=2, reward_funcs=reward)
    flags = [f"--{name}={value}" for name, value in moving_settings(method).items()]
    assert cli_main(["grpo", "--config", str(recipe), "--method", method, *flags]) == 0
    [recorder] = recorders
    assert recorder.checked_batches == 2
    recorder.assert_credit_moved()


# ------------------------------------------------------------------------------------- no output over an input


LAB_GRID = ["--methods", "grpo", "--tasks", "rare", "--seeds", "0", "--max_steps", "1"]


def _folders_of_every_command(tmp_path) -> None:
    """A training run with token credit and card plots, another run, and the folders of eval, lab and compare."""
    for run in ("run", "other"):
        write_fake_trainer_state(tmp_path / run / "trainer_state.json")
        (tmp_path / run / "plots").mkdir()
        (tmp_path / run / "plots" / "reward.png").write_bytes(b"the card's plot")
    records = fake_token_credit_records()
    (tmp_path / "run" / "token_credit.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    for folder, names in {
        "evaluation": ("completions.jsonl", "summary.json"),
        "lab": ("results.json", "summary.json", "report.md"),
        "comparison": ("report.md", "report.html"),
    }.items():
        (tmp_path / folder).mkdir()
        for name in names:
            (tmp_path / folder / name).write_text(f"{folder}'s {name}")


@pytest.mark.parametrize(
    "argv,message",
    [
        (
            ["inspect", "{tmp}/run", "--output", "{tmp}/run/token_credit.jsonl"],
            "is a file this command reads: writing an HTML page there",
        ),
        (
            ["inspect", "{tmp}/run", "--png", "{tmp}/run/token_credit.jsonl"],
            "is a file this command reads: writing a PNG image there",
        ),
        (["inspect", "{tmp}/run", "--output", "{tmp}/run/trainer_state.json"], "exists and is not an HTML page"),
        (["inspect", "{tmp}/run", "--png", "{tmp}/run/trainer_state.json"], "exists and is not a PNG image"),
        (["plot", "{tmp}/run", "--compare", "{tmp}/other"], "--output {tmp}/run/plots holds the plots of"),
        (["plot", "{tmp}/run", "--output", "{tmp}/other/plots"], "holds the plots of {tmp}/other's model card"),
        (
            ["eval", "--model_name_or_path", "m", "--dataset_name", "chain_sum", "--output_dir", "{tmp}/lab"],
            "--output_dir {tmp}/lab holds trl-credit lab's summary.json, which trl-credit eval would replace",
        ),
        # Small grids, so that a command that does not refuse ends soon.
        (["lab", *LAB_GRID, "--output_dir", "{tmp}/evaluation"], "holds trl-credit eval's summary.json, which trl-cr"),
        (["lab", *LAB_GRID, "--output_dir", "{tmp}/comparison"], "holds trl-credit compare's report.md, which trl-c"),
        (
            ["compare", "--methods", "grpo", "--seeds", "0", "--dry_run", "--skip_eval", "--output_dir", "{tmp}/lab"],
            "holds trl-credit lab's report.md, which trl-credit compare would replace",
        ),
    ],
)
def test_no_command_writes_over_a_file_it_reads_or_another_commands_files(tmp_path, capsys, argv, message):
    _folders_of_every_command(tmp_path)
    before = folder_files(tmp_path)
    argv = [arg.replace("{tmp}", str(tmp_path)) for arg in argv]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"trl-credit {argv[0]}: error: ")
    assert message.replace("{tmp}", str(tmp_path)) in err[0]
    assert folder_files(tmp_path) == before
