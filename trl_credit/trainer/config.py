"""Configuration of the credit-assignment GRPO trainer."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from trl import GRPOConfig

from ..methods import DISTANCES

CREDIT_METHODS = ("grpo", "taco", "eapo", "tide")
TIDE_REFERENCES = ("ref", "old")

# The config fields each method reads; `credit_hyperparameters()` and the model card report these.
METHOD_FIELDS = {
    "grpo": (),
    "taco": ("taco_alpha", "taco_lambda"),
    "eapo": ("eapo_kappa", "eapo_kappa_decay_steps", "eapo_quantiles"),
    "tide": (
        "tide_tau",
        "tide_kappa",
        "tide_distance",
        "tide_reference",
        "tide_token_chunk_size",
        "tide_vocab_chunk_size",
    ),
}


@dataclass
class CreditGRPOConfig(GRPOConfig):
    r"""
    Configuration class for [`CreditGRPOTrainer`]: every [`~trl.GRPOConfig`] parameter plus the token-level credit
    method and its hyperparameters. Method defaults are the papers' defaults.

    Parameters:
        > Parameters that select the credit method

        credit_method (`str`, *optional*, defaults to `"grpo"`):
            How the sequence advantage is spread over tokens: `"grpo"` (uniformly, plain GRPO), `"taco"`, `"eapo"` or
            `"tide"`.

        > Parameters of TACO (https://huggingface.co/papers/2607.07976)

        taco_alpha (`float`, *optional*, defaults to `0.01`):
            Tail threshold: a sampled token is in the tail when `p < alpha * exp(-H)`. In `(0, 1]`.
        taco_lambda (`float`, *optional*, defaults to `0.9`):
            Maximal shrinkage of a tail token's positive credit; weights lie in `(1 - lambda, 1]`. In `[0, 1]`.

        > Parameters of EAPO (https://huggingface.co/papers/2609.33781)

        eapo_kappa (`float`, *optional*, defaults to `log 4`):
            Strength of the entropy reweighting; the largest/smallest weight ratio within a response is at most
            `exp(kappa)`. `0` is GRPO.
        eapo_kappa_decay_steps (`int`, *optional*, defaults to `0`):
            Decay kappa linearly to 0 over this many optimizer steps; `0` keeps it constant.
        eapo_quantiles (`list[float]`, *optional*, defaults to `[0.1, 0.9]`):
            Entropy quantiles (over all valid tokens of the generation batch, every process) that map to 0 and 1.

        > Parameters of TIDE (https://huggingface.co/papers/2605.03327)

        tide_tau (`float`, *optional*, defaults to `0.5`):
            Temperature of the per-response softmax over gated deviation scores.
        tide_kappa (`float`, *optional*, defaults to `1.0`):
            Exponent of the normalised-entropy gate; `0` turns the gate off.
        tide_distance (`str`, *optional*, defaults to `"squared_hellinger"`):
            Deviation measure: `"squared_hellinger"` or `"hellinger"` (its square root).
        tide_reference (`str`, *optional*, defaults to `"ref"`):
            Distribution the deviation is measured against: `"ref"`, the frozen initial model (with PEFT, the
            adapter disabled), or `"old"`, the policy as it was at the previous generation batch.
        tide_token_chunk_size (`int`, *optional*, defaults to `1024`):
            Token positions per block when streaming the LM head.
        tide_vocab_chunk_size (`int`, *optional*, defaults to `16384`):
            Vocabulary rows per block when streaming the LM head (online log-sum-exp).

        > Parameters that control the token-credit log

        log_token_credit (`bool`, *optional*, defaults to `False`):
            Append per-token credit records of a few completions to `output_dir/token_credit.jsonl` at each logging
            step, for `trl-credit inspect`.
        token_credit_samples (`int`, *optional*, defaults to `4`):
            Completions recorded per logging step when `log_token_credit=True`.
    """

    credit_method: str = field(
        default="grpo",
        metadata={"help": "Token-level credit method.", "choices": list(CREDIT_METHODS)},
    )
    taco_alpha: float = field(
        default=0.01,
        metadata={"help": "TACO tail threshold alpha: a token is in the tail when p < alpha * exp(-H). In (0, 1]."},
    )
    taco_lambda: float = field(
        default=0.9,
        metadata={"help": "TACO maximal shrinkage lambda of tail tokens' positive credit. In [0, 1]; 0 is GRPO."},
    )
    eapo_kappa: float = field(
        default=math.log(4),
        metadata={"help": "EAPO strength kappa (>= 0): max/min weight ratio in a response <= exp(kappa). 0 is GRPO."},
    )
    eapo_kappa_decay_steps: int = field(
        default=0,
        metadata={"help": "EAPO: decay kappa linearly to 0 over this many optimizer steps (0 = constant)."},
    )
    eapo_quantiles: list[float] = field(
        default_factory=lambda: [0.1, 0.9],
        metadata={"help": "EAPO entropy quantiles (lo, hi), batch-global over all processes, mapped to 0 and 1."},
    )
    tide_tau: float = field(
        default=0.5,
        metadata={"help": "TIDE softmax temperature tau (> 0) over the gated deviation scores of a response."},
    )
    tide_kappa: float = field(
        default=1.0,
        metadata={"help": "TIDE exponent kappa (>= 0) of the normalised-entropy gate; 0 turns the gate off."},
    )
    tide_distance: str = field(
        default="squared_hellinger",
        metadata={"help": "TIDE deviation measure.", "choices": list(DISTANCES)},
    )
    tide_reference: str = field(
        default="ref",
        metadata={
            "help": "TIDE reference: 'ref' = frozen initial model (PEFT: adapter disabled), 'old' = the policy at "
            "the previous generation batch.",
            "choices": list(TIDE_REFERENCES),
        },
    )
    tide_token_chunk_size: int = field(
        default=1024, metadata={"help": "TIDE: token positions per block when streaming the LM head."}
    )
    tide_vocab_chunk_size: int = field(
        default=16384, metadata={"help": "TIDE: vocabulary rows per block when streaming the LM head."}
    )
    log_token_credit: bool = field(
        default=False,
        metadata={"help": "Write per-token credit of a few completions to output_dir/token_credit.jsonl when logging."},
    )
    token_credit_samples: int = field(
        default=4, metadata={"help": "Completions recorded per logging step when log_token_credit is on."}
    )

    def __post_init__(self):
        # Credit fields are checked first so that a bad value is reported before anything else is set up.
        self.eapo_quantiles = [float(q) for q in self.eapo_quantiles]  # the CLI passes strings
        self.validate_credit_fields()
        super().__post_init__()

    def validate_credit_fields(self) -> None:
        """Raise `ValueError` naming the first credit field whose value is outside its allowed range."""
        checks = [
            ("credit_method", self.credit_method in CREDIT_METHODS, f"one of {CREDIT_METHODS}"),
            ("taco_alpha", 0.0 < self.taco_alpha <= 1.0, "in (0, 1]"),
            ("taco_lambda", 0.0 <= self.taco_lambda <= 1.0, "in [0, 1]"),
            ("eapo_kappa", 0.0 <= self.eapo_kappa < math.inf, "finite and >= 0"),
            ("eapo_kappa_decay_steps", self.eapo_kappa_decay_steps >= 0, ">= 0"),
            (
                "eapo_quantiles",
                len(self.eapo_quantiles) == 2 and 0.0 <= self.eapo_quantiles[0] < self.eapo_quantiles[1] <= 1.0,
                "two values lo, hi with 0 <= lo < hi <= 1",
            ),
            ("tide_tau", 0.0 < self.tide_tau < math.inf, "finite and > 0"),
            ("tide_kappa", 0.0 <= self.tide_kappa < math.inf, "finite and >= 0"),
            ("tide_distance", self.tide_distance in DISTANCES, f"one of {DISTANCES}"),
            ("tide_reference", self.tide_reference in TIDE_REFERENCES, f"one of {TIDE_REFERENCES}"),
            ("tide_token_chunk_size", self.tide_token_chunk_size >= 1, ">= 1"),
            ("tide_vocab_chunk_size", self.tide_vocab_chunk_size >= 1, ">= 1"),
            ("token_credit_samples", self.token_credit_samples >= 1, ">= 1"),
        ]
        for name, ok, allowed in checks:
            if not ok:
                raise ValueError(f"{name} must be {allowed}, got {getattr(self, name)!r}")

    def credit_hyperparameters(self) -> dict:
        """The active method's name and hyperparameters, e.g. for model cards and run names."""
        return {"credit_method": self.credit_method, **{f: getattr(self, f) for f in METHOD_FIELDS[self.credit_method]}}
