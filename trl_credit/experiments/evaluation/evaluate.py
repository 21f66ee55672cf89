"""Running an evaluation: preparing the problems, sampling and checking completions, writing the records and the
summary, and copying the summary into the evaluated model's card.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

from ...data import PreparedDataset, prepare_math_dataset
from ...rewards import check_answers, tally
from .backends import GenerationBackend, build_backend
from .estimators import pass_at_k, summarize
from .eval_config import EvalConfig, slug

# ---------------------------------------------------------------------------------------------------------------
# Running an evaluation
# ---------------------------------------------------------------------------------------------------------------


def prepare_eval_data(config: EvalConfig) -> PreparedDataset:
    """The evaluation problems (raises `ValueError` on an unknown source, bad split or missing column)."""
    return prepare_math_dataset(
        config.dataset_name,
        config.dataset_split,
        prompt_column=config.prompt_column,
        answer_column=config.answer_column,
        system_prompt=config.system_prompt,
        num_samples=config.num_problems,
        seed=config.seed,
    )


def run_evaluation(
    config: EvalConfig, *, prepared: PreparedDataset | None = None, backend: GenerationBackend | None = None
) -> dict:
    """Sample, score and aggregate; write `completions.jsonl` and `summary.json` to `config.output_dir`.

    Args:
        config: The evaluation settings.
        prepared: Already loaded problems (the CLI loads them before the model, to fail fast on bad input).
        backend: A generation backend; built from `config` (loading the model) when `None`.

    Returns:
        The summary: metrics (`avg@n`, `pass@k`, `mean_completion_length`, `num_problems`), scoring counters,
        dropped data rows, timings and the configuration.
    """
    from ...data.models import resolve_model_path

    prepared = prepared if prepared is not None else prepare_eval_data(config)
    problems = prepared.dataset
    if backend is None:
        backend = build_backend(config, resolve_model_path(config.model_name_or_path))

    started = time.monotonic()
    completions = backend.generate(list(problems["prompt"]), config.n)
    generation_s = time.monotonic() - started
    if len(completions) != len(problems) or any(len(group) != config.n for group in completions):
        raise RuntimeError(
            f"the backend returned {[len(g) for g in completions]} completions, expected {config.n} each"
        )

    texts = [c.text for group in completions for c in group]
    golds = [gold for gold in problems["solution"] for _ in range(config.n)]
    checks = check_answers(texts, golds, timeout_s=config.verify_timeout)

    output_dir = Path(config.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    num_correct, lengths = [], []
    with open(output_dir / "completions.jsonl", "w", encoding="utf-8") as f:
        for index, (problem, group) in enumerate(zip(problems, completions)):
            group_checks = checks[index * config.n : (index + 1) * config.n]
            correct = sum(check.correct for check in group_checks)
            num_correct.append(correct)
            lengths.extend(c.num_tokens for c in group)
            record = {
                "index": index,
                "problem": problem["problem"],
                "solution": problem["solution"],
                "num_correct": correct,
                **{f"pass@{k}": pass_at_k(config.n, correct, k) for k in config.k},
                "completions": [c.text for c in group],
                "completion_lengths": [c.num_tokens for c in group],
                "extracted_answers": [check.extracted for check in group_checks],
                "correct": [check.correct for check in group_checks],
                "statuses": [check.status for check in group_checks],
            }
            f.write(json.dumps(record, ensure_ascii=False) + "\n")

    summary = {
        "model": config.model_name_or_path,
        "dataset": config.dataset_name,
        "split": prepared.split,
        "n": config.n,
        **summarize(num_correct, config.n, config.k, lengths),
        "dropped_rows": prepared.num_dropped,
        "scoring": tally(checks),
        "generation_seconds": round(generation_s, 3),
        "config": asdict(config),
    }
    (output_dir / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    return summary


def update_model_card(config: EvalConfig, summary: dict) -> Path | None:
    """Add an evaluation to the card of the evaluated model, when it is a folder with a trl-credit model card.

    Writes `summary` to the model folder as `eval_<dataset>_<split>.json` (a later evaluation of the same split
    replaces it), where model cards look for results, then renders the card again (`README.md`: evaluation table and
    `model-index` metadata). Returns the card's path, or `None` when nothing was written: `update_model_card` is
    off, or the model is a Hub id or a folder without a card recorded by `trl_credit.reports.model_card.CreditModelCard`.

    Raises:
        ValueError: the folder's card record cannot be read back.
    """
    from ...reports.model_card import CARD_INPUTS_NAME, regenerate_model_card

    folder = Path(config.model_name_or_path).expanduser()
    if not config.update_model_card or not (folder / CARD_INPUTS_NAME).is_file():
        return None
    name = "_".join(slug(part) for part in (config.dataset_name, summary.get("split")) if part)
    (folder / f"eval_{name}.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    return regenerate_model_card(folder)
