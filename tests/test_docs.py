"""The user docs (README.md, docs/*.md) against the code: flags, metric names, paths, Python blocks, generated tables."""

import contextlib
import io
import json
import re
import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml

from trl_credit.cli import main as cli_main
from trl_credit.methods import COMMON_DIAGNOSTICS, CREDIT_METHODS, parse_credit_methods
from trl_credit.reports import doc_tables
from trl_credit.resources import recipes
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
    if method is None and config is not None:  # a recipe file of the repository, or a packaged recipe's name
        recipe = ROOT / config if (ROOT / config).is_file() else recipes().joinpath(f"{config}.yaml")
        method = yaml.safe_load(recipe.read_text()).get("method")
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


# Counts, from pytest's own collection of the whole suite, what a plain run skips: every real-vLLM case (skipped
# without vLLM), every case marked to skip without Chromium (whether or not this machine has it) and every path case
# that a test excludes with its reason.
COUNT_SKIPS = """
import json, sys, pytest

class Skips:
    counts = {"real_vllm": 0, "chromium": 0, "excluded": 0}

    def pytest_collection_finish(self, session):
        for item in session.items:
            marks = list(item.iter_markers())
            if "/real_vllm/" in item.nodeid:
                self.counts["real_vllm"] += 1
            elif any(m.name == "skipif" and "chromium" in str(m.kwargs.get("reason", "")) for m in marks):
                self.counts["chromium"] += 1
            elif any(m.name == "skip" for m in marks):
                self.counts["excluded"] += 1

plugin = Skips()
pytest.main(["--collect-only", "-qq", "-p", "no:cacheprovider", "tests"], plugins=[plugin])
print(json.dumps(plugin.counts))
"""


def test_the_readme_names_every_test_a_plain_run_skips():
    """Without vLLM (its tests run in their own environment) and without Chromium, these are the skips."""
    run = subprocess.run([sys.executable, "-c", COUNT_SKIPS], cwd=ROOT, capture_output=True, text=True, timeout=600)
    counts = json.loads(run.stdout.strip().splitlines()[-1])
    readme = " ".join(_text("README.md").split())
    found = re.search(
        r"(\d+) skip, saying why: (\d+) real-vLLM cases .*?(?:,| and) (\d+) in headless Chromium [^.]*?"
        r"(?: and (\d+) path cases)?\.",
        readme,
    )
    assert found, "the README does not say which tests skip"
    real_vllm, chromium, excluded = counts["real_vllm"], counts["chromium"], counts["excluded"]
    said = tuple(int(number or 0) for number in found.groups())  # no path-case clause: none is excluded
    assert said == (real_vllm + chromium + excluded, real_vllm, chromium, excluded)


def test_every_test_the_mutation_verdicts_name_exists():
    """docs/testing.md's verdicts name the test that kills each survivor: each is a test of the suite."""
    verdicts = re.findall(r"^\| `trl_credit\.[^`]+` \| killed by (.*) \|$", _text("docs/testing.md"), re.MULTILINE)
    named = {name for verdict in verdicts for name in re.findall(r"`(test_\w+)`", verdict)}
    defined = {
        name
        for path in (ROOT / "tests").glob("test_*.py")
        for name in re.findall(r"^def (test_\w+)", path.read_text(), re.M)
    }
    assert verdicts and named, "no verdict names a test"
    assert not named - defined, f"verdicts name tests that do not exist: {sorted(named - defined)}"
