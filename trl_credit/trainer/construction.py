"""What `CreditGRPOTrainer` checks of its arguments before TRL loads the model, and what it keeps quiet while TRL builds.

TRL's `GRPOTrainer.__init__` loads the model first and meets most of its other arguments only afterwards, or only
inside a training step: a data set without a `prompt` column (a `KeyError` in the first step), `eval_strategy`
without evaluation data (transformers' `ValueError` after the load), a reward function that cannot take TRL's
arguments (a `TypeError` in the first step), LoRA settings PEFT refuses (when it wraps the loaded model). Each is
checked here first, by its owner where there is one (PEFT builds one LoRA layer; `inspect` binds TRL's arguments to the
reward function's signature), and refused with a `ValueError` naming the argument.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from contextlib import contextmanager

import torch

# The keywords TRL 1.15 and 1.16 call a reward function with (`GRPOTrainer._calculate_rewards`), besides one per
# column of the data set other than `prompt` (`environments` too when the trainer has an `environment_factory`).
REWARD_KEYWORDS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric")
_NOT_PASSED_COLUMNS = ("prompt", "completion", "completion_ids")


def check_trainer_inputs(args, reward_funcs, pos_args: tuple, kwargs: dict) -> None:
    """Every check of this module, for the arguments `GRPOTrainer.__init__` is given after `model, reward_funcs, args`
    (`pos_args`, `kwargs`); `ValueError` naming the first refused one."""
    from trl import GRPOTrainer

    try:
        given = inspect.signature(GRPOTrainer.__init__).bind(None, None, reward_funcs, args, *pos_args, **kwargs)
    except TypeError:  # arguments GRPOTrainer does not take: it says so itself
        return
    given = given.arguments
    eval_dataset, peft_config = given.get("eval_dataset"), given.get("peft_config")
    columns = getattr(given.get("train_dataset"), "column_names", None)  # None: an iterable data set, or none
    if columns is not None and "prompt" not in columns:
        raise ValueError(
            f"train_dataset has no 'prompt' column, which GRPOTrainer samples completions for; its columns are "
            f"{columns}: rename the column that holds the prompts to 'prompt'"
        )
    if eval_dataset is None and (args.eval_strategy != "no" or args.eval_on_start):
        shown = f"eval_strategy {str(getattr(args.eval_strategy, 'value', args.eval_strategy))!r}"
        raise ValueError(
            f"{shown if args.eval_strategy != 'no' else 'eval_on_start'} evaluates on eval_dataset, which was not "
            "given: pass eval_dataset, or set eval_strategy 'no' and eval_on_start False"
        )
    check_reward_functions(reward_funcs, columns or [], given.get("environment_factory") is not None)
    if peft_config is not None:
        check_peft_config(peft_config)


def check_reward_functions(reward_funcs, columns, environments: bool = False) -> None:
    """Each reward function that is a Python callable accepts the keywords TRL calls it with (`REWARD_KEYWORDS` and
    the data set's `columns`), as `inspect` binds them to its signature; `ValueError` naming the function."""
    names = [*REWARD_KEYWORDS, *(c for c in columns if c not in _NOT_PASSED_COLUMNS)]
    names += ["environments"] if environments else []
    for func in reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]:
        if isinstance(func, (str, torch.nn.Module)) or not callable(func):  # reward models: TRL loads and calls them
            continue
        try:
            signature = inspect.signature(func)
        except (TypeError, ValueError):  # a builtin without a signature: nothing to ask
            continue
        try:
            signature.bind(**dict.fromkeys(names))
        except TypeError as error:
            shown = f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', type(func).__qualname__)}"
            raise ValueError(
                f"reward function {shown} cannot take the arguments TRL calls it with ({error}): TRL calls "
                f"f({', '.join(f'{name}=...' for name in names)}); declare **kwargs for those it does not read"
            ) from None


LORA_LAYER_SETTINGS = ("r", "lora_alpha", "lora_dropout", "use_rslora", "use_dora")  # what one LoRA layer reads


def check_peft_config(peft_config) -> None:
    """PEFT's own checks of a LoRA config's layer settings (rank, dropout, DoRA, rsLoRA), which it runs only when it
    wraps the loaded model: one LoRA layer is built on a 2 x 2 linear layer. Other PEFT configs are left to PEFT."""
    from peft import LoraConfig, inject_adapter_in_model

    if not isinstance(peft_config, LoraConfig):
        return
    probe = dataclasses.replace(
        peft_config, target_modules=["probe"], modules_to_save=None, layers_to_transform=None, layers_pattern=None
    )
    try:
        inject_adapter_in_model(probe, torch.nn.ModuleDict({"probe": torch.nn.Linear(2, 2)}))
    except ValueError as error:
        settings = ", ".join(f"{name}={getattr(peft_config, name)!r}" for name in LORA_LAYER_SETTINGS)
        raise ValueError(f"peft_config LoraConfig({settings}): PEFT's LoRA layer refuses it: {error}") from None


DEEPSPEED_CPU_GUESS = "Setting accelerator to CPU"


@contextmanager
def deepspeed_cpu_guess_hidden(args):
    """DeepSpeed, which accelerate imports whenever it is installed (TRL's trainer asks it whether the model is a PEFT
    model), logs "Setting accelerator to CPU. If you have GPU ..." on a machine where it finds no accelerator. A run on
    the CPU knows that: while the trainer is built, the message is filtered from DeepSpeed's logger, and the filter is
    removed afterwards (nothing else of DeepSpeed's logging changes)."""
    if not (args.use_cpu or not torch.cuda.is_available()):
        yield
        return
    deepspeed_logger = logging.getLogger("DeepSpeed")  # the logger DeepSpeed creates by that name when imported

    def not_the_guess(record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(DEEPSPEED_CPU_GUESS)

    deepspeed_logger.addFilter(not_the_guess)
    try:
        yield
    finally:
        deepspeed_logger.removeFilter(not_the_guess)
