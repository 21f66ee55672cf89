"""How `trl-credit grpo --accelerate_config` launches its processes: the config it names (a file, or a packaged one by
name), how many processes that config starts (the world size TRL derives the generation batch from, checked before
launching), and the launch itself, as `trl grpo` re-runs its own script under `accelerate launch`."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.resources import as_file
from pathlib import Path

from . import UsageError

LAUNCHED_ENV = "TRL_CREDIT_LAUNCHED"  # set in processes started by `accelerate launch` from this command


def accelerate_config_file(accelerate_config: str):
    """The accelerate config `--accelerate_config` names: a file, or a packaged config by name."""
    from ..resources import accelerate_configs, find_yaml

    try:
        return find_yaml("--accelerate_config", accelerate_config, accelerate_configs())[0]
    except ValueError as error:
        raise UsageError(str(error)) from error


def stays_in_this_process(accelerate_config: str) -> bool:
    """`--accelerate_config none` (or empty): train in this process, whatever the recipe names."""
    return accelerate_config.strip().lower() in ("", "none")


def launched_processes(name: str | None) -> int | None:
    """How many processes in all (every machine's) `trl-credit grpo --accelerate_config name` will start, as accelerate
    reads `num_processes` from that config; None without one (`name` None or `none`), and in a process it started."""
    if os.environ.get(LAUNCHED_ENV) or not isinstance(name, str) or stays_in_this_process(name):
        return None  # a launched process knows its world; no config, or one that `__post_init__` refuses
    from accelerate.commands.config.config_args import load_config_from_file

    with as_file(accelerate_config_file(name)) as config_file:
        processes = load_config_from_file(str(config_file)).num_processes
    if processes < 1:  # accelerate's "not set"; `accelerate launch` would refuse it without `--num_processes`
        raise UsageError(
            f"--accelerate_config {name}: num_processes is {processes}: set it in the file to the number of processes "
            "to launch in all (accelerate reads it from there)"
        )
    return processes


def as_launched(config_class, processes: int):
    """`config_class` as the processes `accelerate launch` starts will build it: TRL derives the generation batch from
    the world size and checks that it holds whole groups (`GRPOConfig.__post_init__`), and the launching process,
    not one of them, would count itself alone."""
    return type(
        config_class.__name__,
        (config_class,),
        {"world_size": property(lambda self: processes), "__module__": config_class.__module__},
    )


def launch_with_accelerate(accelerate_config: str, argv: list[str], output_dir: str) -> int:
    """Re-run `trl_credit.cli.grpo` under `accelerate launch`, as `trl grpo` does with its own script; the workers
    train in the folder this process holds the lock of (`owned_folder`)."""
    from ..trainer.run_folder import HELD_BY_PARENT_ENV

    with as_file(accelerate_config_file(accelerate_config)) as config_file:  # a file on disk, for accelerate
        command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config_file)]
        command += ["-m", "trl_credit.cli.grpo", *argv]
        print(f"trl-credit: launching {' '.join(command)}", flush=True)
        held = str(Path(output_dir).resolve())
        process = subprocess.Popen(command, env={**os.environ, LAUNCHED_ENV: "1", HELD_BY_PARENT_ENV: held})
        try:
            return process.wait()
        except KeyboardInterrupt:  # the workers got the same Ctrl-C: they say where to resume, then exit
            return process.wait() or 130
