"""What `trl-credit grpo` checks of a parsed command line that the configs alone cannot: the output folder on this file
system, evaluation (which the command has no data for), the LoRA settings, asked of PEFT, and whether its trainer can
train the method."""

from __future__ import annotations

import os
import tempfile

from . import UsageError

# Words of PEFT's refusals -> the `ModelConfig` flag of the setting they name (`trl.get_peft_config` maps them).
LORA_FLAGS = {
    "`r`": "lora_r",
    "dropout": "lora_dropout",
    "alpha": "lora_alpha",
    "rslora": "use_rslora",
    "dora": "use_dora",
}


def check_writable(folder: str, shown: str) -> None:
    """Refuse an output folder that is a file, whose name is longer than the file system allows, or that cannot be
    created or written in (tried with a temporary file in the folder, or in its closest existing parent, since
    permissions alone do not say what root or a read-only file system allows)."""
    existing = os.path.abspath(folder)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise UsageError(f"{shown} {folder}: {existing} is a file, not a folder")
    try:
        longest = os.pathconf(existing, "PC_NAME_MAX")
    except (OSError, ValueError):  # a file system that does not say
        longest = 255
    too_long = [name for name in os.path.abspath(folder).split(os.sep) if len(name.encode()) > longest]
    if too_long:
        raise UsageError(
            f"{shown}: the folder name {too_long[0][:40]}... is {len(too_long[0].encode())} bytes long, and the file "
            f"system of {existing} allows at most {longest}"
        )
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as error:
        raise UsageError(f"{shown} {folder}: cannot write in {existing} ({error.strerror})") from None


def check_no_evaluation(training_args, sources) -> None:
    """The command trains on one data set and takes no evaluation data, so evaluation during training would fail after
    the model has loaded (transformers wants an `eval_dataset`)."""
    strategy = str(getattr(training_args.eval_strategy, "value", training_args.eval_strategy))
    for name, value, on in (
        ("eval_strategy", strategy, strategy != "no"),
        ("eval_on_start", training_args.eval_on_start, training_args.eval_on_start),
    ):
        if on:
            raise UsageError(
                f"{sources.describe(name)} {value}: trl-credit grpo takes no evaluation data set, so it cannot evaluate "
                "during training; leave eval_strategy 'no' and evaluate the saved model with `trl-credit eval`"
            )


def check_lora(model_args, sources) -> None:
    """With `use_peft`: the `LoraConfig` TRL builds from the flags, and one LoRA layer built from it by PEFT, whose own
    checks (a rank >= 1, a dropout in [0, 1]) run otherwise only when it wraps the loaded model."""
    if not model_args.use_peft:
        return
    from trl import get_peft_config

    from ..trainer.construction import check_peft_config

    try:
        check_peft_config(get_peft_config(model_args))
    except (ValueError, ImportError) as error:
        words = str(error).split(": PEFT's LoRA layer refuses it: ")[-1]
        named = [flag for phrase, flag in LORA_FLAGS.items() if phrase in words.lower()]
        if named:
            raise UsageError(
                f"{sources.describe(named[0])} {getattr(model_args, named[0])!r}: PEFT refuses it: {words}"
            ) from None
        raise UsageError(f"{sources.describe('use_peft')} true: {words}") from None


def check_trainable(method: str, training_args) -> None:
    """Refuse a method whose statistics the trainer does not compute (one registered for another trainer, as the
    lab's `oracle`): its trainer would refuse it only once the model has loaded."""
    from ..trainer import trainer_pair
    from ..trainer.pairs import missing_statistics

    trainer_class = trainer_pair(method)[1]
    for name, missing in missing_statistics(trainer_class, training_args).items():
        raise UsageError(
            f"--method {method}: {name} reads {', '.join(missing)}, which {trainer_class.__name__} (the trainer of "
            "trl-credit grpo) does not compute; it trains only with the trainer that registered it"
        )
