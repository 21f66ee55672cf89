"""What a `trl-credit compare` plan costs: disk (final models, checkpoints while runs can resume) and time (steps,
completions and a rough duration, from step times already logged or the quick start's measurement)."""

from __future__ import annotations

import json
from pathlib import Path

from .plan import RunSpec, checkpoint_number

QUICKSTART_SECONDS_PER_STEP = 228 / 30
QUICKSTART_TOKENS_PER_STEP = 8 * 48


def parameter_count(model_name_or_path: str) -> tuple[int, object] | None:
    """`(parameters, config)` of a model, counted on the meta device (no weight is read), or `None` when its config
    is not on this machine (a Hub id not in the cache, the offline SmolLM2 before its first conversion)."""
    from ...data import models

    if model_name_or_path.lower() == models.SMOLLM2_ALIAS:
        model_name_or_path = str(models.cache_root() / models._FOLDER_NAME)
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        model_config = AutoConfig.from_pretrained(model_name_or_path)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(model_config)
    except (OSError, ValueError):
        return None
    return sum(p.numel() for p in model.parameters()), model_config  # a tied embedding counts once, as it is saved


def _dtype_bytes(dtype_name: str | None, model_config) -> int:
    import torch

    if dtype_name in (None, "auto"):
        dtype = getattr(model_config, "dtype", None) or torch.float32
    else:
        dtype = getattr(torch, dtype_name)
    return torch.empty((), dtype=dtype).element_size()


def _size(num_bytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.2f} {unit}"
    return f"{num_bytes:.0f} B"


def estimate_disk(runs: list[RunSpec], training_args, model_args) -> str:
    """The plan's disk line: the final models, which stay, and a checkpoint per run, which stays only while the run
    can still resume (weights and AdamW's two moments in the weights' dtype: three times the model)."""
    if model_args.use_peft:
        return "disk: not estimated with --use_peft (the final models and checkpoints hold the adapters only)"
    counted = parameter_count(model_args.model_name_or_path)
    if counted is None:
        return f"disk: not estimated ({model_args.model_name_or_path}'s config is not on this machine yet)"
    count, model_config = counted
    per_parameter = _dtype_bytes(model_args.dtype, model_config)
    model_bytes = count * per_parameter
    line = (
        f"disk: {_size(len(runs) * model_bytes)} for the {len(runs)} final models ({count:,} parameters x "
        f"{per_parameter} bytes = {_size(model_bytes)} each)"
    )
    if training_args.save_strategy == "no":
        return line + "; no checkpoints"
    checkpoint_bytes = 3 * model_bytes
    limit = training_args.save_total_limit
    if limit:
        kept = "its latest checkpoint" if limit == 1 else f"its last {limit} checkpoints"
        at_once = limit + 1  # the Trainer writes a new checkpoint before it deletes the oldest
    elif training_args.save_strategy == "steps" and training_args.max_steps > 0 and training_args.save_steps >= 1:
        at_once = max(1, training_args.max_steps // int(training_args.save_steps))
        kept = "its checkpoint" if at_once == 1 else f"all {at_once} of its checkpoints (no --save_total_limit)"
    else:
        return f"{line}; a run's checkpoints ({_size(checkpoint_bytes)} each) are kept until it is done"
    peak = (len(runs) - 1) * model_bytes + at_once * checkpoint_bytes
    return (
        f"{line}; while a run trains, {kept} (weights and AdamW state: {_size(checkpoint_bytes)} each), deleted "
        f"once the run is done: at most about {_size(peak)} at once"
    )


def measured_step_seconds(runs_dir: Path) -> tuple[float | None, int]:
    """Mean TRL `step_time` over every logged step of the runs already in `runs_dir`, and the number of steps."""
    from ...reports.plots import find_trainer_state, metric_series

    times: list[float] = []
    for run_dir in sorted(p for p in runs_dir.glob("*") if p.is_dir()) if runs_dir.is_dir() else []:
        try:
            state = json.loads(find_trainer_state(run_dir).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            continue
        times += metric_series(state.get("log_history", []), "step_time")[1]
    return (sum(times) / len(times), len(times)) if times else (None, 0)


def estimate_cost(
    runs: list[RunSpec],
    states: dict[str, tuple[str, Path | None]],
    training_args,
    model_name: str,
    num_eval_samples: int | None,
) -> list[str]:
    """Lines describing the plan's cost: steps, completions, evaluation samples and a rough time, with its basis."""
    max_steps = training_args.max_steps
    completions_per_step = training_args.per_device_train_batch_size * training_args.gradient_accumulation_steps
    remaining = [run for run in runs if states[run.name][0] != "done"]
    lines = [f"runs: {len(runs)} ({len(runs) - len(remaining)} done, {len(remaining)} to train)"]
    if max_steps <= 0:
        lines.append("steps: set by num_train_epochs (max_steps is not set): not estimated")
        return lines
    steps_left = 0
    for run in remaining:
        checkpoint = states[run.name][1]
        steps_left += max_steps - (checkpoint_number(checkpoint) if checkpoint is not None else 0)
    lines.append(
        f"optimizer steps: {max_steps} per run x {len(runs)} runs = {max_steps * len(runs)}; {steps_left} left, "
        f"{completions_per_step} completions of <= {training_args.max_completion_length} tokens each per process"
    )
    if num_eval_samples:
        lines.append(f"evaluation: {num_eval_samples} sampled completions per run")
    seconds, measured_steps = measured_step_seconds(runs[0].output_dir.parent)
    if seconds is not None:
        basis = f"mean TRL step_time of {measured_steps} steps already logged in this output folder"
    elif model_name.lower() == "smollm2-135m-instruct" and training_args.use_cpu:
        tokens = completions_per_step * training_args.max_completion_length
        seconds = QUICKSTART_SECONDS_PER_STEP * tokens / QUICKSTART_TOKENS_PER_STEP
        basis = (
            f"the quick start's measurement ({QUICKSTART_SECONDS_PER_STEP:.1f} s/step on 2 CPU cores), scaled by "
            "completion tokens per step"
        )
    else:
        lines.append("time: no estimate until one step has run on this machine (rerun --dry_run after the first run)")
        return lines
    hours = steps_left * seconds / 3600
    lines.append(
        f"time: roughly {hours:.2f} h of training ({seconds:.2f} s/step x {steps_left} steps), from {basis}; "
        "model loading and evaluation come on top. A rough estimate: step times vary with completion lengths."
    )
    return lines
