"""The repository ignores the folders its commands write by default, as the commands name them."""

import dataclasses
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _default(config_class, name: str) -> str:
    return next(f.default for f in dataclasses.fields(config_class) if f.name == name)


def _default_output_folders() -> dict[str, str]:
    """The first folder of each command's default output path."""
    from trl_credit.cli.grpo import parse_arguments
    from trl_credit.experiments.compare.plan import CompareConfig
    from trl_credit.experiments.evaluation import EvalConfig
    from trl_credit.experiments.lab.lab_runs import LabConfig

    grpo_output = parse_arguments(["--method", "taco"])[1].output_dir  # the quick start
    eval_output = EvalConfig(model_name_or_path="m", dataset_name="gsm8k").output_dir
    return {
        "grpo": Path(grpo_output).parts[0],
        "eval": Path(eval_output).parts[0],
        "compare": Path(_default(CompareConfig, "output_dir")).parts[0],
        "lab": Path(_default(LabConfig, "output_dir")).parts[0],
    }


@pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(),
    reason="needs git and a git checkout of the repository: git clone, and apt-get install git",
)
def test_default_output_folders_are_ignored():
    folders = _default_output_folders()
    assert len(set(folders.values())) == 4  # four commands, four folders
    for command, folder in folders.items():
        probe = f"{folder}/run/model.safetensors"
        result = subprocess.run(["git", "check-ignore", "-q", probe], cwd=ROOT, check=False)
        assert result.returncode == 0, f"{probe} (written by `trl-credit {command}`) is not ignored by .gitignore"


@pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(),
    reason="needs git and a git checkout of the repository: git clone, and apt-get install git",
)
def test_a_virtual_environment_in_the_checkout_is_ignored():
    # `python -m venv .venv` in the clone, as a new user does before `pip install -e ".[test]"`.
    result = subprocess.run(["git", "check-ignore", "-q", ".venv/bin/python"], cwd=ROOT, check=False)
    assert result.returncode == 0, ".venv/ (a virtual environment) is not ignored by .gitignore"
