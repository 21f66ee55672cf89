"""The registry is the one place a method lives: no other module of the package names one, each method has one
shape, and a registration lives as long as the test that made it."""

import ast
import collections
import dataclasses
import importlib
from pathlib import Path

import pytest
import torch

from trl_credit.experiments.lab.statistics import TASK_DECISIVE
from trl_credit.methods import (
    COMMON_DIAGNOSTICS,
    CREDIT_METHODS,
    POLICY_ENTROPY,
    POLICY_LOGIT_GAP,
    POLICY_LOGPS,
    PREVIOUS_POLICY_DEVIATION,
    REFERENCE_DEVIATION,
    ROLLOUT_ENTROPY,
    ROLLOUT_LOGPS,
    ROLLOUT_MEAN_ENTROPY,
    ROLLOUT_UNSAMPLED_MASS,
    ROLLOUT_UNSAMPLED_SUM_SQ_PROBS,
    STATISTICS,
    CreditBatch,
    get_credit_method,
    other_paper,
    register_credit_method,
    resolve_stack,
)
from trl_credit.methods.names import label as method_label
from trl_credit.methods.stack import run_stack

PACKAGE = Path(__file__).resolve().parents[1] / "trl_credit"
# The public single-method pairs (TACOTrainer, ...) are the exception the design allows, besides the lab's oracle,
# a method in a file of its own that lives with the lab whose ground truth it reads.
ALLOWED = {PACKAGE / "methods", PACKAGE / "trainer" / "pairs.py", PACKAGE / "experiments" / "lab" / "oracle.py"}


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
    assert all(allowed.exists() for allowed in ALLOWED), "an allowed module was renamed: update ALLOWED"
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


@pytest.mark.parametrize("name", BUILT_IN)
def test_no_two_settings_of_a_method_share_a_mutable_default(name):
    """A list hyperparameter (EAPO's quantiles, HICRA's grams) is a fresh list in every instance of the arguments:
    one run changing it in place leaves the next run's default alone."""
    method = CREDIT_METHODS[name]
    first, second = method.arguments(), method.arguments()
    for field in method.argument_fields():
        value = getattr(first, field.name)
        assert value == getattr(second, field.name)
        if isinstance(value, list):
            assert value is not getattr(second, field.name), f"{name}.{field.name}"


def test_a_hyperparameter_declares_its_default_its_help_and_its_choices():
    """`hyperparameter` as a user's method file calls it (the built-in methods call it at import, before a test can
    switch a mutant on): the default, the help and the choices in the field's metadata, a list copied per instance."""

    from trl_credit.methods import hyperparameter

    @dataclasses.dataclass
    class Arguments:
        scale: float = hyperparameter(0.5, "Scale (> 0).")
        mode: str = hyperparameter("a", "Mode.", choices=("a", "b"))
        grams: list[str] = hyperparameter(["x"], "Grams.")

    fields = {field.name: field for field in dataclasses.fields(Arguments)}
    assert fields["scale"].default == 0.5 and dict(fields["scale"].metadata) == {"help": "Scale (> 0)."}
    assert fields["mode"].default == "a" and dict(fields["mode"].metadata) == {"help": "Mode.", "choices": ["a", "b"]}
    assert dict(fields["grams"].metadata) == {"help": "Grams."}
    first, second = Arguments(), Arguments()
    assert first.grams == ["x"] and first.grams is not second.grams


def test_a_string_setting_with_choices_is_refused_by_the_parser_naming_them(capsys):
    """`hyperparameter(..., choices=...)` puts its choices where TRL's parser reads them: the flag refuses another
    value before any check of ours, naming the choices."""
    from trl import TrlParser

    from trl_credit.methods.tide import TIDEArguments

    with pytest.raises(SystemExit):
        TrlParser((TIDEArguments,)).parse_args_into_dataclasses(["--tide_distance", "l2"])
    error = capsys.readouterr().err
    assert "invalid choice: 'l2' (choose from 'squared_hellinger', 'hellinger')" in error


@pytest.mark.parametrize(
    "name, settings", [(name, {}) for name in BUILT_IN] + [("tide", {"tide_reference": "old"})], ids=str
)
def test_the_stage_a_registration_reports_is_the_stage_the_trainer_plans(name, settings):
    """`reads_training_forward` (what the benchmarks and the docs ask of a method) agrees with the stage the trainer's
    plan gives it, for a method whose statistics depend on its settings too (TIDE's reference)."""
    from trl_credit.trainer.config import plan_stages

    method = CREDIT_METHODS[name]
    plan = plan_stages(name, resolve_stack([method], settings))
    assert method.reads_training_forward(method.hyperparameters(settings)) == bool(plan.training_forward)
    assert bool(plan.training_forward) != bool(plan.generation)


def every_statistic(B=3, T=5, seed=0):
    """Plain tensors of every statistic, each in its range, with a padded mask."""
    g = torch.Generator().manual_seed(seed)
    logp_all = torch.log_softmax(3 * torch.randn(B, T, 11, generator=g), dim=-1)
    probs = logp_all.exp()
    logps = logp_all[..., 0]
    entropy = -(probs * logp_all).sum(-1)
    statistics = {
        name: value
        for names, value in [
            ((POLICY_LOGPS, ROLLOUT_LOGPS), logps),
            ((POLICY_ENTROPY, ROLLOUT_ENTROPY), entropy),
            ((POLICY_LOGIT_GAP,), logps - logp_all.amax(-1)),
            ((ROLLOUT_UNSAMPLED_MASS,), 1 - probs[..., 0]),
            ((ROLLOUT_UNSAMPLED_SUM_SQ_PROBS,), (probs[..., 1:] ** 2).sum(-1)),
            ((ROLLOUT_MEAN_ENTROPY,), torch.full((B, T), entropy.mean().item())),
            ((REFERENCE_DEVIATION, PREVIOUS_POLICY_DEVIATION), torch.rand(B, T, generator=g)),
            ((TASK_DECISIVE,), (torch.rand(B, T, generator=g) < 0.5).float()),
        ]
        for name in names
    }
    mask = torch.arange(T) < torch.tensor([T, T - 2, 1]).unsqueeze(1)
    batch = dict(vocab_size=11, rewards_B=torch.tensor([1.0, 0.0, 1.0]), group_index_B=torch.tensor([0, 0, 0]))
    # Completion ids (pad id 0 past each end) and their texts, for the methods that read tokens (GTPO, HICRA).
    ids = torch.where(mask, torch.randint(1, 11, (B, T), generator=g), 0)
    batch.update(completion_ids_BT=ids, pad_token_id=0, token_texts=lambda row: [f" w{i}" for i in row])
    return torch.tensor([1.0, -0.5, 0.3]), mask, {**statistics, **batch}


@pytest.mark.parametrize("name", BUILT_IN)
def test_one_shape_per_method_checked_once(name, monkeypatch):
    """`<name>_advantages` is the registered function on plain tensors, and its hyperparameters are checked once, by
    its arguments dataclass, on the way in."""
    method = CREDIT_METHODS[name]
    assert getattr(importlib.import_module(method.function.__module__), f"{name}_advantages") == method.on_tensors
    calls = collections.Counter()
    checked = getattr(method.arguments, "__post_init__", None)  # none where every value is allowed (OTB's bool)
    if checked is not None:
        monkeypatch.setattr(method.arguments, "__post_init__", lambda self: calls.update([name]) or checked(self))
    advantages_B, mask_BT, named = every_statistic()
    result = method.on_tensors(advantages_B, mask_BT, **named)
    assert calls == collections.Counter([name] if checked else []) and result.advantages_BT.shape == mask_BT.shape


def _documented(docstring: str):
    def function(batch):
        return batch.advantages_BT

    function.__doc__ = docstring
    return function


def test_what_a_method_shows_is_its_display_name_and_its_docstring(credit_method_registry):
    register_credit_method("documented", display_name="Documented one")(
        _documented(
            """Gives each token its response's
            advantage, unchanged.

            Metrics:
                first_metric: the first meaning: a colon inside
                second_metric: a meaning that runs on
                    over two lines

            A section of its own (a heading starts at the margin):
                not_a_metric: read by nothing

            Token statistic:
                echo: the advantage itself
            """
        )
    )
    method = CREDIT_METHODS["documented"]
    assert (method.display_name, method.summary) == (
        "Documented one",
        "Gives each token its response's advantage, unchanged.",
    )
    assert method.diagnostics == {
        "first_metric": "the first meaning: a colon inside",
        "second_metric": "a meaning that runs on over two lines",
    }
    assert method.token_statistic == ("echo", "the advantage itself")
    register_credit_method("bare")(_documented(None))
    bare = CREDIT_METHODS["bare"]
    assert (bare.display_name, bare.summary, bare.diagnostics, bare.token_statistic) == ("bare", "", {}, None)


@pytest.mark.parametrize(
    "name,other,registered",
    [
        ("gtpo_bytedance", 'ByteDance\'s GTPO, "Group Token Policy Optimization" (arXiv 2508.04349)', "gtpo"),
        ("group_token_po", 'ByteDance\'s GTPO, "Group Token Policy Optimization" (arXiv 2508.04349)', "gtpo"),
        ("entropy_aware_po", 'EAPO, "Entropy-Aware Policy Optimization" (arXiv 2604.11056)', "eapo"),
        ("eapo_entropy_aware", 'EAPO, "Entropy-Aware Policy Optimization" (arXiv 2604.11056)', "eapo"),
    ],
)
def test_an_unknown_name_like_another_papers_method_names_both_papers(name, other, registered):
    method = CREDIT_METHODS[registered]
    with pytest.raises(ValueError) as error:
        get_credit_method(name)
    message = str(error.value)
    assert message.startswith(
        f"unknown credit method {name!r}: {name!r} looks like {other}, which is not registered; "
    )
    assert f'the registered {registered!r} is "{method.paper["title"]}" (arXiv {method.paper["id"]})' in message
    assert message.endswith(f"; registered: grpo, {', '.join(sorted(CREDIT_METHODS))}")


@pytest.mark.parametrize("name", ["gtpo_v2", "tacoo", "po", "entropy"])
def test_an_unknown_name_like_no_other_paper_names_none(name):
    with pytest.raises(ValueError) as error:
        get_credit_method(name)
    assert str(error.value) == f"unknown credit method {name!r}; registered: grpo, {', '.join(sorted(CREDIT_METHODS))}"


def test_the_other_papers_of_a_registration_are_its_own_and_well_formed(credit_method_registry):
    other = other_paper("SB", "Some Boost", "2601.00002", by="Lab")
    register_credit_method(
        "sb", paper={"title": "Surprise Boost", "id": "2601.00001"}, not_to_be_confused_with=(other,)
    )(_documented("Boosts."))
    assert CREDIT_METHODS["sb"].not_to_be_confused_with == (other,)
    assert method_label(CREDIT_METHODS["sb"]) == "sb (arXiv 2601.00001)"
    with pytest.raises(ValueError) as error:
        get_credit_method("some_boost_lab")
    assert "'some_boost_lab' looks like Lab's SB, \"Some Boost\" (arXiv 2601.00002)" in str(error.value)
    with pytest.raises(ValueError, match="^credit method 'sb2': not_to_be_confused_with holds other_paper"):
        register_credit_method("sb2", not_to_be_confused_with=({"name": "SB", "title": "Some Boost"},))


def test_a_registration_made_by_a_test(credit_method_registry):
    register_credit_method("registered_by_a_test")(lambda batch: batch.advantages_BT)
    assert "registered_by_a_test" in credit_method_registry


def test_leaves_the_registry_with_that_test():
    assert "registered_by_a_test" not in CREDIT_METHODS


def test_the_labs_statistic_lives_with_the_lab():
    """`task_decisive` is the credit lab's: the library neither lists nor names it, and only the lab's trainer supplies
    it."""
    from trl_credit.experiments.lab.trainer import LabTrainer
    from trl_credit.trainer import CreditGRPOTrainer

    assert TASK_DECISIVE not in STATISTICS and TASK_DECISIVE not in CreditGRPOTrainer.supplied_statistics
    assert TASK_DECISIVE in LabTrainer.supplied_statistics
    for folder in ("methods", "trainer"):
        assert not [p for p in (PACKAGE / folder).rglob("*.py") if TASK_DECISIVE in p.read_text()]
    with pytest.raises(ValueError, match="statistics must be names"):
        register_credit_method("unnamed_statistic", statistics=("not a name",))


def test_a_credit_batch_whose_mask_is_not_bool_is_refused():
    """The stack runner's own check of what the trainer hands it (the tensor entry points convert the mask first)."""

    from trl_credit.methods import CreditBatch, get_credit_method

    mask = torch.ones(2, 3, dtype=torch.bool)
    statistics = {POLICY_LOGPS: torch.zeros(2, 3), POLICY_ENTROPY: torch.zeros(2, 3)}
    batch = CreditBatch.from_sequence_advantages(torch.ones(2), mask, statistics=statistics)
    taco = get_credit_method("taco")
    with pytest.raises(
        ValueError,
        match=r"^credit method 'taco': mask_BT must be a \(B, T\) bool tensor, got torch.float32 of shape \(2, 3\)$",
    ):
        run_stack(resolve_stack([taco], {}), dataclasses.replace(batch, mask_BT=mask.float()))


def test_a_loss_mask_outside_zero_one_is_refused_naming_its_method():
    from trl_credit import CreditResult
    from trl_credit.methods import apply_credit_method

    name = "registry_test_overweight"
    if name not in CREDIT_METHODS:

        @register_credit_method(name, drops_tokens=True)
        def overweight(batch):
            return CreditResult(batch.advantages_BT, loss_mask_BT=batch.mask_BT.float() * 2)

    mask = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match=rf"^credit method '{name}': the returned loss mask must lie in \[0, 1\]"):
        apply_credit_method(name, torch.ones(2), mask)


def test_the_stack_runner_names_the_method_and_what_is_wrong():
    """What the runner refuses, each message naming the method: a statistic the batch lacks, non-finite sequence
    advantages, non-finite returned advantages."""

    from trl_credit import CreditResult
    from trl_credit.methods import CreditBatch, get_credit_method

    mask = torch.ones(2, 3, dtype=torch.bool)
    statistics = {POLICY_LOGPS: torch.zeros(2, 3), POLICY_ENTROPY: torch.zeros(2, 3)}
    taco = get_credit_method("taco")
    steps = resolve_stack([taco], {})
    bare = CreditBatch.from_sequence_advantages(torch.ones(2), mask)
    with pytest.raises(
        ValueError, match=r"^credit method 'taco' reads statistic 'policy_logps', which the batch does not have$"
    ):
        run_stack(steps, bare)
    batch = CreditBatch.from_sequence_advantages(torch.ones(2), mask, statistics=statistics)
    nan_sequence = dataclasses.replace(batch, sequence_advantages_B=torch.tensor([1.0, float("nan")]))
    with pytest.raises(
        ValueError, match=r"^credit method 'taco': sequence_advantages_B has NaN or inf \(1 of 2 values\)$"
    ):
        run_stack(steps, nan_sequence)

    name = "registry_test_nan_advantages"
    if name not in CREDIT_METHODS:

        @register_credit_method(name)
        def nan_advantages(batch):
            return CreditResult(torch.full_like(batch.advantages_BT, float("nan")))

    method = CREDIT_METHODS[name]
    with pytest.raises(ValueError, match=rf"^credit method '{name}': the returned advantages_BT has NaN or inf"):
        run_stack(resolve_stack([method], {}), batch)


def test_a_metric_its_registration_does_not_declare_is_refused_saying_where_to_declare_it(credit_method_registry):
    from trl_credit import CreditResult
    from trl_credit.methods import apply_credit_method

    @register_credit_method("registry_test_undeclared_metric")
    def undeclared_metric(batch):
        """Logs a metric that no `Metrics:` section declares."""
        return CreditResult(batch.advantages_BT, metrics={"surprise": 1.0})

    with pytest.raises(ValueError) as error:
        apply_credit_method("registry_test_undeclared_metric", torch.ones(2), torch.ones(2, 3, dtype=torch.bool))
    assert str(error.value) == (
        "credit method 'registry_test_undeclared_metric' logged metrics ['surprise'] that its registration does not "
        "declare; list them under 'Metrics:' in the function's docstring"
    )


def test_every_statistic_range_holds_zero():
    """`run_stack` checks a statistic's range with one min/max pass over its values zeroed at masked positions."""
    from trl_credit.methods.batch import STATISTIC_RANGES

    assert all(low <= 0.0 <= high for low, high in STATISTIC_RANGES.values())


def test_loss_weights_handed_to_a_stack_outside_zero_one_are_refused_naming_them():

    from trl_credit.methods import CreditBatch, get_credit_method

    mask = torch.ones(2, 3, dtype=torch.bool)
    batch = CreditBatch.from_sequence_advantages(torch.tensor([1.0, -1.0]), mask)
    taco = get_credit_method("taco")
    # A streamed statistic may round just past its range; a loss weight may not (1 + 5e-5 is inside that slack).
    for weight in (1.5, 1.00005):
        heavy = dataclasses.replace(batch, loss_weights_BT=torch.full((2, 3), weight))
        with pytest.raises(ValueError, match=r"^credit method 'taco': loss_weights_BT must lie in \[0, 1\]"):
            run_stack(resolve_stack([taco], {}), heavy)


@pytest.mark.parametrize(
    "value,declared,want",
    [
        ("true", bool, True),
        ("False", bool, False),
        ("0.5", float, 0.5),
        ("3", int, 3),
        (["1", 2], list[int], [1, 2]),
        (None, float | None, None),
        ("2", int | None, 2),
        ("squared_hellinger", str, "squared_hellinger"),
        ("5", str, "5"),  # a string that reads as a number stays that string
    ],
)
def test_a_hyperparameter_is_coerced_to_its_declared_type(value, declared, want):
    from trl_credit.methods.settings import coerce_value

    got = coerce_value("x", value, declared)
    assert got == want and type(got) is type(want)


def test_the_supported_hyperparameter_types_are_the_documented_ones():
    from typing import Literal

    from trl_credit.methods.settings import supported_type

    assert all(supported_type(t) for t in (bool, int, float, str, Literal["a", "b"], int | None, list[float]))
    unsupported = (dict, list, list[dict], dict[str, int], tuple[int, int], bytes, int | str, dict | None)
    assert not any(supported_type(t) for t in unsupported)


def test_a_check_that_cannot_compare_the_value_fails_it():
    """`check_fields`: a check that raises on the value (a string against a range) counts as failed, naming the field."""
    from types import SimpleNamespace

    from trl_credit.methods.settings import SettingError, check_fields, in_range

    with pytest.raises(SettingError) as error:
        check_fields(SimpleNamespace(alpha="high"), alpha=in_range(0.0, 1.0))
    assert str(error.value) == "alpha must be in [0, 1], got 'high'"


def test_a_value_that_cannot_be_its_declared_type_is_named_with_what_is_allowed():
    from typing import Literal

    from trl_credit.methods.settings import SettingError, coerce_value

    for value, declared, problem in [
        ("c", Literal["a", "b"], "must be one of ['a', 'b'], got 'c'"),
        (["0.1", "high"], list[float], "must be a number, got 'high'"),
        ("high", float | None, "must be a number, got 'high'"),
        ([0.1], float, "must be a number, got [0.1]"),
    ]:
        with pytest.raises(SettingError) as error:
            coerce_value("setting", value, declared)
        assert (error.value.name, error.value.problem) == ("setting", problem)


def test_a_bounded_statistic_rounded_just_outside_its_range_is_taken_and_further_out_refused():
    """A streamed statistic may round past its bound (a squared Hellinger distance of 1 + 5e-5): the stage's check
    takes it within its tolerance (1e-4) and refuses a value beyond it, naming the statistic."""
    from reference_credit import random_reference_batch

    method = CREDIT_METHODS["tide"]
    batch = random_reference_batch()
    advantages_B, mask_BT, named = batch.package_inputs()
    reads = method.statistics_for(method.hyperparameters())
    named = {key: value for key, value in named.items() if key not in batch.statistics or key in reads}
    position = mask_BT.bool().nonzero()[0].tolist()
    for deviation, accepted in ((1 + 5e-5, True), (1 + 1e-3, False)):
        deviation_BT = named["reference_deviation"].clone().float()
        deviation_BT[tuple(position)] = deviation
        call = {**named, "reference_deviation": deviation_BT}
        if accepted:
            assert torch.isfinite(method.on_tensors(advantages_B, mask_BT, **call).advantages_BT).all()
        else:
            with pytest.raises(ValueError, match="statistic 'reference_deviation'"):
                method.on_tensors(advantages_B, mask_BT, **call)


def test_the_same_function_registered_again_is_accepted_and_another_refused():
    """A method module imported again (a reload, or one file under two module names) registers its function again:
    accepted, while another function under the taken name is refused."""

    def twice(batch):
        """Never called."""

    def other(batch):
        """Never called."""

    try:
        register_credit_method("registered_twice")(twice)
        register_credit_method("registered_twice")(twice)
        with pytest.raises(ValueError, match="'registered_twice' is already registered by "):
            register_credit_method("registered_twice")(other)
    finally:
        CREDIT_METHODS.pop("registered_twice", None)


# ------------------------------------------------------------------------------ the batch a method sees


def test_sequence_advantages_spread_on_the_valid_tokens_and_token_advantages_pass_through():
    from trl_credit.methods.batch import token_advantages

    mask_BT = torch.tensor([[True, True, False], [True, False, False]])
    assert token_advantages(torch.tensor([2.0, -1.0]), mask_BT).tolist() == [[2.0, 2.0, 0.0], [-1.0, 0.0, 0.0]]
    per_token_BT = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]])
    assert token_advantages(per_token_BT, mask_BT) is per_token_BT


def test_the_next_method_of_a_stack_sees_the_weights_multiplied_and_the_dropped_tokens_zeroed():
    """`followed_by`, worked by hand: an earlier method's soft loss weight (0.5) times the next result's loss mask; a
    token whose weight reaches 0 leaves the mask, and its advantage and every statistic are 0 there."""

    from trl_credit.methods import CreditBatch, CreditResult

    mask_BT = torch.tensor([[True, True, True, False]])
    entropy_BT = torch.tensor([[0.1, 0.2, 0.3, 0.0]])
    batch = CreditBatch.from_sequence_advantages(torch.tensor([2.0]), mask_BT, statistics={POLICY_ENTROPY: entropy_BT})
    batch = dataclasses.replace(batch, loss_weights_BT=torch.tensor([[0.5, 1.0, 1.0, 0.0]]))
    result = CreditResult(torch.tensor([[3.0, 4.0, 5.0, 0.0]]), loss_mask_BT=torch.tensor([[1.0, 0.0, 0.5, 0.0]]))
    following = batch.followed_by(result)
    assert following.mask_BT.tolist() == [[True, False, True, False]]
    assert following.loss_weights_BT.tolist() == [[0.5, 0.0, 0.5, 0.0]]
    assert following.advantages_BT.tolist() == [[3.0, 0.0, 5.0, 0.0]]
    assert torch.equal(following[POLICY_ENTROPY], torch.tensor([[0.1, 0.0, 0.3, 0.0]]))


def test_a_statistic_the_method_did_not_declare_is_a_clear_error():
    from trl_credit.methods import CreditBatch

    batch = CreditBatch.from_sequence_advantages(torch.tensor([1.0]), torch.tensor([[True]]))
    with pytest.raises(KeyError) as error:
        batch[POLICY_ENTROPY]
    assert error.value.args == (
        f"statistic {POLICY_ENTROPY!r} was not requested; the method's `statistics` must list it",
    )


def test_a_registration_declares_only_what_it_says(credit_method_registry):
    """A method registered with its name alone has no hyperparameters, keeps no promise about signs (TRL's
    sign-reading options then read its own signs), drops no tokens, reshapes the incoming advantages and shows its
    name."""

    @register_credit_method("registry_test_bare")
    def bare(batch):
        return batch.advantages_BT

    method = credit_method_registry["registry_test_bare"]
    assert method.argument_fields() == () and method.argument_names == () and method.hyperparameters() == {}
    assert (method.keeps_signs, method.drops_tokens, method.estimates_advantages) == (False, False, False)
    assert (method.display_name, method.statistics, method.paper) == ("registry_test_bare", (), None)


def test_a_statistic_two_methods_of_a_stack_read_is_checked_once(credit_method_registry, monkeypatch):
    """The stage's inputs are checked once (`checked_batch`), however many methods of the stack read a statistic."""
    from trl_credit.methods import apply_credit_stack
    from trl_credit.methods import stack as stack_module

    for name in ("registry_test_reads_entropy_first", "registry_test_reads_entropy_second"):
        register_credit_method(name, statistics=(POLICY_ENTROPY,))(lambda batch: batch.advantages_BT)
    checked, check = collections.Counter(), stack_module._check
    monkeypatch.setattr(
        stack_module, "_check", lambda method, what, *rest: checked.update([what]) or check(method, what, *rest)
    )
    entropy_BT = torch.rand(2, 3)
    mask_BT = torch.ones(2, 3, dtype=torch.bool)
    apply_credit_stack(
        "registry_test_reads_entropy_first+registry_test_reads_entropy_second",
        torch.tensor([1.0, -1.0]),
        mask_BT,
        **{POLICY_ENTROPY: entropy_BT},
    )
    assert checked[f"statistic {POLICY_ENTROPY!r}"] == 1


def test_a_hyperparameter_outside_a_stack_is_named_with_the_stack():
    from trl_credit.methods.settings import SettingError

    stack = [get_credit_method("eapo"), get_credit_method("taco")]
    with pytest.raises(SettingError) as owned_elsewhere:
        resolve_stack(stack, {"tide_tau": 1.0})
    assert "belongs to credit method 'tide', which is not in the stack 'eapo+taco'" in str(owned_elsewhere.value)
    with pytest.raises(SettingError) as unknown:
        resolve_stack(stack, {"taco_alpah": 1.0})
    assert "is not a hyperparameter of 'eapo+taco'; did you mean 'taco_alpha' or " in str(unknown.value)
    with pytest.raises(SettingError) as unlike:
        resolve_stack(stack[1:], {"zzz": 1.0})
    assert str(unlike.value) == "zzz is not a hyperparameter of 'taco'; it has ['taco_alpha', 'taco_lambda']"
    with pytest.raises(SettingError) as of_grpo:
        resolve_stack([], {"zzz": 1.0})
    assert str(of_grpo.value) == "zzz is not a hyperparameter of 'grpo'; it has none"


def test_an_advantage_estimator_on_tensors_reads_integer_rewards_as_float(credit_method_registry):
    """A 0/1 correctness count given as integers reaches an estimator as the float rewards the trainer hands it (an
    integer tensor has no mean)."""
    from trl_credit.methods import apply_credit_method

    @register_credit_method("registry_test_centred", estimates_advantages=True)
    def centred(batch):
        return (batch.rewards_B - batch.rewards_B.mean()).unsqueeze(1).expand_as(batch.mask_BT)

    mask_BT = torch.ones(2, 3, dtype=torch.bool)
    result = apply_credit_method(
        "registry_test_centred", None, mask_BT, rewards_B=torch.tensor([1, 0]), group_index_B=torch.tensor([0, 0])
    )
    torch.testing.assert_close(result.advantages_BT, torch.tensor([[0.5] * 3, [-0.5] * 3]))
    with pytest.raises(ValueError) as error:
        apply_credit_method(
            "registry_test_centred", None, mask_BT, rewards_B=torch.ones(3), group_index_B=torch.tensor([0, 0])
        )
    assert str(error.value) == "credit method 'registry_test_centred': rewards_B must have shape (2,), got (3,)"
    with pytest.raises(ValueError) as error:
        apply_credit_method(
            "registry_test_centred",
            None,
            mask_BT,
            rewards_B=torch.tensor([1.0, torch.nan]),
            group_index_B=torch.zeros(2),
        )
    assert str(error.value) == "credit method 'registry_test_centred': rewards_B has NaN or inf (1 of 2 values)"
    with pytest.raises(ValueError) as error:
        apply_credit_method("registry_test_centred", None, mask_BT, group_index_B=torch.tensor([0, 0]))
    assert str(error.value) == (
        "credit method 'registry_test_centred' estimates advantages from the groups and raw rewards: the batch must "
        "carry rewards_B of shape (2,), got None"
    )


def test_a_method_may_name_its_statistics_by_a_function_of_its_hyperparameters(credit_method_registry):

    @dataclasses.dataclass
    class EitherArguments:
        registry_test_either_current: bool = dataclasses.field(default=True, metadata={"help": "which policy"})

    def read(hyperparameters):
        return (POLICY_ENTROPY,) if hyperparameters["registry_test_either_current"] else (ROLLOUT_ENTROPY,)

    register_credit_method("registry_test_either", statistics=read, arguments=EitherArguments)(
        lambda batch, registry_test_either_current: batch.advantages_BT
    )
    method = credit_method_registry["registry_test_either"]
    assert method.statistics_for({"registry_test_either_current": False}) == (ROLLOUT_ENTROPY,)
    assert method.reads_training_forward(method.hyperparameters()) is True


def test_a_list_of_stacks_is_one_stack():
    from trl_credit.methods.registry import parse_credit_methods

    assert parse_credit_methods(["eapo+taco", "grpo", "stapo"]) == ("eapo", "taco", "stapo")
    with pytest.raises(ValueError) as error:
        parse_credit_methods(["eapo+taco", "taco"])
    assert str(error.value) == "credit_method lists a method twice: ['eapo+taco', 'taco']"
    with pytest.raises(ValueError) as error:
        parse_credit_methods("eapo++taco")
    assert str(error.value) == "credit_method must name one method or a '+'-separated stack, got 'eapo++taco'"


def test_a_hyperparameter_of_another_method_is_named_with_its_owner():
    from trl_credit.methods.settings import SettingError

    with pytest.raises(SettingError) as error:
        get_credit_method("taco").hyperparameters({"tide_tau": 1.0})
    assert str(error.value) == "tide_tau belongs to credit method 'tide', which is not in the stack 'taco'"


def test_non_finite_advantages_are_named_with_the_stack_that_reads_them():
    """Token advantages handed to a stack, and GRPO's own when the stack is empty (`grpo`)."""
    from trl_credit.methods import apply_credit_method, apply_credit_stack

    mask_BT = torch.ones(2, 3, dtype=torch.bool)
    statistics = {POLICY_LOGPS: torch.zeros(2, 3), POLICY_ENTROPY: torch.zeros(2, 3)}
    advantages_BT = torch.tensor([[1.0, float("nan"), 1.0], [1.0, 1.0, 1.0]])
    with pytest.raises(ValueError) as error:
        apply_credit_method("taco", torch.ones(2), mask_BT, advantages_BT=advantages_BT, **statistics)
    assert str(error.value) == "credit method 'taco': advantages_BT has NaN or inf at valid positions (1 of 6 values)"
    with pytest.raises(ValueError) as error:
        apply_credit_stack("grpo", torch.tensor([1.0, float("inf")]), mask_BT)
    assert str(error.value) == "credit method 'grpo': sequence_advantages_B has NaN or inf (1 of 2 values)"


def test_the_token_view_shows_the_statistic_of_the_last_method_that_returned_one(credit_method_registry):
    from trl_credit import CreditResult

    @register_credit_method("registry_test_with_statistic")
    def with_statistic(batch):
        return CreditResult(batch.advantages_BT, statistic_BT=torch.full_like(batch.advantages_BT, 7.0))

    register_credit_method("registry_test_without_statistic")(lambda batch: batch.advantages_BT)
    stack = [credit_method_registry[f"registry_test_with{out}_statistic"] for out in ("", "out")]
    mask_BT = torch.ones(2, 3, dtype=torch.bool)
    credit = run_stack(resolve_stack(stack, {}), CreditBatch.from_sequence_advantages(torch.ones(2), mask_BT))
    torch.testing.assert_close(credit.statistic_BT, torch.full((2, 3), 7.0))


def test_a_papers_record_is_its_title_id_and_bibtex():
    from trl_credit.methods.registry import paper

    assert paper("Some Boost", "2601.00002", "lab2026sb", "A. Author and B. Author") == {
        "title": "Some Boost",
        "id": "2601.00002",
        "citation": "@article{lab2026sb,\n    title        = {{Some Boost}},\n    author       = {A. Author and B. Author},"
        "\n    year         = 2026,\n    eprint       = {arXiv:2601.00002},\n}",
    }


def test_the_loss_masks_of_a_stack_multiply(credit_method_registry):
    from trl_credit import CreditResult

    for name in ("registry_test_halves_first", "registry_test_halves_second"):
        register_credit_method(name, drops_tokens=True)(
            lambda batch: CreditResult(batch.advantages_BT, loss_mask_BT=torch.full_like(batch.advantages_BT, 0.5))
        )
    stack = [credit_method_registry[f"registry_test_halves_{which}"] for which in ("first", "second")]
    mask_BT = torch.ones(2, 3, dtype=torch.bool)
    credit = run_stack(resolve_stack(stack, {}), CreditBatch.from_sequence_advantages(torch.ones(2), mask_BT))
    torch.testing.assert_close(credit.loss_mask_BT, torch.full((2, 3), 0.25))


def test_finite_values_whose_sum_overflows_are_finite(credit_method_registry):
    """The runner's finiteness check sums first; a sum that overflows is checked value by value."""
    register_credit_method("registry_test_passes_through")(lambda batch: batch.advantages_BT)
    mask_BT = torch.ones(2, 3, dtype=torch.bool)
    batch = CreditBatch.from_sequence_advantages(torch.full((2,), 3e38), mask_BT)
    credit = run_stack(resolve_stack([credit_method_registry["registry_test_passes_through"]], {}), batch)
    torch.testing.assert_close(credit.batch.advantages_BT, torch.full((2, 3), 3e38))


def test_a_hyperparameter_named_like_a_batch_field_is_refused(credit_method_registry):

    @dataclasses.dataclass
    class VocabArguments:
        vocab_size: int = dataclasses.field(default=3, metadata={"help": "shadows CreditBatch.vocab_size"})

    with pytest.raises(ValueError) as error:
        register_credit_method("vocab", arguments=VocabArguments)
    assert str(error.value) == "credit method 'vocab': hyperparameter 'vocab_size' is a field of CreditBatch"


def test_what_a_method_returns_at_masked_positions_is_zeroed(credit_method_registry):
    """The next method, and the loss, take the returned advantages as they are: padding must hold zeros."""
    register_credit_method("registry_test_fills_padding")(lambda batch: torch.ones_like(batch.advantages_BT))
    mask_BT = torch.tensor([[True, True, False], [True, False, False]])
    method = credit_method_registry["registry_test_fills_padding"]
    credit = run_stack(resolve_stack([method], {}), CreditBatch.from_sequence_advantages(torch.ones(2), mask_BT))
    torch.testing.assert_close(credit.batch.advantages_BT, mask_BT.float())
    torch.testing.assert_close(credit.results[0][2].advantages_BT, mask_BT.float())


def test_a_misspelt_hyperparameter_is_offered_at_most_three_close_names(credit_method_registry):

    from trl_credit.methods.settings import SettingError

    fields = [(f"registry_test_many_alpha{i}", float, dataclasses.field(default=0.0)) for i in range(5)]
    arguments = dataclasses.make_dataclass("ManyArguments", fields)
    register_credit_method("registry_test_many", arguments=arguments)(lambda batch, **values: batch.advantages_BT)
    with pytest.raises(SettingError) as error:
        credit_method_registry["registry_test_many"].hyperparameters({"registry_test_many_alpha": 1.0})
    offered = str(error.value).partition("; did you mean ")[2]
    assert offered.count(" or ") == 2 and offered.count("'registry_test_many_alpha") == 3


def test_a_method_name_that_is_not_an_identifier_is_refused():
    with pytest.raises(ValueError) as error:
        register_credit_method("my+method")
    assert str(error.value) == "credit method names must be Python identifiers (they prefix metrics), got 'my+method'"


def test_a_method_is_handed_token_advantages_zeroed_at_masked_positions(credit_method_registry):
    register_credit_method("registry_test_passes_on")(lambda batch: batch.advantages_BT)
    mask_BT = torch.tensor([[True, False], [True, True]])
    given_BT = torch.tensor([[1.0, float("nan")], [2.0, 3.0]])
    batch = CreditBatch.from_sequence_advantages(torch.ones(2), mask_BT)
    batch = dataclasses.replace(batch, advantages_BT=given_BT)
    credit = run_stack(resolve_stack([credit_method_registry["registry_test_passes_on"]], {}), batch)
    torch.testing.assert_close(credit.results[0][1].advantages_BT, torch.tensor([[1.0, 0.0], [2.0, 3.0]]))
