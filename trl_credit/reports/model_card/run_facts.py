"""What a run's card says trained: the base model, the methods, the training set-up, the reward curve, a one-line
result, and the versions and papers behind it.

Each reader takes plain values (a trainer's `args`, its `log_history`, a data set) so that the card can be rendered
again from its recorded inputs. Values that look like secrets (tokens, API keys) never reach a card: `scrub_secrets`
and `format_hyperparameters` redact them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from .evaluation_results import dataset_reference, eval_metrics

# Environment variables whose values must never end up in a card.
SECRET_ENV_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_API_TOKEN", "WANDB_API_KEY", "COMET_API_KEY")
_SECRET_KEY = re.compile(r"(^|_)(token|api_key|apikey|password|secret)$", re.IGNORECASE)
_HF_TOKEN_VALUE = re.compile(r"\bhf_[A-Za-z0-9]{20,}\b")
REDACTED = "<redacted>"


# `grpo` is no registered method: it is the empty stack, every token keeping its response's advantage.
GRPO_DISPLAY_NAME = "GRPO"
GRPO_SUMMARY = "Every token of a completion receives the completion's group-normalised advantage."


def display_name(method: str | None) -> str:
    """A method's display name from its registration (`None`: GRPO)."""
    from ...methods import CREDIT_METHODS

    return GRPO_DISPLAY_NAME if method is None else CREDIT_METHODS[method].display_name


def _summary(method: str | None) -> str:
    from ...methods import CREDIT_METHODS
    from ...methods.names import label

    if method is None:
        return GRPO_SUMMARY
    registered = CREDIT_METHODS[method]
    return (
        f"{label(registered)}: {registered.summary}"
        if registered.summary
        else f"`{method}`: a registered credit method."
    )


def is_secret_key(name: str) -> bool:
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
        shown = REDACTED if is_secret_key(name) and value not in (None, "") else value
        if isinstance(shown, float):
            shown = f"{shown:.6g}"
        rows.append((name, scrub_secrets(str(shown)).replace("|", "\\|")))
    return rows


def framework_versions() -> list[tuple[str, str]]:
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


def trl_grpo_paper() -> dict[str, str]:
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


# --------------------------------------------------------------------------------------------------
# What trained: base model, set-up, result
# --------------------------------------------------------------------------------------------------


def _converted_offline_model(folder: Path) -> str | None:
    """What `folder` is when it is the offline SmolLM2 that `trl_credit.data.models` converts from a GGUF, else `None`."""
    from ...data import models

    if folder.resolve() != (models.cache_root() / models._FOLDER_NAME).resolve():
        return None
    gguf = Path(models.SMOLLM2_GGUF).name
    return f"{models._FOLDER_NAME}, de-quantised from a GGUF (`{gguf}` of the PyPI package `{models.SMOLLM2_PACKAGE}`)"


def base_model_reference(name_or_path: str | None) -> tuple[str | None, str | None]:
    """`(Hub id, description)` of the model training started from, named as its config names it.

    A Hub id is both: the card links it and lists it as `base_model` metadata. A local folder has no Hub id and is
    described by its name only (no local path in a card meant for the Hub), except the offline SmolLM2 that
    `trl_credit.data.models` converts, described as "SmolLM2-135M-Instruct, de-quantised from a GGUF (...)". `(None,
    None)` for a model without a name.
    """
    if not name_or_path:
        return None, None
    folder = Path(name_or_path).expanduser()
    if not folder.is_dir():
        return name_or_path, name_or_path
    return None, _converted_offline_model(folder) or f"the local model `{folder.name}`"


def reward_functions(names: Sequence[str], weights: Sequence[float] | None) -> list[tuple[str, float]]:
    """`(name, weight)` of each reward function, as TRL sums them into `reward` (weights default to 1)."""
    weights = [1.0] * len(names) if weights is None else [float(w) for w in weights]
    return list(zip(names, weights))


def _reward_functions_text(functions: Sequence[Sequence[Any]]) -> str:
    return ", ".join(f"{name} (weight {weight:g})" for name, weight in functions)


def read_training_setup(
    args,
    num_processes: int,
    steps_trained: int,
    reward_funcs: Sequence[tuple[str, float]] = (),
    num_train_prompts: int | None = None,
) -> dict[str, Any]:
    """The training set-up of a run for its card: `GRPOConfig` fields under their names, and derived values.

    Args:
        args: The run's `GRPOConfig` (or `CreditGRPOConfig`).
        num_processes: Processes that trained (`trainer.accelerator.num_processes`).
        steps_trained: Optimizer steps taken (`trainer.state.global_step`).
        reward_funcs: `(name, weight)` of each reward function (`reward_functions`); none: not listed.
        num_train_prompts: Rows of the training data set; `None`: not listed.

    Returns:
        `reward_funcs` (names and weights), `num_train_prompts`, `learning_rate`, `max_steps` (`num_train_epochs` for
        a run bounded by epochs), `steps_trained`, `num_generations`, `per_device_train_batch_size`,
        `gradient_accumulation_steps`, `num_processes`, `global_batch_size` (completions per optimizer step: the
        per-device batch times gradient accumulation times processes), `max_completion_length`, `temperature`,
        `loss_type`, `beta`, `epsilon`, `epsilon_high` (the upper clipping bound TRL applies: `epsilon` when unset)
        and `seed`, in this order.
    """
    schedule = {"max_steps": args.max_steps} if args.max_steps > 0 else {"num_train_epochs": args.num_train_epochs}
    data = {"reward_funcs": _reward_functions_text(reward_funcs)} if reward_funcs else {}
    if num_train_prompts is not None:
        data["num_train_prompts"] = num_train_prompts
    return {
        **data,
        "learning_rate": args.learning_rate,
        **schedule,
        "steps_trained": steps_trained,
        "num_generations": args.num_generations,
        "per_device_train_batch_size": args.per_device_train_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "num_processes": num_processes,
        "global_batch_size": args.per_device_train_batch_size * args.gradient_accumulation_steps * num_processes,
        **{name: getattr(args, name) for name in ("max_completion_length", "temperature", "loss_type", "beta")},
        "epsilon": args.epsilon,
        "epsilon_high": args.epsilon_high if args.epsilon_high is not None else args.epsilon,
        "seed": args.seed,
    }


def read_reward_curve(
    log_history: Sequence[Mapping[str, Any]], reward_funcs: Sequence[tuple[str, float]] = ()
) -> dict[str, Any] | None:
    """The mean training reward at the first and the last logged step (`trainer.state.log_history`).

    Returns `{"first_step", "first_reward", "last_step", "last_reward", "reward_funcs"}` (`reward_funcs`: the
    `(name, weight)` pairs whose weighted sum TRL logs as `reward`, to label it), or `None` when no step logged a
    reward.
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
        "reward_funcs": [[name, weight] for name, weight in reward_funcs],
    }


def _reward_label(functions: Sequence[Sequence[Any]]) -> str:
    """What `reward` is: one function, or the weighted sum TRL takes of several."""
    if not functions:
        return "mean training reward"
    if len(functions) == 1:
        return f"mean training reward ({functions[0][0]})"
    terms = " + ".join(f"{name}" if weight == 1 else f"{weight:g} × {name}" for name, weight in functions)
    return f"mean training reward (the weighted sum {terms})"


def result_line(reward_curve: Mapping[str, Any] | None, summaries: Sequence[Mapping[str, Any]]) -> str | None:
    """The card's one-line result: the training reward's first and last logged values, labelled with the reward
    functions it sums, then each evaluation's avg@ and largest-k pass@ (`None` when there is neither)."""
    parts = []
    if reward_curve:
        parts.append(
            f"{_reward_label(reward_curve.get('reward_funcs') or [])} {reward_curve['first_reward']:.4g} at step "
            f"{reward_curve['first_step']} → {reward_curve['last_reward']:.4g} at step {reward_curve['last_step']}"
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
        parts.append(f"on `{dataset_reference(str(summary['dataset']))[0]}`{split}: {values}")
    return "; ".join(parts) or None


def stack_sections(
    names: Sequence[str | None], hyperparameters: Mapping[str, Any]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One section per method of the stack (its summary, its own hyperparameters as rows), and the hyperparameters
    no method of the stack reads (`credit_method`, other settings), which the card lists with the training set-up."""
    from ...methods import CREDIT_METHODS

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
