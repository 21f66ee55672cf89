"""Resuming from a checkpoint continues a run exactly: same method state, same advantages, same weights.

Run A trains 4 steps and saves checkpoint-2 on the way; run B is a fresh trainer built like A (from the initial
model, as a resumed job is) that resumes from A's checkpoint-2. Transformers restores the RNG states, so B generates
the same completions as A at steps 3-4, and every logged metric of those steps (rewards, losses, gradient norms, the
method's statistics: EAPO's decayed kappa and quantiles, TIDE's deviation from its reference, Clip-Cov's random
draw) and the final weights
must equal A's. TIDE's 'old' reference (the policy of the previous generation batch) is not in the model weights:
the trainer saves it next to them, and this test fails without that. Every registered method and documented stack
resumes, in settings where it moves credit, and run A's credit equals the reference rules (`AdvantageRecorder`).
"""

import json
import math
import os
from collections import Counter

import pytest
import torch
from conftest import (
    make_tiny_tokenizer,
    tiny_config,
    tiny_trainer,
)
from trainer_helpers import AdvantageRecorder, moving_settings, path_cases
from transformers import TrainerCallback

from trl_credit.cli.inspect import main as inspect_main
from trl_credit.reports import token_view
from trl_credit.trainer.reference import PREVIOUS_POLICY_FILE as TIDE_OLD_REFERENCE_NAME
from trl_credit.trainer.run_record import RUN_RECORD, NothingToTrain

TIMING_KEYS = {"step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss"}


def _trainer(method, output_dir, **overrides):
    tokenizer = make_tiny_tokenizer()
    settings = dict(max_steps=4, save_strategy="steps", save_steps=2) | overrides
    args = tiny_config(method, output_dir, **settings)
    return tiny_trainer(args, tokenizer=tokenizer)


def _step_logs(trainer, steps):
    return {e["step"]: e for e in trainer.state.log_history if "loss" in e and e["step"] in steps}


# What resuming must carry over besides the weights, where the moving settings leave it out: EAPO's kappa decay, and
# Clip-Cov's random draw seeded by the step, on a range wide enough that the resumed run must detach the same tokens.
RESUME_SETTINGS = {
    "eapo": {"eapo_kappa_decay_steps": 4},
    "clip_cov": {"clip_cov_ratio": 0.5, "clip_cov_lb": -100.0, "clip_cov_ub": 100.0},
}
CASES = [pytest.param(case.values[0], {}, id=case.id, marks=case.marks) for case in path_cases()] + [
    pytest.param("tide", {"tide_reference": "old"}, id="tide-old")
]


@pytest.mark.parametrize("method,extra", CASES)
def test_resume_equals_uninterrupted_run(monkeypatch, tmp_path, method, extra):
    overrides = moving_settings(method)
    for name in method.split("+"):
        overrides.update(RESUME_SETTINGS.get(name, {}))
    overrides.update(extra)
    uninterrupted = _trainer(method, tmp_path / "a", **overrides)
    # The uninterrupted run's credit is the reference rules' (and moved); the resumed run must equal it.
    recorder = AdvantageRecorder(monkeypatch, uninterrupted)
    uninterrupted.train()
    assert recorder.checked_batches == 4
    recorder.assert_credit_moved()
    monkeypatch.undo()
    checkpoint = tmp_path / "a" / "checkpoint-2"
    assert checkpoint.is_dir()
    assert (checkpoint / TIDE_OLD_REFERENCE_NAME).exists() == (overrides.get("tide_reference") == "old")

    resumed = _trainer(method, tmp_path / "b", **overrides)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.state.global_step == 4

    want, got = _step_logs(uninterrupted, {3, 4}), _step_logs(resumed, {3, 4})
    assert sorted(got) == [3, 4]
    for step in (3, 4):
        keys = set(want[step]) - TIMING_KEYS
        assert keys == set(got[step]) - TIMING_KEYS
        for key in sorted(keys):
            if want[step][key] is None:
                assert got[step][key] is None, key
            else:
                assert got[step][key] == pytest.approx(want[step][key], rel=1e-5, abs=1e-7), f"step {step}: {key}"
    print(
        f"\n[resume] {method} {extra}: max |consumed - recomputed| = {recorder.max_difference:.2e}, "
        f"moved share = {recorder.moved_share():.3f}"
    )
    if method == "eapo":
        assert [got[s]["eapo/kappa"] for s in (3, 4)] == pytest.approx([math.log(4) / 2, math.log(4) / 4])
    if method == "tide":
        assert got[3]["tide/mean_deviation"] > 0
    if method == "stare":
        assert got[3]["stare/reweighted_fraction"] > 0
    if method == "clip_cov":  # tokens were drawn at the resumed steps, so the same draw was checked
        assert all(got[s]["clip_cov/detached_fraction"] > 0 for s in (3, 4))
    for (name, p_want), (_, p_got) in zip(uninterrupted.model.named_parameters(), resumed.model.named_parameters()):
        torch.testing.assert_close(p_got, p_want, atol=1e-7, rtol=1e-6, msg=name)


def test_tide_old_checkpoint_without_reference_falls_back_to_resumed_policy(tmp_path, caplog):
    """A checkpoint written without the reference file (e.g. by an older version) resumes with a warning."""
    first = _trainer("tide", tmp_path / "a", tide_reference="old", max_steps=2)
    first.train()
    checkpoint = tmp_path / "a" / "checkpoint-2"
    os.remove(checkpoint / TIDE_OLD_REFERENCE_NAME)
    resumed = _trainer("tide", tmp_path / "b", tide_reference="old", max_steps=3)
    with caplog.at_level("WARNING"):
        resumed.train(resume_from_checkpoint=str(checkpoint))
    assert TIDE_OLD_REFERENCE_NAME in caplog.text
    (entry,) = [e for e in resumed.state.log_history if e.get("step") == 3 and "loss" in e]
    assert entry["tide/mean_deviation"] == pytest.approx(0.0, abs=1e-6)  # reference = the resumed policy itself


class _InterruptAtStep(TrainerCallback):
    """Ctrl-C during `step`, after its batch was generated and its token credit written, before its checkpoint."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise KeyboardInterrupt


def test_resume_after_an_interrupt_records_each_step_token_credit_once(tmp_path, capsys):
    run = tmp_path / "run"
    settings = dict(max_steps=3, save_steps=1, log_token_credit=True, token_credit_samples=4)
    interrupted = _trainer("taco", run, **settings)
    interrupted.add_callback(_InterruptAtStep(2))
    with pytest.raises(KeyboardInterrupt):
        interrupted.train()
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-1"]
    assert Counter(r["step"] for r in token_view.read_token_credit(run)) == {1: 4, 2: 4}  # step 2 was logged

    resumed = _trainer("taco", run, **settings)  # a new process would build the same trainer
    resumed.train(resume_from_checkpoint=str(run / "checkpoint-1"))
    records = token_view.read_token_credit(run)
    assert Counter(r["step"] for r in records) == {1: 4, 2: 4, 3: 4}
    # Each step's records are the batch that step trained on: all 4 completions, so their mean is the logged reward.
    for step in (1, 2, 3):
        logged = next(e["reward"] for e in resumed.state.log_history if e.get("step") == step and "reward" in e)
        step_rewards = [r["reward"] for r in records if r["step"] == step]
        assert sum(step_rewards) / len(step_rewards) == pytest.approx(logged), step

    capsys.readouterr()
    assert inspect_main([str(run), "--step", "2", "--all"]) == 0
    assert "showing all 4 completions" in capsys.readouterr().out


def test_every_saved_file_gets_the_same_mode(tmp_path):
    """safetensors writes through a temporary file (mode 0600); the model, the reference and the rest are alike."""
    trainer = _trainer("tide", tmp_path / "run", tide_reference="old", max_steps=1, save_steps=1)
    trainer.train()
    trainer.save_model()
    checkpoint = tmp_path / "run" / "checkpoint-1"
    weights = [
        checkpoint / TIDE_OLD_REFERENCE_NAME,
        checkpoint / "model.safetensors",
        tmp_path / "run" / "model.safetensors",
    ]
    assert all(path.is_file() for path in weights)
    modes = {path.relative_to(tmp_path).as_posix(): oct(path.stat().st_mode & 0o777) for path in weights}
    expected = oct((tmp_path / "run" / "training_args.bin").stat().st_mode & 0o777)
    assert set(modes.values()) == {expected}, modes


# ------------------------------------------------------------------------------------- a resume belongs to its run


def test_a_checkpoint_of_another_method_is_refused_before_it_loads_unless_asked(tmp_path):
    first = _trainer("taco", tmp_path / "a", max_steps=1, save_steps=1)
    first.train()
    checkpoint = tmp_path / "a" / "checkpoint-1"
    other = _trainer("eapo", tmp_path / "b", max_steps=2)
    with pytest.raises(ValueError, match=r"it was trained with taco \(taco_alpha=0.01, taco_lambda=0.9\), but this"):
        other.train(resume_from_checkpoint=str(checkpoint))
    assert other.state.global_step == 0 and not list((tmp_path / "b").glob("checkpoint-*"))
    asked = _trainer("eapo", tmp_path / "b", max_steps=2, resume_with_other_method=True)
    asked.train(resume_from_checkpoint=str(checkpoint))
    assert asked.state.global_step == 2
    stacks = [(entry["from_step"], entry["credit_method"]) for entry in asked.run_record["stacks"]]
    assert stacks == [(1, "taco"), (2, "eapo")]
    assert (
        json.loads((tmp_path / "b" / "checkpoint-2" / RUN_RECORD).read_text())["stacks"] == asked.run_record["stacks"]
    )


def test_a_checkpoint_saved_before_runs_were_recorded_resumes_with_a_warning(tmp_path, caplog):
    _trainer("taco", tmp_path / "a", max_steps=1, save_steps=1).train()
    checkpoint = tmp_path / "a" / "checkpoint-1"
    os.remove(checkpoint / RUN_RECORD)
    resumed = _trainer("taco", tmp_path / "a", max_steps=2, save_steps=1)
    with caplog.at_level("WARNING"):
        resumed.train(resume_from_checkpoint=str(checkpoint))
    assert f"{checkpoint} has no {RUN_RECORD}" in caplog.text and resumed.state.global_step == 2


@pytest.mark.parametrize("schedule", [{"max_steps": 2}, {"max_steps": -1, "num_train_epochs": 1}])
def test_a_checkpoint_at_the_last_step_has_nothing_to_train(tmp_path, schedule):
    """transformers trains one step before its stopping check: a finished run would go on to step 3."""
    settings = dict(save_steps=1, **schedule)
    finished = _trainer("taco", tmp_path / "a", **settings)
    finished.train()
    last = finished.state.global_step
    resumed = _trainer("taco", tmp_path / "a", **settings)
    with pytest.raises(NothingToTrain, match=f"checkpoint-{last} is at step {last} and the run ends at step {last}"):
        resumed.train(resume_from_checkpoint=True)  # the last checkpoint of output_dir
    assert resumed.state.global_step == last and not (tmp_path / "a" / f"checkpoint-{last + 1}").exists()
