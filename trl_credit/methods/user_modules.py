"""Importing the module that registers a user's credit method: `credit_method="mymethods:boost"` or
`"examples/custom_credit_method.py:boost"`."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path


def import_user_module(module: str) -> None:
    """Import a dotted module name, or a `.py` file by path (e.g. `examples/custom_credit_method.py`).

    A dotted name that is not importable is also looked for in the current folder (`mymethods` ->
    `./mymethods.py`), as `python -m` would find it: console scripts do not put that folder on `sys.path`. A module
    whose import raised is left out of `sys.modules` (as `import` leaves it), so importing it again runs it again.
    """
    if not module.endswith(".py"):
        try:
            importlib.import_module(module)
            return
        except ModuleNotFoundError as error:
            local = Path.cwd() / (module.replace(".", "/") + ".py")
            if error.name != module.split(".")[0] or not local.is_file():
                raise
            module = str(local)
    path = Path(module).resolve()
    name = f"trl_credit_user_{path.stem}"
    if name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or not path.is_file():
        raise ImportError(f"no such file: {module}")
    module_object = importlib.util.module_from_spec(spec)
    sys.modules[name] = module_object
    try:
        spec.loader.exec_module(module_object)
    except BaseException:
        # As `import` does: a module that failed is not imported, so that the next attempt (the file fixed) runs it.
        del sys.modules[name]
        raise


def import_registering_module(module_name: str, registry: dict) -> None:
    """Import the user's module that registers methods into `registry`, or `ValueError` in one line. If the import
    raises, the methods it registered before failing are forgotten with the module: a retry, the file fixed, starts
    afresh."""
    registered = dict(registry)
    try:
        import_user_module(module_name)
    except BaseException as error:
        registry.clear()
        registry.update(registered)
        if not isinstance(error, Exception):  # KeyboardInterrupt, SystemExit: not the module's error to report
            raise
        reason = " ".join(f"{type(error).__name__}: {error}".split())
        raise ValueError(f"cannot import credit-method module {module_name!r}: {reason}") from error
