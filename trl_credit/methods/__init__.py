"""The token-level credit methods: one file each, pure tensor functions (no TRL import), and their registry.

Each method file holds a method's hyperparameters (a dataclass that checks itself), the statistics it reads and the
registered function that reshapes the advantage, whose docstring says what the method shows, plus `<name>_advantages`,
the same function on plain tensors ([`CreditMethod.on_tensors`]). Around them: `batch.py` (the statistics by name,
[`CreditBatch`], [`CreditResult`]), `settings.py` (hyperparameter checks and conversion), `validation.py` (the checks
around every call), `registry.py` (registration, lookup, stacks) and `user_modules.py` (importing a user's method
file). Importing this package registers the built-in methods.
"""

from .ar_lopti import ARLoptiArguments, ar_lopti_advantages
from .batch import (
    GENERATION_STATISTICS,
    LOSS_FORWARD_STATISTICS,
    POLICY_ENTROPY,
    POLICY_LOGIT_GAP,
    POLICY_LOGPS,
    PREVIOUS_POLICY_DEVIATION,
    REFERENCE_DEVIATION,
    ROLLOUT_ENTROPY,
    ROLLOUT_LOGPS,
    ROLLOUT_MEAN_ENTROPY,
    ROLLOUT_SUM_SQ_PROBS,
    STATISTICS,
    CreditBatch,
    CreditResult,
)
from .clip_cov import ClipCovArguments, clip_cov_advantages
from .eapo import EAPOArguments, eapo_advantages, eapo_kappa_schedule, eapo_normalized_entropy, quantile_linear
from .entropy_adv import EntropyAdvArguments, entropy_adv_advantages
from .gtpo import GTPOArguments, gtpo_advantages, gtpo_conflict_runs
from .hicra import HICRA_PAPER_GRAMS, HICRAArguments, hicra_advantages, hicra_planning_mask
from .high_entropy import HighEntropyArguments, high_entropy_advantages
from .minp_support import MinPSupportArguments, minp_support_advantages
from .otb import OTBArguments, otb_advantages, otb_baselines, otb_path_variance
from .registry import (
    COMMON_DIAGNOSTICS,
    CREDIT_METHODS,
    CreditMethod,
    apply_credit_method,
    apply_credit_stack,
    get_credit_method,
    parse_credit_methods,
    register_credit_method,
    stack_hyperparameters,
)
from .settings import SettingError, check_fields, in_range
from .stapo import STAPOArguments, stapo_advantages
from .stare import STAREArguments, stare_advantages, stare_selection_size
from .taco import TACOArguments, taco_advantages, taco_tail_risk
from .tampo import TAMPOArguments, tampo_advantages
from .tide import DISTANCES, TIDEArguments, tide_advantages, tide_entropy_gate, tide_scores

# The three methods the package is built around, after GRPO: what `compare` and the lab run by default.
DEFAULT_COMPARISON = ("grpo", "taco", "eapo", "tide")

__all__ = [
    "COMMON_DIAGNOSTICS",
    "CREDIT_METHODS",
    "DEFAULT_COMPARISON",
    "DISTANCES",
    "GENERATION_STATISTICS",
    "HICRA_PAPER_GRAMS",
    "LOSS_FORWARD_STATISTICS",
    "POLICY_ENTROPY",
    "POLICY_LOGIT_GAP",
    "POLICY_LOGPS",
    "PREVIOUS_POLICY_DEVIATION",
    "REFERENCE_DEVIATION",
    "ROLLOUT_ENTROPY",
    "ROLLOUT_LOGPS",
    "ROLLOUT_MEAN_ENTROPY",
    "ROLLOUT_SUM_SQ_PROBS",
    "STATISTICS",
    "CreditBatch",
    "CreditMethod",
    "CreditResult",
    "SettingError",
    "ARLoptiArguments",
    "ClipCovArguments",
    "EAPOArguments",
    "EntropyAdvArguments",
    "GTPOArguments",
    "HICRAArguments",
    "HighEntropyArguments",
    "MinPSupportArguments",
    "OTBArguments",
    "STAPOArguments",
    "STAREArguments",
    "TAMPOArguments",
    "TACOArguments",
    "TIDEArguments",
    "apply_credit_method",
    "check_fields",
    "in_range",
    "apply_credit_stack",
    "ar_lopti_advantages",
    "clip_cov_advantages",
    "eapo_advantages",
    "eapo_kappa_schedule",
    "eapo_normalized_entropy",
    "entropy_adv_advantages",
    "get_credit_method",
    "gtpo_advantages",
    "gtpo_conflict_runs",
    "hicra_advantages",
    "hicra_planning_mask",
    "high_entropy_advantages",
    "minp_support_advantages",
    "otb_advantages",
    "otb_baselines",
    "otb_path_variance",
    "parse_credit_methods",
    "quantile_linear",
    "register_credit_method",
    "stack_hyperparameters",
    "stapo_advantages",
    "stare_advantages",
    "stare_selection_size",
    "taco_advantages",
    "taco_tail_risk",
    "tampo_advantages",
    "tide_advantages",
    "tide_entropy_gate",
    "tide_scores",
]
