"""A run never trains on, or saves, a non-finite model, and owns its output folder (`trl_credit.trainer.run_safety`,
`trl_credit.trainer.run_folder`), from Python and from `trl-credit grpo`, `compare` and `lab`.

Each non-finite case is made by what a user could do (a NaN weight decay, a reward function returning inf) or, for the
loss itself, by a trainer whose TRL loss turns NaN at step 2; the checks read what is on disk afterwards. A lock
held by another process is held by a real one, spawned by the test.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shlex
import signal
import socket
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from conftest import (
    length_reward,
    make_tiny_tokenizer,
    tiny_config,
    tiny_recipe,
    tiny_trainer,
)
from fake_runs import folder_files
from safetensors.torch import load_file
from trl import GRPOTrainer

from trl_credit import CreditGRPOTrainer
from trl_credit.cli import main as cli_main
from trl_credit.experiments.lab.lab_runs import LabConfig, previous_records
from trl_credit.trainer import run_safety
from trl_credit.trainer.run_folder import JOB_ID_ENV, LOCK_FILE, RunFolderBusy, run_folder_lock
from trl_credit.trainer.run_safety import NonFiniteTrainingError

FINAL_FILES = ("model.safetensors", "config.json", "trainer_state.json")  # `save_model` and `save_state`


def _trainer(output_dir, trainer_class=CreditGRPOTrainer, reward=length_reward, **overrides):
    tokenizer = make_tiny_tokenizer()
    settings = dict(max_steps=3, save_strategy="steps", save_steps=1) | overrides
    return tiny_trainer(
        tiny_config("taco", output_dir, **settings), trainer_class, tokenizer=tokenizer, reward_funcs=reward
    )


def _checkpoints(folder) -> list[str]:
    return sorted(p.name for p in folder.glob("checkpoint-*"))


def _all_finite(model) -> bool:
    return all(torch.isfinite(p).all() for p in model.parameters())


class _NaNTRLLossAtStep2(GRPOTrainer):
    def _compute_loss(self, model, inputs):
        loss = super()._compute_loss(model, inputs)
        return loss * math.nan if self.state.global_step == 1 else loss


class NaNLossAtStep2(CreditGRPOTrainer, _NaNTRLLossAtStep2):
    """TRL's loss of step 2 (every micro-batch of it) is NaN, as a diverging model's would be: the credit trainer's
    `_compute_loss` receives it from TRL's (its base `_NaNTRLLossAtStep2` stands between them)."""


class NaNGradientAtStep2(CreditGRPOTrainer):
    """A finite loss whose backward overflows at step 2: one gradient element is NaN."""

    def training_step(self, *args, **kwargs):
        loss = super().training_step(*args, **kwargs)
        if self.state.global_step == 1:
            next(self.model.parameters()).grad.view(-1)[0] = math.nan
        return loss


@pytest.mark.parametrize(
    "trainer_class,stopped",
    [
        (
            NaNLossAtStep2,
            "the loss is not finite (likely cause: a diverged model (learning_rate=0.05 may be too high))",
        ),
        (NaNGradientAtStep2, "the gradient norm is not finite (likely cause: an overflow in the backward pass"),
    ],
)
def test_a_nan_loss_or_gradient_stops_at_its_step_before_the_update_keeping_the_earlier_checkpoint(
    tmp_path, trainer_class, stopped
):
    out = tmp_path / "run"
    trainer = _trainer(out, trainer_class)
    with pytest.raises(NonFiniteTrainingError) as raised:
        trainer.train()
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"step 2: {stopped}")
    assert f"the last checkpoint, {out / 'checkpoint-1'}, is from a finite step" in message
    assert _checkpoints(out) == ["checkpoint-1"]  # save_steps=1, yet no checkpoint of step 2
    # Step 2's update never ran: the weights are checkpoint-1's, finite.
    saved = load_file(out / "checkpoint-1" / "model.safetensors")
    assert saved.keys() == trainer.model.state_dict().keys()
    for name, value in trainer.model.state_dict().items():
        assert torch.isfinite(saved[name]).all() and torch.equal(value, saved[name]), name


def _guard_on_one_process() -> run_safety.NonFiniteGuard:
    """The guard with accelerate's Accelerator as it uses it, on one process: its device and its sum over processes."""
    return run_safety.NonFiniteGuard(
        SimpleNamespace(device=torch.device("cpu"), reduce=lambda flags, reduction: flags)
    )


def test_a_gradient_sharded_by_fsdp2_is_checked_on_this_processs_shard(tmp_path, process_group_of_one):
    """FSDP2 keeps parameters and gradients as DTensors: the guard reads this process's shard as a plain tensor, so
    that its checks are local and one reduction of the flags is the only collective (a DTensor's own `aminmax` would
    be one per parameter). One process, in a gloo group of its own."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from transformers import TrainerState

    mesh = init_device_mesh("cpu", (1,))
    model = torch.nn.Linear(2, 2, bias=False)
    model.weight = torch.nn.Parameter(distribute_tensor(torch.ones(2, 2), mesh, [Shard(0)]))
    gradient = torch.tensor([[1.0, 2.0], [float("nan"), 3.0]])
    model.weight.grad = distribute_tensor(gradient, mesh, [Shard(0)])
    shard = run_safety._local(model.weight.grad)
    assert type(shard) is torch.Tensor and torch.equal(shard.isnan(), gradient.isnan())
    guard = _guard_on_one_process()
    with pytest.raises(NonFiniteTrainingError, match="the gradient norm is not finite"):
        guard.on_pre_optimizer_step(tiny_config("grpo", tmp_path), TrainerState(), None, model=model)


def test_a_nan_weight_decay_stops_at_step_1_and_writes_no_checkpoint_of_it(tmp_path):
    out = tmp_path / "run"
    trainer = _trainer(out)
    # Set on the built trainer, as a config that refuses NaN cannot be given it: the trainer must not rely on that.
    trainer.args.weight_decay = math.nan
    with pytest.raises(NonFiniteTrainingError) as raised:
        trainer.train()
    message = str(raised.value)
    assert message.startswith("step 1: the weights after the update are not finite (likely cause: weight_decay=nan)")
    assert message.endswith("no checkpoint was saved")
    assert not _all_finite(trainer.model)  # what the guard saw; none of it reached the disk
    assert not out.exists() or _checkpoints(out) == []


def test_a_non_finite_setting_of_any_field_is_named_and_not_the_learning_rate(tmp_path):
    args = tiny_config("taco", tmp_path / "run", max_steps=2)
    # Set on the config after it is built, as one that refuses NaN cannot be given it: the guard must not rely on that.
    args.entropy_coef = math.nan  # TRL's entropy bonus: the loss of step 1 is NaN
    tokenizer = make_tiny_tokenizer()
    trainer = tiny_trainer(args, tokenizer=tokenizer)
    with pytest.raises(NonFiniteTrainingError) as raised:
        trainer.train()
    assert str(raised.value).startswith("step 1: the loss is not finite (likely cause: entropy_coef=nan); ")
    assert "learning_rate" not in str(raised.value)


def _reward_from_step_2(value: float):
    def reward_from_step_2(completions, trainer_state, **kwargs):
        return [value if trainer_state.global_step >= 1 else r for r in length_reward(completions)]

    return reward_from_step_2


def test_an_infinite_reward_stops_training_naming_the_reward_function(tmp_path):
    out = tmp_path / "run"
    trainer = _trainer(out, reward=_reward_from_step_2(math.inf))
    with pytest.raises(NonFiniteTrainingError, match=r"^step 2: the rewards of reward_from_step_2 are not finite"):
        trainer.train()
    assert _checkpoints(out) == ["checkpoint-1"] and _all_finite(trainer.model)


def test_a_nan_reward_is_trls_no_reward_and_trains_on(tmp_path):
    """TRL reads NaN as "every reward function returned None": such completions get no advantage, nothing is NaN."""
    trainer = _trainer(tmp_path / "run", reward=_reward_from_step_2(math.nan))
    trainer.train()
    assert trainer.state.global_step == 3 and _all_finite(trainer.model)


# -------------------------------------------------------------------------------------------------- the CLI


def infinite_from_step_2(completions, trainer_state, **kwargs):
    """A reward function for `--reward_funcs test_run_safety:infinite_from_step_2`."""
    return _reward_from_step_2(math.inf)(completions, trainer_state)


def test_grpo_stops_at_a_non_finite_step_exits_1_and_saves_no_final_model_or_card(tmp_path, tiny_model_dir, capsys):
    recipe = tiny_recipe(
        tmp_path,
        tiny_model_dir,
        max_steps=3,
        save_strategy="steps",
        save_steps=1,
        reward_funcs=["test_run_safety:infinite_from_step_2"],
    )
    assert cli_main(["grpo", "--config", str(recipe)]) == 1
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if line.startswith("trl-credit grpo:")]
    assert errors == [
        "trl-credit grpo: error: step 2: the rewards of infinite_from_step_2 are not finite (likely cause: "
        "infinite_from_step_2 returning inf); training stopped before saving step 2; the last checkpoint, "
        f"{tmp_path / 'run' / 'checkpoint-1'}, is from a finite step"
    ]
    assert "saved to" not in captured.out
    run = tmp_path / "run"
    assert not [name for name in FINAL_FILES if (run / name).exists()]
    # The card (README.md, plots/) there is the one written with checkpoint-1, as TRL writes it with each checkpoint.
    assert _checkpoints(run) == ["checkpoint-1"]


HOLDER = """
import sys
from types import SimpleNamespace
from trl_credit.trainer.run_folder import run_folder_lock
with run_folder_lock(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.read()
"""


@pytest.fixture
def holder():
    """`holder(folder, job=None)`: another process holding the lock of `folder` until the test ends (or it is killed),
    as a launcher of the multi-machine job `job` (`JOB_ID_ENV`) when given."""
    processes = []

    def hold(folder, job=None):
        env = {key: value for key, value in os.environ.items() if key != JOB_ID_ENV}
        process = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(folder)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env if job is None else {**env, JOB_ID_ENV: job},
        )
        processes.append(process)
        assert process.stdout.readline() == "held\n"
        return process

    yield hold
    for process in processes:
        process.stdin.close()
        process.wait(timeout=30)


def _one_error_line(capsys, command: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"trl-credit {command}: error:"), err
    return err[0]


def test_a_second_run_into_a_held_folder_is_refused_before_loading_naming_the_holder(
    tmp_path, tiny_model_dir, holder, no_model_loading, capsys
):
    recipe = tiny_recipe(tmp_path, tiny_model_dir)
    process = holder(tmp_path / "run")
    assert cli_main(["grpo", "--config", str(recipe)]) == 2
    error = _one_error_line(capsys, "grpo")
    assert f"is in use by process {process.pid} on {socket.gethostname()}, which is training into it" in error
    assert sorted(os.listdir(tmp_path / "run")) == [LOCK_FILE]

    for command, argv in (
        ("compare", ["--methods", "grpo", "--seeds", "0", "--skip_eval"]),
        ("lab", ["--methods", "grpo", "--tasks", "rare", "--seeds", "0"]),
    ):
        assert cli_main([command, *argv, "--output_dir", str(tmp_path / "run")]) == 2
        assert f"in use by process {process.pid}" in _one_error_line(capsys, command)


def test_a_trainer_into_a_held_folder_is_refused(tmp_path, holder):
    process = holder(tmp_path / "run")
    with pytest.raises(RunFolderBusy, match=f"in use by process {process.pid}"):
        _trainer(tmp_path / "run").train()


def test_the_lock_is_reentrant_here_and_outlives_no_crash(tmp_path, holder):
    folder = tmp_path / "run"
    with run_folder_lock(folder), run_folder_lock(folder):  # the CLI's, then the trainer's, in one process
        (folder / "log.txt").write_text("written")
    holder(folder)  # released: another process takes it
    crashed = holder(tmp_path / "other")
    os.kill(crashed.pid, signal.SIGKILL)  # a crash: the operating system releases its lock
    crashed.wait()
    with run_folder_lock(tmp_path / "other"):
        assert (tmp_path / "other" / LOCK_FILE).read_text().splitlines()[:2] == [
            str(os.getpid()),
            socket.gethostname(),
        ]
    with run_folder_lock(tmp_path / "empty"):  # a run that wrote nothing leaves no folder behind
        pass
    assert not (tmp_path / "empty").exists()


def test_launchers_of_one_job_on_several_machines_share_the_folder_and_another_job_is_refused(
    tmp_path, tiny_model_dir, holder, no_model_loading, monkeypatch, capsys
):
    """The first launcher of job `job-1` holds the folder; another launcher of `job-1` (another machine's) goes on
    without taking it; a launcher of `job-2`, or of no job, is refused, naming the holder and its job."""
    folder = tmp_path / "run"
    process = holder(folder, job="job-1")
    monkeypatch.setenv(JOB_ID_ENV, "job-1")
    with run_folder_lock(folder):
        (folder / "written by machine 1").write_text("")
    assert (folder / LOCK_FILE).read_text().splitlines()[0] == str(process.pid)  # still the first launcher's

    recipe = tiny_recipe(tmp_path, tiny_model_dir, output_dir=str(folder))
    for job in ("job-2", None):
        if job is None:
            monkeypatch.delenv(JOB_ID_ENV)
        else:
            monkeypatch.setenv(JOB_ID_ENV, job)
        with pytest.raises(RunFolderBusy, match=f"in use by process {process.pid} .*job job-1"):
            with run_folder_lock(folder):
                pass
        assert cli_main(["grpo", "--config", str(recipe)]) == 2
        error = _one_error_line(capsys, "grpo")
        assert f"in use by process {process.pid} on {socket.gethostname()}" in error
        assert f"{JOB_ID_ENV}=job-1" in error


def test_a_finished_run_is_refused_naming_both_fixes_and_both_are_accepted(tmp_path, tiny_model_dir, holder, capsys):
    recipe = tiny_recipe(tmp_path, tiny_model_dir, save_strategy="steps", save_steps=1)
    run = tmp_path / "run"
    assert cli_main(["grpo", "--config", str(recipe)]) == 0
    holder(run).stdin.close()  # the lock was released when the command ended
    state = (run / "trainer_state.json").read_text()
    capsys.readouterr()

    assert cli_main(["grpo", "--config", str(recipe), "--method", "eapo"]) == 2
    error = _one_error_line(capsys, "grpo")
    assert f"--output_dir {run} holds a finished run (trainer_state.json, config.json, model.safetensors)" in error
    assert "--overwrite_output_dir true" in error and "--resume_from_checkpoint" in error
    assert (run / "trainer_state.json").read_text() == state

    overwrite = ["--overwrite_output_dir", "true"]
    assert cli_main(["grpo", "--config", str(recipe), "--method", "eapo", *overwrite]) == 0
    assert "eapo" in (run / "README.md").read_text().lower()
    capsys.readouterr()
    # A resume into the finished folder would replace its model, card and state just the same.
    resumed = ["--resume_from_checkpoint", str(run / "checkpoint-1"), "--max_steps", "2"]
    state = (run / "trainer_state.json").read_text()
    assert cli_main(["grpo", "--config", str(recipe), "--method", "eapo", *resumed]) == 2
    error = _one_error_line(capsys, "grpo")
    assert f"holds a finished run (trainer_state.json, config.json, model.safetensors), which resuming {run}" in error
    assert (run / "trainer_state.json").read_text() == state
    assert cli_main(["grpo", "--config", str(recipe), "--method", "eapo", *resumed, *overwrite]) == 0
    assert json.loads((run / "trainer_state.json").read_text())["global_step"] == 2


def test_lab_refuses_a_folder_of_runs_with_other_settings_unless_overwritten(tmp_path, capsys):
    other = LabConfig(output_dir=str(tmp_path), learning_rate=1e-3)
    settings = {k: v for k, v in vars(other).items() if k not in ("methods", "tasks", "seeds", "output_dir")}
    settings.pop("overwrite_output_dir")
    run = {"task": "rare", "method": "grpo", "seed": 0}
    (tmp_path / "results.json").write_text(json.dumps({"settings": settings, "runs": [run]}))

    assert previous_records(other) == [run]  # the same settings: continued, nothing repeated
    assert previous_records(LabConfig(output_dir=str(tmp_path), overwrite_output_dir=True)) == []
    assert (
        cli_main(["lab", "--methods", "grpo", "--tasks", "rare", "--seeds", "0", "--output_dir", str(tmp_path)]) == 2
    )
    error = _one_error_line(capsys, "lab")
    assert "holds 1 runs with other settings (learning_rate): pass --overwrite_output_dir true" in error


# ------------------------------------------------------------------------------------- a resume belongs to its run


def _finished_eapo_run(tmp_path, tiny_model_dir, capsys, **settings):
    """A finished EAPO run of `trl-credit grpo` with a checkpoint at each step, its recipe and its folder."""
    recipe = tiny_recipe(tmp_path, tiny_model_dir, save_strategy="steps", save_steps=1, **settings)
    assert cli_main(["grpo", "--config", str(recipe), "--method", "eapo"]) == 0
    capsys.readouterr()
    return recipe, tmp_path / "run"


def test_resuming_another_methods_checkpoint_is_refused_before_loading_unless_asked_and_the_card_says_both(
    tmp_path, tiny_model_dir, capsys, monkeypatch
):
    recipe, run = _finished_eapo_run(tmp_path, tiny_model_dir, capsys)
    record = json.loads((run / "checkpoint-1" / "_trl_credit_run.json").read_text())
    assert record["credit_method"] == "eapo" and record["output_dir"] == str(run) and record["global_step"] == 1
    assert [entry["from_step"] for entry in record["stacks"]] == [1]
    other = tmp_path / "t10"
    taco = ["--method", "taco", "--max_steps", "2", "--resume_from_checkpoint", str(run / "checkpoint-1")]
    with monkeypatch.context() as patched:  # the refusal comes before any model loads
        patched.setattr("trl_credit.data.models.resolve_model_path", _no_model)
        assert cli_main(["grpo", "--config", str(recipe), *taco, "--output_dir", str(other)]) == 2
    error = _one_error_line(capsys, "grpo")
    assert f"--resume_from_checkpoint {run / 'checkpoint-1'}: it was trained with eapo (eapo_kappa=" in error
    assert "but this run trains taco (taco_alpha=0.01, taco_lambda=0.9)" in error
    assert "--resume_with_other_method true" in error and not other.exists()

    asked = ["--resume_with_other_method", "true", "--output_dir", str(other)]
    assert cli_main(["grpo", "--config", str(recipe), *taco, *asked]) == 0
    stacks = json.loads((other / "checkpoint-2" / "_trl_credit_run.json").read_text())["stacks"]
    assert [(entry["from_step"], entry["credit_method"]) for entry in stacks] == [(1, "eapo"), (2, "taco")]
    card = (other / "README.md").read_text()
    assert "| `credit_method_by_step` | `steps 1-1: eapo (eapo_kappa=" in card
    assert "; steps 2-2: taco (taco_alpha=0.01, taco_lambda=0.9)` |" in card
    capsys.readouterr()

    # t10 now holds a run of its own: the EAPO run's checkpoint does not resume into it.
    eapo = ["--method", "eapo", "--max_steps", "2", "--resume_from_checkpoint", str(run / "checkpoint-1")]
    for name in ("trainer_state.json", "config.json", "model.safetensors"):
        (other / name).unlink()  # an interrupted run: no finished-run guard, only its checkpoints
    assert cli_main(["grpo", "--config", str(recipe), *eapo, "--output_dir", str(other)]) == 2
    error = _one_error_line(capsys, "grpo")
    assert f"--output_dir {other} holds checkpoints of another run (checkpoint-2), which the resumed run" in error


def _no_model(*args, **kwargs):
    raise AssertionError("a model was loaded before the refusal")


def test_resuming_a_finished_run_at_its_last_step_trains_nothing_and_rewrites_nothing(
    tmp_path, tiny_model_dir, capsys, monkeypatch
):
    recipe, run = _finished_eapo_run(tmp_path, tiny_model_dir, capsys, max_steps=2)
    before = folder_files(run)
    monkeypatch.setattr("trl_credit.data.models.resolve_model_path", _no_model)
    resumed = ["--method", "eapo", "--resume_from_checkpoint", str(run / "checkpoint-2")]
    assert cli_main(["grpo", "--config", str(recipe), *resumed]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("trl-credit grpo:")]
    assert lines == [
        f"trl-credit grpo: {run / 'checkpoint-2'} is at step 2 and the run ends at step 2: nothing to train; {run} "
        "holds a finished run, left as it is (a larger --max_steps trains on)"
    ]
    assert folder_files(run) == before  # no step 3, no card or state rewritten

    # A run interrupted after its last checkpoint, before its final save: the checkpoint's model is its final one.
    monkeypatch.undo()
    for name in ("trainer_state.json", "config.json", "model.safetensors"):
        (run / name).unlink()
    assert cli_main(["grpo", "--config", str(recipe), *resumed]) == 0
    assert "nothing to train; saving its model as the run's final model" in capsys.readouterr().out
    assert json.loads((run / "trainer_state.json").read_text())["global_step"] == 2
    assert (run / "model.safetensors").read_bytes() == (run / "checkpoint-2" / "model.safetensors").read_bytes()
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]


def interrupt_at_step_2(completions, trainer_state, **kwargs):
    """A reward function for `--reward_funcs test_run_safety:interrupt_at_step_2`: Ctrl-C while step 2 is generated,
    when `INTERRUPT_AT_STEP_2` is set."""
    if trainer_state.global_step == 1 and os.environ.get("INTERRUPT_AT_STEP_2"):
        raise KeyboardInterrupt
    return [1.0] * len(completions)


def test_ctrl_c_ends_with_one_line_naming_the_checkpoint_and_the_command_that_resumes_it(
    tmp_path, tiny_model_dir, capsys, monkeypatch
):
    recipe = tiny_recipe(
        tmp_path,
        tiny_model_dir,
        max_steps=2,
        save_strategy="steps",
        save_steps=1,
        reward_funcs=["test_run_safety:interrupt_at_step_2"],
    )
    run = tmp_path / "run"
    monkeypatch.setenv("INTERRUPT_AT_STEP_2", "1")
    assert cli_main(["grpo", "--config", str(recipe), "--method", "taco"]) == 130
    line = _one_error_line_of(capsys)
    command = f"trl-credit grpo --config {recipe} --method taco --resume_from_checkpoint {run / 'checkpoint-1'}"
    checkpoint = run / "checkpoint-1"
    assert (
        line
        == f"trl-credit grpo: interrupted after step 1; the last checkpoint is {checkpoint}; resume with: {command}"
    )
    monkeypatch.delenv("INTERRUPT_AT_STEP_2")
    assert cli_main(shlex.split(command)[1:]) == 0  # the command, as printed, resumes it
    assert json.loads((run / "trainer_state.json").read_text())["global_step"] == 2


def _one_error_line_of(capsys) -> str:
    """The one line of `trl-credit grpo` on stderr, among what transformers and TRL print there (progress bars)."""
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("trl-credit grpo:")]
    assert len(lines) == 1, lines
    return lines[0]


def test_weights_an_update_made_non_finite_with_finite_settings_name_every_optimizer_setting(tmp_path):
    """An update that overflowed (a weight set to inf by the optimizer step) under finite settings, whose learning
    rate and weight decay do not scale the weights past 1: the message lists every optimizer setting."""
    out = tmp_path / "run"
    trainer = _trainer(out, max_steps=2, save_strategy="no")
    trainer.create_optimizer()
    weight = next(trainer.model.parameters())
    trainer.optimizer.register_step_post_hook(lambda optimizer, args, kwargs: weight.data.view(-1)[0].fill_(math.inf))
    with pytest.raises(NonFiniteTrainingError) as raised:
        trainer.train()
    settings = "learning_rate=0.05, weight_decay=0, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-08"
    assert str(raised.value) == (
        f"step 1: the weights after the update are not finite (likely cause: {settings}); training stopped before "
        "saving step 1; no checkpoint was saved"
    )


def test_an_update_scaling_the_weights_by_learning_rate_times_weight_decay_names_both(tmp_path):
    """Decoupled weight decay scales each weight by 1 - learning_rate x weight_decay: past 1 in size the weights
    overflow (every weight beyond 1.2 in size, here in one step), though each setting is finite and within float32."""
    trainer = _trainer(tmp_path / "run", max_steps=1, save_strategy="no", learning_rate=1.0, weight_decay=3e38)
    with pytest.raises(NonFiniteTrainingError) as raised:
        trainer.train()
    assert str(raised.value).startswith(
        "step 1: the weights after the update are not finite (likely cause: weight_decay=3e+38 with "
        "learning_rate=1 (each update scales the weights by 1 - learning_rate x weight_decay)); "
    )


def test_no_tensors_and_empty_tensors_are_finite():
    """A process whose shard of the trainable weights or of their gradients is empty has nothing non-finite."""
    cpu = torch.device("cpu")
    assert run_safety._all_finite([], cpu).item() is True
    assert run_safety._all_finite([torch.empty(0), torch.ones(2)], cpu).item() is True
    assert run_safety._all_finite([torch.empty(0), torch.tensor([1.0, math.nan])], cpu).item() is False


def test_a_sharded_parameter_is_checked_through_the_shard_this_process_holds():
    """DeepSpeed ZeRO-3 empties a parameter and keeps this process's shard in `ds_tensor`: the guard reads the shard
    (a NaN there is this process's to report), a plain parameter as it is."""
    shard = torch.tensor([1.0, float("nan")])
    partitioned = torch.nn.Parameter(torch.empty(0))
    partitioned.ds_tensor = shard
    assert run_safety._local(partitioned) is shard
    plain = torch.nn.Parameter(torch.ones(2))
    assert run_safety._local(plain) is plain


@dataclasses.dataclass
class OptimizerSettings:
    """The optimizer's settings as `TrainingArguments` holds them, and the output folder the guard names."""

    output_dir: str = "."
    learning_rate: float = 1e-5
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8


def test_an_optimizer_setting_beyond_the_weights_dtype_is_named_with_that_dtype():
    """A finite learning rate of 1e5 is beyond float16, whose largest value is 65504: it alone is named."""
    beyond = run_safety._update_suspects(OptimizerSettings(learning_rate=1e5), torch.float16)
    assert beyond == ["learning_rate=100000 (beyond float16)"]
    within = run_safety._update_suspects(OptimizerSettings(learning_rate=1e5), torch.float32)
    assert within == ["learning_rate=100000, weight_decay=0, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-08"]
    decay = run_safety._update_suspects(OptimizerSettings(learning_rate=1.0, weight_decay=1.5), torch.float32)
    assert decay == [
        "weight_decay=1.5 with learning_rate=1 (each update scales the weights by 1 - learning_rate x weight_decay)"
    ]
    # A product of exactly 1 zeroes the weights each update instead of overshooting 0: not that suspect.
    zeroing = run_safety._update_suspects(OptimizerSettings(learning_rate=1.0, weight_decay=1.0), torch.float32)
    assert zeroing == ["learning_rate=1, weight_decay=1, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-08"]
    largest = run_safety._update_suspects(OptimizerSettings(learning_rate=65504.0), torch.float16)
    assert largest == ["learning_rate=65504, weight_decay=0, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-08"]


def test_a_non_finite_element_of_a_list_setting_names_the_whole_list():
    @dataclasses.dataclass
    class WeightedRewards:
        reward_weights: list = dataclasses.field(default_factory=lambda: [1.0, math.nan])
        learning_rate: float = 1e-5

    assert run_safety.non_finite_settings(WeightedRewards()) == ["reward_weights=[1.0, nan]"]

    @dataclasses.dataclass
    class WithMethodSettings:
        credit_kwargs: dict = dataclasses.field(default_factory=lambda: {"taco_alpha": math.inf, "taco_lambda": 0.9})

    assert run_safety.non_finite_settings(WithMethodSettings()) == ["taco_alpha=inf"]


def test_the_last_checkpoint_is_the_latest_checkpoint_folder_up_to_the_step(tmp_path):
    for name in ("checkpoint-2", "checkpoint-5", "checkpoint-best"):
        (tmp_path / name).mkdir()
    (tmp_path / "checkpoint-3").write_text("a file, not a checkpoint")
    assert run_safety.last_checkpoint(tmp_path, 4) == str(tmp_path / "checkpoint-2")
    assert run_safety.last_checkpoint(tmp_path, 5) == str(tmp_path / "checkpoint-5")
    assert run_safety.last_checkpoint(tmp_path, 1) is None


def test_an_update_made_non_finite_names_the_settings_beyond_the_weights_own_dtype(tmp_path):
    """The guard reads the dtype of the weights it checks: a learning rate within float32 but beyond float16 is the
    likely cause for float16 weights."""
    model = torch.nn.Linear(2, 2, bias=False).half()  # one weight tensor: the dtype is its own
    model.weight.data[0, 0] = math.inf
    guard = _guard_on_one_process()
    args = OptimizerSettings(learning_rate=1e5, output_dir=str(tmp_path))
    with pytest.raises(NonFiniteTrainingError) as raised:
        guard.on_optimizer_step(args, SimpleNamespace(global_step=0), None, model=model)
    assert "(likely cause: learning_rate=100000 (beyond float16))" in str(raised.value)
    args = OptimizerSettings(learning_rate=math.nan, weight_decay=math.inf, output_dir=str(tmp_path))
    with pytest.raises(NonFiniteTrainingError) as raised:
        guard.on_optimizer_step(args, SimpleNamespace(global_step=0), None, model=model)
    assert "(likely cause: learning_rate=nan or weight_decay=inf)" in str(raised.value)


def test_infinite_rewards_of_two_functions_name_both(tmp_path):
    guard = _guard_on_one_process()
    guard.saw_rewards(torch.tensor([[math.inf, 1.0, -math.inf], [0.0, 1.0, 0.0]]), ["accuracy", "format", "length"])
    with pytest.raises(NonFiniteTrainingError) as raised:
        guard.on_pre_optimizer_step(OptimizerSettings(output_dir=str(tmp_path)), SimpleNamespace(global_step=4), None)
    assert str(raised.value) == (
        "step 5: the rewards of accuracy, length are not finite (likely cause: accuracy returning inf or length "
        "returning inf); training stopped before saving step 5; no checkpoint was saved"
    )


def test_a_non_finite_loss_of_any_micro_batch_of_a_step_stops_it(tmp_path):
    """Under gradient accumulation the guard sees each micro-batch's loss: the first one's NaN is not hidden by the
    finite loss of the last."""
    guard = _guard_on_one_process()
    guard.saw_loss(torch.tensor(math.nan))
    guard.saw_loss(torch.tensor(0.5))
    with pytest.raises(NonFiniteTrainingError, match="^step 1: the loss is not finite"):
        guard.on_pre_optimizer_step(
            OptimizerSettings(output_dir=str(tmp_path)),
            SimpleNamespace(global_step=0),
            None,
            model=torch.nn.Linear(2, 2),
        )
