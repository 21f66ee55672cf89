"""The credit-assignment GRPO trainer, its config, and the single-method pairs (re-exported by `trl_credit`).

Importing it changes nothing in TRL: the installed TRL is checked when a trainer is built, and TRL 1.15's torch
fallback for its fused LM head applies only inside the trainer's own scoring calls (`trl_compat`).
"""

from .config import CreditGRPOConfig  # noqa: F401
from .credit_trainer import CreditGRPOTrainer  # noqa: F401
from .pairs import (  # noqa: F401
    EAPOConfig,
    EAPOTrainer,
    TACOConfig,
    TACOTrainer,
    TIDEConfig,
    TIDETrainer,
    trainer_pair,
)
