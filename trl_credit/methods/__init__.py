"""The token-level credit methods: one file each, pure tensor functions (no TRL import), and their registry.

Each file holds a method's hyperparameters, the statistics it reads and the function that reshapes the
advantage; importing this package registers the built-in methods.
"""

from .eapo import EAPOArguments, eapo_advantages, eapo_entropy_bounds, eapo_kappa_schedule, eapo_normalized_entropy, quantile_linear
from .registry import (
    CREDIT_METHODS,
    STATISTICS,
    CreditBatch,
    CreditMethod,
    CreditResult,
    get_credit_method,
    parse_credit_methods,
    register_credit_method,
)
from .taco import TACOArguments, taco_advantages, taco_tail_risk
from .tide import DISTANCES, TIDEArguments, tide_advantages, tide_entropy_gate, tide_scores

__all__ = [
    "CREDIT_METHODS",
    "DISTANCES",
    "STATISTICS",
    "CreditBatch",
    "CreditMethod",
    "CreditResult",
    "EAPOArguments",
    "TACOArguments",
    "TIDEArguments",
    "eapo_advantages",
    "eapo_entropy_bounds",
    "eapo_kappa_schedule",
    "eapo_normalized_entropy",
    "get_credit_method",
    "parse_credit_methods",
    "quantile_linear",
    "register_credit_method",
    "taco_advantages",
    "taco_tail_risk",
    "tide_advantages",
    "tide_entropy_gate",
    "tide_scores",
]
