"""`trl-credit grpo`: GRPO training with a token-level credit method, mirroring `trl grpo`.

    trl-credit grpo --method taco                                   # the offline CPU quickstart
    trl-credit grpo --config taco_qwen3_1.7b_base                   # a packaged paper recipe on GPUs
    trl-credit grpo --method eapo --config my.yaml --learning_rate 2e-6 --accelerate_config zero3

The arguments are parsed and checked in `grpo_arguments.py`: YAML values are defaults and flags override them;
`--config` is a file or a packaged recipe by name; without it, the packaged `configs/quickstart.yaml` supplies the
defaults. With `--accelerate_config NAME|PATH` (or `accelerate_config:` in the YAML) the command re-launches this module
through `accelerate launch`. Every argument is checked, and the data set is loaded, before any model is; `--dry_run`
stops after the checks of the arguments.
"""

from __future__ import annotations

import os
import shlex
import sys

from ..command_line import normalise_options
from . import owned_folder
from .grpo_arguments import UsageError, parse_arguments
from .grpo_launch import LAUNCHED_ENV, accelerate_config_file, launch_with_accelerate


class TrainingStopped(Exception):
    """Training stopped at a non-finite step: reported in one line, exit status 1, nothing saved from that state."""


def check_before_loading(training_args, model_args) -> None:
    """What can be checked before any model or data set is loaded: the model reference and vLLM."""
    from ..data.models import check_model_reference, check_vllm_installed

    try:
        check_model_reference(model_args.model_name_or_path)
    except ValueError as error:
        raise UsageError(f"--model_name_or_path: {error}") from error
    if training_args.use_vllm:
        try:
            check_vllm_installed("--use_vllm true")
        except ValueError as error:
            raise UsageError(str(error)) from error
    if training_args.use_cpu:
        cpu_threads()


class TrainingInterrupted(Exception):
    """Ctrl-C during training: reported in one line naming the last checkpoint and the command that resumes it, exit
    status 130 (the shell's for SIGINT)."""


class NothingToTrain(Exception):
    """The checkpoint to resume is at the run's last step: reported in one line, exit status 0, nothing written."""


def check_output_folder(script_args, training_args) -> None:
    """Refuse an `--output_dir` that holds a finished run, unless it is to be overwritten, whether the run starts
    afresh or resumes a checkpoint (its final model, card and state would be replaced either way)."""
    from ..trainer.run_folder import finished_run_files

    found = finished_run_files(training_args.output_dir)
    if not found or script_args.overwrite_output_dir:
        return
    held = f"--output_dir {training_args.output_dir} holds a finished run ({', '.join(found)})"
    if training_args.resume_from_checkpoint is None:
        raise UsageError(
            f"{held}: pass --overwrite_output_dir true to replace it, or continue it in another folder with "
            "--resume_from_checkpoint CHECKPOINT --output_dir OTHER"
        )
    raise UsageError(
        f"{held}, which resuming {training_args.resume_from_checkpoint} would replace: pass another --output_dir "
        "to continue it there, or --overwrite_output_dir true to replace the finished run's model, card and state"
    )


def check_resume(training_args) -> None:
    """A resume continues its own run (`trainer.run_record`): refuse another method stack or hyperparameters, or a
    folder of another run's checkpoints. A checkpoint at `--max_steps` into a folder that holds a finished run is
    `NothingToTrain`; into any other, its model is saved as the run's final one (`train`)."""
    from ..trainer.run_folder import finished_run_files
    from ..trainer.run_record import checkpoint_step, nothing_to_train, resume_refusal

    checkpoint = training_args.resume_from_checkpoint
    if checkpoint is None:
        return
    found = nothing_to_train(checkpoint, checkpoint_step(checkpoint), training_args.max_steps)
    if found and finished_run_files(training_args.output_dir):
        raise NothingToTrain(
            f"{found}; {training_args.output_dir} holds a finished run, left as it is (a larger --max_steps trains on)"
        )
    refusal = resume_refusal(
        checkpoint, training_args, opt_in="--resume_with_other_method true", folder="--output_dir"
    )
    if refusal:
        raise UsageError(f"--resume_from_checkpoint {checkpoint}: {refusal}")


def cpu_threads() -> int:
    """The threads a CPU run uses: `OMP_NUM_THREADS`, else every core (torch reads the variable only at start-up)."""
    value = os.environ.get("OMP_NUM_THREADS") or str(os.cpu_count() or 1)
    if not value.isdigit() or int(value) < 1:
        raise UsageError(f"OMP_NUM_THREADS={value!r} must be a positive integer (threads of a CPU run)")
    return int(value)


def dry_run(script_args, training_args, model_args) -> int:
    """`--dry_run`: the arguments are checked; check the output folder and the accelerate config too, and say what
    would train, and how, without loading or writing anything."""
    check_output_folder(script_args, training_args)
    print(
        f"trl-credit grpo: dry run: {script_args.method} on {script_args.dataset_name}, "
        f"model {model_args.model_name_or_path}, output {training_args.output_dir}"
    )
    if script_args.accelerate_config:
        config_file = accelerate_config_file(script_args.accelerate_config)
        print(
            f"trl-credit grpo: would launch {training_args.world_size} processes through accelerate with "
            f"{script_args.accelerate_config} ({config_file}), a generation batch of "
            f"{training_args.generation_batch_size} completions"
        )
    return 0


def training_dataset(script_args, seed: int):
    """The prompts a run with these script arguments and seed trains on."""
    from ..data import load_math_dataset

    return load_math_dataset(
        script_args.dataset_name,
        script_args.dataset_train_split,
        prompt_column=script_args.prompt_column,
        answer_column=script_args.answer_column,
        system_prompt=script_args.system_prompt,
        num_samples=script_args.max_train_samples,
        seed=seed,
    )


def _check_hub_dataset(source: str) -> None:
    """Fail fast when the data set would come from a Hub that cannot be reached (`datasets` retries for ~30 s)."""
    from huggingface_hub import constants, dataset_info

    from ..data import SOURCES, hub_dataset_id

    spec = SOURCES.get(source)
    repo = spec.location if spec is not None and spec.kind == "hub" else None if spec else hub_dataset_id(source)
    if repo is None or constants.HF_HUB_OFFLINE:  # offline, `datasets` reads its cache without retrying
        return
    try:
        dataset_info(repo, timeout=10)
    except Exception as error:  # noqa: BLE001 - not found, private, no network: the data cannot be fetched
        reason = " ".join(str(error).split())[:200] or type(error).__name__
        raise UsageError(
            f"--dataset_name {source}: cannot fetch {repo} from the Hugging Face Hub ({reason})"
        ) from None


def load_training_data(script_args, training_args):
    _check_hub_dataset(script_args.dataset_name)
    try:
        return training_dataset(script_args, training_args.seed)
    except (ValueError, FileNotFoundError) as error:  # unknown source, bad split, missing column
        raise UsageError(str(error).splitlines()[0]) from error
    except Exception as error:  # noqa: BLE001 - `datasets` reports a Hub id missing from an offline cache so
        reason = " ".join(str(error).split())[:200] or type(error).__name__
        raise UsageError(f"--dataset_name {script_args.dataset_name}: cannot load it ({reason})") from error


def interrupted_at(step: int, training_args, argv: list[str]) -> str:
    """What an interrupted run left: its last checkpoint, and the command that resumes from it (`argv` as given, with
    the checkpoint for `--resume_from_checkpoint`)."""
    from ..trainer.run_safety import last_checkpoint

    checkpoint = last_checkpoint(training_args.output_dir, step) or training_args.resume_from_checkpoint
    if checkpoint is None:
        return (
            f"interrupted after step {step}; no checkpoint was saved (--save_strategy steps --save_steps N saves them)"
        )
    kept, skip = [], False
    for arg in argv:  # the given `--resume_from_checkpoint`, if any, is replaced
        if skip or arg == "--resume_from_checkpoint":
            skip = not skip
            continue
        if not arg.startswith("--resume_from_checkpoint="):
            kept.append(arg)
    command = shlex.join(["trl-credit", "grpo", *kept, "--resume_from_checkpoint", str(checkpoint)])
    return f"interrupted after step {step}; the last checkpoint is {checkpoint}; resume with: {command}"


def reward_summary(log_history: list[dict]) -> str:
    """Mean reward over the first and last third of the logged steps, and whether it went up."""
    rewards = [entry["reward"] for entry in log_history if "reward" in entry]
    if len(rewards) < 2:
        return "reward: not enough logged steps to compare"
    third = max(1, len(rewards) // 3)
    start, end = sum(rewards[:third]) / third, sum(rewards[-third:]) / third
    verdict = "improved" if end > start else "did not improve"
    return (
        f"reward {verdict}: mean {start:.3f} over the first {third} logged steps -> "
        f"{end:.3f} over the last {third} (change {end - start:+.3f}, {len(rewards)} steps)"
    )


def train(script_args, training_args, model_args, argv: list[str]) -> None:
    import torch
    from trl import get_peft_config, get_quantization_config

    from ..data import hub_dataset_id
    from ..data.models import resolve_model_path
    from ..reports.model_card import with_research_card
    from ..rewards import get_reward_funcs
    from ..trainer import trainer_pair
    from ..trainer.construction import check_reward_functions
    from ..trainer.run_record import NothingToTrain as RunNothingToTrain
    from ..trainer.run_safety import NonFiniteTrainingError

    dataset = load_training_data(script_args, training_args)
    try:
        reward_funcs = get_reward_funcs(
            script_args.reward_funcs, max_completion_length=training_args.max_completion_length
        )
        check_reward_functions(reward_funcs, dataset.column_names)  # TRL would call them only after the load
    except ValueError as error:
        raise UsageError(f"--reward_funcs: {error}") from error
    if training_args.use_cpu:
        torch.set_num_threads(cpu_threads())

    model_path = resolve_model_path(model_args.model_name_or_path)
    training_args.model_init_kwargs = {
        "revision": model_args.model_revision,
        "dtype": model_args.dtype,
        "attn_implementation": model_args.attn_implementation,
        **(training_args.model_init_kwargs or {}),
    }
    # The research card, written at the end of training, at each checkpoint and in `push_to_hub`.
    trainer_class = with_research_card(trainer_pair(script_args.method)[1])
    trainer = trainer_class(
        model=model_path,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=dataset,
        quantization_config=get_quantization_config(model_args),
        peft_config=get_peft_config(model_args),
    )
    trainer.accelerator.print(
        f"trl-credit: {script_args.method} on {script_args.dataset_name} ({len(dataset)} prompts), "
        f"model {model_args.model_name_or_path}, output {training_args.output_dir}"
    )
    try:
        trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    except NonFiniteTrainingError as error:  # no final model, card or plots from a non-finite state
        raise TrainingStopped(str(error)) from error
    except RunNothingToTrain as error:  # the checkpoint is the run's last step: its model is the run's final model
        trainer.accelerator.print(f"trl-credit grpo: {error}; saving its model as the run's final model")
    except KeyboardInterrupt:
        raise TrainingInterrupted(interrupted_at(trainer.state.global_step, training_args, argv)) from None
    trainer.save_model(training_args.output_dir)
    trainer.save_state()  # trainer_state.json in the output folder: the curves, whether or not checkpoints were saved
    dataset_name = hub_dataset_id(script_args.dataset_name) or script_args.dataset_name
    trainer.create_model_card(dataset_name=dataset_name)
    trainer.accelerator.print(f"trl-credit: {reward_summary(trainer.state.log_history)}")
    trainer.accelerator.print(f"trl-credit: model, model card and plots saved to {training_args.output_dir}")
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=dataset_name)
    # Finish the trackers and destroy the process group, as `trl grpo` does: a process that exits with its gloo group
    # alive can abort in interpreter shutdown ("terminate called without an active exception", pytorch#190489).
    # `Trainer.end` is transformers >= 5.18's; before it, accelerate's `end_training` is what it calls.
    getattr(trainer, "end", trainer.accelerator.end_training)()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    given = normalise_options(argv)  # as typed, for the command that resumes an interrupted run
    try:
        script_args, training_args, model_args, argv = parse_arguments(argv)
        if script_args.dry_run:
            return dry_run(script_args, training_args, model_args)
        check_before_loading(training_args, model_args)
        check_resume(training_args)
        check_output_folder(script_args, training_args)
        if training_args.use_cpu:  # else DeepSpeed, imported by accelerate whenever installed, announces its guess
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        with owned_folder(training_args.output_dir):
            if script_args.accelerate_config and not os.environ.get(LAUNCHED_ENV):
                return launch_with_accelerate(script_args.accelerate_config, argv, training_args.output_dir)
            train(script_args, training_args, model_args, given)
    except UsageError as error:
        print(f"trl-credit grpo: error: {error}", file=sys.stderr)
        return 2
    except TrainingStopped as error:
        print(f"trl-credit grpo: error: {error}", file=sys.stderr)
        return 1
    except NothingToTrain as error:
        print(f"trl-credit grpo: {error}", file=sys.stderr)
        return 0
    except TrainingInterrupted as error:
        print(f"trl-credit grpo: {error}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:  # before training began: nothing to resume
        print("trl-credit grpo: interrupted before training began", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
