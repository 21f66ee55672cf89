"""The test suite's own rules: helpers live in helper modules, not in test modules; a skip says how to enable its test.

Read with `ast` from the source of every module under `tests/`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
MODULES = sorted(path.name for path in TESTS.glob("*.py"))

# Words of a skip reason that tell how to get what is missing: a command, or the device the test needs.
HOW_TO_ENABLE = ("pip install", "apt-get install", "git clone", "CUDA", "XPU")


def _imports(module: str) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse((TESTS / module).read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("module", [m for m in MODULES if m != Path(__file__).name])
def test_no_module_of_the_tests_imports_a_test_module(module):
    assert sorted(name for name in _imports(module) if name.startswith("test_")) == []


def _skip_reasons(module: str) -> list[tuple[int, str | None]]:
    """`(line, reason)` of each `skipif`, `importorskip` and `skip` call; the reason is None where it is not a literal
    (an f-string or a variable, which the test cannot read) and "" where no reason is given."""
    tree = ast.parse((TESTS / module).read_text())
    constants = {  # module-level string constants, e.g. a reason shared by several skips
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in ("skipif", "importorskip", "skip"):
            continue
        reason = next((kw.value for kw in node.keywords if kw.arg in ("reason", "msg")), None)
        if reason is None and node.func.attr == "skip" and node.args:
            reason = node.args[0]
        if reason is None:
            found.append((node.lineno, ""))
        elif isinstance(reason, ast.Constant):
            found.append((node.lineno, reason.value))
        elif isinstance(reason, ast.Name) and reason.id in constants:
            found.append((node.lineno, constants[reason.id]))
        else:
            found.append((node.lineno, None))
    return found


@pytest.mark.parametrize("module", MODULES)
def test_skip_reasons_say_how_to_enable_the_test(module):
    unclear = [
        (line, reason)
        for line, reason in _skip_reasons(module)
        if reason is not None and not any(words in reason for words in HOW_TO_ENABLE)
    ]
    assert unclear == []


def test_the_readme_names_chromium_in_its_test_section():
    readme = (TESTS.parent / "README.md").read_text()
    assert "apt-get install chromium" in readme
