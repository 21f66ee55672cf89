"""Model cards for models trained with trl-credit, and the list of files a Hub push uploads.

The card follows TRL's own (`trl.trainer.utils.generate_model_card`): the same sections in the same
order (quick start, training procedure, framework versions, citations), plus the credit method with
all its hyperparameters, the method paper next to GRPO's and TRL's citations, the training data, the
training curves and, when `trl-credit eval` summaries are given, an evaluation table.

The Jinja template is `model_cards/credit_model_card.md.j2` at the top of the source tree, installed as
the package data folder `trl_credit/model_cards`.
"""

from __future__ import annotations

import importlib.resources
import json
import os
import re
from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard, ModelCardData

TEMPLATE_NAME = "credit_model_card.md.j2"
TRL_CREDIT_URL = "https://github.com/trl-credit/trl-credit"
BASE_TAGS = ("trl", "grpo", "trl-credit")

METHOD_DISPLAY_NAMES = {"grpo": "GRPO", "taco": "TACO", "eapo": "EAPO", "tide": "TIDE"}
METHOD_SUMMARIES = {
    "grpo": "Plain GRPO: every token of a completion receives the completion's group-normalised advantage.",
    "taco": (
        "TACO (Tail-Aware Credit calibratiOn) keeps GRPO's advantage but shrinks the positive credit of "
        "implausible tail tokens, those much less likely than the policy's typical token "
        "(`p < alpha * exp(-H)`), by a smooth factor in `(1 - lambda, 1]`. Negative advantages are untouched."
    ),
    "eapo": (
        "EAPO (Entropic Advantage Policy Optimization) reweights each completion's advantage across its "
        "tokens by their rollout entropy (mean weight 1 per completion): successful completions push more "
        "credit onto high-entropy tokens, failed ones put the largest penalties on low-entropy tokens."
    ),
    "tide": (
        "TIDE reweights each completion's advantage across its tokens (mean weight 1 per completion) by a "
        "softmax over an entropy-gated distance between the policy's and a frozen reference's next-token "
        "distributions."
    ),
}

# Environment variables whose values must never end up in a card.
SECRET_ENV_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_API_TOKEN", "WANDB_API_KEY", "COMET_API_KEY")
_SECRET_KEY = re.compile(r"(^|_)(token|api_key|apikey|password|secret)$", re.IGNORECASE)
_HF_TOKEN_VALUE = re.compile(r"\bhf_[A-Za-z0-9]{20,}\b")
REDACTED = "<redacted>"


# --------------------------------------------------------------------------------------------------
# Template and inputs
# --------------------------------------------------------------------------------------------------


def template_path() -> Path:
    """The card template: the installed package data, else the source checkout's `model_cards/`."""
    installed = importlib.resources.files("trl_credit") / "model_cards" / TEMPLATE_NAME
    if installed.is_file():
        return Path(str(installed))
    return Path(__file__).resolve().parents[1] / "model_cards" / TEMPLATE_NAME


def _is_secret_key(name: str) -> bool:
    # Matches `hub_token`, `wandb_api_key`, but not `tide_token_chunk_size` (the key must *end* in it).
    return bool(_SECRET_KEY.search(name))


def scrub_secrets(text: str) -> str:
    """Replace Hugging Face tokens and the values of `SECRET_ENV_VARS` found in `text` by `<redacted>`."""
    for name in SECRET_ENV_VARS:
        value = os.environ.get(name)
        if value and len(value) >= 8:  # a short value would redact ordinary words
            text = text.replace(value, REDACTED)
    return _HF_TOKEN_VALUE.sub(REDACTED, text)


def format_hyperparameters(hyperparameters: Mapping[str, Any]) -> list[tuple[str, str]]:
    """`(name, value)` rows for the card, in the given order; secret-looking keys are redacted."""
    rows = []
    for name, value in hyperparameters.items():
        shown = REDACTED if _is_secret_key(name) and value not in (None, "") else value
        if isinstance(shown, float):
            shown = f"{shown:.6g}"
        rows.append((name, scrub_secrets(str(shown)).replace("|", "\\|")))
    return rows


def _plot_entries(plots: Sequence[str]) -> list[dict[str, str]]:
    """Image links for the card; `plots/taco_diagnostics.png` gets the title `taco diagnostics`."""
    return [{"path": Path(plot).as_posix(), "title": Path(plot).stem.replace("_", " ")} for plot in plots]


def _framework_versions() -> list[tuple[str, str]]:
    def installed(distribution: str) -> str:
        try:
            return version(distribution)
        except PackageNotFoundError:
            return "not installed"

    from trl_credit import __version__ as trl_credit_version

    versions = [("trl-credit", trl_credit_version)]
    for label, distribution in [("TRL", "trl"), ("Transformers", "transformers"), ("Pytorch", "torch"),
                                ("Datasets", "datasets"), ("Tokenizers", "tokenizers")]:
        versions.append((label, installed(distribution)))
    return versions


def load_eval_summaries(output_dir: str | Path) -> list[dict[str, Any]]:
    """The `trl-credit eval` summaries saved in `output_dir` (`eval*.json` with `pass@k` or `avg@...`)."""
    summaries = []
    for path in sorted(Path(output_dir).glob("eval*.json")):
        try:
            summary = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue  # not an eval summary: the card simply has no row for it
        if isinstance(summary, dict) and any(key == "pass@k" or key.startswith("avg@") for key in summary):
            summaries.append(summary)
    return summaries


def _k_sorted(keys) -> list[str]:
    return sorted(keys, key=lambda k: (int(k) if str(k).isdigit() else float("inf"), str(k)))


def eval_table(summaries: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Columns and rows of the evaluation table, one row per summary.

    A summary has `pass@k` (`{k: value}`), and `avg@k` (`{k: value}`) or `avg@n` (a float averaged over
    the `n` samples per problem); `dataset`, `n` and `mean_completion_length` are shown when present.
    """
    avg_ks = _k_sorted({str(k) for s in summaries for k in (s.get("avg@k") or {})})
    pass_ks = _k_sorted({str(k) for s in summaries for k in (s.get("pass@k") or {})})
    has_avg_n = any("avg@n" in s for s in summaries)
    columns = ["Dataset", "n", *(f"avg@{k}" for k in avg_ks), *(["avg@n"] if has_avg_n else []),
               *(f"pass@{k}" for k in pass_ks), "Mean completion length"]

    def cell(value) -> str:
        if value is None:
            return "–"
        return f"{value:.4g}" if isinstance(value, float) else str(value).replace("|", "\\|")

    rows = []
    for s in summaries:
        avg, passes = {str(k): v for k, v in (s.get("avg@k") or {}).items()}, {str(k): v for k, v in (s.get("pass@k") or {}).items()}
        row = [s.get("dataset"), s.get("n"), *(avg.get(k) for k in avg_ks), *([s.get("avg@n")] if has_avg_n else []),
               *(passes.get(k) for k in pass_ks), s.get("mean_completion_length")]
        rows.append([cell(value) for value in row])
    return columns, rows


def _grpo_paper() -> dict[str, str]:
    from trl import GRPOTrainer  # deferred: importing TRL takes seconds and the trainer has it loaded already

    return dict(GRPOTrainer._paper)


# --------------------------------------------------------------------------------------------------
# The card
# --------------------------------------------------------------------------------------------------


def generate_credit_model_card(
    *,
    base_model: str | None,
    model_name: str,
    hub_model_id: str,
    dataset_name: str | None,
    method: str,
    hyperparameters: Mapping[str, Any],
    tags: Sequence[str] = (),
    plots: Sequence[str] = (),
    eval_summary: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
    wandb_url: str | None = None,
    trackio_url: str | None = None,
    comet_url: str | None = None,
    trainer_name: str,
    papers: Sequence[Mapping[str, str]] = (),
    grpo_paper: Mapping[str, str] | None = None,
) -> ModelCard:
    """Build the model card of a model trained with a trl-credit trainer.

    Args:
        base_model: Hub id of the model training started from (`None` for a local path).
        model_name: name of the trained model (the card's title).
        hub_model_id: `user/model` used in the quick-start snippet.
        dataset_name: The training data set: a Hub id (linked, and listed in the metadata), another name such as a
            local file or a procedural task (named only), or `None`.
        method: credit method, one of `"grpo"`, `"taco"`, `"eapo"`, `"tide"`.
        hyperparameters: the method's hyperparameters (`config.credit_hyperparameters()`), optionally
            with other training settings; rendered as a table, secret-looking keys redacted.
        tags: extra tags; `trl`, `grpo`, `trl-credit` and the method name are always added.
        plots: PNG paths relative to the folder the card is saved in (see `save_training_plots`).
        eval_summary: one `trl-credit eval` summary, a list of them, or `None` (no evaluation section).
        wandb_url, trackio_url, comet_url: experiment-tracker links shown as badges.
        trainer_name: the trainer's `_name` (e.g. `"TACO"`).
        papers: the papers of the methods of the stack (`title`, `id` = arXiv id, `citation` = BibTeX).
        grpo_paper: GRPO's paper; defaults to `trl.GRPOTrainer._paper`.

    Returns:
        A `huggingface_hub.ModelCard` whose metadata validates; `card.save(path)` writes it.
    """
    from .methods import get_credit_method, parse_credit_methods

    names = [get_credit_method(name).name for name in parse_credit_methods(method)] or ["grpo"]
    grpo_paper = dict(grpo_paper) if grpo_paper is not None else _grpo_paper()
    papers = [
        {**paper, "name": METHOD_DISPLAY_NAMES.get(paper.get("name"), paper.get("name") or paper["title"])}
        for paper in papers if paper.get("id") != grpo_paper.get("id")
    ]
    all_tags = list(dict.fromkeys(["generated_from_trainer", *BASE_TAGS, *names, *tags]))
    if isinstance(eval_summary, Mapping):
        eval_summary = [eval_summary]
    eval_columns, eval_rows = eval_table(eval_summary or [])

    from .data import hub_dataset_id

    on_hub = dataset_name is not None and hub_dataset_id(dataset_name) == dataset_name
    card_data = ModelCardData(
        base_model=base_model, library_name="transformers",
        datasets=[dataset_name] if on_hub else None,
        model_name=model_name, tags=all_tags,
    )
    card = ModelCard.from_template(
        card_data,
        template_path=str(template_path()),
        base_model=base_model,
        model_name=model_name,
        hub_model_id=hub_model_id,
        dataset_name=dataset_name,
        dataset_on_hub=on_hub,
        method_display=" + ".join(METHOD_DISPLAY_NAMES.get(name, name) for name in names),
        method_summaries=[METHOD_SUMMARIES.get(name, f"`{name}`: a registered credit method.") for name in names],
        hyperparameters=format_hyperparameters(hyperparameters),
        plots=_plot_entries(plots),
        eval_columns=eval_columns,
        eval_rows=eval_rows,
        wandb_url=wandb_url,
        trackio_url=trackio_url,
        comet_url=comet_url,
        trainer_name=trainer_name,
        papers=papers,
        grpo_paper=grpo_paper,
        versions=_framework_versions(),
        trl_credit_url=TRL_CREDIT_URL,
    )
    # Absent badges and sections leave runs of blank lines; Markdown ignores them but readers of the raw
    # README do not. No code block of the card holds two consecutive blank lines.
    content = re.sub(r"\n{3,}", "\n\n", card.content)
    # Last line of defence: no input above should hold a token, but a URL or a value might.
    return ModelCard(scrub_secrets(content))


# --------------------------------------------------------------------------------------------------
# What a push uploads
# --------------------------------------------------------------------------------------------------


def collect_upload_folder(output_dir: str | Path) -> list[str]:
    """The files `Trainer.push_to_hub()` uploads from `output_dir`, as sorted POSIX relative paths.

    It uploads the whole folder (model, tokenizer, `training_args.bin`, card `README.md`, `plots/`, and
    any other file such as `token_credit.jsonl`) except names matching `_*` and `checkpoint-*` (the
    patterns transformers passes to `upload_folder`) and huggingface_hub's default ignores (`.git`,
    `.cache/huggingface`). Mirrors that filter offline, so tests and users can check a push's content.
    """
    from huggingface_hub.utils import DEFAULT_IGNORE_PATTERNS, filter_repo_objects
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    output_dir = Path(output_dir)
    files = sorted(path.relative_to(output_dir).as_posix() for path in output_dir.glob("**/*") if path.is_file())
    ignore = ["_*", f"{PREFIX_CHECKPOINT_DIR}-*", *DEFAULT_IGNORE_PATTERNS]
    return list(filter_repo_objects(files, ignore_patterns=ignore))
