"""trl-credit: token-level credit assignment (TACO, EAPO, TIDE) for TRL's GRPOTrainer."""

__version__ = "0.1.0"

from .methods import eapo_advantages, taco_advantages, tide_advantages
