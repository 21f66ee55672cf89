"""The package layout: the library (`methods/`, `trainer/`) apart from the tooling around it, one job per module.

Imports are read with `ast` from the source, so a deferred import inside a function counts as much as one at the top.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import trl_credit

PACKAGE = Path(trl_credit.__file__).resolve().parent
LIBRARY = ("methods", "trainer")
TOOLING = ("data", "rewards", "reports", "experiments", "cli")
MAX_LINES = 400

MODULES = sorted(path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py"))


def _module_name(relative: str) -> str:
    parts = ["trl_credit", *Path(relative).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(relative: str) -> set[str]:
    """Every `trl_credit` module `relative` imports, as absolute dotted names (`from . import x` gives `pkg.x` too)."""
    name = _module_name(relative)
    package = name if relative.endswith("__init__.py") else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse((PACKAGE / relative).read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return {module for module in found if module == "trl_credit" or module.startswith("trl_credit.")}


def _group(module: str) -> str | None:
    """`library`, `tooling`, or None for the package's top-level modules (`trl_credit`, `trl_credit.resources`)."""
    parts = module.split(".")
    if len(parts) < 2 or parts[1] not in LIBRARY + TOOLING:
        return None
    return "library" if parts[1] in LIBRARY else "tooling"


def test_every_folder_of_the_package_is_library_or_tooling():
    # `configs/` and `model_cards/` join the package as data in a wheel (pyproject's package-dir), not as code.
    folders = {path.name for path in PACKAGE.iterdir() if path.is_dir()} - {"__pycache__", "configs", "model_cards"}
    assert folders == set(LIBRARY + TOOLING)


@pytest.mark.parametrize("module", MODULES)
def test_no_module_is_over_400_lines(module):
    assert len((PACKAGE / module).read_text().splitlines()) <= MAX_LINES


# What every method is registered, checked and run with; its code apart from its prose (docstrings, comments).
REGISTRY_MACHINERY = ("methods/registry.py", "methods/settings.py", "methods/stack.py", "methods/batch.py")
MAX_MACHINERY_CODE_LINES = 450


def code_lines(source: str) -> int:
    """The lines of `source` that are neither blank, comments nor part of a docstring."""
    tree = ast.parse(source)
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and ast.get_docstring(
            node, clean=False
        ):
            first = node.body[0]
            docstrings.update(range(first.lineno, first.end_lineno + 1))
    return sum(
        1
        for number, line in enumerate(source.splitlines(), 1)
        if line.strip() and not line.strip().startswith("#") and number not in docstrings
    )


def test_the_registry_machinery_is_at_most_450_lines_of_code():
    counts = {module: code_lines((PACKAGE / module).read_text()) for module in REGISTRY_MACHINERY}
    assert sum(counts.values()) <= MAX_MACHINERY_CODE_LINES, counts


def test_code_lines_skips_blank_lines_comments_and_docstrings():
    source = '"""Module\ndocstring."""\n\n# a comment\nX = 1  # code\n\n\ndef f():\n    """Doc."""\n    return "not a docstring"\n'
    assert code_lines(source) == 3  # X = 1, def f(), return


LIBRARY_MODULES = [m for m in MODULES if _group(_module_name(m)) != "tooling"]


@pytest.mark.parametrize("module", LIBRARY_MODULES)
def test_the_library_imports_nothing_from_the_tooling(module):
    # The trainer writes TRL's model card and the token-credit records (their schema is
    # `trainer/token_credit_records.py`, which `reports/token_view` reads back); the research card is the tooling's.
    assert sorted(m for m in imported_modules(module) if _group(m) == "tooling") == []


def test_the_import_reader_sees_relative_deferred_and_submodule_imports(tmp_path, monkeypatch):
    # The reader itself, on a module written for it: each import form resolves to the absolute module it names.
    source = (
        "import trl_credit.data\n"
        "from ..rewards import RewardStats\n"
        "def f():\n"
        "    from ...reports import token_view\n"
        "    from . import sources\n"
    )
    (tmp_path / "trl_credit" / "trainer" / "sub").mkdir(parents=True)
    (tmp_path / "trl_credit" / "trainer" / "sub" / "mod.py").write_text(source)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "trl_credit")
    assert imported_modules("trainer/sub/mod.py") == {
        "trl_credit.data",
        "trl_credit.trainer.rewards",
        "trl_credit.trainer.rewards.RewardStats",
        "trl_credit.reports",
        "trl_credit.reports.token_view",
        "trl_credit.trainer.sub",
        "trl_credit.trainer.sub.sources",
    }


def test_the_package_docstring_names_every_folder():
    for folder in LIBRARY + TOOLING:
        assert f"`{folder}/`" in trl_credit.__doc__


MAX_TRAINER_IMPORT_CHAIN = 6  # modules, the first included: `pairs -> credit_trainer -> ... -> trl_compat`


def longest_import_chain(folder: str) -> list[str]:
    """The longest chain of imports between the modules of `folder` (a module imports the next), cycles cut."""
    modules = {_module_name(m): m for m in MODULES if m.startswith(f"{folder}/")}
    imports = {name: sorted(set(imported_modules(m)) & set(modules) - {name}) for name, m in modules.items()}

    def longest_from(name: str, seen: tuple[str, ...]) -> list[str]:
        chains = [longest_from(n, (*seen, name)) for n in imports[name] if n not in seen]
        return [name, *max(chains, key=len, default=[])]

    return max((longest_from(name, ()) for name in modules), key=len)


def test_the_longest_import_chain_inside_the_trainer_is_at_most_6_modules():
    chain = longest_import_chain("trainer")
    assert len(chain) <= MAX_TRAINER_IMPORT_CHAIN, " -> ".join(chain)


def test_the_chain_reader_follows_imports_and_cuts_cycles(tmp_path, monkeypatch):
    folder = tmp_path / "trl_credit" / "trainer"
    folder.mkdir(parents=True)
    for name, source in {"a": "from . import b\n", "b": "from .c import x\n", "c": "from . import a\nx = 1\n"}.items():
        (folder / f"{name}.py").write_text(source)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "trl_credit")
    monkeypatch.setattr(sys.modules[__name__], "MODULES", ["trainer/a.py", "trainer/b.py", "trainer/c.py"])
    assert len(longest_import_chain("trainer")) == 3


MAX_MODULE_DOCSTRING_LINES = 15


def _machinery_modules() -> list[str]:
    """The library's modules but the methods' own files (whose docstring states their paper's rule)."""
    from trl_credit.methods import _MACHINERY

    methods = [f"methods/{name}.py" for name in ("__init__", *_MACHINERY)]
    return ["__init__.py", *methods, *(m for m in MODULES if m.startswith("trainer/"))]


@pytest.mark.parametrize("module", _machinery_modules())
def test_a_module_docstring_is_at_most_15_lines_and_docs_layout_holds_the_rest(module):
    docstring = ast.get_docstring(ast.parse((PACKAGE / module).read_text()), clean=False) or ""
    assert len(docstring.strip("\n").splitlines()) <= MAX_MODULE_DOCSTRING_LINES
