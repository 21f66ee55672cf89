"""Files shipped inside the package: the recipes (`trl_credit.configs`, with the accelerate configs in its
`accelerate/` folder) and the model-card template (`trl_credit.model_cards`).

Both are regular packages whose sources are the repository's top-level `configs/` and `model_cards/` (pyproject's
`package-dir`). They are read through `importlib.resources` alone, so that a wheel, an editable install and the tests
all read them the same way; `importlib.resources.as_file` gives a real file where another program opens one.
"""

from __future__ import annotations

from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path

QUICK_START = "quickstart"  # the recipe `trl-credit grpo` reads without `--config`


def recipes() -> Traversable:
    """The packaged recipes (`configs/` in the repository)."""
    return files("trl_credit.configs")


def accelerate_configs() -> Traversable:
    """The packaged accelerate configs (`configs/accelerate/`)."""
    return recipes().joinpath("accelerate")


def model_card_template(name: str) -> str:
    """The text of the packaged model-card template `name` (in `model_cards/`)."""
    return files("trl_credit.model_cards").joinpath(name).read_text(encoding="utf-8")


def yaml_names(folder: Traversable) -> list[str]:
    """The names of the YAML files in a packaged `folder`: `zero3` for `zero3.yaml`."""
    return sorted(entry.name.removesuffix(".yaml") for entry in folder.iterdir() if entry.name.endswith(".yaml"))


def find_yaml(option: str, name_or_path: str, folder: Traversable) -> tuple[Traversable, str]:
    """The file `name_or_path`, else the YAML file of that name in the packaged `folder`, and how to name it in a
    message; `ValueError` naming `option`, the value and the packaged names when it is neither."""
    if Path(name_or_path).is_file():
        return Path(name_or_path), name_or_path
    names = yaml_names(folder)
    if name_or_path in names:
        return folder.joinpath(f"{name_or_path}.yaml"), f"packaged {name_or_path}.yaml"
    raise ValueError(f"{option} {name_or_path!r} is neither a file nor a packaged name; packaged: {', '.join(names)}")
