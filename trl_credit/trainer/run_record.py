"""A checkpoint belongs to its run: what trained it is recorded in it, and a resume that would mix two runs is refused.

Every `checkpoint-N` the trainer saves holds `RUN_RECORD` (`_trl_credit_run.json`, kept out of Hub uploads): the run's
`run_id` (drawn when a run starts from scratch, kept by every resume), the `output_dir` it trains into, `global_step`,
its method stack with every hyperparameter (`credit_method`, `credit_kwargs`), and `stacks`, which steps trained with
which stack (one entry unless a resume changed it, with `resume_with_other_method`).

`RunRecord`, a mixin of `CreditGRPOTrainer`, checks a resume in `train(resume_from_checkpoint=...)` before the
checkpoint loads (`trl-credit grpo` asks the same before the model loads): the folder is a checkpoint
(`checkpoint_problem`), its stack is the config's (`resume_refusal`), the output folder holds no other run's
checkpoints (which the resumed run would mix with its own and overwrite), and it is not already at the run's last step
(`NothingToTrain`: transformers would train one step past `max_steps` before its stopping check). A checkpoint saved
before runs were recorded resumes with a warning.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

from transformers import TrainerCallback
from transformers.trainer_utils import get_last_checkpoint
from transformers.utils import logging

logger = logging.get_logger(__name__)

RUN_RECORD = "_trl_credit_run.json"
TRAINER_STATE = "trainer_state.json"  # transformers' `TRAINER_STATE_NAME`: the step a resume continues from
# What a checkpoint's weights are saved as, by backend: a model or adapter file (`save_model`), or a folder (the
# shards of DeepSpeed's `global_stepN`, FSDP's sharded state, one adapter per sub-folder).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".index.json")


class NothingToTrain(ValueError):
    """The checkpoint to resume is at or past the run's last step: training it would go past `max_steps`."""


def read_run_record(checkpoint) -> dict | None:
    """The record of `checkpoint`, or None for one written before runs were recorded."""
    path = Path(checkpoint) / RUN_RECORD
    return json.loads(path.read_text()) if path.is_file() else None


def checkpoint_step(checkpoint) -> int:
    """The optimizer step `checkpoint` was saved at (its `trainer_state.json`)."""
    return int(json.loads((Path(checkpoint) / TRAINER_STATE).read_text())["global_step"])


def checkpoint_problem(folder) -> str | None:
    """What `folder` lacks to be a checkpoint a run can resume from, or None: the trainer state (the step and
    schedule) and the weights."""
    folder = Path(folder)
    if not folder.is_dir():
        return "no such folder"
    lacking = [] if (folder / TRAINER_STATE).is_file() else [TRAINER_STATE]
    weights = [p for p in folder.iterdir() if p.is_dir() or p.name.endswith(WEIGHT_SUFFIXES)]
    if not weights:
        lacking.append("the model's weights (model.safetensors, an adapter, or a DeepSpeed/FSDP state folder)")
    if not lacking:
        return None
    return (
        f"not a checkpoint: a checkpoint folder (checkpoint-N, saved by a run with save_strategy steps) holds "
        f"{TRAINER_STATE} and the model's weights, and this one lacks {' and '.join(lacking)}"
    )


def _stack(record_or_args) -> tuple[str, dict]:
    """`(credit_method, credit_kwargs)` of a record or a config, as JSON stores them (so that they compare equal)."""
    get = record_or_args.get if isinstance(record_or_args, dict) else lambda name: getattr(record_or_args, name)
    return get("credit_method"), json.loads(json.dumps(get("credit_kwargs") or {}))


def describe_stack(stack: tuple[str, dict]) -> str:
    method, kwargs = stack
    return f"{method} ({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})" if kwargs else method


def _other_runs_checkpoints(output_dir, checkpoint, run_id: str | None) -> list[str]:
    """The checkpoints in `output_dir` of another run than `checkpoint`'s: another recorded `run_id`, or, outside the
    checkpoint's own folder, none recorded."""
    own_folder = Path(checkpoint).resolve().parent == Path(output_dir).resolve()
    found = []
    for path in sorted(Path(output_dir).glob("checkpoint-*")):
        if not path.is_dir() or path.resolve() == Path(checkpoint).resolve():
            continue
        record = read_run_record(path)
        if (record["run_id"] != run_id) if (record and run_id) else not own_folder:
            found.append(path.name)
    return found


def resume_refusal(
    checkpoint, args, opt_in: str = "resume_with_other_method=True", folder: str = "output_dir"
) -> str | None:
    """Why resuming `checkpoint` with the config `args` would mix two runs, or None: another method stack or other
    hyperparameters (unless `args.resume_with_other_method`), or an output folder that holds another run's
    checkpoints. `opt_in` and `folder` are how the caller names that setting and `output_dir`."""
    record = read_run_record(checkpoint)
    if record is not None and not args.resume_with_other_method and _stack(record) != _stack(args):
        return (
            f"it was trained with {describe_stack(_stack(record))}, but this run trains {describe_stack(_stack(args))}: "
            f"resuming would train one model with both and report one; resume with the checkpoint's method and "
            f"hyperparameters, or pass {opt_in} to continue it with this stack (the model card then lists which "
            "steps trained with which)"
        )
    others = _other_runs_checkpoints(args.output_dir, checkpoint, record and record["run_id"])
    if others:
        return (
            f"{folder} {args.output_dir} holds checkpoints of another run ({', '.join(others)}), which the resumed "
            f"run would mix with its own and overwrite: choose another {folder}"
        )
    return None


def nothing_to_train(checkpoint, step: int, last_step: int) -> str | None:
    if last_step > 0 and step >= last_step:
        return f"{checkpoint} is at step {step} and the run ends at step {last_step}: nothing to train"
    return None


def new_run_record(args, checkpoint=None) -> dict:
    """The record of a run of `args`, from scratch or resuming `checkpoint`: the same run when it resumes into the
    checkpoint's own folder, else a new one (a branch) that keeps the steps' stacks of the run it continues."""
    current = dict(zip(("credit_method", "credit_kwargs"), _stack(args)))
    previous, step = (read_run_record(checkpoint), checkpoint_step(checkpoint)) if checkpoint else (None, 0)
    stacks = [entry for entry in (previous or {}).get("stacks", []) if entry["from_step"] <= step]
    if not stacks or _stack(stacks[-1]) != _stack(current):
        stacks.append({"from_step": step + 1, **current})
    same_run = previous and Path(checkpoint).resolve().parent == Path(args.output_dir).resolve()
    run_id = previous["run_id"] if same_run else uuid.uuid4().hex
    resumed = {"resumed_from": os.path.abspath(checkpoint)} if checkpoint else {}
    return {"run_id": run_id, "output_dir": os.path.abspath(args.output_dir), **resumed, **current, "stacks": stacks}


def stacks_by_step(record: dict | None, last_step: int) -> str | None:
    """Which steps trained with which stack, for the model card (`steps 1-2: eapo (...); steps 3-4: taco`), or None
    when one stack trained them all."""
    if not record or len(record["stacks"]) < 2:
        return None
    ends = [entry["from_step"] - 1 for entry in record["stacks"][1:]] + [last_step]
    return "; ".join(
        f"steps {entry['from_step']}-{end}: {describe_stack(_stack(entry))}"
        for entry, end in zip(record["stacks"], ends)
    )


class _NothingToTrainCheck(TrainerCallback):
    """Stops a resumed run whose step is already its last, when training begins (the schedule is known then, also for
    a run bounded by epochs), before the first step and before any other callback writes."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        found = nothing_to_train(self.trainer.resumed_checkpoint, state.global_step, state.max_steps)
        if self.trainer.resumed_checkpoint is not None and found:
            raise NothingToTrain(found)


class RunRecord:
    """Mixin of `CreditGRPOTrainer`: checks a resume before it loads and records the run in each checkpoint (see the
    module). Sets `run_record` (the record of the run `train()` trains, read by the research card) and
    `resumed_checkpoint`."""

    run_record: dict | None = None
    resumed_checkpoint: str | None = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.add_callback(_NothingToTrainCheck(self))

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        if resume_from_checkpoint is True:  # transformers' "the last checkpoint of output_dir"
            resume_from_checkpoint = get_last_checkpoint(self.args.output_dir) or resume_from_checkpoint
        checkpoint = resume_from_checkpoint if isinstance(resume_from_checkpoint, (str, os.PathLike)) else None
        if checkpoint is not None:
            for problem in (checkpoint_problem(checkpoint), resume_refusal(checkpoint, self.args)):
                if problem:
                    raise ValueError(f"resume_from_checkpoint {checkpoint}: {problem}")
            if read_run_record(checkpoint) is None:
                logger.warning(
                    f"{checkpoint} has no {RUN_RECORD} (it was saved before trl-credit recorded runs): its method "
                    f"stack cannot be checked against {describe_stack(_stack(self.args))}, which the run is recorded "
                    "as having trained with from step 1"
                )
        self.resumed_checkpoint = None if checkpoint is None else str(checkpoint)
        self.run_record = new_run_record(self.args, checkpoint)
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self.args.should_save and self.run_record is not None:
            folder = Path(self._get_output_dir(trial=trial)) / f"checkpoint-{self.state.global_step}"
            record = {**self.run_record, "global_step": self.state.global_step}
            (folder / RUN_RECORD).write_text(json.dumps(record, indent=1) + "\n")
