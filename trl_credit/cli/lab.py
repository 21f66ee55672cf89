"""`trl-credit lab`: where does each credit method put the advantage, on tasks whose decisive tokens are known?

    trl-credit lab                                              # grpo, taco, eapo, tide x needle, fork, rare x 3 seeds
    trl-credit lab --methods grpo taco --tasks rare --seeds 0 --max_steps 100
    trl-credit lab --methods grpo oracle taco --tasks mdp --horizon 128 --decisive 1 --num_generations 4
    trl-credit lab --methods grpo eapo --tasks mdp --horizon 128 --credit_kwargs '{"eapo_kappa": 0.69}'

A tiny model is trained from scratch on 2 CPU cores with the real `CreditGRPOTrainer` (see `trl_credit.experiments.lab`).
`--horizon` sets the completion length of every task, `--decisive` the number of decisive forks of `fork` and `mdp`,
`--num_generations` the group size, `--credit_kwargs` the methods' hyperparameters. The `oracle` method gives each
response's advantage to the tokens the task marks decisive and a quarter of it to the others: with `grpo` (the same
advantage on every token) in the grid, the report adds the fraction of the grpo-to-oracle gap each method closes.
`OUTPUT_DIR/results.json` holds every run's series and metrics, `OUTPUT_DIR/report.md` the tables (mean ± 95 % t
interval over seeds, and the paired difference to `grpo`). Finished runs in `results.json` are not repeated.
"""

from __future__ import annotations

import os
import shlex
import sys

from . import run_command

PROG = "trl-credit lab"


def main(argv: list[str] | None = None) -> int:
    """Run `trl-credit lab` with `argv` (without the command name); return the exit status."""
    return run_command(PROG, _lab, sys.argv[1:] if argv is None else list(argv))


def _lab(argv: list[str]) -> int:
    import torch

    from ..experiments.lab.lab_runs import LabConfig, previous_records, run_lab
    from . import UsageError, one_line, owned_folder
    from .outputs import check_output_folder
    from .parsing import CommandParser, require_scipy

    (config,) = CommandParser(LabConfig, prog=PROG, description=__doc__.split("\n\n")[0]).parse_config(argv)
    check_output_folder("lab", config.output_dir)
    require_scipy()  # say so before training, not after
    try:
        previous_records(config)  # a folder of runs with other settings: refused unless --overwrite_output_dir
    except ValueError as error:
        raise UsageError(one_line(error)) from error
    torch.set_num_threads(1)  # a ~20k-parameter model: more threads only add synchronisation
    # The lab trains on the CPU; DeepSpeed, which accelerate imports whenever it is installed, would guess so aloud.
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    command = shlex.join(["trl-credit", "lab", *argv])
    with owned_folder(config.output_dir):
        run_lab(config, command=command)
    print(f"{PROG}: results in {config.output_dir}/results.json, report in {config.output_dir}/report.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
