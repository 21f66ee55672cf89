"""The card itself: rendering it from the Jinja template, saving it with its inputs, rendering it again after an
evaluation, and the files a Hub push uploads with it (`trainer_card` reads it off a trainer).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard, ModelCardData

from ...resources import model_card_template
from .evaluation_results import eval_results, eval_table, load_eval_summaries
from .run_facts import (
    REDACTED,
    display_name,
    format_hyperparameters,
    framework_versions,
    is_secret_key,
    result_line,
    scrub_secrets,
    stack_sections,
    trl_grpo_paper,
)

TEMPLATE_NAME = "credit_model_card.md.j2"
CARD_INPUTS_NAME = "_trl_credit_card.json"  # `_*` files stay out of `Trainer.push_to_hub` uploads
DEFAULT_QUICK_START_QUESTION = (  # TRL's own card asks this when no training prompt is known
    "If you had a time machine, but could only go to the past or the future once and never return, which would you "
    "choose and why?"
)
TRL_CREDIT_URL = "https://github.com/trl-credit/trl-credit"
BASE_TAGS = ("trl", "grpo", "trl-credit")


def card_template() -> str:
    """The card's Jinja template, shipped in the package (`model_cards/` in the repository)."""
    return model_card_template(TEMPLATE_NAME)


def _plot_entries(plots: Sequence[str]) -> list[dict[str, str]]:
    """Image links for the card; `plots/taco_diagnostics.png` gets the title `taco diagnostics`."""
    return [{"path": Path(plot).as_posix(), "title": Path(plot).stem.replace("_", " ")} for plot in plots]


def _python_literal(prompt: str | Sequence[Mapping[str, str]]) -> str:
    """`prompt` as Python source for the quick-start snippet: a string, or a list with one message per line.

    JSON string literals are valid Python ones (same escapes), and read like the snippet's other strings.
    """
    if isinstance(prompt, str):
        return json.dumps(prompt, ensure_ascii=False)
    lines = [
        f'    {{"role": {json.dumps(m["role"])}, "content": {json.dumps(m["content"], ensure_ascii=False)}}},'
        for m in prompt
    ]
    return "\n".join(["[", *lines, "]"])


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
    base_model_description: str | None = None,
    training_setup: Mapping[str, Any] | None = None,
    reward_curve: Mapping[str, Any] | None = None,
    tags: Sequence[str] = (),
    plots: Sequence[str] = (),
    eval_summary: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
    wandb_url: str | None = None,
    trackio_url: str | None = None,
    comet_url: str | None = None,
    trainer_name: str,
    papers: Sequence[Mapping[str, str]] = (),
    grpo_paper: Mapping[str, str] | None = None,
    example_prompt: str | Sequence[Mapping[str, str]] | None = None,
) -> CreditModelCard:
    """Build the model card of a model trained with a trl-credit trainer.

    Args:
        base_model: Hub id of the model training started from (`None` for a local path).
        base_model_description: How the card names a base model that has no Hub id (see `base_model_reference`).
        model_name: name of the trained model (the card's title).
        hub_model_id: `user/model` used in the quick-start snippet.
        dataset_name: The training data set: a Hub id (linked, and listed in the metadata), another name such as a
            local file or a procedural task (named only), or `None`.
        method: the credit method or stack, as `credit_method` (`"grpo"` for plain GRPO).
        hyperparameters: the methods' hyperparameters (`config.credit_hyperparameters()`), optionally with other
            training settings. Each method of the stack gets a table of the ones it reads (its registered
            arguments); the rest join the training set-up table. Secret-looking keys are redacted.
        training_setup: the training set-up table (`read_training_setup`), or `None`.
        reward_curve: the mean training reward at the first and last logged steps (`read_reward_curve`), shown in
            the one-line result with the evaluation results; `None` when unknown.
        tags: extra tags; `trl`, `grpo`, `trl-credit` and the method name are always added.
        plots: PNG paths relative to the folder the card is saved in (see `save_training_plots`).
        eval_summary: one `trl-credit eval` summary, a list of them, or `None` (no evaluation section); also
            written as `model-index` metadata (see `eval_results`).
        wandb_url, trackio_url, comet_url: experiment-tracker links shown as badges.
        trainer_name: the trainer's `_name` (e.g. `"TACO"`).
        papers: the papers of the methods of the stack (`title`, `id` = arXiv id, `citation` = BibTeX).
        grpo_paper: GRPO's paper; defaults to `trl.GRPOTrainer._paper`.
        example_prompt: the prompt of the quick-start snippet, normally `first_training_prompt(train_dataset)`;
            `None` asks TRL's generic question.

    Returns:
        A `huggingface_hub.ModelCard` whose metadata validates; `card.save(path)` writes it and records these
        inputs next to it for `regenerate_model_card`.
    """
    from ...methods import get_credit_method, parse_credit_methods

    names = [get_credit_method(name).name for name in parse_credit_methods(method)] or [None]
    grpo_paper = dict(grpo_paper) if grpo_paper is not None else trl_grpo_paper()
    inputs = _recordable_inputs(
        base_model=base_model,
        model_name=model_name,
        hub_model_id=hub_model_id,
        dataset_name=dataset_name,
        method=method,
        hyperparameters=hyperparameters,
        tags=tags,
        plots=plots,
        wandb_url=wandb_url,
        trackio_url=trackio_url,
        comet_url=comet_url,
        trainer_name=trainer_name,
        papers=papers,
        grpo_paper=grpo_paper,
        example_prompt=example_prompt,
        base_model_description=base_model_description,
        training_setup=training_setup,
        reward_curve=reward_curve,
    )
    method_sections, other_settings = stack_sections(names, hyperparameters)
    papers = [
        {**paper, "name": display_name(paper["name"]) if paper.get("name") else paper["title"]}
        for paper in papers
        if paper.get("id") != grpo_paper.get("id")
    ]
    all_tags = list(dict.fromkeys(["generated_from_trainer", *BASE_TAGS, *filter(None, names), *tags]))
    if isinstance(eval_summary, Mapping):
        eval_summary = [eval_summary]
    eval_columns, eval_rows = eval_table(eval_summary or [])
    if example_prompt is None:
        example_prompt = [{"role": "user", "content": DEFAULT_QUICK_START_QUESTION}]

    from ...data import hub_dataset_id

    on_hub = dataset_name is not None and hub_dataset_id(dataset_name) == dataset_name
    card_data = ModelCardData(
        base_model=base_model,
        library_name="transformers",
        datasets=[dataset_name] if on_hub else None,
        model_name=model_name,
        tags=all_tags,
        eval_results=eval_results(eval_summary or []) or None,
    )
    card = ModelCard.from_template(
        card_data,
        template_str=card_template(),
        base_model=base_model,
        base_model_description=base_model_description,
        result=result_line(reward_curve, eval_summary or []),
        model_name=model_name,
        hub_model_id=hub_model_id,
        quick_start_prompt=_python_literal(example_prompt),
        quick_start_from_training=inputs["example_prompt"] is not None,
        dataset_name=dataset_name,
        dataset_on_hub=on_hub,
        method_display=" + ".join(display_name(name) for name in names),
        plain_grpo=names == [None],
        method_sections=method_sections,
        setup_rows=format_hyperparameters({**other_settings, **(training_setup or {})}),
        plots=_plot_entries(plots),
        eval_columns=eval_columns,
        eval_rows=eval_rows,
        wandb_url=wandb_url,
        trackio_url=trackio_url,
        comet_url=comet_url,
        trainer_name=trainer_name,
        papers=papers,
        grpo_paper=grpo_paper,
        versions=framework_versions(),
        trl_credit_url=TRL_CREDIT_URL,
    )
    # Absent badges and sections leave runs of blank lines; Markdown ignores them but readers of the raw
    # README do not. No code block of the card holds two consecutive blank lines.
    content = re.sub(r"\n{3,}", "\n\n", card.content)
    # Last line of defence: no input above should hold a token, but a URL or a value might.
    card = CreditModelCard(scrub_secrets(content))
    card.inputs = inputs
    return card


class CreditModelCard(ModelCard):
    """A `ModelCard` that remembers the inputs of `generate_credit_model_card` it was rendered from.

    `save(path)` writes the card and, next to it, those inputs (`_trl_credit_card.json`: secret-looking
    hyperparameters redacted, no evaluation summary, which is read again from the folder), so that
    `regenerate_model_card` can render the same card with new evaluation results.
    """

    inputs: dict[str, Any] | None = None

    def save(self, filepath: str | Path) -> None:
        super().save(filepath)
        if self.inputs is not None:
            record = Path(filepath).parent / CARD_INPUTS_NAME
            record.write_text(json.dumps(self.inputs, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def _recordable_inputs(
    *,
    hyperparameters: Mapping[str, Any],
    training_setup: Mapping[str, Any] | None,
    wandb_url,
    trackio_url,
    comet_url,
    tags,
    plots,
    papers,
    **inputs,
) -> dict[str, Any]:
    """The card's inputs as JSON: secret-looking hyperparameters redacted, other non-JSON values as text."""

    def plain(name: str, value):
        if is_secret_key(name) and value not in (None, ""):
            return REDACTED
        if isinstance(value, str):
            return scrub_secrets(value)
        return value if value is None or isinstance(value, (bool, int, float)) else scrub_secrets(str(value))

    return {
        **inputs,
        "hyperparameters": {name: plain(name, value) for name, value in hyperparameters.items()},
        "training_setup": None
        if training_setup is None
        else {name: plain(name, value) for name, value in training_setup.items()},
        "tags": list(tags),
        "plots": list(plots),
        "papers": [dict(paper) for paper in papers],
        **{
            name: plain(name, url)
            for name, url in (("wandb_url", wandb_url), ("trackio_url", trackio_url), ("comet_url", comet_url))
        },
    }


def regenerate_model_card(
    folder: str | Path, example_prompt: str | Sequence[Mapping[str, str]] | None = None
) -> Path | None:
    """Render the card saved in `folder` again, with the `eval*.json` summaries found there now.

    Args:
        folder: A training output folder whose card was saved by `CreditModelCard.save`.
        example_prompt: A new quick-start prompt; `None` keeps the recorded one.

    Returns:
        The path of the rewritten `README.md`, or `None` when `folder` holds no recorded trl-credit card.

    Raises:
        ValueError: the record exists but cannot be read back.
    """
    folder = Path(folder)
    record = folder / CARD_INPUTS_NAME
    if not record.is_file():
        return None
    try:
        inputs = json.loads(record.read_text(encoding="utf-8"))
        if example_prompt is not None:
            inputs["example_prompt"] = example_prompt
        card = generate_credit_model_card(**inputs, eval_summary=load_eval_summaries(folder) or None)
    except (json.JSONDecodeError, TypeError, KeyError, AttributeError) as error:
        raise ValueError(f"{record} does not record a trl-credit model card ({error})") from error
    card.save(folder / "README.md")
    return folder / "README.md"


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
