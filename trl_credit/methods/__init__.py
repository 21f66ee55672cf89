"""The token-level credit methods: one file each, pure tensor functions (no TRL import), and their registry.

Every module of this folder other than the registry machinery (`_MACHINERY`) is a method, imported here, which
registers it: adding one is adding its file. Its own names (`TACOArguments`, `taco_advantages`) are imported from
its module (`trl_credit.methods.taco`); this package exports the machinery. See docs/layout.md and docs/extending.md.
"""

import importlib
import pkgutil

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
    ROLLOUT_UNSAMPLED,
    ROLLOUT_UNSAMPLED_MASS,
    ROLLOUT_UNSAMPLED_SUM_SQ_PROBS,
    STATISTICS,
    CreditBatch,
    CreditResult,
)
from .names import other_paper
from .registry import (
    COMMON_DIAGNOSTICS,
    CREDIT_METHODS,
    CreditMethod,
    apply_credit_method,
    apply_credit_stack,
    get_credit_method,
    parse_credit_methods,
    register_credit_method,
    resolve_stack,
)
from .settings import SettingError, check_fields, hyperparameter, in_range
from .stack import StackCredit, StackStep, run_stack

# The modules of this folder that are not methods: what every method is registered, checked and run with.
_MACHINERY = ("batch", "names", "registry", "settings", "stack", "user_modules")
for _module in pkgutil.iter_modules(__path__):
    if _module.name not in _MACHINERY:
        importlib.import_module(f"{__name__}.{_module.name}")

# The three methods the package is built around, after GRPO: what `compare` and the lab run by default.
DEFAULT_COMPARISON = ("grpo", "taco", "eapo", "tide")

__all__ = [
    "COMMON_DIAGNOSTICS",
    "CREDIT_METHODS",
    "DEFAULT_COMPARISON",
    "GENERATION_STATISTICS",
    "LOSS_FORWARD_STATISTICS",
    "POLICY_ENTROPY",
    "POLICY_LOGIT_GAP",
    "POLICY_LOGPS",
    "PREVIOUS_POLICY_DEVIATION",
    "REFERENCE_DEVIATION",
    "ROLLOUT_ENTROPY",
    "ROLLOUT_LOGPS",
    "ROLLOUT_MEAN_ENTROPY",
    "ROLLOUT_UNSAMPLED",
    "ROLLOUT_UNSAMPLED_MASS",
    "ROLLOUT_UNSAMPLED_SUM_SQ_PROBS",
    "STATISTICS",
    "CreditBatch",
    "CreditMethod",
    "CreditResult",
    "SettingError",
    "StackCredit",
    "StackStep",
    "apply_credit_method",
    "apply_credit_stack",
    "check_fields",
    "hyperparameter",
    "get_credit_method",
    "in_range",
    "other_paper",
    "parse_credit_methods",
    "register_credit_method",
    "run_stack",
    "resolve_stack",
]
