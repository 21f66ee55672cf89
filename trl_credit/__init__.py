"""trl-credit: token-level credit assignment (TACO, EAPO, TIDE) for TRL's GRPOTrainer.

The pure method functions import only torch; the trainers (which import TRL) load on first access.
"""

from __future__ import annotations

import importlib

from .methods import (
    CREDIT_METHODS,
    CreditBatch,
    CreditResult,
    apply_credit_method,
    eapo_advantages,
    register_credit_method,
    taco_advantages,
    tide_advantages,
)

__version__ = "0.1.0"

_TRAINER_EXPORTS = (
    "METHODS",
    "CreditGRPOConfig",
    "CreditGRPOTrainer",
    "EAPOConfig",
    "EAPOTrainer",
    "TACOConfig",
    "TACOTrainer",
    "TIDEConfig",
    "TIDETrainer",
)

__all__ = [
    "CREDIT_METHODS",
    "CreditBatch",
    "CreditResult",
    "apply_credit_method",
    "eapo_advantages",
    "register_credit_method",
    "taco_advantages",
    "tide_advantages",
    *_TRAINER_EXPORTS,
]


def __getattr__(name: str):
    if name in _TRAINER_EXPORTS:
        return getattr(importlib.import_module(".trainer", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
