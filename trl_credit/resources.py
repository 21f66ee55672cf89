"""Files shipped with the package: recipes (`configs/`) and model-card templates (`model_cards/`).

In a wheel they live inside the package (setuptools maps the top-level folders to `trl_credit.configs`
and `trl_credit.model_cards`); in a source checkout they are read from the repository itself.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

_REPO_ROOT = Path(__file__).resolve().parents[1]


def packaged_dir(name: str) -> Path:
    """Folder of packaged data `name` (`"configs"` or `"model_cards"`)."""
    if name not in ("configs", "model_cards"):
        raise ValueError(f"unknown packaged folder {name!r}; expected 'configs' or 'model_cards'")
    source = _REPO_ROOT / name
    if source.is_dir():
        return source
    return Path(str(importlib.resources.files(f"trl_credit.{name}")))


def accelerate_config_path(name_or_path: str) -> Path:
    """A path to an accelerate config: an existing file, or a packaged name such as `zero3`."""
    if Path(name_or_path).is_file():
        return Path(name_or_path)
    candidate = packaged_dir("configs") / "accelerate" / f"{name_or_path}.yaml"
    if not candidate.is_file():
        available = sorted(p.stem for p in (packaged_dir("configs") / "accelerate").glob("*.yaml"))
        raise ValueError(
            f"--accelerate_config {name_or_path!r} is neither a file nor a packaged config; packaged: {available}"
        )
    return candidate
