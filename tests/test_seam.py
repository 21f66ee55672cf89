"""The trainer a newcomer reads in one sitting: the path from TRL's hand-off to a method's function, traced on a real
training step (`step_trace`), and the size of the library's functions (read with `ast`)."""

from __future__ import annotations

import ast

import pytest
import trl
from step_trace import PACKAGE, trace_training_step

from trl_credit.trainer.trl_compat import needs_torch_fused_head

MAX_HOPS = 5
MAX_SEAM_FUNCTIONS = 12
MAX_SEAM_FILES = 5
MAX_FUNCTION_LINES = 60


def test_a_taco_step_inside_trls_loss_is_five_hops_and_at_most_12_package_functions_in_5_files(make_trainer):
    """Inside the scoring call TRL's `_compute_loss` makes for its forward, on one real step: the path down to `taco`
    (the trainer's training-forward stage, the one stack runner `methods/stack.py`, the method) and every package
    function a reader meets there (batch and result checks, metrics, `followed_by`, the write-back)."""
    trainer = make_trainer("taco", max_steps=1)
    step = trace_training_step(trainer, "taco")
    assert len(step.paths_to_target) == 1  # one micro-batch, one loss forward
    (path,) = step.paths_to_target
    print(f"\nTRL -> {' -> '.join(name for _, name in path)}")
    print(f"distinct package functions on the step: {len(step.package_functions)} ({len(step.seam_functions)} inside")
    print("TRL's scoring call of the loss)")
    assert len(path) <= MAX_HOPS, path
    assert {module for module, _ in path} == {"trainer/credit_trainer.py", "methods/stack.py", "methods/taco.py"}
    assert path[0][1] == "CreditGRPOTrainer._get_per_token_logps_and_entropies" and path[-1][1] == "taco"
    seam = set(step.seam_functions)
    if needs_torch_fused_head(trl.__version__):  # TRL 1.15's fused head needs the torch fallback around the forward
        seam.discard(("trainer/trl_compat.py", "_torch_fused_head"))
    files = {module for module, _ in seam}
    assert len(seam) <= MAX_SEAM_FUNCTIONS and len(files) <= MAX_SEAM_FILES, sorted(seam)


def _functions_over_the_limit(module: str) -> list[tuple[str, int]]:
    tree = ast.parse((PACKAGE / module).read_text())
    return [
        (node.name, node.end_lineno - node.lineno + 1)
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]


# The library: the trainer and the methods.
LIBRARY_MODULES = sorted(
    path.relative_to(PACKAGE).as_posix()
    for folder in ("trainer", "methods")
    for path in (PACKAGE / folder).glob("*.py")
)


@pytest.mark.parametrize("module", LIBRARY_MODULES)
def test_no_function_of_the_library_is_over_60_lines(module):
    assert _functions_over_the_limit(module) == []


def test_the_length_reader_counts_a_function_from_its_def_to_its_last_line(tmp_path, monkeypatch):
    import step_trace

    (tmp_path / "long.py").write_text("def f():\n" + "    x = 1\n" * 60 + "\n\ndef g():\n    pass\n")
    monkeypatch.setattr(step_trace, "PACKAGE", tmp_path)
    monkeypatch.setitem(globals(), "PACKAGE", tmp_path)
    assert _functions_over_the_limit("long.py") == [("f", 61)]
