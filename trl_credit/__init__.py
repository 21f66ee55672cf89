"""trl-credit: token-level credit assignment (TACO, EAPO, TIDE) for TRL's GRPOTrainer.

The library is two folders; everything else is tooling around it, grouped by role, and the library imports none of it.
Each folder imports only from itself and the folders listed before it (`tests/test_layout.py`):

- `methods/`: the credit methods, one pure function per paper over `(B, T)` tensors (no TRL), and their registry;
- `trainer/`: `CreditGRPOTrainer`, its config and the single-method pairs (`TACOTrainer`, ...);
- `rewards/`: reward functions in TRL's convention and the Math-Verify answer checks behind them;
- `data/`: math data sets as TRL prompts with gold answers, and the offline SmolLM2 model;
- `reports/`: the model card, the training plots and the token-credit view;
- `experiments/`: evaluation (avg@k, pass@k), comparisons over methods and seeds, and the credit lab;
- `cli/`: the `trl-credit` command and its sub-commands, and the generated tables of the docs.

Everything loads on first access, so that `trl-credit --help` answers without importing torch. See docs/layout.md.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_METHOD_EXPORTS = (
    "CREDIT_METHODS",
    "CreditBatch",
    "CreditResult",
    "apply_credit_method",
    "eapo_advantages",
    "register_credit_method",
    "taco_advantages",
    "tide_advantages",
)

_TRAINER_EXPORTS = (
    "CreditGRPOConfig",
    "CreditGRPOTrainer",
    "EAPOConfig",
    "EAPOTrainer",
    "TACOConfig",
    "TACOTrainer",
    "TIDEConfig",
    "TIDETrainer",
    "trainer_pair",
)

__all__ = [*_METHOD_EXPORTS, *_TRAINER_EXPORTS]


def __getattr__(name: str):
    if name in _METHOD_EXPORTS:
        # A method on plain tensors is named in its own file (`methods/taco.py`: `taco_advantages`); the rest is the
        # registry's.
        module = f".methods.{name.removesuffix('_advantages')}" if name.endswith("_advantages") else ".methods"
        return getattr(importlib.import_module(module, __name__), name)
    if name in _TRAINER_EXPORTS:
        return getattr(importlib.import_module(".trainer", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
