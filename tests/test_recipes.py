"""The packaged recipes (configs/*.yaml) parse, by packaged name, without a deprecation warning of TRL or
transformers."""

import importlib.util
import warnings

import pytest

from trl_credit.cli.grpo import parse_arguments
from trl_credit.resources import QUICK_START, recipes, yaml_names


@pytest.mark.parametrize("recipe", yaml_names(recipes()))
def test_recipe_uses_current_argument_names(recipe):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # GPU recipes ask for bf16, which TrainingArguments refuses on a CPU-only machine: override just that.
        argv = ["--config", recipe, "--bf16", "false", "--use_cpu", "true"]
        if importlib.util.find_spec("tensorboard") is None:  # the recipes' [tensorboard] extra (test_cli.py)
            argv += ["--report_to", "none"]
        parse_arguments(argv)
    deprecations = [str(w.message) for w in caught if issubclass(w.category, (FutureWarning, DeprecationWarning))]
    assert not deprecations, f"{recipe}: {deprecations}"


def test_quick_start_writes_no_optimizer_state_unless_asked(tmp_path, tiny_model_dir):
    """The quick start's saving settings, on the tiny model: the final model only; full checkpoints on request."""
    import json

    from trl_credit.cli import main as cli_main

    data = tmp_path / "problems.jsonl"
    data.write_text(
        "".join(json.dumps({"question": f"what is {a} + 1 ?", "answer": str(a + 1)}) + "\n" for a in range(8))
    )
    small = ["--model_name_or_path", tiny_model_dir, "--dataset_name", str(data), "--max_train_samples", "8"]
    small += ["--per_device_train_batch_size", "4", "--max_completion_length", "6", "--max_steps", "2"]
    quick_start = QUICK_START  # by its packaged name, as `trl-credit grpo` reads it without --config

    assert cli_main(["grpo", "--config", quick_start, *small, "--output_dir", str(tmp_path / "plain")]) == 0
    written = {path.name for path in (tmp_path / "plain").rglob("*")}
    assert "model.safetensors" in written and "trainer_state.json" in written
    assert not {name for name in written if name.startswith("checkpoint-") or name == "optimizer.pt"}

    asked = ["--save_strategy", "steps", "--save_steps", "2", "--output_dir", str(tmp_path / "resumable")]
    assert cli_main(["grpo", "--config", quick_start, *small, *asked]) == 0
    assert (tmp_path / "resumable" / "checkpoint-2" / "optimizer.pt").is_file()
