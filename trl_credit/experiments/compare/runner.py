"""Executing the plan of `trl-credit compare`: training subprocesses and the held-out evaluation.

Each run is a `trl-credit grpo` subprocess whose output is copied to `RUN/train.log` (and the console). Its peak
memory is the `ru_maxrss` that `os.wait4` reports for it: the peak resident set size (CPU memory) of the largest
single process of the run (with `accelerate launch`, of the largest worker), not a sum over processes, and not GPU
memory. After a successful exit compare writes `RUN/.done` with the wall time and that peak, and deletes the run's
`checkpoint-*` folders (weights and optimizer state, three times the model): a done run is never resumed, and its
final model, `trainer_state.json` and model card are in the run folder.

The evaluation calls `trl_credit.experiments.evaluation.run_evaluation`, the code behind `trl-credit eval`, in this process:
completions and `summary.json` go to `RUN/eval/`, and the summary is copied to `RUN/eval.json`, where model cards
look for evaluation results; the run's model card is then rendered again with them.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import trl_credit

from .plan import DONE_MARKER, EVAL_SUMMARY, RUN_RECORD, RunSpec, latest_checkpoint, run_state


class RunFailed(Exception):
    """A training subprocess exited with a non-zero status."""


def _child_environment() -> dict[str, str]:
    """The environment of a run: this one, with this `trl_credit` first on the path, so the runs use the same code."""
    package_parent = str(Path(trl_credit.__file__).resolve().parents[1])
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": package_parent + (os.pathsep + path if path else "")}


def _peak_rss_mib(rusage) -> float:
    # Linux reports ru_maxrss in KiB, macOS in bytes.
    return rusage.ru_maxrss / (1024 * 1024 if sys.platform == "darwin" else 1024)


def execute_run(spec: RunSpec, echo: bool = True) -> dict:
    """Train (or resume) one run in a subprocess; write `.done`; return what `.done` holds.

    Raises:
        RunFailed: the subprocess exited with a non-zero status (the run folder keeps its checkpoints).
    """
    state, checkpoint = run_state(spec.output_dir)
    if state == "done":
        remove_checkpoints(spec.output_dir)  # left by a compare that stopped between `.done` and the deletion
        return json.loads((spec.output_dir / DONE_MARKER).read_text())
    spec.output_dir.mkdir(parents=True, exist_ok=True)
    record_path = spec.output_dir / RUN_RECORD
    record = (
        json.loads(record_path.read_text())
        if record_path.is_file()
        else {
            "method": spec.method,
            "seed": spec.seed,
            "grpo_argv": spec.grpo_argv(),
            "attempts": [],
        }
    )
    command = spec.command(resume_from=checkpoint)
    started = time.monotonic()
    with open(spec.output_dir / "train.log", "ab") as log:
        log.write(f"$ {shlex.join(command)}\n".encode())
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_child_environment())
        try:
            with process.stdout:
                for line in process.stdout:
                    log.write(line)
                    if echo:
                        sys.stdout.buffer.write(line)
                        sys.stdout.flush()
        except BaseException:  # Ctrl-C: stop the run; its checkpoints let the next compare resume it
            process.terminate()
            process.wait()
            raise
        _, status, rusage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    attempt = {
        "resumed_from": checkpoint.name if checkpoint else None,
        "returncode": process.returncode,
        "wall_seconds": round(time.monotonic() - started, 2),
        "peak_rss_mib": round(_peak_rss_mib(rusage), 1),
    }
    record["attempts"].append(attempt)
    record_path.write_text(json.dumps(record, indent=1) + "\n")
    if process.returncode != 0:
        raise RunFailed(f"{spec.name} exited with status {process.returncode}; see {spec.output_dir / 'train.log'}")
    done = {
        "method": spec.method,
        "seed": spec.seed,
        "wall_seconds": round(sum(a["wall_seconds"] for a in record["attempts"]), 2),
        "peak_rss_mib": max(a["peak_rss_mib"] for a in record["attempts"]),
        "peak_rss_note": "ru_maxrss of the run's largest process (os.wait4): CPU resident memory, not GPU memory",
        "attempts": len(record["attempts"]),
    }
    (spec.output_dir / DONE_MARKER).write_text(json.dumps(done, indent=1) + "\n")
    remove_checkpoints(spec.output_dir)
    return done


def remove_checkpoints(run_dir: Path) -> list[str]:
    """Delete the `checkpoint-*` folders of a done run whose final model is saved in `run_dir`; return their names."""
    saved = (run_dir / "trainer_state.json").is_file() and any(
        (run_dir / name).is_file() for name in ("config.json", "adapter_config.json")
    )
    if not saved:  # not a run `trl-credit grpo` finished: keep what could still resume it
        return []
    removed = []
    while (checkpoint := latest_checkpoint(run_dir)) is not None:
        shutil.rmtree(checkpoint)
        removed.append(checkpoint.name)
    return removed


def evaluation_config(spec: RunSpec, settings: dict):
    """The `EvalConfig` of a run's final model: `settings` are `EvalConfig` fields shared by every run."""
    from ..evaluation import EvalConfig

    return EvalConfig(model_name_or_path=str(spec.output_dir), output_dir=str(spec.output_dir / "eval"), **settings)


def _comparable(config: dict) -> dict:
    # Neither setting changes the numbers (and summaries written before `update_model_card` existed lack it).
    return {key: value for key, value in config.items() if key not in ("output_dir", "update_model_card")}


def evaluate_run(spec: RunSpec, settings: dict, train_problems: set[str] | None = None) -> dict:
    """Evaluate a finished run's model unless `eval.json` already holds an evaluation with the same settings.

    Either way, the run's model card is then rendered again with the evaluation.

    `train_problems`, the problem texts the run trained on, gives `train_overlap`: how many evaluated problems also
    occur verbatim in training (small procedural tasks repeat problems across splits).
    """
    from ...reports.model_card import regenerate_model_card
    from ..evaluation import run_evaluation

    config = evaluation_config(spec, settings)
    summary_path = spec.output_dir / EVAL_SUMMARY
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else None
    if summary is None or _comparable(summary.get("config", {})) != _comparable(asdict(config)):
        summary = run_evaluation(config)
        if train_problems is not None:
            problems = [json.loads(line)["problem"] for line in open(Path(config.output_dir) / "completions.jsonl")]
            summary["train_overlap"] = sum(problem in train_problems for problem in problems)
        summary_path.write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    regenerate_model_card(spec.output_dir)  # also when cached: the card may have been saved before the evaluation
    return summary
