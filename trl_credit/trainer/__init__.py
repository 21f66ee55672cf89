"""The credit-assignment GRPO trainer, its config, and the single-method pairs (re-exported by `trl_credit`)."""

from . import trl_compat
from .config import CreditGRPOConfig  # noqa: F401
from .credit_trainer import CreditGRPOTrainer  # noqa: F401
from .methods import (  # noqa: F401
    METHODS,
    EAPOConfig,
    EAPOTrainer,
    TACOConfig,
    TACOTrainer,
    TIDEConfig,
    TIDETrainer,
    trainer_pair,
)

trl_compat.install()  # TRL 1.15 on devices without Triton: see trl_compat
trl_compat.check_trl_surfaces()  # at import, before any trainer is built (cached)
