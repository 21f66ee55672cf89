"""The public single-method trainer/config pairs, `TACOTrainer`/`TACOConfig`, `EAPOTrainer`/`EAPOConfig` and
`TIDETrainer`/`TIDEConfig`: each built by [`paper_pair`] from the method's registration and the papers' recipe.

A pair's config is [`CreditGRPOConfig`] with `credit_method` fixed to the method and clip-higher on
(`epsilon_high=0.28`, the recipe all three papers train with); its trainer is `CreditGRPOTrainer` pinned to the
method, with the paper's metadata for model cards and Hub tags from the registration. The method's hyperparameters
are keywords of the config that land in `credit_kwargs`, the one place they are kept.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from dataclasses import field

from ..methods import get_credit_method
from .config import CreditGRPOConfig, parse_credit_kwargs, unsupplied_statistics
from .credit_trainer import CreditGRPOTrainer

# The clip-higher bound of DAPO's recipe, which TACO, EAPO and TIDE all train with.
PAPER_EPSILON_HIGH = 0.28
_PAIRS: dict[str, tuple[type[CreditGRPOConfig], type[CreditGRPOTrainer]]] = {}


def paper_pair(method_name: str, recipe: str) -> tuple[type[CreditGRPOConfig], type[CreditGRPOTrainer]]:
    """The config and trainer of method `method_name`, named after its display name (`TACOConfig`, `TACOTrainer`)
    and defined in this module, so that pickles (training_args.bin) find them by qualified name; `recipe` is what
    else of the paper's recipe the config's docstring says."""
    method = get_credit_method(method_name)
    prefix = method.display_name.replace("-", "")
    help_text = f"Upper clipping bound epsilon_high; the paper's recipe uses clip-higher (0.2 / {PAPER_EPSILON_HIGH})."
    config_class = dataclasses.make_dataclass(
        f"{prefix}Config",
        [
            ("credit_method", str, field(default=method_name, metadata={"help": f"Fixed to {method_name!r}."})),
            ("epsilon_high", float | None, field(default=PAPER_EPSILON_HIGH, metadata={"help": help_text})),
        ],
        bases=(CreditGRPOConfig,),
        namespace={
            "__module__": __name__,
            "__doc__": f"Configuration for [`{prefix}Trainer`]: [`CreditGRPOConfig`] with `credit_method="
            f'"{method_name}"` and the paper\'s recipe: clip-higher `epsilon_high={PAPER_EPSILON_HIGH}`, {recipe}. '
            f"Its hyperparameters are keywords too (`{prefix}Config({method.argument_names[0]}=...)`); they land "
            "in `credit_kwargs`.",
        },
    )
    config_class.__init__ = _pinned_init(config_class.__init__, method_name, method.argument_names)
    trainer_class = types.new_class(
        f"{prefix}Trainer",
        (CreditGRPOTrainer,),
        {"credit_method": method_name},
        lambda namespace: namespace.update(
            __module__=__name__,
            __doc__=f"GRPO with {method.display_name}: {method.summary}",
            config_class=config_class,
        ),
    )
    _PAIRS[method_name] = (config_class, trainer_class)
    return config_class, trainer_class


def _pinned_init(generated_init, method_name: str, argument_names: tuple[str, ...]):
    """The dataclass's `__init__`, refusing another method and taking the method's hyperparameters as keywords,
    which join `credit_kwargs` (one given both ways is an error, whatever the values: nothing says which wins)."""

    @functools.wraps(generated_init)
    def __init__(self, *args, **kwargs):
        if kwargs.get("credit_method", method_name) != method_name:
            raise ValueError(
                f"{type(self).__name__} trains credit_method {method_name!r}, got {kwargs['credit_method']!r}; use "
                "CreditGRPOConfig to choose the method"
            )
        given = {name: kwargs.pop(name) for name in argument_names if name in kwargs}
        credit_kwargs = parse_credit_kwargs(kwargs.get("credit_kwargs")) or {}
        if set(given) & set(credit_kwargs):
            name = min(set(given) & set(credit_kwargs))
            raise ValueError(
                f"{name} is set twice: {type(self).__name__}({name}={given[name]!r}) and "
                f"credit_kwargs[{name!r}] = {credit_kwargs[name]!r}"
            )
        if given:
            kwargs["credit_kwargs"] = {**credit_kwargs, **given}
        generated_init(self, *args, **kwargs)

    return __init__


TACOConfig, TACOTrainer = paper_pair("taco", "no KL and token-mean `dapo` aggregation (TRL's defaults)")
EAPOConfig, EAPOTrainer = paper_pair("eapo", "`dapo` loss, `scale_rewards='group'` and `beta=0` (TRL's defaults)")
TIDEConfig, TIDETrainer = paper_pair(
    "tide", "`beta=0` (TRL's default): deviation-driven credit replaces the KL penalty"
)


def trainer_pair(credit_method: str) -> tuple[type[CreditGRPOConfig], type[CreditGRPOTrainer]]:
    """The config and trainer classes for `credit_method` (a name or a stack): its pair, else the general ones."""
    return _PAIRS.get(credit_method, (CreditGRPOConfig, CreditGRPOTrainer))


def trainable_methods() -> list[str]:
    """The registered methods that `trl-credit grpo` trains (with their default hyperparameters): those whose
    statistics their trainer computes. A method registered for another trainer (the lab's `oracle`) is not one."""
    from ..methods import CREDIT_METHODS, resolve_stack

    return [
        name
        for name, method in CREDIT_METHODS.items()
        if not unsupplied_statistics(resolve_stack([method], {}), trainer_pair(name)[1].supplied_statistics)
    ]
