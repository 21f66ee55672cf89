"""The public single-method trainer/config pairs: `TACOTrainer`, `EAPOTrainer`, `TIDETrainer`.

Each config declares its method's hyperparameters as fields (`TACOConfig(taco_alpha=0.05)`) and re-declares only
what the paper's recipe changes; each trainer is `CreditGRPOTrainer` pinned to one method (`credit_method="taco"` in the class
statement), which takes the paper's metadata for model cards and Hub tags from the method's registration.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..methods import EAPOArguments, TACOArguments, TIDEArguments
from .config import CreditGRPOConfig
from .credit_trainer import CreditGRPOTrainer

_CLIP_HIGHER_HELP = "Upper clipping bound epsilon_high; the paper's recipe uses clip-higher (0.2 / 0.28)."


@dataclass
class TACOConfig(CreditGRPOConfig, TACOArguments):
    r"""
    Configuration for [`TACOTrainer`]: [`CreditGRPOConfig`] with `credit_method="taco"` and the paper's recipe
    (clip-higher `epsilon_high=0.28`, no KL, token-mean `dapo` aggregation, which are TRL's defaults otherwise).
    """

    credit_method: str = field(default="taco", metadata={"help": "Token-level credit method (fixed to 'taco')."})
    epsilon_high: float | None = field(default=0.28, metadata={"help": _CLIP_HIGHER_HELP})


@dataclass
class EAPOConfig(CreditGRPOConfig, EAPOArguments):
    r"""
    Configuration for [`EAPOTrainer`]: [`CreditGRPOConfig`] with `credit_method="eapo"` and the paper's recipe
    (clip-higher `epsilon_high=0.28`, `dapo` loss, `scale_rewards="group"`, `beta=0`).
    """

    credit_method: str = field(default="eapo", metadata={"help": "Token-level credit method (fixed to 'eapo')."})
    epsilon_high: float | None = field(default=0.28, metadata={"help": _CLIP_HIGHER_HELP})


@dataclass
class TIDEConfig(CreditGRPOConfig, TIDEArguments):
    r"""
    Configuration for [`TIDETrainer`]: [`CreditGRPOConfig`] with `credit_method="tide"`. TIDE replaces the KL
    penalty (`beta=0`, TRL's default) with deviation-driven credit; it builds DAPO's recipe, so clip-higher is on.
    """

    credit_method: str = field(default="tide", metadata={"help": "Token-level credit method (fixed to 'tide')."})
    epsilon_high: float | None = field(default=0.28, metadata={"help": _CLIP_HIGHER_HELP})


class TACOTrainer(CreditGRPOTrainer, credit_method="taco"):
    """GRPO with TACO: positive credit of implausible tail tokens is shrunk (statistics from the training forward)."""

    config_class = TACOConfig


class EAPOTrainer(CreditGRPOTrainer, credit_method="eapo"):
    """GRPO with EAPO: credit moves to high-entropy tokens on success and to low-entropy tokens on failure."""

    config_class = EAPOConfig


class TIDETrainer(CreditGRPOTrainer, credit_method="tide"):
    """GRPO with TIDE: credit follows the entropy-gated Hellinger deviation of the policy from a reference."""

    config_class = TIDEConfig


# The trainer and config the CLI uses for a method name; any other name or stack trains with CreditGRPOTrainer.
METHODS = {
    "grpo": (CreditGRPOConfig, CreditGRPOTrainer),
    "taco": (TACOConfig, TACOTrainer),
    "eapo": (EAPOConfig, EAPOTrainer),
    "tide": (TIDEConfig, TIDETrainer),
}


def trainer_pair(credit_method: str) -> tuple[type[CreditGRPOConfig], type[CreditGRPOTrainer]]:
    """The config and trainer classes for `credit_method` (a name or a stack)."""
    return METHODS.get(credit_method, METHODS["grpo"])
