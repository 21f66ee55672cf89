"""The package layout: the library (`methods/`, `trainer/`) apart from the tooling around it, one job per module.

Imports are read with `ast` from the source, so a deferred import inside a function counts as much as one at the top.
"""

from __future__ import annotations

import ast
import re
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


def _import_statements(relative: str) -> list[tuple[str, list[str]]]:
    """`(module, names)` of every import in `relative`, the module absolute: `import a.b` gives `("a.b", [])`, `from .x
    import y, z` in `pkg/m.py` gives `("pkg.x", ["y", "z"])`."""
    name = _module_name(relative)
    package = name if relative.endswith("__init__.py") else name.rpartition(".")[0]
    statements = []
    for node in ast.walk(ast.parse((PACKAGE / relative).read_text())):
        if isinstance(node, ast.Import):
            statements += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            statements.append((module, [alias.name for alias in node.names]))
    return statements


def imported_modules(relative: str) -> set[str]:
    """Every `trl_credit` module `relative` imports, as absolute dotted names (`from . import x` gives `pkg.x` too)."""
    found = set()
    for module, names in _import_statements(relative):
        found.add(module)
        found.update(f"{module}.{name}" for name in names)
    return {module for module in found if module == "trl_credit" or module.startswith("trl_credit.")}


def package_imports(relative: str) -> set[str]:
    """The modules of the package that `relative` imports: a submodule taken from a package is that submodule, any
    other name taken from a package its `__init__.py` (`from . import UsageError` in `cli/parsing.py`: `trl_credit.cli`)."""
    modules = {_module_name(m) for m in MODULES}
    found = set()
    for module, names in _import_statements(relative):
        for target in [f"{module}.{name}" for name in names] or [module]:
            while target not in modules and "." in target:  # a name defined in a module: that module
                target = target.rpartition(".")[0]
            if target in modules:
                found.add(target)
    return found - {_module_name(relative)}


def test_every_folder_of_the_package_is_library_or_tooling():
    # `configs/` and `model_cards/` join the package as data in a wheel (pyproject's package-dir), not as code.
    folders = {path.name for path in PACKAGE.iterdir() if path.is_dir()} - {"__pycache__", "configs", "model_cards"}
    assert folders == set(LIBRARY + TOOLING) == set(LAYERS) - {None}


@pytest.mark.parametrize("module", MODULES)
def test_no_module_is_over_400_lines(module):
    assert len((PACKAGE / module).read_text().splitlines()) <= MAX_LINES


# What every method is registered, checked and run with; its code apart from its prose (docstrings, comments). 450
# until two registration facts a method declares joined it (`keeps_signs`, what TRL's sign-reading options read after
# it; `not_to_be_confused_with`, the other papers of its name): 455 with them; 465 since `settings.hyperparameter`
# (5 lines) declares each method's fields (the method files lost 129).
REGISTRY_MACHINERY = ("methods/registry.py", "methods/settings.py", "methods/stack.py", "methods/batch.py")
MAX_MACHINERY_CODE_LINES = 465


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


def test_the_registry_machinery_is_at_most_465_lines_of_code():
    counts = {module: code_lines((PACKAGE / module).read_text()) for module in REGISTRY_MACHINERY}
    assert sum(counts.values()) <= MAX_MACHINERY_CODE_LINES, counts


def test_code_lines_skips_blank_lines_comments_and_docstrings():
    source = '"""Module\ndocstring."""\n\n# a comment\nX = 1  # code\n\n\ndef f():\n    """Doc."""\n    return "not a docstring"\n'
    assert code_lines(source) == 3  # X = 1, def f(), return


# The layers of the package, bottom to top: a module imports from its own layer and from those below it, never from one
# above (docs/layout.md). The library is below all the tooling. `None` is the package's own modules
# (`trl_credit/__init__.py`, which re-exports the library, `resources.py`, `command_line.py`): above the library, below
# the tooling. The tooling's order is what each folder needs: data sets are checked with the reward functions' answer
# checks, the reports read data sets' names, the experiments write reports, and the command line runs them all.
LAYERS = ("methods", "trainer", None, "rewards", "data", "reports", "experiments", "cli")


def layer(module: str) -> int:
    """The position in `LAYERS` of the dotted `module` (or of a name defined in it)."""
    parts = module.split(".")
    return LAYERS.index(parts[1] if len(parts) > 1 and parts[1] in LAYERS else None)


@pytest.mark.parametrize("module", MODULES)
def test_every_import_points_down_the_layers(module):
    # So the library imports nothing from the tooling: the trainer writes TRL's model card and the token-credit records
    # (their schema is `trainer/token_credit_records.py`, which `reports/token_view` reads back); the research card is
    # the tooling's. TYPE_CHECKING and deferred imports count as much as the others.
    own = layer(_module_name(module))
    assert sorted(m for m in package_imports(module) if layer(m) > own) == []


def import_cycles() -> list[list[str]]:
    """The groups of modules of the package that import each other, directly or through others (Tarjan's strongly
    connected components of the import graph, each of two or more modules, or one that imports itself)."""
    graph = {_module_name(m): package_imports(m) for m in MODULES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in sorted(graph[module]):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = stack[stack.index(module) :]
            del stack[stack.index(module) :]
            if len(group) > 1 or module in graph[module]:
                cycles.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return cycles


def test_no_modules_import_each_other():
    assert import_cycles() == []


def test_docs_layout_lists_the_layers_in_their_order():
    section = (PACKAGE.parent / "docs" / "layout.md").read_text().split("## Import layers", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[2].strip() for line in section.splitlines() if re.match(r"\| \d+ \|", line)]
    assert [row.strip("`/") if row.endswith("/`") else None for row in reversed(rows)] == list(LAYERS)
    top_level = sorted(f"`{module}`" for module in MODULES if "/" not in module)
    assert sorted(rows[LAYERS[::-1].index(None)].split(", ")) == top_level


def test_docs_layout_has_one_row_per_trainer_module():
    layout = (PACKAGE.parent / "docs" / "layout.md").read_text()
    rows = re.findall(r"^\| `(\w+\.py)` \|", layout.split("| `trl_credit/trainer/` module |", 1)[1], re.M)
    modules = [module.removeprefix("trainer/") for module in MODULES if module.startswith("trainer/")]
    assert sorted(rows) == sorted(module for module in modules if module != "__init__.py")


def test_the_layer_and_cycle_readers_catch_an_upward_import_and_a_cycle(tmp_path, monkeypatch):
    # A package written for the readers: `methods/a` and `methods/b` import each other (one of them only for type
    # checking), and `trainer/t` imports the command line.
    sources = {
        "methods/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n",
        "methods/b.py": "from . import a\nB = 1\n",
        "trainer/t.py": "from ..methods.b import B\ndef f():\n    from ..cli import UsageError\n",
        "cli/__init__.py": "UsageError = Exception\n",
    }
    for relative, source in sources.items():
        (tmp_path / "trl_credit" / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "trl_credit" / relative).write_text(source)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "trl_credit")
    monkeypatch.setattr(sys.modules[__name__], "MODULES", sorted(sources))
    assert package_imports("trainer/t.py") == {"trl_credit.methods.b", "trl_credit.cli"}
    assert [m for m in package_imports("trainer/t.py") if layer(m) > layer("trl_credit.trainer.t")] == [
        "trl_credit.cli"
    ]
    assert import_cycles() == [["trl_credit.methods.a", "trl_credit.methods.b"]]


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
