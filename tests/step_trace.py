"""One training step of a trainer traced with `sys.setprofile`: which package functions it calls, and the call path
from TRL's hand-off to a credit method's function.

TRL's hand-off is the scoring call TRL's `GRPOTrainer._compute_loss` makes for its forward: the first frame called from
that TRL frame. The path is the chain of frames on the stack when the method's function is entered, from that call
down to the function; its hops are the calls along it.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import trl

import trl_credit

PACKAGE = Path(trl_credit.__file__).resolve().parent
TRL_GRPO = Path(trl.__file__).resolve().parent / "trainer" / "grpo_trainer.py"


@dataclass
class StepTrace:
    """What one traced training step called."""

    package_functions: set[tuple[str, str]] = field(default_factory=set)  # (file relative to the package, qualname)
    # Those called while TRL's scoring call of its loss is on the stack: the extent of the seam.
    seam_functions: set[tuple[str, str]] = field(default_factory=set)
    paths_to_target: list[list[tuple[str, str]]] = field(default_factory=list)  # one per call of the target


# Comprehensions are frames of their own in Python 3.11, not functions a reader sees.
_COMPREHENSIONS = ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>")


def _frame_key(frame) -> tuple[str, str]:
    path = Path(frame.f_code.co_filename).resolve()
    where = path.relative_to(PACKAGE).as_posix() if path.is_relative_to(PACKAGE) else path.as_posix()
    return where, frame.f_code.co_qualname


def _is_trl_compute_loss(frame) -> bool:
    code = frame.f_code
    return code.co_name == "_compute_loss" and Path(code.co_filename).resolve() == TRL_GRPO


def _path_from_trl_hand_off(frame) -> list[tuple[str, str]] | None:
    """The frames from the call TRL's `_compute_loss` made down to `frame` (inclusive), or None outside that call."""
    chain = []
    while frame is not None:
        if _is_trl_compute_loss(frame):
            return list(reversed(chain))
        chain.append(_frame_key(frame))
        frame = frame.f_back
    return None


def trace_training_step(trainer, target: str) -> StepTrace:
    """Train `trainer` for one step (TRL's `training_step`, generation and loss) under `sys.setprofile`.

    `target`: the qualname of the method function whose call paths from TRL's hand-off are recorded (`"taco"`).
    """
    trace = StepTrace()

    def profile(frame, event, arg):
        if event != "call":
            return
        key = _frame_key(frame)
        if key[0].startswith("/") or key[1].endswith(_COMPREHENSIONS):
            return
        trace.package_functions.add(key)
        path = _path_from_trl_hand_off(frame)
        if path is not None:
            trace.seam_functions.add(key)
            if key[1] == target:
                trace.paths_to_target.append(path)

    training_step = trainer.training_step
    traced = []

    def traced_training_step(*args, **kwargs):
        if traced:  # one step only
            return training_step(*args, **kwargs)
        traced.append(True)
        sys.setprofile(profile)
        try:
            return training_step(*args, **kwargs)
        finally:
            sys.setprofile(None)

    trainer.training_step = traced_training_step
    try:
        trainer.train()
    finally:
        del trainer.training_step
    return trace


def count_calls(run: Callable[[], object], outside: Callable[[tuple[str, str]], bool]) -> Counter:
    """Run `run()` under `sys.setprofile`: how often each package function was called, by `(file, qualname)`, leaving
    out the calls made while a frame for which `outside(key)` holds is on the stack (that frame's own call too)."""
    calls, keys = (
        Counter(),
        {},
    )  # keys: each code object's key, None outside the package (profiling every call is slow)

    def key_of(frame):
        code = frame.f_code
        if code not in keys:
            key = _frame_key(frame)
            keys[code] = None if key[0].startswith("/") or key[1].endswith(_COMPREHENSIONS) else key
        return keys[code]

    def profile(frame, event, arg):
        key = key_of(frame) if event == "call" else None
        if key is None:
            return
        caller = frame
        while caller is not None:
            if key_of(caller) is not None and outside(key_of(caller)):
                return
            caller = caller.f_back
        calls[key] += 1

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return calls


if __name__ == "__main__":  # the numbers for a report: `python tests/step_trace.py`
    import tempfile

    sys.path.insert(0, str(Path(__file__).parent))
    from conftest import length_reward, make_tiny_model, make_tiny_tokenizer, tiny_config, tiny_prompt_dataset

    from trl_credit import CreditGRPOTrainer

    with tempfile.TemporaryDirectory() as folder:
        tokenizer = make_tiny_tokenizer()
        trainer = CreditGRPOTrainer(
            model=make_tiny_model(tokenizer),
            reward_funcs=length_reward,
            args=tiny_config("taco", folder, max_steps=1),
            train_dataset=tiny_prompt_dataset(),
            processing_class=tokenizer,
        )
        step = trace_training_step(trainer, "taco")
    path = step.paths_to_target[0]
    print("path from TRL's hand-off to taco:", " -> ".join(f"{f}:{q}" for f, q in path))
    print("hops:", len(path), "files:", sorted({f for f, _ in path}))
    print("distinct package functions on the step:", len(step.package_functions))
    for where, name in sorted(step.package_functions):
        print("  ", "seam" if (where, name) in step.seam_functions else "    ", where, name)
    print("of them inside TRL's scoring call of the loss:", len(step.seam_functions))
