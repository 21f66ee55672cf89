"""Scale-out engines as far as a CPU allows: accelerate configs, the LM-head helpers, vLLM-style rollouts, gpu_check.

* The accelerate YAMLs load with accelerate's own config loader and mirror TRL's.
* vLLM is emulated by a `rollout_func` returning completions and sampling log-probs, with `use_vllm` switched on
  after construction: TRL's real vLLM code then runs the old-log-prob forward, computes the importance-sampling
  ratio and multiplies the per-token loss by it. Every registered method and documented stack trains there, in
  settings where it moves credit, and the advantages and loss mask TRL's loss consumed equal the reference rules of
  `tests/reference_credit.py` on statistics recomputed from the model's logits (`trainer_helpers.AdvantageRecorder`).
* DeepSpeed ZeRO-2, ZeRO-3 (LM head partitioned at every step, so `full_lm_head` gathers it and `vocab_size` reads
  `ds_shape`) and FSDP2 are tested for real with two processes in `test_multiprocess.py`, every method.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import (
    make_tiny_model,
    make_tiny_tokenizer,
    tiny_config,
    tiny_trainer,
)
from trainer_helpers import (
    AdvantageRecorder,
    assert_all_params_changed,
    make_rollout_func,
    moving_settings,
    on_vllm_branch,
    path_cases,
)

from trl_credit import CreditGRPOTrainer
from trl_credit.trainer.model_parts import full_lm_head, unsharded_root, vocab_size

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs" / "accelerate"


# ------------------------------------------------------------------------------------------- accelerate configs


@pytest.mark.parametrize(
    "name,distributed_type,extra",
    [
        ("single_gpu", "NO", {}),
        ("multi_gpu", "MULTI_GPU", {}),
        ("zero2", "DEEPSPEED", {"zero_stage": 2}),
        ("zero3", "DEEPSPEED", {"zero_stage": 3, "zero3_init_flag": True}),
        ("fsdp2", "FSDP", {"fsdp_version": 2}),
    ],
)
def test_accelerate_configs_load_and_mirror_trl(name, distributed_type, extra):
    import trl
    from accelerate.commands.config.config_args import load_config_from_file

    path = CONFIGS / f"{name}.yaml"
    config = load_config_from_file(str(path))
    assert config.distributed_type.value == distributed_type
    assert config.mixed_precision == "bf16" and config.num_machines == 1
    section = config.deepspeed_config if distributed_type == "DEEPSPEED" else config.fsdp_config
    for key, value in extra.items():
        assert section[key] == value, key
    ours = yaml.safe_load(path.read_text())
    theirs = yaml.safe_load((Path(trl.__file__).parent / "accelerate_configs" / f"{name}.yaml").read_text())
    assert ours == theirs


def test_accelerate_launch_parser_accepts_the_configs():
    """`accelerate launch --config_file` fills every field from each YAML without complaint."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    for path in sorted(CONFIGS.glob("*.yaml")):
        args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
        args, defaults, _ = _validate_launch_command(args)
        assert defaults is not None and args.num_processes == defaults.num_processes
        assert args.use_deepspeed == (defaults.distributed_type.value == "DEEPSPEED")
        assert args.use_fsdp == (defaults.distributed_type.value == "FSDP")


# ------------------------------------------------------------------------------------------------- LM head


def test_full_lm_head_and_unsharded_root_are_identity_without_sharding():
    model = make_tiny_model(make_tiny_tokenizer())
    assert vocab_size(model) == model.lm_head.weight.shape[0]
    with unsharded_root(model), full_lm_head(model) as (weight, bias):
        assert weight is model.lm_head.weight and bias is None


# ---------------------------------------------------------------------------------------- vLLM-style rollouts


class ISRecorder(CreditGRPOTrainer):
    """Records the importance-sampling ratios the loss received."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.is_ratios = []

    def _compute_loss(self, model, inputs):
        self.is_ratios.append(inputs["importance_sampling_ratio"])
        return super()._compute_loss(model, inputs)


def _train_through_vllm_path(monkeypatch, tmp_path, method, is_mode, **overrides):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.16
    tokenizer = make_tiny_tokenizer()
    settings = {**moving_settings(method), **overrides}
    args = tiny_config(
        method,
        tmp_path / "out",
        vllm_importance_sampling_mode=is_mode,
        vllm_importance_sampling_clip_max=2.0,
        **settings,
    )
    rollout_func = make_rollout_func(vary_lengths=True)  # rewards that vary within groups
    trainer = tiny_trainer(args, ISRecorder, tokenizer=tokenizer, rollout_func=rollout_func)
    on_vllm_branch(trainer)
    assert trainer.vllm_importance_sampling_correction
    recorder = AdvantageRecorder(monkeypatch, trainer)  # an independent recomputation of the consumed credit
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()

    steps = trainer.state.max_steps * trainer.args.gradient_accumulation_steps
    assert recorder.checked_batches == steps
    recorder.assert_credit_moved()
    generations = -(-steps // trainer.num_iterations)
    assert trainer.vllm_generation.syncs == generations  # one weight sync per generation batch
    ratios = torch.cat([r.flatten() for r in trainer.is_ratios])
    assert ratios.numel() and (ratios != 1).any()  # the correction really multiplied the per-token loss
    log = trainer.state.log_history[0]
    assert "sampling/importance_sampling_ratio/mean" in log
    assert_all_params_changed(before, dict(trainer.model.named_parameters()))
    for name in method.split("+"):
        assert name == "grpo" or any(key.startswith(f"{name}/") for key in log), f"{name} logged no metric of its own"
    print(
        f"\n[fake vLLM {is_mode}] {method}: max |consumed - recomputed| = {recorder.max_difference:.2e}, "
        f"moved share = {recorder.moved_share():.3f}"
    )
    return log


@pytest.mark.parametrize("method", path_cases())
def test_vllm_importance_sampling_path(monkeypatch, tmp_path, method):
    """Every registered method and documented stack through TRL's vLLM branch (IS correction, token_truncate)."""
    _train_through_vllm_path(monkeypatch, tmp_path, method, "token_truncate")


@pytest.mark.parametrize("method", path_cases())
def test_vllm_sequence_mask_path_over_two_iterations(monkeypatch, tmp_path, method):
    """The same with TRL's sequence-masking IS mode and `num_iterations=2` (each micro-batch trained on twice): 3 steps,
    so that a second generation batch comes from a trained policy (TIDE's deviation is 0 at the first)."""
    _train_through_vllm_path(monkeypatch, tmp_path, method, "sequence_mask", num_iterations=2)


# ------------------------------------------------------------------------------------------------- gpu_check


def _gpu_check():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return gpu_check


def test_gpu_check_refuses_clearly_without_cuda(monkeypatch):
    gpu_check = _gpu_check()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="CUDA is not available"):
        gpu_check.main(["--model", "unused"])


def test_gpu_check_cpu_smoke_run():
    """Every part of the GPU check but the CUDA kernel branch, on the tiny model: kernels against float64, both
    regimes, a method that drops tokens, the controls."""
    gpu_check = _gpu_check()
    report = gpu_check.main(
        [
            "--device",
            "cpu",
            "--tiny",
            "--steps",
            "2",
            "--prompts",
            "2",
            "--max_completion_length",
            "4",
            "--methods",
            "grpo,stapo,tide,grpo_beta",
            "--vllm-methods",
            "grpo,eapo,tide",
            "--kernel-tokens",
            "64",
        ]
    )
    runs = [(r["regime"], r["method"]) for r in report["runs"]]
    assert runs == [("generate", m) for m in ("grpo", "stapo", "tide", "grpo_beta")] + [
        ("vllm", m) for m in ("grpo", "eapo", "tide")
    ]
    assert all(r["steps"] == 2 and r["step_s"] > 0 and r["finite_loss"] for r in report["runs"])
    assert report["kernels"]["ok"] and not report.get("failed") and not report["skipped"]
    assert report["kernels"]["softcap"]["max_abs_error"]["deviation"] < 1e-5  # float32 on CPU


def test_gpu_check_carries_what_the_gpu_image_lacks():
    """The wheels `--fetch-wheels` downloads (`.ci/floors` fetches and installs them for real): trl, datasets,
    math-verify and the packages only they need here, never one the image's torch or transformers brings."""
    from importlib.metadata import version

    carried = _gpu_check().carried_distributions()
    lacking = {"trl", "datasets", "math-verify", "latex2sympy2-extended", "dill", "multiprocess", "xxhash"}
    assert lacking <= set(carried), lacking - set(carried)
    assert carried["trl"] == version("trl") and carried["datasets"] == version("datasets")
    image = {"torch", "transformers", "accelerate", "numpy", "huggingface-hub", "pyarrow", "pandas", "tokenizers"}
    assert not image & set(carried), image & set(carried)


def test_gpu_check_exits_non_zero_when_a_run_fails():
    """A failed run is reported, the others still run, and the exit status says so: one generation per prompt is a
    config TRL refuses, so every run of this call fails for real."""
    import os
    import subprocess

    command = [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--tiny"]
    command += ["--steps", "1", "--prompts", "2", "--generations", "1", "--max_completion_length", "2"]
    command += ["--regimes", "generate", "--methods", "grpo,taco", "--kernel-tokens", "16"]
    done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "[generate] grpo: FAILED" in done.stdout and "[generate] taco: FAILED" in done.stdout
    assert "kernels ok; 2 failed runs" in done.stdout


# ------------------------------------------------------------------------------------------ multi-node SLURM


def test_slurm_multinode_dry_run(tmp_path):
    """The SLURM example parses, puts vLLM on the last node, and writes per-node accelerate configs that load."""
    import os
    import subprocess

    from accelerate.commands.config.config_args import load_config_from_file

    script = ROOT / "examples" / "slurm_multinode.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    env = dict(os.environ, DRY_RUN="1", NODELIST="n1 n2 n3", RUN_DIR=str(tmp_path), METHOD="eapo")
    proc = subprocess.run(["bash", str(script), "--max_steps", "7"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    server, train = [line for line in proc.stdout.splitlines() if line.startswith(("srun", "trl-credit"))]
    assert "--nodelist=n3 trl vllm-serve" in server
    assert train.startswith("trl-credit grpo --method eapo")
    for flag in (
        "--use_vllm",
        "--vllm_mode server",
        "--vllm_server_host n3",
        "--max_steps 7",
        f"--accelerate_config {tmp_path}/accelerate_node0.yaml",
    ):
        assert flag in train, flag
    config = load_config_from_file(str(tmp_path / "accelerate_node0.yaml"))
    assert (config.num_machines, config.num_processes, config.machine_rank) == (2, 16, 0)
    assert config.main_process_ip == "n1" and config.distributed_type.value == "DEEPSPEED"
    one_node = subprocess.run(["bash", str(script)], env=dict(env, NODELIST="n1"), capture_output=True, text=True)
    assert one_node.returncode == 2 and "at least 2 nodes" in one_node.stderr
