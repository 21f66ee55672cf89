"""The credit-assignment GRPO trainer, its config, and the single-method pairs (re-exported by `trl_credit`).

Importing it changes nothing in TRL: the installed TRL is checked when a trainer is built, and TRL 1.15's torch
fallback for its fused LM head applies only inside the trainer's own scoring calls (`trl_compat`). The exports load on
first access, so that the token-credit schema (`token_credit_records`) is read without importing TRL or torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "CreditGRPOConfig": ".config",
    "CreditGRPOTrainer": ".credit_trainer",
    "EAPOConfig": ".pairs",
    "EAPOTrainer": ".pairs",
    "TACOConfig": ".pairs",
    "TACOTrainer": ".pairs",
    "TIDEConfig": ".pairs",
    "TIDETrainer": ".pairs",
    "trainer_pair": ".pairs",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
