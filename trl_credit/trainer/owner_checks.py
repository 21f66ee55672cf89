"""Each setting of a config checked by the library that owns it, before any model loads.

TRL hands most of its config to other libraries, which check their values only once asked: transformers' logits
processors when the first completion is sampled, torch's optimizer when training starts, transformers' reporting
callbacks and the Hub when the trainer is built. `check_with_owners` asks each owner when a `CreditGRPOConfig` is
built, with the values TRL will pass it: the optimizer `Trainer.get_optimizer_cls_and_kwargs` builds (on one dummy
parameter, `weight_decay` to its constructor's own check); the logits processors of `temperature`, `top_p`, `top_k`,
`min_p` and `repetition_penalty` (with `use_vllm`, vLLM's `SamplingParams` and the engine settings TRL passes it);
TRL's enumerated fields (`TRL_CHOICES`), vLLM's among them; the callbacks `report_to` names; with `push_to_hub`
or `log_completions_hub_repo`, offline mode, a token and the repository name.

Torch and transformers compare numbers with `<` and `>`, which NaN passes: the numbers they take are checked for it
first (`field_domains.FINITE_FIELDS`).
vLLM's engine settings (`VLLM_ENGINE_FIELDS`) are checked by vLLM when it is installed; without it, and without
`use_vllm`, a value other than TRL's default is refused as having no effect. `SettingError` names the field.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import re
import sys
import traceback
import warnings
from typing import Any

from ..methods import SettingError
from .field_domains import check_finite
from .trl_compat import TRL_CHOICES

SAMPLING_FLOATS = ("temperature", "top_p", "min_p", "repetition_penalty")
# `GRPOConfig` field -> the vLLM config class and field that check it, for the engine settings TRL passes to `LLM`.
VLLM_ENGINE_FIELDS = {
    "vllm_gpu_memory_utilization": ("CacheConfig", "gpu_memory_utilization"),
    "vllm_tensor_parallel_size": ("ParallelConfig", "tensor_parallel_size"),
}


def check_with_owners(args) -> None:
    """Ask the owner of each setting of `args` (a `GRPOConfig`, after its `__post_init__`) whether it accepts it;
    raise `SettingError` naming the first refused field."""
    check_choices(args)
    check_finite(args)
    check_optimizer(args)
    if args.use_vllm:
        check_vllm(args)
    else:
        check_transformers_sampling(args)
        check_vllm_engine_without_vllm(args)
    check_reporting(args)
    if args.log_completions_hub_repo is not None:
        check_hub(args, "log_completions_hub_repo")
    if args.push_to_hub:
        check_hub(args)


def _refused(name: str, value: Any, owner: str, error: Exception) -> SettingError:
    return SettingError(name, f"is {value!r}, which {owner} refuses: {_owner_words(error)}")


def _owner_words(error: Exception) -> str:
    """The owner's own message, on one line (pydantic's first error, as vLLM's config classes raise)."""
    errors = getattr(error, "errors", None)
    if callable(errors):
        try:
            return errors()[0]["msg"]
        except Exception:  # noqa: BLE001 - not pydantic's: fall back to the message
            pass
    return " ".join(str(error).split()) or type(error).__name__


def check_choices(args) -> None:
    for name, allowed in TRL_CHOICES.items():
        value = getattr(args, name, None)
        if value not in allowed:
            raise SettingError(name, f"must be one of {', '.join(allowed)} (TRL's values), got {value!r}")


def check_optimizer(args) -> None:
    """Build the optimizer transformers' `Trainer` would, on one dummy parameter."""
    import torch
    from transformers import Trainer

    if args.optim_target_modules is not None:  # GaLore and APOLLO pick the real model's modules: nothing to ask yet
        return
    model = torch.nn.Linear(1, 1)
    optim = str(getattr(args.optim, "value", args.optim))  # an `OptimizerNames` member after `__post_init__`
    owner = f"the optimizer of optim {optim!r}"
    try:
        optimizer_class, optimizer_kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    except (ValueError, ImportError, RuntimeError) as error:
        raise _refused("optim", optim, "transformers", error) from None
    constructor = inspect.signature(optimizer_class).parameters
    if "weight_decay" in constructor:  # `Trainer` passes it in the parameter groups, which torch does not check
        try:
            optimizer_class(model.parameters(), **{**optimizer_kwargs, "weight_decay": args.weight_decay})
        except (ValueError, TypeError) as error:
            name = _optimizer_field(error)
            raise _refused(name, getattr(args, name), owner, error) from None
    groups = [{"params": list(model.parameters()), "weight_decay": args.weight_decay}]
    try:
        optimizer_class(groups, **optimizer_kwargs)
    except (ValueError, TypeError) as error:
        name = _optimizer_field(error)
        raise _refused(name, getattr(args, name), owner, error) from None


def _optimizer_field(error: Exception) -> str:
    """The `TrainingArguments` field behind torch's words (`Invalid beta parameter at index 0: nan`)."""
    words = str(error).lower()
    for phrase, name in (
        ("beta parameter at index 0", "adam_beta1"),
        ("beta parameter at index 1", "adam_beta2"),
        ("epsilon", "adam_epsilon"),
        ("weight_decay", "weight_decay"),
    ):
        if phrase in words:
            return name
    return "learning_rate"


def check_transformers_sampling(args) -> None:
    """Build the logits processors transformers' `generate` builds from TRL's sampling settings."""
    from transformers.generation import logits_process as processors

    built = [
        ("temperature", processors.TemperatureLogitsWarper),
        ("top_p", processors.TopPLogitsWarper),
        ("repetition_penalty", processors.RepetitionPenaltyLogitsProcessor),
    ]
    if args.top_k not in (None, 0):  # 0 turns top-k filtering off, as in `generate`
        built.append(("top_k", processors.TopKLogitsWarper))
    if args.min_p is not None:
        built.append(("min_p", processors.MinPLogitsWarper))
    for name, processor in built:
        value = getattr(args, name)
        try:
            processor(value)
        except (ValueError, TypeError) as error:
            raise _refused(name, value, f"transformers' {processor.__name__}", error) from None


def check_vllm(args) -> None:
    """With `use_vllm`: vLLM's `SamplingParams` from the values TRL passes, and its engine settings' own checks (when
    vLLM is installed; `trl-credit grpo` refuses `use_vllm` without it)."""
    if importlib.util.find_spec("vllm") is None:
        return
    from vllm import SamplingParams

    _check_vllm_engine(args, list(VLLM_ENGINE_FIELDS))
    sampling = {
        "n": 1,
        "repetition_penalty": args.repetition_penalty,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "min_p": 0.0 if args.min_p is None else args.min_p,
        "max_tokens": args.max_completion_length,
        "logprobs": 0,
        **(args.generation_kwargs or {}),
    }
    try:
        SamplingParams(**sampling)
    except Exception as error:  # noqa: BLE001 - vLLM's VLLMValidationError (a ValueError only in some releases)
        named = [n for n in sorted(sampling, key=len, reverse=True) if re.search(rf"\b{n}\b", str(error))]
        parameter = getattr(error, "parameter", None) or next(iter(named), None)
        fields = {"max_tokens": "max_completion_length", **{name: name for name in SAMPLING_FLOATS}, "top_k": "top_k"}
        if parameter in (args.generation_kwargs or {}) or parameter not in fields:
            raise _refused("generation_kwargs", args.generation_kwargs, "vLLM's SamplingParams", error) from None
        raise _refused(fields[parameter], getattr(args, fields[parameter]), "vLLM's SamplingParams", error) from None


def _check_vllm_engine(args, names: list[str]) -> None:
    import vllm.config

    for name in names:
        class_name, vllm_name = VLLM_ENGINE_FIELDS[name]
        value = getattr(args, name)
        try:
            getattr(vllm.config, class_name)(**{vllm_name: value})
        except Exception as error:  # noqa: BLE001 - pydantic's ValidationError, or vLLM's own
            raise _refused(name, value, f"vLLM's {class_name}", error) from None


def check_vllm_engine_without_vllm(args) -> None:
    """Without `use_vllm`, vLLM's engine settings are checked by vLLM when it is installed; without it nothing can,
    and a value other than TRL's default has no effect: refused."""
    defaults = {f.name: f.default for f in dataclasses.fields(type(args))}
    changed = [name for name in VLLM_ENGINE_FIELDS if getattr(args, name) != defaults.get(name)]
    if not changed:
        return
    if importlib.util.find_spec("vllm") is not None:
        _check_vllm_engine(args, changed)
        return
    name = changed[0]
    raise SettingError(
        name,
        f"{getattr(args, name)!r} has no effect: use_vllm is off (and vLLM, which would check it, is not installed); "
        f"drop it or set use_vllm",
    )


# The integrations whose library an extra of trl-credit installs (the paper recipes report to tensorboard).
REPORTING_EXTRAS = {"tensorboard": "tensorboard"}


def check_reporting(args) -> None:
    """Build the callbacks `report_to` names, as transformers' `Trainer` does (each refuses a missing library)."""
    from transformers.integrations import get_reporting_integration_callbacks

    report_to = args.report_to or []
    try:
        callbacks = get_reporting_integration_callbacks(report_to)
    except ValueError as error:
        raise _refused("report_to", report_to, "transformers", error) from None
    for callback in callbacks:
        try:
            _build_callback(callback)
        except Exception as error:  # noqa: BLE001 - RuntimeError, ImportError, NeptuneCallback's ValueError: refused
            refused = _refused("report_to", report_to, f"transformers' {callback.__name__}", error)
            extras = [extra for name, extra in REPORTING_EXTRAS.items() if name in report_to]
            if extras:
                hint = f" (pip install 'trl-credit[{','.join(extras)}]')"
                refused = SettingError(refused.name, refused.problem + hint)
            raise refused from None


def _build_callback(callback) -> None:
    """Build `callback` as `Trainer` would. A refused one is dropped at once, and its `__del__`, which may read what its
    `__init__` never set (`MLflowCallback._auto_end_run`), is kept from printing a traceback, then or at exit."""
    try:
        with warnings.catch_warnings():  # a deprecation it announces is announced again when `Trainer` builds it
            warnings.simplefilter("ignore")
            callback()
    except Exception as error:
        hook, sys.unraisablehook = sys.unraisablehook, lambda unraisable: None
        try:
            traceback.clear_frames(error.__traceback__)  # the half-built callback's only reference: it goes now
        finally:
            sys.unraisablehook = hook
        raise


def check_hub(args, setting: str = "push_to_hub") -> None:
    """With `push_to_hub` (or `log_completions_hub_repo`, whose repository TRL creates when the trainer is built): the
    Hub can be reached (not offline), a token is set, and the repository name is valid."""
    from pathlib import Path

    from huggingface_hub import constants, get_token
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    shown, off = ("is on", "turn push_to_hub off") if setting == "push_to_hub" else ("is set", f"unset {setting}")
    if constants.HF_HUB_OFFLINE:
        raise SettingError(
            setting, f"{shown}, but the Hugging Face Hub is offline (HF_HUB_OFFLINE=1): unset HF_HUB_OFFLINE, or {off}"
        )
    if not (args.hub_token or get_token()):
        raise SettingError(
            setting, f"{shown}, but no Hugging Face token is set: run `hf auth login`, set HF_TOKEN or hub_token"
        )
    if setting == "push_to_hub":
        repo = args.hub_model_id or Path(args.output_dir).absolute().name  # what `Trainer` creates
        setting = "hub_model_id" if args.hub_model_id else "output_dir"
    else:
        repo = getattr(args, setting)
    try:
        validate_repo_id(repo)
    except HFValidationError as error:
        raise SettingError(
            setting, f"gives the Hub repository {repo!r}, which huggingface_hub refuses: {_owner_words(error)}"
        ) from None
