from .config import CREDIT_METHODS, CreditGRPOConfig
from .credit_trainer import CreditGRPOTrainer
from .methods import METHODS, EAPOConfig, EAPOTrainer, TACOConfig, TACOTrainer, TIDEConfig, TIDETrainer

__all__ = [
    "CREDIT_METHODS",
    "METHODS",
    "CreditGRPOConfig",
    "CreditGRPOTrainer",
    "EAPOConfig",
    "EAPOTrainer",
    "TACOConfig",
    "TACOTrainer",
    "TIDEConfig",
    "TIDETrainer",
]
