"""Model cards: TRL's sections and order, the credit method, valid metadata, no secrets, push content."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
from fake_runs import write_fake_trainer_state
from huggingface_hub import ModelCard, ModelCardData

from trl_credit import model_card
from trl_credit.plots import save_training_plots

FAKE_TOKEN = "hf_" + "FakeSecretValue0123456789abcdefXYZ"
TACO_PAPER = {
    "title": "When Implausible Tokens Get Reinforced: Tail-Aware Credit Calibration for LLM Reinforcement Learning",
    "id": "2607.07976",
    "citation": "@article{taco2026,\n  title = {When Implausible Tokens Get Reinforced},\n  eprint = {arXiv:2607.07976},\n}",
}
GRPO_PAPER = {"title": "DeepSeekMath", "id": "2402.03300", "citation": "@article{shao2024deepseekmath,\n}"}
TACO_HYPERPARAMETERS = {"credit_method": "taco", "taco_alpha": 0.01, "taco_lambda": 0.9, "learning_rate": 1e-6}


def make_card(**overrides) -> ModelCard:
    arguments = dict(
        base_model="HuggingFaceTB/SmolLM2-135M-Instruct", model_name="smollm2-taco", hub_model_id="someone/smollm2-taco",
        dataset_name="open-r1/DAPO-Math-17k-Processed", method="taco", hyperparameters=TACO_HYPERPARAMETERS,
        tags=["math"], plots=["plots/reward.png", "plots/taco_diagnostics.png"], eval_summary=None,
        trainer_name="TACO", papers=[{**TACO_PAPER, "name": "taco"}], grpo_paper=GRPO_PAPER,
    )
    return model_card.generate_credit_model_card(**{**arguments, **overrides})


def _headings(markdown: str) -> list[str]:
    # Headings outside fenced code blocks only.
    return re.findall(r"^(#{1,3} [^\n]+)$", re.sub(r"```.*?```", "", markdown, flags=re.DOTALL), flags=re.MULTILINE)


def test_metadata_validates_and_has_the_tags():
    card = make_card()
    reparsed = ModelCard(card.content)  # parses and validates the YAML header
    data = reparsed.data.to_dict()
    assert data["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert data["datasets"] == ["open-r1/DAPO-Math-17k-Processed"]
    assert data["library_name"] == "transformers"
    assert {"trl", "grpo", "trl-credit", "taco", "math"} <= set(data["tags"])
    ModelCardData(**data)


def test_sections_follow_trl_and_add_the_credit_method():
    trl_template = Path(importlib.util.find_spec("trl").submodule_search_locations[0]) / "templates" / "lm_model_card.md"
    trl_headings = [h for h in _headings(trl_template.read_text()) if "{{" not in h]
    headings = _headings(make_card(eval_summary={"dataset": "math500", "n": 500, "avg@n": 0.4, "pass@k": {"1": 0.4}}).content)
    # TRL's sections appear in TRL's order, ours are inserted around them.
    assert [h for h in headings if h in trl_headings] == trl_headings
    expected = ["## Quick start", "## Training procedure", "### Credit method: TACO", "### Training data",
                "### Training curves", "### Framework versions", "## Evaluation", "## Citations"]
    assert [h for h in headings if h in expected] == expected


def test_method_paper_hyperparameters_plots_and_citations():
    text = make_card().content
    assert "https://huggingface.co/papers/2607.07976" in text and "https://huggingface.co/papers/2402.03300" in text
    for name, value in [("taco_alpha", "0.01"), ("taco_lambda", "0.9"), ("learning_rate", "1e-06")]:
        assert f"| `{name}` | `{value}` |" in text
    assert "![reward](plots/reward.png)" in text and "![taco diagnostics](plots/taco_diagnostics.png)" in text
    assert text.index("Cite TACO as") < text.index("Cite GRPO as") < text.index("Cite TRL as")
    assert TACO_PAPER["citation"] in text and GRPO_PAPER["citation"] in text
    assert "## Evaluation" not in text and "\n\n\n" not in text
    assert "[open-r1/DAPO-Math-17k-Processed](https://huggingface.co/datasets/open-r1/DAPO-Math-17k-Processed)" in text


def test_grpo_citation_defaults_to_trl_and_is_not_repeated():
    card = make_card(method="grpo", trainer_name="GRPO", papers=[], grpo_paper=None, hyperparameters={})
    text = card.content
    assert "DeepSeekMath" in text and "2402.03300" in text  # from trl.GRPOTrainer._paper
    assert text.count("@article{shao2024deepseekmath") == 1 and "Cite GRPO as" in text


def test_evaluation_table_from_summaries(tmp_path):
    (tmp_path / "eval_math500.json").write_text(json.dumps(
        {"model": "m", "dataset": "math500", "n": 500, "avg@k": {"8": 0.41, "16": 0.43},
         "pass@k": {"1": 0.4, "8": 0.7}, "mean_completion_length": 812.5}))
    (tmp_path / "eval_gsm8k.json").write_text(json.dumps(
        {"model": "m", "dataset": "gsm8k", "n": 1319, "avg@n": 0.62, "pass@k": {"1": 0.6}}))
    (tmp_path / "eval_notes.json").write_text("[1, 2]")  # not a summary: ignored
    summaries = model_card.load_eval_summaries(tmp_path)
    assert [s["dataset"] for s in summaries] == ["gsm8k", "math500"]
    text = make_card(eval_summary=summaries).content
    assert "| Dataset | n | avg@8 | avg@16 | avg@n | pass@1 | pass@8 | Mean completion length |" in text
    assert "| gsm8k | 1319 | – | – | 0.62 | 0.6 | – | – |" in text
    assert "| math500 | 500 | 0.41 | 0.43 | – | 0.4 | 0.7 | 812.5 |" in text


def test_unknown_method_is_rejected():
    with pytest.raises(ValueError, match="unknown credit method 'ppo'"):
        make_card(method="ppo")


def test_no_token_in_card_or_upload(tmp_path, monkeypatch, tiny_model_dir):
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    monkeypatch.setenv("WANDB_API_KEY", "wandb-secret-0123456789")
    output_dir = Path(tiny_model_dir)  # a saved model and tokenizer, as at the end of training
    history = json.loads(write_fake_trainer_state(tmp_path / "state.json").read_text())["log_history"]
    plots = save_training_plots(history, output_dir)
    card = make_card(
        plots=plots,
        hyperparameters={**TACO_HYPERPARAMETERS, "hub_token": FAKE_TOKEN, "tide_token_chunk_size": 256,
                         "note": f"pushed with {FAKE_TOKEN}", "tracker_key": "wandb-secret-0123456789"},
        wandb_url=f"https://wandb.ai/someone/run?token={FAKE_TOKEN}",
    )
    card.save(output_dir / "README.md")
    text = (output_dir / "README.md").read_text()
    assert FAKE_TOKEN not in text and "wandb-secret" not in text and "hf_" not in text
    assert "| `hub_token` | `<redacted>` |" in text and "| `tide_token_chunk_size` | `256` |" in text

    # What Trainer.push_to_hub() would send: everything but checkpoints, `_*` files and .git.
    (output_dir / "checkpoint-2").mkdir()
    (output_dir / "checkpoint-2" / "model.safetensors").write_bytes(b"weights")
    (output_dir / "_scratch.txt").write_text("local only")
    (output_dir / ".git").mkdir()
    (output_dir / ".git" / "HEAD").write_text("ref")
    uploaded = model_card.collect_upload_folder(output_dir)
    assert {"README.md", "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", *plots} <= set(uploaded)
    assert not [path for path in uploaded if path.startswith(("checkpoint-", "_", ".git"))]
    for relative in uploaded:
        assert FAKE_TOKEN.encode() not in (output_dir / relative).read_bytes(), f"token in uploaded {relative}"


def test_a_stack_lists_every_method_with_its_paper():
    from trl_credit.methods import CREDIT_METHODS

    papers = [{**CREDIT_METHODS[name].paper, "name": name} for name in ("eapo", "taco")]
    text = make_card(method="eapo+taco", trainer_name="CreditGRPO", papers=papers).content
    assert "### Credit method: EAPO + TACO" in text and "each reshaping the token advantages" in text
    assert "https://huggingface.co/papers/2609.33781" in text and "https://huggingface.co/papers/2607.07976" in text
    assert text.index("Cite EAPO as") < text.index("Cite TACO as") < text.index("Cite GRPO as")
    assert "author       = {Lou, Xiuyi and Xu, Zicheng and Chuang, Yu-Neng and Le, Hoang Anh Duy" in text
    assert "and others" not in text
