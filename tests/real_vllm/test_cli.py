"""`trl-credit grpo --use_vllm true` and `trl-credit eval --backend vllm`, each in its own process as a user runs them
(`grpo` with the colocate CPU shims of `cpu_shims.py` applied first)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import tiny_recipe
from trainer_helpers import moving_settings

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent


def run(arguments, shims=False):
    """`trl-credit ARGUMENTS` in a fresh process; with `shims`, after `cpu_shims.apply_colocate_shims()`."""
    launcher = ["-c", "from real_vllm.cpu_shims import run_cli; run_cli()"] if shims else ["-m", "trl_credit.cli"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)]), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *launcher, *arguments], capture_output=True, text=True, env=env, cwd=ROOT)


def test_grpo_cli_trains_with_colocated_vllm(tmp_path, vllm_model_dir):
    """Rewards that differ within every group (2 prompts of 4 completions a step), and TACO's tail threshold where
    tokens fall in the tail (`MOVING_SETTINGS`): the run trains (gradient norm > 0) and TACO moves credit."""
    reward = ["real_vllm.helpers:distinct_in_group_reward"]  # no tied group, whatever vLLM samples
    recipe = tiny_recipe(tmp_path, vllm_model_dir, max_steps=2, per_device_train_batch_size=8, reward_funcs=reward)
    flags = ["--use_vllm", "true", "--vllm_mode", "colocate", "--vllm_gpu_memory_utilization", "0.1"]
    flags += [f"--{name}={value}" for name, value in moving_settings("taco").items()]
    done = run(["grpo", "--config", str(recipe), "--method", "taco", *flags], shims=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trl-credit: taco on" in done.stdout
    steps = [
        e for e in json.loads((tmp_path / "run" / "trainer_state.json").read_text())["log_history"] if "loss" in e
    ]
    assert len(steps) == 2
    for entry in steps:  # vLLM generated, TRL's IS correction ran (its old-log-prob forward feeds TACO's statistics)
        assert entry["credit/extra_forwards"] == 0 and "sampling/importance_sampling_ratio/mean" in entry
        assert entry["reward_std"] > 0 and entry["grad_norm"] > 0
    assert any(entry["taco/tail_fraction_pos"] > 0 for entry in steps)  # positive credit in the tail was shrunk
    assert (tmp_path / "run" / "model.safetensors").is_file()


def test_eval_cli_with_the_vllm_backend_samples_what_transformers_does(tmp_path, vllm_model_dir):
    """Greedy decoding in float32: vLLM's completions are transformers' (vLLM's detokenizer joins the tiny
    tokenizer's words without the spaces transformers puts between them)."""
    problems = tmp_path / "problems.jsonl"
    problems.write_text(
        "".join(json.dumps({"question": f"what is {a} + 1 ?", "answer": str(a + 1)}) + "\n" for a in range(3))
    )
    common = [
        "--model_name_or_path",
        vllm_model_dir,
        "--dataset_name",
        str(problems),
        "--n",
        "2",
        "--temperature",
        "0",
    ]
    common += ["--max_new_tokens", "6", "--dtype", "float32", "--update_model_card", "false"]
    outputs = {}
    for backend in ("vllm", "transformers"):
        extra = ["--vllm_gpu_memory_utilization", "0.1"] if backend == "vllm" else []
        done = run(["eval", *common, "--backend", backend, "--output_dir", str(tmp_path / backend), *extra])
        assert done.returncode == 0, done.stderr[-3000:]
        rows = [json.loads(line) for line in (tmp_path / backend / "completions.jsonl").read_text().splitlines()]
        outputs[backend] = [["".join(text.split()) for text in row["completions"]] for row in rows]
        assert json.loads((tmp_path / backend / "summary.json").read_text())["n"] == 2
    assert len(outputs["vllm"]) == 3 and all(len(group) == 2 for group in outputs["vllm"])
    assert outputs["vllm"] == outputs["transformers"]


def test_grpo_cli_asks_vllm_about_its_settings_before_any_model(tmp_path, vllm_model_dir):
    """With `--use_vllm true`, vLLM's own checks (its engine config, `SamplingParams`) refuse, when the arguments are
    parsed, what they would refuse once the engine starts or samples; `--top_p 1.5` is one (our own field check leaves
    values above 1 to the sampler that reads them)."""
    recipe = tiny_recipe(tmp_path, vllm_model_dir, max_steps=1)
    cases = {
        (
            "--vllm_gpu_memory_utilization",
            "1.5",
        ): "vLLM's CacheConfig refuses: Input should be less than or equal to 1",
        ("--top_p", "1.5"): "--top_p is 1.5, which vLLM's SamplingParams refuses: top_p must be in (0, 1]",
        ("--repetition_penalty", "0"): "--repetition_penalty is 0.0, which vLLM's SamplingParams refuses: ",
    }
    from trl_credit.cli import UsageError
    from trl_credit.cli.grpo_arguments import parse_arguments

    arguments = ["--config", str(recipe), "--use_vllm", "true", "--output_dir", str(tmp_path / "run")]
    for flags, message in cases.items():
        with pytest.raises(UsageError) as refused:
            parse_arguments([*arguments, *flags])
        assert message in str(refused.value) and len(str(refused.value).splitlines()) == 1, flags
    assert not (tmp_path / "run").exists()
