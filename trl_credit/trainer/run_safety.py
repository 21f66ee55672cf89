"""A run never trains on, or saves, a non-finite model, and owns its output folder while it trains.

`CreditGRPOTrainer` does both for every way of training (a notebook, a script, `trl-credit grpo`):

* its `NonFiniteGuard` callback checks every optimizer step: before the update, that the step's loss (every
  micro-batch's, handed over by the trainer's `_compute_loss`), its rewards and gradients are finite; after it, that the
  weights are. At the first step where one is not,
  training stops with `NonFiniteTrainingError`: one line naming the step, what was not finite, the setting that likely
  caused it (any setting that is not finite, whatever its field; only a finite configuration blames the learning
  rate), and the last checkpoint, all of which were written at finite steps before it. The exception is raised
  before the step's `on_step_end`, so no checkpoint of that step is written, and `train()` does not return, so no final
  model or card is saved from that state. A non-finite statistic is an error, not a loss: nothing trained before it is
  lost.
* its `train()` holds the output folder's lock (`run_folder.run_folder_lock`) on the process that saves (process zero),
  so a second process training into the same folder is refused.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor
from transformers import TrainerCallback

OPTIMIZER_SETTINGS = ("learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon")


class NonFiniteTrainingError(RuntimeError):
    """A step's loss, gradients or updated weights were not finite; training stopped before saving that step."""


def _all_finite(tensors, device) -> torch.Tensor:
    """One boolean tensor on `device`: every element of `tensors` is finite."""
    # A tensor's minimum and maximum: a NaN propagates into both and an infinity is one of them, and no temporary of
    # the tensor's size is made (an embedding matrix can be gigabytes).
    extremes = [torch.stack(torch.aminmax(t)).to(device) for t in tensors if t.numel()]
    return torch.isfinite(torch.cat(extremes)).all() if extremes else torch.ones((), dtype=torch.bool, device=device)


def _local(parameter: torch.Tensor) -> torch.Tensor:
    # The part of a sharded parameter this process holds: DeepSpeed ZeRO-3 keeps it in `ds_tensor` (the parameter
    # itself is empty there), FSDP2 in a DTensor's local shard.
    local = getattr(parameter, "ds_tensor", parameter)
    return local.to_local() if isinstance(local, DTensor) else local


def _setting(name: str, value: float) -> str:
    return f"{name}={value:g}"


def _beyond(args, names, dtype: torch.dtype) -> list[str]:
    """The settings among `names` beyond the range of the weights' `dtype` (finite: `non_finite_settings` names any
    that is not)."""
    largest = torch.finfo(dtype).max
    return [
        f"{_setting(name, getattr(args, name))} (beyond {str(dtype).removeprefix('torch.')})"
        for name in names
        if abs(getattr(args, name)) > largest
    ]


def non_finite_settings(args) -> list[str]:
    """Every setting of `args` (a field, an element of a list field, a method hyperparameter of `credit_kwargs`)
    that is a number and not finite, as `name=value`: whatever the field, it is the likeliest cause of a non-finite
    step."""
    settings = {f.name: getattr(args, f.name, None) for f in dataclasses.fields(args)}
    settings.update(getattr(args, "credit_kwargs", None) or {})
    found = []
    for name, value in settings.items():
        values = value if isinstance(value, (list, tuple)) else [value]
        numbers = [v for v in values if isinstance(v, float)]
        if any(not math.isfinite(v) for v in numbers):
            found.append(_setting(name, value) if not isinstance(value, (list, tuple)) else f"{name}={list(value)}")
    return found


def _update_suspects(args, dtype: torch.dtype) -> list[str]:
    """The settings that likely made an update non-finite: any that is not finite, else the optimizer's."""
    suspects = non_finite_settings(args) or _beyond(args, OPTIMIZER_SETTINGS, dtype)
    if not suspects and args.learning_rate * args.weight_decay > 1:  # decoupled decay scales by 1 - lr x wd
        suspects = [
            f"{_setting('weight_decay', args.weight_decay)} with {_setting('learning_rate', args.learning_rate)} "
            "(each update scales the weights by 1 - learning_rate x weight_decay)"
        ]
    return suspects or [", ".join(_setting(name, getattr(args, name)) for name in OPTIMIZER_SETTINGS)]


class NonFiniteGuard(TrainerCallback):
    """Stops training at the first step whose loss, rewards, gradients or updated weights are not finite (see the
    module). The trainer hands it each training loss (`saw_loss`) and the rewards of each batch (`saw_rewards`); the
    gradients and weights are those of the model the callbacks are given."""

    def __init__(self, accelerator):
        self.accelerator = accelerator
        self._losses_finite: torch.Tensor | None = None  # of the micro-batches since the last optimizer step
        self._infinite_rewards: list[str] = []  # the reward functions that returned inf for the last batch

    def saw_loss(self, loss: torch.Tensor) -> None:
        finite = torch.isfinite(loss.detach()).all()
        self._losses_finite = finite if self._losses_finite is None else self._losses_finite & finite

    def saw_rewards(self, rewards_RF: torch.Tensor, names: list[str]) -> None:
        """The rewards of a batch, `(rows of every process, reward functions)`: an infinite one stops the next step
        (TRL reads a NaN one as "no reward": every reward function returned None)."""
        infinite_F = torch.isinf(rewards_RF).any(dim=0).tolist()
        self._infinite_rewards = [name for name, infinite in zip(names, infinite_F) if infinite]

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if self._infinite_rewards:
            names = self._infinite_rewards
            self._stop(
                args, state, f"the rewards of {', '.join(names)} are", [f"{name} returning inf" for name in names]
            )
        device = self.accelerator.device
        losses_finite = self._losses_finite if self._losses_finite is not None else torch.tensor(True)
        self._losses_finite = None
        gradients = [_local(p.grad) for p in _trainable(model) if p.grad is not None]
        finite = torch.stack([losses_finite.to(device), _all_finite(gradients, device)])
        loss_bad, gradients_bad = self._on_any_process(~finite)
        if loss_bad:  # only a finite configuration blames the learning rate
            suspects = non_finite_settings(args) or [
                f"a diverged model ({_setting('learning_rate', args.learning_rate)} may be too high)"
            ]
            self._stop(args, state, "the loss is", suspects)
        if gradients_bad:
            suspects = non_finite_settings(args) or [
                "an overflow in the backward pass (a lower learning_rate, or float32 instead of fp16/bf16)"
            ]
            self._stop(args, state, "the gradient norm is", suspects)

    def on_optimizer_step(self, args, state, control, model=None, **kwargs):
        weights = [_local(p) for p in _trainable(model)]
        weights_finite = _all_finite(weights, self.accelerator.device)
        (weights_bad,) = self._on_any_process(~weights_finite.unsqueeze(0))
        if weights_bad:  # so `weights` is not empty: every process lists the same trainable parameters
            self._stop(args, state, "the weights after the update are", _update_suspects(args, weights[0].dtype))

    def _on_any_process(self, flags_F: torch.Tensor) -> list[bool]:
        """Each flag, true when it is true on any process: every process stops at the same step."""
        return [bool(flag) for flag in self.accelerator.reduce(flags_F.float(), reduction="sum") > 0]

    def _stop(self, args, state, what: str, suspects: list[str]):
        step = state.global_step + 1
        checkpoint = last_checkpoint(args.output_dir, state.global_step)
        kept = f"the last checkpoint, {checkpoint}, is from a finite step" if checkpoint else "no checkpoint was saved"
        raise NonFiniteTrainingError(
            f"step {step}: {what} not finite (likely cause: {' or '.join(suspects)}); training stopped before saving "
            f"step {step}; {kept}"
        )


def _trainable(model) -> list[torch.Tensor]:
    return [p for p in model.parameters() if p.requires_grad]


def last_checkpoint(output_dir, up_to_step: int) -> str | None:
    """The `checkpoint-N` folder of `output_dir` with the largest `N <= up_to_step`, or None."""
    found = []
    for path in Path(output_dir).glob("checkpoint-*"):
        match = re.fullmatch(r"checkpoint-(\d+)", path.name)
        if match and path.is_dir() and int(match[1]) <= up_to_step:
            found.append((int(match[1]), str(path)))
    return max(found)[1] if found else None
