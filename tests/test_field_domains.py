"""Every field of TRL's `GRPOConfig` (transformers' `TrainingArguments` included) whose help states a range or choices
is refused outside it when a `CreditGRPOConfig` is built, before any model loads, in one line naming the field.

The fields are found by reading the installed TRL's and transformers' help at test time, so a field a new release adds
is caught here, not by a user. Where the help's words give the domain (`[0, 1)`, `(0, 1]`, `between 0.0 and 1.0`,
`positive`, `one of`, `Options:`, a `choices` list or an enum), the values outside it are derived from them; where they
do not, they are given by hand below, with the words that state the domain.
"""

import dataclasses
import enum
import re
import typing

import pytest
from trl import GRPOConfig

from trl_credit import CreditGRPOConfig
from trl_credit.trainer.field_domains import TRL_FIELD_CHECKS
from trl_credit.trainer.trl_compat import TRL_CHOICES

# Words of a help text that state a field's domain. "positive advantage(s)" is the sign of an advantage, and a version
# bound (`PyTorch >= 2.6`) or a comparison in an explanation (`ratio < 1`) is no domain: neither is matched.
DOMAIN_WORDS = re.compile(
    r"""\bbetween\s+-?[\d.]+\s+and\b | \bin\s+(?:range\s+)?`?[\[(]\s*-?[\d.]+ | \brange:\s*[\[(] | \bmust\s+be\b |
    \bshould\s+be\b | \bone\s+of\b | \boptions?\s*: | \bsupported\s+(?:values|options)\b |
    \b(?:non-)?(?:positive|negative)\b(?!\s+advantage) | \bnon-negative\b | \bgreater\s+than\b | \bless\s+than\b |
    \bat\s+(?:least|most)\b | \bexpects?\b""",
    re.IGNORECASE | re.VERBOSE,
)
INTERVAL = re.compile(r"([\[(])\s*(-?\d+(?:\.\d+)?)\s*[,\-]\s*(-?\d+(?:\.\d+)?)\s*([\])])")
BETWEEN = re.compile(r"\bbetween\s+(-?\d+(?:\.\d+)?)\s+and\s+(-?\d+(?:\.\d+)?)", re.IGNORECASE)

# Fields whose help states a domain in words no rule above reads: the values outside it, and the words.
OUT_OF_DOMAIN_BY_HAND = {
    "max_steps": [-5, 0],  # "If set to a positive number, the total number of training steps" (-1: the epochs)
    "num_generations": [1, 0],  # "the effective batch size ... must be evenly divisible by this value": groups of >= 2
    "delta": [0.5, -1.0],  # "Recommended to be greater than `1 + ε`"
    "vllm_max_model_length": [1],  # "at least the maximum prompt length in the dataset plus `max_completion_length`"
    "log_completions_hub_repo": ["not a/valid/repository"],  # "Should be a complete repository name like ..."
}
EXTRA_SETTINGS = {"log_completions_hub_repo": {"log_completions": True}}  # TRL refuses the repository without it

# Fields whose help matches the words above but states no domain of the field, with why.
NOT_A_DOMAIN = {
    "neftune_noise_alpha": "'Typical range: [5.0, 15.0]' is advice; transformers applies any alpha",
    "entropy_coef": "'A positive value adds an entropy bonus' says what a sign does; a negative one is a penalty",
    "vllm_gpu_memory_utilization": "'must be passed separately' is about the vLLM server (vLLM checks the value)",
    "vllm_tensor_parallel_size": "'must be passed separately' is about the vLLM server (vLLM checks the value)",
}
# Fields with a stated domain that no row of `TRL_FIELD_CHECKS`, `TRL_CHOICES` or declared choices checks, because
# their owner refuses a value outside it before the model loads, in one line naming the field: where, and why.
CHECKED_ELSEWHERE = {
    "warmup_steps": "transformers' TrainingArguments.__post_init__ refuses a negative value, naming the field",
    "min_p": "transformers' MinPLogitsWarper (or vLLM's SamplingParams): owner_checks.check_transformers_sampling",
    "vllm_max_model_length": "checked against max_completion_length by field_domains.check_trl_fields",
    "log_completions_hub_repo": "huggingface_hub's validate_repo_id, with the Hub's other checks: owner_checks",
}


def stated_domain(field: dataclasses.Field) -> list[str]:
    """The words of the field's help (and a `choices` list or an enum type) that state its domain."""
    found = [match.group(0) for match in DOMAIN_WORDS.finditer(" ".join(field.metadata.get("help", "").split()))]
    if field.metadata.get("choices"):
        found.append("choices")
    if _enum_type(field.type) is not None:
        found.append("enum")
    return found


def _enum_type(annotation):
    for argument in typing.get_args(annotation) or (annotation,):
        if isinstance(argument, type) and issubclass(argument, enum.Enum):
            return argument
        if typing.get_args(argument) and _enum_type(argument) is not None:
            return _enum_type(argument)
    return None


def out_of_domain(field: dataclasses.Field) -> list:
    """Values outside the domain the field's help states, as the help's own words give it."""
    if field.name in OUT_OF_DOMAIN_BY_HAND:
        return OUT_OF_DOMAIN_BY_HAND[field.name]
    words = " ".join(field.metadata.get("help", "").split())
    listed = typing.get_origin(field.type) is list
    if (
        field.metadata.get("choices")
        or _enum_type(field.type) is not None
        or re.search(r"one of|options?\s*:|supported (values|options)", words, re.IGNORECASE)
    ):
        return [["no_such_value"]] if listed else ["no_such_value"]
    interval = INTERVAL.search(words)
    between = BETWEEN.search(words)
    if interval or between:
        left, low, high, right = interval.groups() if interval else ("[", *between.groups(), "]")
        low, high = float(low), float(high)
        values = [low if left == "(" else low - 0.5]
        if not re.search(r"\binteger\b", words):  # "an integer or a float in [0, 1)": the interval is the fraction's
            values.append(high if right == ")" else high + 0.5)
        return values
    if re.search(r"\bnon-negative\b", words, re.IGNORECASE):
        return [-1.0]
    if re.search(r"\bpositive\b", words, re.IGNORECASE):
        return [-1.0, 0.0]
    return []


def _stated_fields() -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(GRPOConfig) if stated_domain(f) and f.name not in NOT_A_DOMAIN]


def test_every_field_with_a_stated_domain_has_a_check_or_a_named_owner():
    """A field whose help states a domain is a row of `TRL_FIELD_CHECKS`, a TRL enumerated field (`TRL_CHOICES`),
    a field whose choices transformers declares (an enum or `choices`), or named in `CHECKED_ELSEWHERE` with why."""
    declared = {f.name for f in dataclasses.fields(GRPOConfig) if f.metadata.get("choices") or _enum_type(f.type)}
    covered = set(TRL_FIELD_CHECKS) | set(TRL_CHOICES) | declared | set(CHECKED_ELSEWHERE)
    uncovered = [f"{f.name} ({', '.join(stated_domain(f))})" for f in _stated_fields() if f.name not in covered]
    assert not uncovered, "help states a domain that nothing checks: " + "; ".join(uncovered)
    stale = sorted((set(NOT_A_DOMAIN) | set(OUT_OF_DOMAIN_BY_HAND)) - {f.name for f in dataclasses.fields(GRPOConfig)})
    assert not stale, f"named here but no longer fields of GRPOConfig: {stale}"


def test_every_field_with_a_stated_domain_is_refused_outside_it_in_one_line_naming_it(monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # the repository name is checked last
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    base = {"output_dir": str(tmp_path), "use_cpu": True, "bf16": False, "report_to": "none"}
    failures = []
    for field in _stated_fields():
        values = out_of_domain(field)
        if not values:
            failures.append(f"{field.name}: its help states a domain ({stated_domain(field)}): give values outside it")
        for value in values:
            try:
                CreditGRPOConfig(**base, **EXTRA_SETTINGS.get(field.name, {}), **{field.name: value})
            except ValueError as error:
                lines = str(error).splitlines()
                if len(lines) != 1 or not re.search(rf"\b{field.name}\b", lines[0]):
                    failures.append(f"{field.name}={value!r}: refused, but not in one line naming it: {error}")
                continue
            failures.append(f"{field.name}={value!r} accepted, outside the domain its help states")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize(
    "help_text,values",
    [
        ("Must be in (0, 1]. Set to 1.0 to consider all tokens.", [0.0, 1.5]),
        ("Should be an integer or a float in range `[0,1)`.", [-0.5]),
        ("Range: [0.0-1.0]. A value of `0.0` masks all", [-0.5, 1.5]),
        ("It must be a value between 0.0 and 1.0.", [-0.5, 1.5]),
        ("It expects a positive value (e.g., 0.5).", [-1.0, 0.0]),
        ("Options: 'no', 'steps', 'epoch'.", ["no_such_value"]),
    ],
)
def test_values_outside_a_stated_domain_are_read_from_the_help(help_text, values):
    """The derivation the walk relies on, on the phrasings TRL and transformers use."""
    field = dataclasses.field(metadata={"help": help_text})
    field.name, field.type = "probe", float
    assert stated_domain(field) and out_of_domain(field) == values


@pytest.mark.parametrize(
    "name", ["token_credit_samples", "statistics_token_chunk_size", "statistics_vocab_chunk_size"]
)
@pytest.mark.parametrize("value", ["4", 2.5, 0])
def test_trl_credits_own_sizes_are_integers_named_when_wrong(tmp_path, name, value):
    """From Python no parser converts `"4"`: the field is named with the type it needs, not a bare `TypeError`."""
    with pytest.raises(ValueError, match=rf"^{name} must be an integer >= 1, got {re.escape(repr(value))}$"):
        CreditGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", **{name: value})
