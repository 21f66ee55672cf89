"""Evaluation: the pass@k estimator against the closed form, aggregation with a controlled generator, the real
transformers backend on a tiny model, and `trl-credit eval` refusing bad input before any model is loaded."""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

import pytest

from trl_credit.cli import main as dispatcher_main
from trl_credit.cli.eval import main as eval_main
from trl_credit.experiments import evaluation
from trl_credit.experiments.evaluation import Completion, EvalConfig, pass_at_k, run_evaluation, summarize
from trl_credit.experiments.evaluation import evaluate as eval_run


def closed_form_pass_at_k(n: int, c: int, k: int) -> float:
    return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))


def test_pass_at_k_matches_closed_form():
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(closed_form_pass_at_k(n, c, k), abs=1e-12)
    # Where C(n, k) overflows a float (n = 2000), the product form stays exact to rounding.
    assert pass_at_k(2000, 3, 100) == pytest.approx(closed_form_pass_at_k(2000, 3, 100), rel=1e-9)
    assert pass_at_k(10, 0, 5) == 0.0 and pass_at_k(10, 6, 5) == 1.0
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(4, 1, 5)


def test_summarize():
    metrics = summarize([0, 2, 4], n=4, ks=[1, 4], completion_lengths=[1, 2, 3, 6])
    assert metrics["avg@4"] == pytest.approx(0.5)
    assert metrics["pass@1"] == pytest.approx(0.5)
    assert metrics["pass@4"] == pytest.approx(2 / 3)
    assert metrics["mean_completion_length"] == 3.0 and metrics["num_problems"] == 3


class CountingBackend:
    """A generator with a known answer distribution: problem `i` gets `correct[i]` right answers out of `n`."""

    def __init__(self, golds: list[str], correct: list[int]):
        self.golds, self.correct, self.calls = golds, correct, 0

    def generate(self, prompts, n):
        self.calls += 1
        assert len(prompts) == len(self.golds)
        groups = []
        for gold, c in zip(self.golds, self.correct):
            wrong = str(int(gold) + 1)
            # Right answers boxed, as a last number, or as an equivalent fraction; wrong ones boxed.
            right = [rf"so \boxed{{{gold}}}", f"{gold}", rf"\boxed{{\frac{{{2 * int(gold)}}}{{2}}}}"]
            texts = [right[j % 3] for j in range(c)] + [rf"\boxed{{{wrong}}}"] * (n - c)
            groups.append([Completion(text, num_tokens=10 + j) for j, text in enumerate(texts)])
        return groups


def test_run_evaluation_with_a_controlled_generator(tmp_path):
    config = EvalConfig("unused", "chain_sum", num_problems=5, n=6, k=[1, 3, 6], output_dir=str(tmp_path / "out"))
    prepared = evaluation.prepare_eval_data(config)
    correct = [0, 1, 3, 5, 6]
    backend = CountingBackend(prepared.dataset["solution"], correct)
    summary = run_evaluation(config, prepared=prepared, backend=backend)

    assert summary["num_problems"] == 5 and summary["n"] == 6
    assert summary["avg@6"] == pytest.approx(sum(correct) / 30)
    for k in (1, 3, 6):
        expected = sum(closed_form_pass_at_k(6, c, k) for c in correct) / 5
        assert summary[f"pass@{k}"] == pytest.approx(expected)
    assert summary["mean_completion_length"] == pytest.approx(12.5)  # lengths 10..15 per problem
    assert summary["scoring"] == {"timeouts": 0, "parse_failures": 0, "no_answer": 0}

    records = [json.loads(line) for line in (tmp_path / "out" / "completions.jsonl").read_text().splitlines()]
    assert [r["num_correct"] for r in records] == correct
    assert [r["pass@3"] for r in records] == pytest.approx([closed_form_pass_at_k(6, c, 3) for c in correct])
    assert all(len(r["completions"]) == len(r["correct"]) == 6 for r in records)
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["pass@6"] == summary["pass@6"]


def test_cli_with_a_controlled_generator(tmp_path, monkeypatch, capsys, tiny_model_dir):
    correct = [2, 0, 4]

    def fake_build_backend(config, model_path):
        assert model_path == tiny_model_dir
        golds = evaluation.prepare_eval_data(config).dataset["solution"]
        return CountingBackend(golds, correct)

    monkeypatch.setattr(eval_run, "build_backend", fake_build_backend)
    argv = [
        "--model_name_or_path",
        tiny_model_dir,
        "--dataset_name",
        "chain_sum",
        "--num_problems",
        "3",
        "--n",
        "4",
        "--k",
        "1",
        "2",
        "--output_dir",
        str(tmp_path),
    ]
    assert dispatcher_main(["eval", *argv]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["pass@2"] == pytest.approx(sum(closed_form_pass_at_k(4, c, 2) for c in correct) / 3)
    assert printed["avg@4"] == pytest.approx(6 / 12)


def test_default_split_is_the_held_out_one():
    """Without `--dataset_split`, every named source is evaluated on its held-out split: TRL's test split when the
    source has one, never the split training loads by default (the first), and a one-split benchmark on its split."""
    from trl import ScriptArguments

    from trl_credit.data import SOURCES

    trl_test_split = ScriptArguments.__dataclass_fields__["dataset_test_split"].default
    for name, spec in SOURCES.items():
        split = EvalConfig("unused", name).dataset_split
        assert split in spec.splits, name
        if trl_test_split in spec.splits:
            assert split == trl_test_split, name
        else:
            assert spec.splits == (split,), name
        if len(spec.splits) > 1:
            assert split != spec.splits[0], name
    # A Hub id that is no named source: TRL's test split; a local file has one split, read whole.
    assert EvalConfig("unused", "someone/problems").dataset_split == trl_test_split
    assert EvalConfig("unused", "problems.jsonl").dataset_split is None
    assert EvalConfig("unused", "chain_sum", dataset_split="train").dataset_split == "train"  # an explicit split wins


def test_cli_adds_the_results_to_a_trl_credit_model_card(tmp_path, monkeypatch, capsys):
    """`trl-credit eval` on a training folder: the summary lands there and the card's YAML carries its numbers and the
    held-out split it evaluated by default."""
    import yaml

    from trl_credit.data import SOURCES
    from trl_credit.reports import model_card

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text('{"model_type": "llama"}')  # a model folder (never loaded)
    (run_dir / "model.safetensors").write_bytes(b"")
    model_card.generate_credit_model_card(
        base_model=None,
        model_name="run",
        hub_model_id=None,
        dataset_name="chain_sum",
        method="taco",
        hyperparameters={"taco_alpha": 0.01},
        trainer_name="TACO",
        papers=[],
        grpo_paper={"title": "DeepSeekMath", "id": "2402.03300", "citation": "@article{shao2024deepseekmath,\n}"},
    ).save(run_dir / "README.md")
    correct = [2, 0, 4]
    monkeypatch.setattr(
        eval_run,
        "build_backend",
        lambda config, path: CountingBackend(evaluation.prepare_eval_data(config).dataset["solution"], correct),
    )
    argv = [
        "--model_name_or_path",
        str(run_dir),
        "--dataset_name",
        "chain_sum",
        "--num_problems",
        "3",
        "--n",
        "4",
        "--k",
        "1",
        "2",
        "--output_dir",
        str(tmp_path / "eval"),
    ]
    assert eval_main(argv) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["model_card"] == str(run_dir / "README.md")
    written = json.loads((tmp_path / "eval" / "summary.json").read_text())
    held_out = written["split"]
    assert printed["split"] == held_out == EvalConfig("unused", "chain_sum").dataset_split
    assert held_out in SOURCES["chain_sum"].splits and held_out != SOURCES["chain_sum"].splits[0]  # not training's
    assert json.loads((run_dir / f"eval_chain_sum_{held_out}.json").read_text()) == written

    card = (run_dir / "README.md").read_text()
    [index] = yaml.safe_load(card.split("---\n")[1])["model-index"]
    [result] = index["results"]
    assert result["task"]["type"] == "text-generation"
    assert result["dataset"] == {"name": "chain_sum", "type": "chain_sum", "split": held_out}
    metrics = {m["type"]: m["value"] for m in result["metrics"]}
    # From the per-problem correct counts, and from the per-problem records the evaluation wrote.
    records = [json.loads(line) for line in (tmp_path / "eval" / "completions.jsonl").read_text().splitlines()]
    assert metrics["avg@4"] == pytest.approx(6 / 12)
    assert metrics["pass@2"] == pytest.approx(sum(closed_form_pass_at_k(4, c, 2) for c in correct) / 3)
    assert metrics["pass@2"] == pytest.approx(sum(r["pass@2"] for r in records) / len(records))
    assert metrics == {key: written[key] for key in ("avg@4", "pass@1", "pass@2")}
    assert f"| chain_sum | {held_out} | 3 | 4 | 0.5 |" in card.split("## Evaluation")[1]

    # --update_model_card false leaves the folder alone.
    argv[argv.index("--output_dir") + 1] = str(tmp_path / "eval2")
    assert eval_main([*argv, "--update_model_card", "false"]) == 0
    assert "model_card" not in json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (run_dir / "README.md").read_text() == card
    assert json.loads((run_dir / f"eval_chain_sum_{held_out}.json").read_text()) == written


def test_cli_leaves_a_folder_without_a_trl_credit_card_alone(tiny_model_dir, tmp_path, monkeypatch, capsys):
    before = sorted(p.name for p in Path(tiny_model_dir).iterdir())
    monkeypatch.setattr(
        eval_run,
        "build_backend",
        lambda config, path: CountingBackend(evaluation.prepare_eval_data(config).dataset["solution"], [1]),
    )
    argv = [
        "--model_name_or_path",
        tiny_model_dir,
        "--dataset_name",
        "chain_sum",
        "--num_problems",
        "1",
        "--n",
        "2",
        "--output_dir",
        str(tmp_path / "eval"),
    ]
    assert eval_main(argv) == 0
    assert "model_card" not in json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert sorted(p.name for p in Path(tiny_model_dir).iterdir()) == before


def test_cli_transformers_backend_on_a_tiny_model(tiny_model_dir, tmp_path, capsys):
    def run(name, *extra):
        argv = [
            "--model_name_or_path",
            tiny_model_dir,
            "--dataset_name",
            "chain_sum",
            "--num_problems",
            "3",
            "--max_new_tokens",
            "6",
            "--batch_size",
            "2",
            "--output_dir",
            str(tmp_path / name),
            *extra,
        ]
        assert eval_main(argv) == 0
        return [json.loads(line) for line in (tmp_path / name / "completions.jsonl").read_text().splitlines()]

    sampled = run("a", "--n", "3", "--temperature", "1.0", "--seed", "1")
    assert len(sampled) == 3 and all(len(r["completions"]) == 3 for r in sampled)
    assert all(1 <= length <= 6 for r in sampled for length in r["completion_lengths"])
    assert run("b", "--n", "3", "--temperature", "1.0", "--seed", "1") == sampled  # seeded
    greedy = run("c", "--n", "2", "--temperature", "0")
    assert all(r["completions"][0] == r["completions"][1] for r in greedy)
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert set(summary) >= {"avg@3", "pass@1", "pass@2", "pass@3", "mean_completion_length", "dropped_rows"}


def _bad_inputs(tmp_path, tiny_dir):
    data_file = tmp_path / "p.jsonl"
    data_file.write_text(json.dumps({"question": "1+1", "answer": "2"}) + "\n")
    base = ["--model_name_or_path", tiny_dir]
    return {
        "unknown flag": (base + ["--dataset_name", "chain_sum", "--nn", "3"], "unrecognized arguments: --nn 3"),
        "k > n": (base + ["--dataset_name", "chain_sum", "--n", "2", "--k", "4"], "every k must be between 1 and n=2"),
        "bad value": (base + ["--dataset_name", "chain_sum", "--temperature", "hot"], "argument --temperature"),
        "negative": (base + ["--dataset_name", "chain_sum", "--top_p", "0"], "top_p must be in (0, 1]"),
        "missing arg": (["--dataset_name", "chain_sum"], "required: --model_name_or_path"),
        "unknown dataset": (base + ["--dataset_name", "gsm9k"], "unknown dataset 'gsm9k'"),
        "bad split": (base + ["--dataset_name", "gsm8k", "--dataset_split", "dev"], "bad split 'dev' for gsm8k"),
        "missing column": (
            base + ["--dataset_name", str(data_file), "--answer_column", "gold"],
            "answer_column 'gold' is not a column",
        ),
        "missing model": (
            ["--model_name_or_path", str(tmp_path / "nowhere"), "--dataset_name", "chain_sum"],
            "does not exist",
        ),
    }


@pytest.fixture
def no_backend(monkeypatch):
    """Fail the test if anything builds an evaluation backend (besides `no_model_loading`'s refusals)."""

    def refuse(*args, **kwargs):
        raise AssertionError("a backend was built before the input was checked")

    monkeypatch.setattr(eval_run, "build_backend", refuse)


@pytest.mark.parametrize(
    "case",
    [
        "unknown flag",
        "k > n",
        "bad value",
        "negative",
        "missing arg",
        "unknown dataset",
        "bad split",
        "missing column",
        "missing model",
    ],
)
def test_cli_bad_input_exits_2_with_one_line_before_loading(case, tmp_path, capsys, no_model_loading, no_backend):
    argv, expected = _bad_inputs(tmp_path, str(tmp_path))[case]
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')  # a model folder, never loaded
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert eval_main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trl-credit eval: error: ") and expected in lines[0]
    assert captured.out == ""


def test_cli_vllm_missing_is_bad_input(tmp_path, capsys, no_model_loading, no_backend, monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    (tmp_path / "model.safetensors").write_bytes(b"")
    argv = ["--model_name_or_path", str(tmp_path), "--dataset_name", "chain_sum", "--backend", "vllm"]
    assert eval_main(argv) == 2
    assert "needs vLLM" in capsys.readouterr().err


def test_cli_help(capsys):
    assert eval_main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "--model_name_or_path" in out and "Samples per problem." in out
