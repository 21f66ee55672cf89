"""Model cards for models trained with trl-credit, and the list of files a Hub push uploads.

The card follows TRL's own (`trl.trainer.utils.generate_model_card`): the same sections in the same
order (quick start, training procedure, framework versions, citations). It adds what trained: the base model (a Hub
id, a local folder's name, or the offline SmolLM2 de-quantised from a GGUF), a one-line result (the mean training
reward at the first and last logged steps, and the evaluation results), the training set-up (learning rate, steps,
batch, generation and loss settings), each method of the stack with its own hyperparameters, the method papers next
to GRPO's and TRL's citations, the training data, the training curves and, when `trl-credit eval` summaries are
given, an evaluation table and the same numbers as `model-index` metadata (huggingface_hub's `EvalResult`s), which
the Hub renders as evaluation results. The quick-start snippet prompts the model with the first training prompt when
one is given. `trainer_model_card` gathers all of it from a trainer after training.

`CreditModelCard.save` also records the card's inputs next to it (`_trl_credit_card.json`, which a Hub push
skips), so that `regenerate_model_card` can render the card again once `trl-credit eval` has added results.

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

from huggingface_hub import EvalResult, ModelCard, ModelCardData

TEMPLATE_NAME = "credit_model_card.md.j2"
CARD_INPUTS_NAME = "_trl_credit_card.json"  # `_*` files stay out of `Trainer.push_to_hub` uploads
EVAL_TASK_TYPE = "text-generation"
SAMPLING_SETTINGS = ("temperature", "top_p", "max_new_tokens")  # recorded with each metric of the model-index
DEFAULT_QUICK_START_QUESTION = (  # TRL's own card asks this when no training prompt is known
    "If you had a time machine, but could only go to the past or the future once and never return, which would you "
    "choose and why?"
)
TRL_CREDIT_URL = "https://github.com/trl-credit/trl-credit"
BASE_TAGS = ("trl", "grpo", "trl-credit")

# Environment variables whose values must never end up in a card.
SECRET_ENV_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_API_TOKEN", "WANDB_API_KEY", "COMET_API_KEY")
_SECRET_KEY = re.compile(r"(^|_)(token|api_key|apikey|password|secret)$", re.IGNORECASE)
_HF_TOKEN_VALUE = re.compile(r"\bhf_[A-Za-z0-9]{20,}\b")
REDACTED = "<redacted>"


# --------------------------------------------------------------------------------------------------
# Template and inputs
# --------------------------------------------------------------------------------------------------


def _display_name(method: str | None) -> str:
    """A method's display name from its registration (`None`: GRPO)."""
    from .methods import CREDIT_METHODS, GRPO_DISPLAY_NAME

    return GRPO_DISPLAY_NAME if method is None else CREDIT_METHODS[method].display_name


def _summary(method: str | None) -> str:
    from .methods import CREDIT_METHODS, GRPO_SUMMARY

    if method is None:
        return GRPO_SUMMARY
    registered = CREDIT_METHODS[method]
    return (
        f"{registered.display_name}: {registered.summary}"
        if registered.summary
        else f"`{method}`: a registered credit method."
    )


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
    for label, distribution in [
        ("TRL", "trl"),
        ("Transformers", "transformers"),
        ("Pytorch", "torch"),
        ("Datasets", "datasets"),
        ("Tokenizers", "tokenizers"),
    ]:
        versions.append((label, installed(distribution)))
    return versions


def load_eval_summaries(output_dir: str | Path) -> list[dict[str, Any]]:
    """The `trl-credit eval` summaries saved in `output_dir` (`eval*.json` holding avg@ or pass@ metrics)."""
    summaries = []
    for path in sorted(Path(output_dir).glob("eval*.json")):
        try:
            summary = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue  # not an eval summary: the card simply has no row for it
        if isinstance(summary, dict) and eval_metrics(summary):
            summaries.append(summary)
    return summaries


_METRIC_KEY = re.compile(r"(avg|pass)@(\d+|n)")


def eval_metrics(summary: Mapping[str, Any]) -> dict[str, float]:
    """The avg@/pass@ numbers of one evaluation summary, as `{"avg@4": ..., "pass@1": ...}`, avg@ first, then by k.

    Reads the flat keys `trl-credit eval` writes (`avg@4`, `pass@1`, ...) and the nested form
    `{"avg@k": {k: value}, "pass@k": {k: value}}`; `avg@n` is the accuracy averaged over the `n` samples per problem.
    """
    metrics = {
        key: float(value)
        for key, value in summary.items()
        if _METRIC_KEY.fullmatch(key) and isinstance(value, (int, float)) and not isinstance(value, bool)
    }
    for kind in ("avg", "pass"):
        for k, value in (summary.get(f"{kind}@k") or {}).items():
            metrics[f"{kind}@{k}"] = float(value)

    def order(key: str) -> tuple:
        kind, k = key.split("@")
        return (kind != "avg", int(k) if k.isdigit() else float("inf"))

    return {key: metrics[key] for key in sorted(metrics, key=order)}


def _dataset_reference(name: str) -> tuple[str, str, str | None]:
    """`(name shown, Hub type, Hub config)` of an evaluation data set; a local file is named by its file name only."""
    from .data import SOURCES, hub_dataset_id

    spec, hub_id = SOURCES.get(name), hub_dataset_id(name)
    if spec is not None:
        return name, hub_id or name, spec.hub_config if spec.kind == "hub" else None
    if hub_id is not None:
        return hub_id, hub_id, None
    label = Path(name).name or name  # no local path in a card meant for the Hub
    return label, label, None


def eval_table(summaries: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Columns and rows of the evaluation table, one row per summary (see `eval_metrics` for the metrics read).

    `dataset`, `split`, `num_problems`, `n` (samples per problem) and `mean_completion_length` are shown when
    present; the split and problem columns only when some summary has them.
    """
    metrics = [eval_metrics(s) for s in summaries]
    names = list(eval_metrics({key: 0.0 for m in metrics for key in m}))  # every metric, in eval_metrics' order
    has_split = any(s.get("split") for s in summaries)
    has_problems = any("num_problems" in s for s in summaries)
    columns = [
        "Dataset",
        *(["Split"] if has_split else []),
        *(["Problems"] if has_problems else []),
        "n",
        *names,
        "Mean completion length",
    ]

    def cell(value) -> str:
        if value is None:
            return "–"
        return f"{value:.4g}" if isinstance(value, float) else str(value).replace("|", "\\|")

    rows = []
    for s, values in zip(summaries, metrics):
        dataset = _dataset_reference(str(s["dataset"]))[0] if s.get("dataset") else None
        row = [
            dataset,
            *([s.get("split")] if has_split else []),
            *([s.get("num_problems")] if has_problems else []),
            s.get("n"),
            *(values.get(name) for name in names),
            s.get("mean_completion_length"),
        ]
        rows.append([cell(value) for value in row])
    return columns, rows


def eval_results(summaries: Sequence[Mapping[str, Any]]) -> list[EvalResult]:
    """The summaries as huggingface_hub `EvalResult`s (`model-index` metadata): one per summary and metric.

    Task `text-generation`; the data set's Hub id as its type when it has one (its name otherwise), its split;
    the metric (`avg@4`, `pass@1`, ...) as type and name, with the sampling settings it was measured under as
    `metric_args` (`n` samples per problem, and the temperature, top-p and token limit `trl-credit eval` recorded).
    """
    results = []
    for summary in summaries:
        if not summary.get("dataset"):
            continue  # the model-index needs a data set
        name, dataset_type, dataset_config = _dataset_reference(str(summary["dataset"]))
        config = summary.get("config") if isinstance(summary.get("config"), Mapping) else {}
        settings = {"n": summary.get("n"), **{key: config.get(key) for key in SAMPLING_SETTINGS}}
        settings = {key: value for key, value in settings.items() if value is not None}
        for metric, value in eval_metrics(summary).items():
            results.append(
                EvalResult(
                    task_type=EVAL_TASK_TYPE,
                    dataset_type=dataset_type,
                    dataset_name=name,
                    dataset_config=dataset_config,
                    dataset_split=summary.get("split"),
                    metric_type=metric,
                    metric_name=metric,
                    metric_value=value,
                    metric_args=settings or None,
                )
            )
    return results


def _grpo_paper() -> dict[str, str]:
    from trl import GRPOTrainer  # deferred: importing TRL takes seconds and the trainer has it loaded already

    return dict(GRPOTrainer._paper)


def first_training_prompt(dataset) -> str | list[dict[str, str]] | None:
    """The first prompt of a training set as the trainer receives it, for the card's quick start.

    A conversation (a list of `{"role", "content"}` messages, to which the text-generation pipeline applies the
    chat template as TRL does) or a plain string. `None` when the data set is empty, has no `prompt` column, or its
    first prompt is not plain text (image or tool-call content).
    """
    row = next(iter(dataset), None)
    prompt = row.get("prompt") if isinstance(row, Mapping) else None
    if isinstance(prompt, str):
        return prompt
    if (
        isinstance(prompt, list)
        and prompt
        and all(
            isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in prompt
        )
    ):
        return [{"role": m["role"], "content": m["content"]} for m in prompt]
    return None


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
# What trained: base model, set-up, result
# --------------------------------------------------------------------------------------------------


def _converted_offline_model(folder: Path) -> str | None:
    """What `folder` is when it is the offline SmolLM2 that `trl_credit.models` converts from a GGUF, else `None`."""
    from . import models

    if folder.resolve() != (models.cache_root() / models._FOLDER_NAME).resolve():
        return None
    gguf = Path(models.SMOLLM2_GGUF).name
    return f"{models._FOLDER_NAME}, de-quantised from a GGUF (`{gguf}` of the PyPI package `{models.SMOLLM2_PACKAGE}`)"


def base_model_reference(name_or_path: str | None) -> tuple[str | None, str | None]:
    """`(Hub id, description)` of the model training started from, named as its config names it.

    A Hub id is both: the card links it and lists it as `base_model` metadata. A local folder has no Hub id and is
    described by its name only (no local path in a card meant for the Hub), except the offline SmolLM2 that
    `trl_credit.models` converts, described as "SmolLM2-135M-Instruct, de-quantised from a GGUF (...)". `(None,
    None)` for a model without a name.
    """
    if not name_or_path:
        return None, None
    folder = Path(name_or_path).expanduser()
    if not folder.is_dir():
        return name_or_path, name_or_path
    return None, _converted_offline_model(folder) or f"the local model `{folder.name}`"


def read_training_setup(args, num_processes: int, steps_trained: int) -> dict[str, Any]:
    """The training set-up of a run for its card: `GRPOConfig` fields under their names, and three derived values.

    Args:
        args: The run's `GRPOConfig` (or `CreditGRPOConfig`).
        num_processes: Processes that trained (`trainer.accelerator.num_processes`).
        steps_trained: Optimizer steps taken (`trainer.state.global_step`).

    Returns:
        `learning_rate`, `max_steps` (`num_train_epochs` for a run bounded by epochs), `steps_trained`,
        `num_generations`, `per_device_train_batch_size`, `gradient_accumulation_steps`, `num_processes`,
        `global_batch_size` (completions per optimizer step: the per-device batch times gradient accumulation times
        processes), `max_completion_length`, `temperature`, `loss_type`, `beta` and `seed`, in this order.
    """
    schedule = {"max_steps": args.max_steps} if args.max_steps > 0 else {"num_train_epochs": args.num_train_epochs}
    return {
        "learning_rate": args.learning_rate,
        **schedule,
        "steps_trained": steps_trained,
        "num_generations": args.num_generations,
        "per_device_train_batch_size": args.per_device_train_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "num_processes": num_processes,
        "global_batch_size": args.per_device_train_batch_size * args.gradient_accumulation_steps * num_processes,
        **{
            name: getattr(args, name) for name in ("max_completion_length", "temperature", "loss_type", "beta", "seed")
        },
    }


def read_reward_curve(log_history: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The mean training reward at the first and the last logged step (`trainer.state.log_history`).

    Returns `{"first_step", "first_reward", "last_step", "last_reward"}`, or `None` when no step logged a reward.
    """
    logged = [entry for entry in log_history if "reward" in entry]
    if not logged:
        return None
    first, last = logged[0], logged[-1]
    return {
        "first_step": first["step"],
        "first_reward": first["reward"],
        "last_step": last["step"],
        "last_reward": last["reward"],
    }


def result_line(reward_curve: Mapping[str, Any] | None, summaries: Sequence[Mapping[str, Any]]) -> str | None:
    """The card's one-line result: the training reward's first and last logged values, then each evaluation's
    avg@ and largest-k pass@ (`None` when there is neither)."""
    parts = []
    if reward_curve:
        parts.append(
            f"mean training reward {reward_curve['first_reward']:.4g} at step {reward_curve['first_step']} → "
            f"{reward_curve['last_reward']:.4g} at step {reward_curve['last_step']}"
        )
    for summary in summaries:
        metrics = eval_metrics(summary)
        shown = [next((key for key in metrics if key.startswith("avg@")), None)]
        shown.append(next((key for key in reversed(metrics) if key.startswith("pass@")), None))
        values = ", ".join(f"{key} {metrics[key]:.4g}" for key in shown if key is not None)
        if not summary.get("dataset"):
            parts.append(f"evaluation: {values}")
            continue
        split = f" ({summary['split']})" if summary.get("split") else ""
        parts.append(f"on `{_dataset_reference(str(summary['dataset']))[0]}`{split}: {values}")
    return "; ".join(parts) or None


def _method_sections(
    names: Sequence[str | None], hyperparameters: Mapping[str, Any]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One section per method of the stack (its summary, its own hyperparameters as rows), and the hyperparameters
    no method of the stack reads (`credit_method`, other settings), which the card lists with the training set-up."""
    from .methods import CREDIT_METHODS

    sections, claimed = [], set()
    for name in names:
        own = [key for key in CREDIT_METHODS[name].argument_names if key in hyperparameters] if name else []
        claimed.update(own)
        sections.append(
            {
                "summary": _summary(name),
                "hyperparameters": format_hyperparameters({k: hyperparameters[k] for k in own}),
            }
        )
    return sections, {key: value for key, value in hyperparameters.items() if key not in claimed}


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
    from .methods import get_credit_method, parse_credit_methods

    names = [get_credit_method(name).name for name in parse_credit_methods(method)] or [None]
    grpo_paper = dict(grpo_paper) if grpo_paper is not None else _grpo_paper()
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
    method_sections, other_settings = _method_sections(names, hyperparameters)
    papers = [
        {**paper, "name": _display_name(paper["name"]) if paper.get("name") else paper["title"]}
        for paper in papers
        if paper.get("id") != grpo_paper.get("id")
    ]
    all_tags = list(dict.fromkeys(["generated_from_trainer", *BASE_TAGS, *filter(None, names), *tags]))
    if isinstance(eval_summary, Mapping):
        eval_summary = [eval_summary]
    eval_columns, eval_rows = eval_table(eval_summary or [])
    if example_prompt is None:
        example_prompt = [{"role": "user", "content": DEFAULT_QUICK_START_QUESTION}]

    from .data import hub_dataset_id

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
        template_path=str(template_path()),
        base_model=base_model,
        base_model_description=base_model_description,
        result=result_line(reward_curve, eval_summary or []),
        model_name=model_name,
        hub_model_id=hub_model_id,
        quick_start_prompt=_python_literal(example_prompt),
        quick_start_from_training=inputs["example_prompt"] is not None,
        dataset_name=dataset_name,
        dataset_on_hub=on_hub,
        method_display=" + ".join(_display_name(name) for name in names),
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
        versions=_framework_versions(),
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
        if _is_secret_key(name) and value not in (None, ""):
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


def trainer_model_card(
    trainer, model_name: str | None = None, dataset_name: str | None = None, tags: Sequence[str] | None = None
) -> CreditModelCard:
    """The card of a trl-credit trainer's run, read from the trainer after training; `CreditModelCard.save` it.

    Reads the base model from the policy's config, the set-up from `trainer.args` and the number of processes, the
    methods of the stack and their hyperparameters from `trainer.args`, the reward curve from
    `trainer.state.log_history`, and any `trl-credit eval` summaries from `output_dir`. Writes the training plots
    to `output_dir/plots/` (see `trl_credit.plots.save_training_plots`).

    Args:
        trainer: A `CreditGRPOTrainer` (or one of its method trainers).
        model_name: The card's title; defaults to the name of `output_dir`.
        dataset_name: The training data set, as `generate_credit_model_card` takes it.
        tags: Extra tags, after the trainer's and the methods' names.
    """
    from transformers import is_wandb_available
    from trl.trainer.utils import get_comet_experiment_url, get_config_model_id, get_trackio_space_url

    from .plots import save_training_plots

    args, state = trainer.args, trainer.state
    policy = trainer.accelerator.unwrap_model(trainer.model)
    base_model, base_model_description = base_model_reference(get_config_model_id(policy.config))
    methods = args.credit_methods
    wandb_url = None
    if is_wandb_available():
        import wandb

        wandb_url = wandb.run.url if wandb.run is not None else None
    return generate_credit_model_card(
        base_model=base_model,
        base_model_description=base_model_description,
        model_name=model_name or os.path.basename(os.path.normpath(args.output_dir)),
        hub_model_id=trainer.hub_model_id,
        dataset_name=dataset_name,
        method=args.credit_method,
        hyperparameters=args.credit_hyperparameters(),
        training_setup=read_training_setup(args, trainer.accelerator.num_processes, state.global_step),
        reward_curve=read_reward_curve(state.log_history),
        tags=list(dict.fromkeys([*trainer._tag_names, *(m.name for m in methods), *(tags or [])])),
        plots=save_training_plots(state.log_history, args.output_dir) if state.log_history else [],
        eval_summary=load_eval_summaries(args.output_dir) or None,
        wandb_url=wandb_url,
        trackio_url=get_trackio_space_url(),
        comet_url=get_comet_experiment_url(),
        trainer_name=trainer._name,
        papers=[{**m.paper, "name": m.name} for m in methods if m.paper],
        example_prompt=first_training_prompt(trainer.train_dataset) if trainer.train_dataset is not None else None,
    )


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
