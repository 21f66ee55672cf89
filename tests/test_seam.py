"""The trainer a newcomer reads in one sitting: the path from TRL's hand-off to a method's function, traced on a real
training step (`step_trace`), and the size of the library's functions (read with `ast`)."""

from __future__ import annotations

import ast

import pytest
import trl
from step_trace import PACKAGE, count_calls, trace_training_step

from trl_credit.methods import _MACHINERY
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


# The config and the registry machinery: where `credit_method` and `credit_kwargs` become the steps that train.
CONFIG_FLOW_FILES = {"trainer/config.py", "trainer/pairs.py", *(f"methods/{name}.py" for name in _MACHINERY)}
MAX_CONFIG_FLOW_FUNCTIONS = 12


def _a_methods_own_code(key: tuple[str, str]) -> bool:
    """A method's own file (its arguments' checks): the method author's room, not the config flow."""
    folder, _, name = key[0].partition("/")
    return folder == "methods" and name.removesuffix(".py") not in (*_MACHINERY, "__init__")


def test_the_config_flow_is_at_most_12_functions_and_resolves_the_stack_once(make_trainer):
    """From `credit_method` and `credit_kwargs` to the steps that train, on a real config and trainer: every function
    of the config and the registry machinery that building them calls (but a method's checks of its own arguments,
    and the config's `__getattr__`, which answers TRL's attribute probes), and how often the stack is resolved:
    parsed from its name (`parse_credit_methods`) and its steps built (`resolve_stack`)."""
    built = []
    calls = count_calls(lambda: built.append(make_trainer("eapo+taco", taco_alpha=0.1)), outside=_a_methods_own_code)
    flow = sorted(key for key in calls if key[0] in CONFIG_FLOW_FILES and key[1] != "CreditGRPOConfig.__getattr__")
    print(f"\nconfig flow: {len(flow)} functions in {len({module for module, _ in flow})} files: {flow}")
    assert len(flow) <= MAX_CONFIG_FLOW_FUNCTIONS, flow
    assert calls[("methods/registry.py", "parse_credit_methods")] == 1
    assert calls[("methods/registry.py", "resolve_stack")] == 1
    (trainer,) = built
    assert trainer.stage_plan is trainer.args.stage_plan  # the trainer trains the steps the config resolved
    assert [step.hyperparameters.get("taco_alpha") for step in trainer.stage_plan.steps] == [None, 0.1]


def test_the_trainers_state_is_one_class_over_trls_and_its_docstring_lists_every_trl_method_it_overrides():
    """No mixin between the credit trainer and TRL's (run safety and the run record are callbacks and calls from the
    methods it overrides), nothing overrides `training_step` (TRL's tests patch it with `wraps=`), and each TRL method
    the trainer overrides is in its docstring's list, which says why."""
    from trl import GRPOTrainer

    from trl_credit import CreditGRPOTrainer
    from trl_credit.trainer.statistics_sources import StatisticsSources

    assert CreditGRPOTrainer.__bases__ == (StatisticsSources, GRPOTrainer)
    ours = CreditGRPOTrainer.__mro__[: CreditGRPOTrainer.__mro__.index(GRPOTrainer)]
    assert not any("training_step" in vars(cls) for cls in ours)
    overridden = sorted(
        {name for cls in ours for name in vars(cls) if callable(getattr(GRPOTrainer, name, None))}
        - {"__init_subclass__"}
    )
    assert len(overridden) >= 8  # the reader: a trainer that overrides nothing would pass the next line vacuously
    listed = [name for name in overridden if f"`{name}`" in CreditGRPOTrainer.__doc__]
    assert listed == overridden


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
