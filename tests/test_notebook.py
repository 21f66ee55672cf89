"""Execute `examples/token_credit_quickstart.ipynb` headless and offline on SmolLM2-135M-Instruct, and check what it
displays: the token-credit view of TACO's completions and the GRPO and TACO reward curves."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "examples" / "token_credit_quickstart.ipynb"
STEPS = 2  # per run; the notebook's own default (20) is for people

NOTEBOOK_PACKAGES = "the notebook test needs nbformat, nbclient and ipykernel: pip install -e '.[test]'"
nbformat = pytest.importorskip("nbformat", reason=NOTEBOOK_PACKAGES)
nbclient = pytest.importorskip("nbclient", reason=NOTEBOOK_PACKAGES)
pytest.importorskip("ipykernel", reason=NOTEBOOK_PACKAGES)
for module, install in [("gguf", "pip install gguf"), ("reasoning_gym", "pip install reasoning-gym==0.1.25")]:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"the notebook needs {module}: {install}", allow_module_level=True)
try:
    from trl_credit.data.models import smollm2_gguf_path

    smollm2_gguf_path()
except RuntimeError as error:
    pytest.skip(str(error), allow_module_level=True)


def test_notebook_trains_grpo_and_taco_on_smollm2_offline(tmp_path):
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    assert not [cell for cell in notebook.cells if cell.cell_type == "code" and cell.outputs], "commit it cleared"
    client = nbclient.NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    # The kernel runs in tmp_path (outputs land there) and must import this checkout, installed or not.
    env = {
        # Not inherited: an in-process `trl-credit grpo` test sets it, and the notebook must set it itself.
        **{key: value for key, value in os.environ.items() if key != "DS_ACCELERATOR"},
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "TRL_CREDIT_NOTEBOOK_STEPS": str(STEPS),
        # One torch thread: on 2 cores shared with other processes, two threads run several times slower.
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    client.execute(env=env)

    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [output for output in outputs if output.output_type == "error"]
    html = [output.data["text/html"] for output in outputs if "text/html" in output.get("data", {})]
    assert any("<iframe srcdoc=" in page and "class=&quot;tok&quot;" in page for page in html)
    assert [output for output in outputs if "image/png" in output.get("data", {})]  # the reward curves
    text = "".join(output.get("text", "") for output in outputs if output.output_type == "stream")
    assert "GRPO: mean reward" in text and "TACO: mean reward" in text
    # The notebook trains on the CPU and says so: DeepSpeed (a test dependency) must not announce its own guess.
    assert "Setting accelerator to CPU" not in text

    for run, method in [("notebook-grpo", "grpo"), ("notebook-taco", "taco")]:
        history = json.loads((tmp_path / run / "trainer_state.json").read_text())["log_history"]
        assert [entry["step"] for entry in history if "reward" in entry] == list(range(1, STEPS + 1))
        records = [json.loads(line) for line in (tmp_path / run / "token_credit.jsonl").read_text().splitlines()]
        assert {record["method"] for record in records} == {method}
        assert len({record["step"] for record in records}) == STEPS  # completions recorded at every step
        assert all(record["completion"].strip() for record in records)  # SmolLM2's real completions
