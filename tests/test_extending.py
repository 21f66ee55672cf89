"""User methods and stacks: registration, the example method, `eapo+taco` from Python, YAML and the CLI."""

import dataclasses
import math
import sys

import pytest
import torch
from conftest import tiny_config, tiny_recipe, train_changing_every_parameter
from reference_formulas import eapo_loop, random_inputs, taco_loop

from trl_credit import CreditBatch, CreditResult, register_credit_method
from trl_credit.cli import main as cli_main
from trl_credit.methods import (
    CREDIT_METHODS,
    POLICY_ENTROPY,
    POLICY_LOGPS,
    ROLLOUT_ENTROPY,
    apply_credit_method,
    get_credit_method,
    resolve_stack,
)
from trl_credit.methods.stack import run_stack
from trl_credit.reports.model_card import write_model_card

EXAMPLE = "examples/custom_credit_method.py:surprise_boost"


def test_a_stack_applies_in_order_each_method_seeing_the_previous_advantages():
    adv, logps, entropy, _, mask = random_inputs(3)
    batch = CreditBatch.from_sequence_advantages(
        adv, mask, statistics={ROLLOUT_ENTROPY: entropy, POLICY_LOGPS: logps, POLICY_ENTROPY: entropy}
    )
    steps = resolve_stack([get_credit_method(name) for name in ("eapo", "taco")], {})
    stacked = run_stack(steps, batch).batch
    # By hand: EAPO's loop, then TACO's weight (its loop's output over A) on the rows with A > 0.
    eapo_BT = eapo_loop(adv, entropy, mask, math.log(4), (0.1, 0.9))
    safe = torch.where(adv != 0, adv, 1.0).unsqueeze(1)
    taco_weight_BT = taco_loop(adv, logps, entropy, mask, 0.01, 0.9) / safe
    expected = torch.where((adv > 0).unsqueeze(1), eapo_BT * taco_weight_BT, eapo_BT)
    torch.testing.assert_close(stacked.advantages_BT, expected)


def test_a_second_function_under_a_registered_name_is_refused():
    with pytest.raises(ValueError, match="'taco' is already registered"):
        register_credit_method("taco")(lambda batch: batch.advantages_BT)
    with pytest.raises(ValueError, match="must be Python identifiers"):
        register_credit_method("my+method")


def test_the_example_method_trains_with_its_hyperparameter_from_credit_kwargs(tmp_path, make_trainer):
    method = get_credit_method(EXAMPLE)  # imports the file, which registers the method
    assert method.name == "surprise_boost" and method.hyperparameters({"surprise_boost_max": "3"}) == {
        "surprise_boost_max": 3.0
    }
    trainer = train_changing_every_parameter(make_trainer(EXAMPLE, credit_kwargs='{"surprise_boost_max": 2.0}'))
    weights = [e["surprise_boost/weight_max"] for e in trainer.state.log_history if "surprise_boost/weight_max" in e]
    # The boost set through credit_kwargs (None: a batch whose advantages were all 0).
    assert 2.0 in weights and all(w is None or w == pytest.approx(2.0) for w in weights)
    with pytest.raises(ValueError, match="surprise_boost_max must be >= 1, got 0.5"):
        tiny_config(EXAMPLE, tmp_path, credit_kwargs={"surprise_boost_max": 0.5})
    with pytest.raises(
        ValueError, match="surprise_boost_mx is not a hyperparameter .* did you mean 'surprise_boost_max'"
    ):
        tiny_config(EXAMPLE, tmp_path, credit_kwargs={"surprise_boost_mx": 2.0})


def test_stack_and_user_method_train_from_the_cli_and_yaml(tmp_path, tiny_model_dir):
    recipe = tiny_recipe(tmp_path / "a", tiny_model_dir, credit_method=["eapo", "taco"])
    assert cli_main(["grpo", "--config", str(recipe)]) == 0
    run = tmp_path / "a" / "run"
    card = (run / "README.md").read_text()
    assert "### Credit method: EAPO + TACO" in card and "Cite EAPO as" in card and "Cite TACO as" in card
    assert {"eapo_diagnostics.png", "taco_diagnostics.png"} <= {p.name for p in (run / "plots").iterdir()}

    recipe = tiny_recipe(tmp_path / "b", tiny_model_dir)
    argv = ["grpo", "--config", str(recipe), "--method", f"eapo+{EXAMPLE}", "--surprise-boost-max", "1.5"]
    assert cli_main(argv) == 0
    card = (tmp_path / "b" / "run" / "README.md").read_text()
    assert "| `surprise_boost_max` | `1.5` |" in card and "| `eapo_kappa` |" in card


def test_a_method_registered_outside_the_package_reaches_plots_token_view_and_card(tmp_path, make_trainer):
    """Registration alone: its diagnostics are plotted, its statistic is named in the token view, its paper cited."""
    from trl_credit.reports.token_view import read_token_credit

    trainer = make_trainer(
        EXAMPLE, output_dir=tmp_path, credit_kwargs={"surprise_boost_max": 2.0}, log_token_credit=True, max_steps=2
    )
    method = get_credit_method(EXAMPLE)
    # TRL's card of the notebook trainer (`create_model_card`, in `push_to_hub`) names and cites the method too.
    assert (trainer._name, trainer._paper, trainer._tag_names[-1]) == (method.display_name, method.paper, method.name)
    trainer.train()
    write_model_card(trainer)
    assert (tmp_path / "plots" / "surprise_boost_diagnostics.png").is_file()
    records = read_token_credit(tmp_path / "token_credit.jsonl")
    assert records and {r["statistic_name"] for r in records} == {"surprise"}
    card = (tmp_path / "README.md").read_text()
    assert "Surprise boost" in card and "2601.00001" in card and "@misc{boost" in card
    assert "Up to `surprise_boost_max` times more credit" in card


def test_a_trainer_pinned_to_a_user_method_takes_its_card_metadata_from_the_registration(tmp_path, make_trainer):
    from trl_credit import CreditGRPOTrainer

    method = get_credit_method(EXAMPLE)  # imports the example module, which registers the method

    class SurpriseBoostTrainer(CreditGRPOTrainer, credit_method="surprise_boost"):
        pass

    method = get_credit_method("surprise_boost")
    assert SurpriseBoostTrainer._name == method.display_name == "Surprise boost"
    assert SurpriseBoostTrainer._paper == method.paper and SurpriseBoostTrainer._tag_names[-1] == "surprise_boost"
    assert CreditGRPOTrainer._tag_names == ["trl", "grpo", "trl-credit"]  # the base class is left as it was
    with pytest.raises(ValueError, match="SurpriseBoostTrainer trains with credit_method='surprise_boost'"):
        make_trainer("taco", trainer_class=SurpriseBoostTrainer, output_dir=tmp_path)
    with pytest.raises(ValueError, match="unknown credit method 'surprise_bost'"):

        class Misspelt(CreditGRPOTrainer, credit_method="surprise_bost"):
            pass


def test_undeclared_metrics_and_reserved_names_are_refused():
    def reserved_metric(batch):
        """Reserved metric: logs a metric under a name the trainer logs for every method.

        Metrics:
            mean_weight: mine
        """
        return batch.advantages_BT

    with pytest.raises(ValueError, match=r"the trainer logs \['mean_weight'\] for every method"):
        register_credit_method("reserved_metric")(reserved_metric)

    @register_credit_method("undeclared_metric")
    def undeclared_metric(batch):
        return CreditResult(batch.advantages_BT, metrics={"secret": 1.0})

    @register_credit_method("undeclared_drop")
    def undeclared_drop(batch):
        return CreditResult(batch.advantages_BT, loss_mask_BT=batch.mask_BT.float())

    adv, _, _, _, mask = random_inputs(1)
    with pytest.raises(ValueError, match=r"'undeclared_metric' logged metrics \['secret'\] that its registration"):
        apply_credit_method("undeclared_metric", adv, mask)
    with pytest.raises(
        ValueError, match="'undeclared_drop' returned a loss mask but is registered with drops_tokens=False"
    ):
        apply_credit_method("undeclared_drop", adv, mask)


def _arguments(**defaults) -> type:
    return dataclasses.make_dataclass("Arguments", [(name, type(value), value) for name, value in defaults.items()])


def test_a_hyperparameter_is_named_after_its_method_so_nothing_else_can_set_it(tmp_path):
    from trl_credit import CreditGRPOConfig

    def identity(batch, **hyperparameters):
        return batch.advantages_BT

    # GRPOConfig has a `temperature`: a method's own would be read from, or shadowed by, TRL's.
    with pytest.raises(ValueError, match=r"'temperature' must start with the method's name \(warm_temperature\)"):
        register_credit_method("warm", arguments=_arguments(temperature=5.0))(identity)
    assert "warm" not in CREDIT_METHODS
    register_credit_method("warm", arguments=_arguments(warm_temperature=5.0))(identity)
    args = tiny_config("warm", tmp_path)
    assert args.temperature == 1.0 and args.method_hyperparameters(CREDIT_METHODS["warm"]) == {"warm_temperature": 5.0}
    args = tiny_config("warm", tmp_path, credit_kwargs={"warm_temperature": "3"})
    assert args.method_hyperparameters(CREDIT_METHODS["warm"]) == {"warm_temperature": 3.0}

    # Two methods can only collide through a name that extends another's: refused, naming both.
    register_credit_method("warm_up", arguments=_arguments(warm_up_alpha=0.1))(identity)
    with pytest.raises(ValueError, match="'warm_up_alpha' is already declared by 'warm_up'"):
        register_credit_method("warm", arguments=_arguments(warm_up_alpha=0.9))(identity)
    # ... and with TRL's config only through a method named like a prefix of its fields: refused before training.
    register_credit_method("top", arguments=_arguments(top_k=3))(identity)
    taken = (
        r"credit method 'top' declares \['top_k'\], which CreditGRPOConfig \(TRL's GRPOConfig\) also declares: rename"
    )
    with pytest.raises(ValueError, match=taken):
        CreditGRPOConfig(output_dir=str(tmp_path), credit_method="top", use_cpu=True, bf16=False)
    unsupported = (
        r"^credit method 'warm': hyperparameter 'warm_table' has type <class 'NoneType'>; use bool, int, float, str, "
        r"a Literal, an optional or a list of these$"
    )
    with pytest.raises(ValueError, match=unsupported):
        register_credit_method("warm", arguments=_arguments(warm_table=None))(identity)


def test_a_stack_records_each_method_own_values(tmp_path):
    args = tiny_config("eapo+taco", tmp_path, credit_kwargs={"eapo_kappa": "1", "taco_alpha": 5e-2})
    assert args.method_hyperparameters(CREDIT_METHODS["eapo"])["eapo_kappa"] == 1.0
    assert args.method_hyperparameters(CREDIT_METHODS["taco"]) == {"taco_alpha": 0.05, "taco_lambda": 0.9}
    recorded = args.to_dict()["credit_kwargs"]  # what `training_args` and the card carry: every value, defaults too
    assert recorded == {
        **CREDIT_METHODS["eapo"].hyperparameters({"eapo_kappa": 1.0}),
        "taco_alpha": 0.05,
        "taco_lambda": 0.9,
    }


def test_a_method_module_in_the_current_folder_is_found_and_names_a_safe_output_folder(tmp_path, monkeypatch):
    from trl_credit.cli.grpo import parse_arguments

    source = open(EXAMPLE.split(":")[0]).read().replace('"surprise_boost"', '"cwd_boost"')
    (tmp_path / "mymethods.py").write_text(source.replace("surprise_boost_max", "cwd_boost_max"))
    monkeypatch.chdir(tmp_path)
    _, args, _, _ = parse_arguments(["--method", "eapo+mymethods:cwd_boost", "--cwd-boost-max", "2"])
    assert args.credit_hyperparameters()["cwd_boost_max"] == 2.0
    assert args.output_dir == "outputs/smollm2-135m-instruct-eapo+cwd_boost"


def _scaling_method_source(name: str, factor: float) -> str:
    """A user method module registering `name`: every token's advantage times `factor`."""
    return (
        "from trl_credit import register_credit_method\n\n\n"
        f"@register_credit_method({name!r})\n"
        f"def {name}(batch):\n"
        f"    return batch.advantages_BT * {factor}\n"
    )


# Ways a user's method module fails to import. After registering: its method must not stay behind.
BROKEN_MODULES = {
    "raises_first": lambda source: "raise RuntimeError('not yet')\n" + source,
    "raises_after_registering": lambda source: source + "\nraise RuntimeError('not yet')\n",
    "syntax_error": lambda source: source + "\ndef unfinished(:\n",
}


@pytest.mark.parametrize("form", ["file", "package"])
@pytest.mark.parametrize("breakage", list(BROKEN_MODULES))
def test_a_failed_user_module_import_can_be_retried_once_the_file_is_fixed(tmp_path, monkeypatch, form, breakage):
    name = f"retry_{breakage}_{form}"  # names of its own: the modules of a passing case stay imported
    if form == "file":
        module_file, spec = tmp_path / f"{name}.py", f"{tmp_path / name}.py:{name}"
        module_name = f"trl_credit_user_{name}"
    else:
        package = tmp_path / f"{name}_package"
        package.mkdir()
        (package / "__init__.py").write_text("")
        module_file, module_name = package / "methods.py", f"{name}_package.methods"
        spec = f"{module_name}:{name}"
        monkeypatch.syspath_prepend(str(tmp_path))
    module_file.write_text(BROKEN_MODULES[breakage](_scaling_method_source(name, 3.0)))
    with pytest.raises(Exception):  # noqa: B017 - how the failure is reported is not this test's subject
        get_credit_method(spec)
    assert name not in CREDIT_METHODS and module_name not in sys.modules

    module_file.write_text(_scaling_method_source(name, 2.0))  # fixed, in the same Python session
    advantages_B, mask_BT = torch.tensor([0.5, -1.0]), torch.ones(2, 3, dtype=torch.bool)
    result = get_credit_method(spec).on_tensors(advantages_B, mask_BT)
    torch.testing.assert_close(result.advantages_BT, 2.0 * advantages_B.unsqueeze(1).expand(2, 3))


def test_the_method_name_follows_the_last_colon_of_a_file_path(tmp_path, credit_method_registry):
    folder = tmp_path / "runs:2026"
    folder.mkdir()
    (folder / "colon_methods.py").write_text(_scaling_method_source("colon_boost", 2.0))
    method = get_credit_method(f"{folder / 'colon_methods.py'}:colon_boost")
    assert method.name == "colon_boost" and "colon_boost" in credit_method_registry


# Run in the copy of the package, in a process of its own (the registry of this one stays as it is).
PROBE_CHECKS = """
import contextlib, io, sys
from pathlib import Path
import torch
import trl_credit
root = Path(sys.argv[1])
assert Path(trl_credit.__file__).is_relative_to(root), trl_credit.__file__
from trl_credit.resources import recipes
assert Path(str(recipes())).is_relative_to(root), recipes()  # the copy's packaged data, not an installed one
from trl_credit.methods import CREDIT_METHODS
method = CREDIT_METHODS["surprise_boost"]
assert method.display_name == "Surprise boost"
# By hand: surprise -log p = [1, 2] and [0.5, 1], row maxima 2 and 1, weights 1 + (1.5 - 1) * surprise / max.
logps = torch.tensor([[-1.0, -2.0], [-0.5, -1.0]])
result = method.on_tensors(torch.tensor([1.0, -1.0]), torch.ones(2, 2, dtype=torch.bool), rollout_logps=logps)
assert result.advantages_BT.tolist() == [[1.25, 1.5], [-1.25, -1.5]], result.advantages_BT
from trl_credit.cli import main
for argv in (["grpo", "--help"], ["grpo", "--method", "surprise_boost", "--help"]):
    help_text = io.StringIO()
    with contextlib.redirect_stdout(help_text), contextlib.suppress(SystemExit):
        main(argv)
    assert "surprise_boost" in help_text.getvalue() and "rarest sampled tokens" in help_text.getvalue()
assert "--surprise_boost_max" in help_text.getvalue()
from trl_credit import CreditGRPOConfig
config = CreditGRPOConfig(output_dir=str(root / "run"), credit_method="surprise_boost", credit_kwargs={"surprise_boost_max": "3"}, use_cpu=True)
assert config.credit_kwargs == {"surprise_boost_max": 3.0}
from trl_credit.cli import doc_tables
check = io.StringIO()
with contextlib.redirect_stdout(check):
    assert doc_tables.main(["--check"]) == 1
assert "run python -m trl_credit.cli.doc_tables" in check.getvalue(), check.getvalue()
with contextlib.redirect_stdout(io.StringIO()):
    assert doc_tables.main([]) == 0
assert doc_tables.stale_documents() == []
tables = "".join((root / name).read_text() for name in doc_tables.documents(root))
assert "Surprise boost" in tables and "surprise_boost_max" in tables and "2601.00001" in tables
from trl_credit.reports.model_card.card import generate_credit_model_card
card = str(generate_credit_model_card(base_model=None, model_name="m", hub_model_id="u/m", dataset_name=None,
    method="surprise_boost", hyperparameters={"surprise_boost_max": 3.0}, trainer_name="GRPO"))
assert "Surprise boost (arXiv 2601.00001): Up to" in card and "rarest sampled tokens" in card and "surprise_boost_max" in card, card
from trl_credit.trainer.token_credit_records import method_statistic_name
assert method_statistic_name("surprise_boost") == "surprise"
print("every surface has surprise_boost")
"""


def test_a_built_in_method_is_one_new_file_plus_the_docs_regeneration(tmp_path):
    """A new module in `trl_credit/methods/` (the example method, in a copy of the package with its docs) is registered
    by importing the package, and reaches every surface: plain tensors, `trl-credit grpo --help`, the config, the generated docs
    tables (stale until `python -m trl_credit.cli.doc_tables` runs, which the check names), the model card and
    the token-credit view."""
    import shutil
    import subprocess
    from pathlib import Path

    import trl_credit

    package, repository = Path(trl_credit.__file__).parent, Path(__file__).resolve().parents[1]
    shutil.copytree(package, tmp_path / "trl_credit", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "docs").mkdir()
    for name in ["README.md", *(f"docs/{path.name}" for path in (repository / "docs").glob("*.md"))]:
        shutil.copy(repository / name, tmp_path / name)
    shutil.copytree(repository / "examples", tmp_path / "examples")  # the example the docs show
    for folder in ("configs", "model_cards"):  # the packaged data, where a wheel installs it
        shutil.copytree(repository / folder, tmp_path / "trl_credit" / folder)
    # The example user method, as one new file of the package.
    shutil.copy(
        repository / "examples" / "custom_credit_method.py", tmp_path / "trl_credit" / "methods" / "surprise_boost.py"
    )
    environment = {**__import__("os").environ, "PYTHONPATH": str(tmp_path)}
    run = subprocess.run(
        [sys.executable, "-c", PROBE_CHECKS, str(tmp_path)],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "every surface has surprise_boost" in run.stdout
