"""`CreditGRPOTrainer` from Python refuses, before TRL loads the model, what TRL would fail on only after it (a data set
without `prompt`, `eval_strategy` without evaluation data, a reward function that cannot take TRL's arguments, LoRA
settings PEFT refuses), and does not print DeepSpeed's accelerator guess on a CPU run."""

import os
import re
import subprocess
import sys

import pytest
from conftest import length_reward, tiny_config, tiny_prompt_dataset

from trl_credit import CreditGRPOTrainer

# A model that cannot be loaded: a refusal that names the argument proves it came before the load.
UNLOADABLE = "/no/such/model/folder"


def _refused(match: str, **given) -> None:
    arguments = {"reward_funcs": length_reward, "train_dataset": tiny_prompt_dataset(), **given}
    args = arguments.pop("args", None) or tiny_config("taco", "unused")
    with pytest.raises(ValueError, match=match):
        CreditGRPOTrainer(model=UNLOADABLE, args=args, **arguments)


def test_a_data_set_without_a_prompt_column_is_refused_naming_its_columns():
    renamed = tiny_prompt_dataset().rename_column("prompt", "question")
    _refused(
        r"train_dataset has no 'prompt' column, .* its columns are \['question', 'solution'\]", train_dataset=renamed
    )


@pytest.mark.parametrize("setting", [{"eval_strategy": "steps", "eval_steps": 1}, {"eval_on_start": True}])
def test_evaluation_without_evaluation_data_is_refused(setting):
    args = tiny_config("taco", "unused", **setting)
    _refused(r"evaluates on eval_dataset, which was not given", args=args)


def _no_arguments():
    return [1.0]


def _named_only(completions, solution):  # TRL also passes prompts, completion_ids, trainer_state, ...
    return [1.0] * len(completions)


def _reads_what_it_needs(completions, solution, **kwargs):
    return [1.0] * len(completions)


@pytest.mark.parametrize("reward", [os.getcwd, _no_arguments, _named_only])
def test_a_reward_function_that_cannot_take_trls_arguments_is_refused(reward):
    _refused(rf"reward function \S*{reward.__name__} cannot take the arguments TRL calls it with", reward_funcs=reward)


def test_a_reward_function_that_takes_trls_arguments_passes_the_check():
    from trl_credit.trainer.construction import check_reward_functions

    check_reward_functions([_reads_what_it_needs, length_reward, "a/reward-model"], ["prompt", "solution"])


@pytest.mark.parametrize(
    "lora,words",
    [({"r": 0}, "`r` should be a positive integer"), ({"lora_dropout": 2.0}, "dropout probability has to be between")],
)
def test_lora_settings_peft_refuses_are_refused_before_the_model_loads(lora, words):
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(target_modules=["q_proj"], **lora)
    _refused(rf"peft_config LoraConfig\(.*\): PEFT's LoRA layer refuses it: {re.escape(words)}", peft_config=config)


def test_the_python_api_does_not_print_deepspeeds_accelerator_guess(tiny_model_dir):
    """DeepSpeed (imported by accelerate whenever installed) logs 'Setting accelerator to CPU' when TRL's trainer is
    built on a machine without a GPU, unless DS_ACCELERATOR is set: the trainer hides it on a CPU run."""
    pytest.importorskip("deepspeed")
    code = (
        "import sys; sys.path.insert(0, 'tests'); from conftest import tiny_config, tiny_prompt_dataset, length_reward\n"
        "from trl_credit import TACOTrainer\n"
        f"TACOTrainer(model={tiny_model_dir!r}, reward_funcs=length_reward, args=tiny_config('taco', sys.argv[1]), "
        "train_dataset=tiny_prompt_dataset())\n"
        "import logging; print('deepspeed' in sys.modules, logging.getLogger('DeepSpeed').filters)\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "DS_ACCELERATOR"}  # as a user's shell has it
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run(
        [sys.executable, "-c", code, tiny_model_dir + "-run"], capture_output=True, text=True, env=env, cwd=root
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines()[-1] == "True []"  # DeepSpeed was imported; the filter is gone afterwards
    assert "Setting accelerator to CPU" not in result.stdout + result.stderr
