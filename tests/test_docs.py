"""The user docs (README.md, docs/*.md) against the code: flags, metric names, paths, Python blocks, generated tables."""

import contextlib
import io
import json
import re
import shlex
from functools import cache
from pathlib import Path

import pytest
import yaml

from trl_credit.cli import main as cli_main
from trl_credit.methods import COMMON_DIAGNOSTICS, CREDIT_METHODS, parse_credit_methods
from trl_credit.reports import doc_tables
from trl_credit.rewards import RewardStats
from trl_credit.trainer.diagnostics import TRAINER_METRICS

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = doc_tables.documents(ROOT)
_FENCE = re.compile(r"```(\w*)\n(.*?)```", re.DOTALL)
_FLAG = re.compile(r"(?<![\w-])--[A-Za-z][\w-]*")


def _text(name: str) -> str:
    return (ROOT / name).read_text()


def test_the_readme_stays_short():
    assert len(_text("README.md").splitlines()) <= 150


def test_docs_hold_pages_and_the_images_they_show():
    """Results live in results/ (rendered into pages by benchmarks/render_reports.py), not under docs/."""
    kinds = {path.suffix for path in (ROOT / "docs").rglob("*") if path.is_file()}
    assert kinds <= {".md", ".png", ".svg"}, f"docs/ holds {sorted(kinds - {'.md', '.png', '.svg'})} files"


def test_generated_tables_are_up_to_date():
    assert doc_tables.stale_documents(ROOT) == [], "run: python -m trl_credit.reports.doc_tables"


# --------------------------------------------------------------------------------------------------- commands


def _commands() -> list[tuple[str, list[str]]]:
    """Every `trl-credit SUB ...` command of the docs (code blocks and inline code), as (document, argv)."""
    found = []
    for name in DOCUMENTS:
        text = _text(name)
        snippets = [body.replace("\\\n", " ") for _, body in _FENCE.findall(text)]
        snippets += re.findall(r"`(trl-credit [^`]+)`", _FENCE.sub("", text))
        for snippet in snippets:
            for line in snippet.splitlines():
                line = line.split(" # ")[0]
                if "trl-credit " not in line:
                    continue
                command = line[line.index("trl-credit ") :]
                try:
                    argv = shlex.split(command)[1:]
                except ValueError:
                    argv = command.split()[1:]
                if argv and not argv[0].startswith("-"):
                    found.append((name, argv))
    return found


@cache
def _help(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):  # some subcommands return, some exit
        cli_main([*argv, "--help"])
    return out.getvalue()


def _option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv and argv.index(name) + 1 < len(argv) else None


def _grpo_help(argv: list[str]) -> str:
    method = _option(argv, "--method")
    config = _option(argv, "--config")
    if method is not None and method.isupper():  # a placeholder such as NAME
        method = None
    if method is None and config is not None:
        method = yaml.safe_load((ROOT / config).read_text()).get("method")
    # TRL's `TrlParser` reads `--config` itself, before argparse: its help does not list it.
    return _help("grpo", "--method", method or "grpo") + " --config "


def _accepted(argv: list[str]) -> set[str]:
    command = argv[0]
    if command == "grpo":
        text = _grpo_help(argv)
    elif command == "compare":
        methods = []
        for arg in argv[argv.index("--methods") + 1 :] if "--methods" in argv else ["grpo"]:
            if arg.startswith("-"):
                break
            methods.append(arg)
        text = _help("compare") + "".join(_grpo_help(["grpo", "--method", m]) for m in methods)
    else:
        text = _help(command)
    return set(_FLAG.findall(text))


def test_docs_name_commands():
    assert {argv[0] for _, argv in _commands()} >= {"grpo", "eval", "inspect", "plot", "compare", "lab"}


@pytest.mark.parametrize("document,argv", _commands(), ids=lambda x: x if isinstance(x, str) else " ".join(x)[:60])
def test_every_flag_of_a_documented_command_is_accepted(document, argv):
    flags = {flag for flag in _FLAG.findall(" ".join(argv)) if flag != "--help"}
    unknown = sorted(flags - _accepted(argv))
    assert not unknown, f"{document}: `trl-credit {' '.join(argv)}` uses {unknown}, which the command does not accept"


# ---------------------------------------------------------------------------------------------------- metrics


def _emitted_metrics() -> set[str]:
    metrics = set(TRAINER_METRICS) | {f"rewards/{key}" for key in RewardStats.MEANINGS}
    for method in CREDIT_METHODS.values():
        metrics |= {f"{method.name}/{name}" for name in [*method.diagnostics, *COMMON_DIAGNOSTICS]}
    return metrics | {f"METHOD/{name}" for name in COMMON_DIAGNOSTICS}


def test_every_metric_the_docs_name_is_emitted():
    prefixes = "|".join(sorted({*CREDIT_METHODS, "credit", "rewards", "METHOD"}))
    named = re.compile(rf"`((?:{prefixes})/[a-z_]+)`")
    emitted = _emitted_metrics()
    unknown = sorted(
        {(name, metric) for name in DOCUMENTS for metric in named.findall(_text(name))}
        - {(name, metric) for name in DOCUMENTS for metric in emitted}
    )
    assert not unknown, f"metrics the docs name but nothing logs: {unknown}"


# ------------------------------------------------------------------------------------------------------ paths

_TOP = ("trl_credit/", "docs/", "configs/", "examples/", "benchmarks/", "tests/", "model_cards/", ".ci/")


def _named_paths(name: str) -> set[str]:
    text = _text(name)
    base = (ROOT / name).parent
    paths = set()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):  # Markdown links
        if not re.match(r"[a-z]+://|#|mailto:", target):
            paths.add(str((base / target.split("#")[0]).resolve().relative_to(ROOT)))
    for span in re.findall(r"`([^`\s]+)`", text):  # code spans naming a repository file or folder
        path = span.split(":")[0].rstrip(",.")
        if path.startswith(_TOP) and not re.search(r"[A-Z]{3,}|\*|\{|<", path):
            paths.add(path.rstrip("/"))
    return paths


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_repository_path_the_docs_name_exists(document):
    missing = sorted(path for path in _named_paths(document) if not (ROOT / path).exists())
    assert not missing, f"{document} names paths that do not exist: {missing}"


# ----------------------------------------------------------------------------------------------------- python


def _python_blocks(name: str) -> list[str]:
    return [body for language, body in _FENCE.findall(_text(name)) if language == "python"]


@pytest.mark.parametrize("document", [name for name in DOCUMENTS if _python_blocks(name)])
def test_every_python_block_compiles(document):
    for block in _python_blocks(document):
        compile(block, document, "exec")


def test_the_readme_quick_start_trains_offline(tmp_path, monkeypatch):
    """The README's Python quick start as written, with one step instead of 30 and its output in a temp folder."""
    (block,) = [b for b in _python_blocks("README.md") if "trainer.train()" in b]
    assert "max_steps=30" in block and 'output_dir="smollm2-taco"' in block
    block = block.replace("max_steps=30", "max_steps=1").replace('"smollm2-taco"', repr(str(tmp_path / "run")))
    namespace = {}
    exec(compile(block, "README.md", "exec"), namespace)
    trainer = namespace["trainer"]
    assert trainer.state.global_step == 1 and trainer.args.credit_method == "taco"
    assert any("taco/tail_fraction" in entry for entry in trainer.state.log_history)
    # The run's final checkpoint is its model, without the optimizer state (twice the model's size again).
    checkpoint = tmp_path / "run" / "checkpoint-1"
    saved = {path.name for path in checkpoint.iterdir()}
    assert "model.safetensors" in saved and "optimizer.pt" not in saved, saved


def test_the_readme_first_command_trains_offline(tmp_path):
    """README command 1 as written (the packaged quick-start recipe, offline SmolLM2, chain sums), 2 of its 30 steps,
    its output in a temp folder; `benchmarks/quickstart.py` runs the 30 and prints what docs/quickstart_run reports."""
    first_line = _FENCE.findall(_text("README.md"))[0][1].splitlines()[0]
    command = first_line.split(" && ")[-1]
    assert command == "trl-credit grpo --method taco"
    output_dir = tmp_path / "run"
    assert cli_main([*shlex.split(command)[1:], "--max_steps", "2", "--output_dir", str(output_dir)]) == 0
    history = json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
    assert [entry["step"] for entry in history if "reward" in entry] == [1, 2]
    assert any("taco/tail_fraction" in entry for entry in history)
    assert {"README.md", "model.safetensors", "token_credit.jsonl"} <= {path.name for path in output_dir.iterdir()}


def test_the_extending_example_is_the_example_file_that_trains():
    # The block is generated from examples/custom_credit_method.py (first test); tests/test_extending.py trains it.
    block = _python_blocks("docs/extending.md")[0]
    assert block.strip() in (ROOT / "examples" / "custom_credit_method.py").read_text()


def test_stacks_in_the_docs_are_valid():
    for _, argv in _commands():
        method = _option(argv, "--method")
        if method:
            parse_credit_methods(method)


def _test_cases(path: Path, decorated_by: str | None = None) -> int:
    """The test cases `path` defines (each `parametrize` over a literal, or `sorted(NAME)` of a module-level literal,
    multiplies them); only the tests decorated with `decorated_by` when it is given."""
    import ast

    tree = ast.parse(path.read_text())
    literals = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            with contextlib.suppress(ValueError, TypeError, SyntaxError):
                literals[node.targets[0].id] = ast.literal_eval(node.value)
    total = 0
    for node in tree.body:
        if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
            continue
        names = {ast.unparse(d).split("(")[0] for d in node.decorator_list}
        if decorated_by is not None and decorated_by not in names:
            continue
        cases = 1
        for decorator in node.decorator_list:
            if isinstance(decorator, ast.Call) and ast.unparse(decorator.func).endswith("parametrize"):
                values = decorator.args[1]
                if isinstance(values, ast.Call) and ast.unparse(values.func) == "sorted":
                    values = values.args[0]
                cases *= len(literals[values.id] if isinstance(values, ast.Name) else ast.literal_eval(values))
        total += cases
    return total


def test_the_readme_names_every_test_a_plain_run_skips():
    """Without vLLM (its tests run in their own environment) and without Chromium, these are the skips."""
    real_vllm = sum(_test_cases(path) for path in sorted((ROOT / "tests" / "real_vllm").glob("test_*.py")))
    chromium = sum(_test_cases(path, "needs_chromium") for path in sorted((ROOT / "tests").glob("test_*.py")))
    readme = " ".join(_text("README.md").split())
    found = re.search(r"(\d+) skip, saying why: (\d+) real-vLLM tests .*? and (\d+) in headless Chromium", readme)
    assert found, "the README does not say which tests skip"
    assert tuple(map(int, found.groups())) == (real_vllm + chromium, real_vllm, chromium)
