"""The package as users install it: the wheel holds every module and every packaged file, byte for byte, the sdist
builds the same wheel, and the metadata is valid and says what pyproject.toml says.

The sdist and the two wheels (one from the sdist, one straight from the source tree) are built once, from a copy of
the files git would check out, with this environment's build backend (`python -m build --no-isolation`). `.ci/wheel`
builds them with build isolation, installs the wheel into a fresh environment and runs the README's commands from
outside the repository.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("build", reason="the packaging tests build with `build`: pip install -e '.[test]'")
from packaging.metadata import Metadata  # noqa: E402  (after the skip: `build` brings packaging)
from packaging.requirements import Requirement  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# Where each source folder lands in the wheel: the package, and the data folders pyproject's package-dir maps into it.
SHIPPED = {"trl_credit": "trl_credit", **PYPROJECT["tool"]["setuptools"]["package-dir"]}
SHIPPED = {folder: package.replace(".", "/") for package, folder in SHIPPED.items()}


def _checkout_files() -> list[str]:
    """The files a fresh checkout of this tree holds: those git tracks, and new ones it does not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sorted(name for name in listed.split("\0") if name and (ROOT / name).is_file())


def _build(source: Path, outdir: Path, *which: str) -> None:
    command = [sys.executable, "-m", "build", "--no-isolation", *which, "--outdir", str(outdir), str(source)]
    run = subprocess.run(command, capture_output=True, text=True)
    assert run.returncode == 0, f"{' '.join(command)}:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """The sdist, the wheel built from it, and the wheel built from the source tree."""
    work = tmp_path_factory.mktemp("packaging")
    for name in _checkout_files():
        (work / "checkout" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, work / "checkout" / name)
    _build(work / "checkout", work / "dist")  # the sdist, then the wheel from the unpacked sdist
    _build(work / "checkout", work / "tree", "--wheel")
    (sdist,), (wheel,), (tree_wheel,) = (
        list(work.glob(pattern)) for pattern in ("dist/*.tar.gz", "dist/*.whl", "tree/*.whl")
    )
    return {"sdist": sdist, "wheel": wheel, "tree_wheel": tree_wheel}


def _wheel_digests(wheel: Path) -> dict[str, str]:
    with zipfile.ZipFile(wheel) as archive:
        return {name: hashlib.sha256(archive.read(name)).hexdigest() for name in archive.namelist()}


def test_the_wheel_holds_every_module_and_packaged_file(built):
    """Every file of `trl_credit/`, `configs/` and `model_cards/`, where the package reads it, and nothing else."""
    expected = {}
    for name in _checkout_files():
        folder, _, rest = name.partition("/")
        if folder in SHIPPED:
            expected[f"{SHIPPED[folder]}/{rest}"] = hashlib.sha256((ROOT / name).read_bytes()).hexdigest()
    assert {"trl_credit/configs/quickstart.yaml", "trl_credit/configs/accelerate/zero3.yaml"} <= set(expected)
    shipped = {name: digest for name, digest in _wheel_digests(built["wheel"]).items() if ".dist-info/" not in name}
    assert sorted(set(expected) - set(shipped)) == [], "missing from the wheel: widen [tool.setuptools] in pyproject"
    assert sorted(set(shipped) - set(expected)) == [], "in the wheel, but not in the source tree"
    assert [name for name in expected if shipped[name] != expected[name]] == []


def test_the_sdist_builds_the_same_wheel(built):
    assert _wheel_digests(built["wheel"]) == _wheel_digests(built["tree_wheel"])


def test_the_sdist_holds_what_builds_the_wheel(built):
    """The shipped folders, the build's configuration and the README and licence: no part of the test suite, which
    reads the whole repository."""
    with tarfile.open(built["sdist"]) as sdist:
        names = {member.name.split("/", 1)[1] for member in sdist.getmembers() if member.isfile()}
    generated = {"PKG-INFO", "setup.cfg"} | {name for name in names if name.startswith("trl_credit.egg-info/")}
    sources = {"LICENSE", "MANIFEST.in", "README.md", "pyproject.toml"}
    sources |= {name for name in _checkout_files() if name.partition("/")[0] in SHIPPED}
    assert names - generated == sources


def test_the_metadata_says_what_pyproject_says(built):
    project = PYPROJECT["project"]
    with zipfile.ZipFile(built["wheel"]) as archive:
        (metadata_name,) = [name for name in archive.namelist() if name.endswith(".dist-info/METADATA")]
        metadata = Metadata.from_email(archive.read(metadata_name), validate=True)
        entry_points = archive.read(metadata_name.replace("METADATA", "entry_points.txt")).decode()
    with tarfile.open(built["sdist"]) as sdist:
        (pkg_info,) = [
            member
            for member in sdist.getmembers()
            if member.name.count("/") == 1 and member.name.endswith("/PKG-INFO")
        ]
        sdist_metadata = Metadata.from_email(sdist.extractfile(pkg_info).read(), validate=True)
    assert (metadata.name, str(metadata.version)) == (project["name"], project["version"])
    assert (sdist_metadata.name, str(sdist_metadata.version)) == (project["name"], project["version"])
    assert str(metadata.requires_python) == project["requires-python"]
    assert metadata.license_expression == project["license"]
    assert metadata.description == (ROOT / "README.md").read_text()
    requirements = {str(Requirement(text)) for text in project["dependencies"]}
    for extra, texts in project["optional-dependencies"].items():
        requirements |= {str(Requirement(f'{text}; extra == "{extra}"')) for text in texts}
    assert {str(requirement) for requirement in metadata.requires_dist} == requirements
    assert set(metadata.provides_extra) == set(project["optional-dependencies"])
    assert "trl-credit = trl_credit.cli:main" in entry_points


# Run with the wheel unpacked ahead of this checkout on the path, from a folder outside the repository.
FROM_THE_WHEEL = """
import sys
from pathlib import Path

import yaml

import trl_credit
from trl_credit.cli.grpo import parse_arguments
from trl_credit.reports.model_card import card_template
from trl_credit.resources import accelerate_configs, find_yaml, recipes

site = Path(sys.argv[1])
for found in (trl_credit.__file__, str(recipes()), str(accelerate_configs())):
    assert Path(found).is_relative_to(site), found
quick_start = yaml.safe_load((site / "trl_credit/configs/quickstart.yaml").read_text())
assert parse_arguments([])[1].max_completion_length == quick_start["max_completion_length"]
cpu = ["--bf16", "false", "--use_cpu", "true", "--report_to", "none"]
assert parse_arguments(["--config", "taco_qwen3_1.7b_base", *cpu])[0].accelerate_config == "zero2"
zero3 = find_yaml("--accelerate_config", "zero3", accelerate_configs())[0]
assert zero3.read_text() == (site / "trl_credit/configs/accelerate/zero3.yaml").read_text()
assert card_template() == (site / "trl_credit/model_cards/credit_model_card.md.j2").read_text()
print("read from the wheel")
"""


def test_the_installed_wheel_reads_its_recipes_accelerate_configs_and_card_template(built, tmp_path):
    """Installed (`pip install --target`, not editable) and imported from outside the repository, the package reads
    the quick start's recipe, a paper recipe and an accelerate config by packaged name, and the card template, from
    the wheel itself."""
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target", str(site)]
    subprocess.run([*pip, str(built["wheel"])], check=True, capture_output=True)
    (tmp_path / "user").mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    run = subprocess.run(
        [sys.executable, "-c", FROM_THE_WHEEL, str(site)],
        cwd=tmp_path / "user",
        env=env,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == "read from the wheel"
