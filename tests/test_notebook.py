"""Execute `examples/token_credit_quickstart.ipynb` headless and offline, and check what it displays."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "examples" / "token_credit_quickstart.ipynb"

nbformat = pytest.importorskip("nbformat", reason="notebook tests need nbformat, nbclient and ipykernel")
nbclient = pytest.importorskip("nbclient", reason="notebook tests need nbformat, nbclient and ipykernel")
pytest.importorskip("ipykernel", reason="notebook tests need nbformat, nbclient and ipykernel")
try:
    from trl_credit import TACOTrainer  # noqa: F401
except ImportError as error:
    pytest.skip(f"trl_credit.TACOTrainer is not importable yet ({error})", allow_module_level=True)


def test_quickstart_notebook_runs_offline(tmp_path):
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    # The kernel runs in tmp_path (outputs land there) and must import this checkout, installed or not.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    client.execute(env=env)

    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [output for output in outputs if output.output_type == "error"]
    html = [output.data["text/html"] for output in outputs if "text/html" in output.get("data", {})]
    assert any("<iframe srcdoc=" in page and "class=&quot;tok&quot;" in page for page in html)
    pngs = [output for output in outputs if "image/png" in output.get("data", {})]
    assert len(pngs) >= 4  # the token-credit PNG, reward, entropy, length (+ diagnostics)
    run_dir = tmp_path / "token-credit-quickstart"
    assert (run_dir / "token_credit.jsonl").is_file() and (run_dir / "plots" / "reward.png").is_file()
