"""The token-level credit methods as pure tensor functions (no TRL import).

Each function maps GRPO's sequence advantages `(B,)` plus per-token statistics `(B, T)` to per-token
advantages `(B, T)`; see `docs/` and the specification for the formulas.
"""

from .eapo import eapo_advantages, eapo_entropy_bounds, eapo_kappa, eapo_normalized_entropy, quantile_linear
from .taco import taco_advantages, taco_tail_risk
from .tide import DISTANCES, tide_advantages, tide_entropy_gate, tide_scores

__all__ = [
    "DISTANCES",
    "eapo_advantages",
    "eapo_entropy_bounds",
    "eapo_kappa",
    "eapo_normalized_entropy",
    "quantile_linear",
    "taco_advantages",
    "taco_tail_risk",
    "tide_advantages",
    "tide_entropy_gate",
    "tide_scores",
]
