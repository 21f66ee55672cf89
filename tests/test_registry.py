"""The registry is the one place a method lives: no other module of the package names one."""

import ast
from pathlib import Path

import pytest

from trl_credit.methods import CREDIT_METHODS
from trl_credit.methods.registry import COMMON_DIAGNOSTICS, STATISTICS

PACKAGE = Path(__file__).resolve().parents[1] / "trl_credit"
# The public single-method pairs (TACOTrainer, ...) are the exception the design allows, besides the lab's oracle,
# a method in a file of its own that lives with the lab whose ground truth it reads.
ALLOWED = {PACKAGE / "methods", PACKAGE / "trainer" / "methods.py", PACKAGE / "experiments" / "lab" / "oracle.py"}


def _code_strings(tree: ast.AST):
    """String constants of a module that are not docstrings (documentation may give examples)."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node


def test_no_module_outside_the_methods_names_a_method():
    import re

    names = re.compile(r"\b(" + "|".join(sorted(CREDIT_METHODS)) + r")\b", re.IGNORECASE)
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if any(path == allowed or allowed in path.parents for allowed in ALLOWED):
            continue
        tree = ast.parse(path.read_text())
        for node in _code_strings(tree):
            if names.search(node.value):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.value!r}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and names.search(node.id):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: name {node.id}")
    assert not found, "\n".join(found)


BUILT_IN = sorted(
    name for name, m in CREDIT_METHODS.items() if m.function.__module__.startswith("trl_credit.methods.")
)


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_registration_is_complete(name):
    method = CREDIT_METHODS[name]
    assert method.display_name and method.summary and method.diagnostics and method.token_statistic
    assert (
        method.paper
        and {"title", "id", "citation"} <= set(method.paper)
        and method.paper["id"] in method.paper["citation"]
    )
    assert not set(method.diagnostics) & set(COMMON_DIAGNOSTICS)
    for field in method.argument_fields():
        assert field.metadata.get("help"), f"{name}.{field.name} has no help"
    statistics = (
        method.statistics if not callable(method.statistics) else method.statistics_for(method.hyperparameters())
    )
    assert set(statistics) <= set(STATISTICS)
