"""A run owns its output folder: one process at a time writes into it (`run_folder_lock`), and a folder that holds a
finished run is recognised (`finished_run_files`) so that the command line can refuse to replace it.

The lock is an exclusive `fcntl.flock` on `LOCK_FILE` in the folder, taken without waiting: another process gets
`RunFolderBusy`, naming the holder (pid, host and run, written into the file). The operating system releases the lock
when its process exits, however it exits: a crash leaves no stale lock. The file stays (deleting it races with a
process that just opened it), except in a folder that taking the lock created and the run left empty. Its name starts
with `_`, which TRL's `push_to_hub` does not upload. Within one process the lock is re-entrant (`trl-credit grpo`, then
the trainer's `train()`; two trainers of a notebook one after the other); a command that starts worker processes
passes the folder it holds to them in `HELD_BY_PARENT_ENV`. The launchers of one job on several machines share a
`JOB_ID_ENV`: the first to reach the folder holds the lock, the others go on without it (docs/scaling.md,
"Multi-node").
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path

LOCK_FILE = "_trl_credit.lock"
# Set by a process that holds the lock of a folder in the environment of the workers it starts: the folder's path.
HELD_BY_PARENT_ENV = "TRL_CREDIT_RUN_FOLDER_HELD"
# The job this process belongs to, the same in every launcher of one training job on several machines (a SLURM job id):
# a folder held by that job is not refused.
JOB_ID_ENV = "TRL_CREDIT_JOB_ID"
# What a finished run leaves at the top of its output folder: `save_state` and `save_model` at the end of training
# (a checkpoint keeps its own in `checkpoint-N`; TRL writes the model card, README.md, at every checkpoint too).
FINISHED_RUN_FILES = ("trainer_state.json", "config.json", "adapter_config.json", "model.safetensors")

# The locks this process holds: folder (resolved) -> [open lock file, depth, whether taking it created the folder].
_held: dict[str, list] = {}


class RunFolderBusy(RuntimeError):
    """Another process holds the lock of the output folder."""


def _key(folder) -> str:
    return str(Path(folder).resolve())


def finished_run_files(folder) -> list[str]:
    """The files of `FINISHED_RUN_FILES` at the top of `folder`: empty when it holds no finished run."""
    return [name for name in FINISHED_RUN_FILES if (Path(folder) / name).is_file()]


def _holder(lock_file) -> tuple[str, str, str]:
    """`(pid, host, job)` as the holder wrote them (empty strings until it has)."""
    lock_file.seek(0)
    pid, host, job = (lock_file.read().splitlines() + ["", "", ""])[:3]
    return pid.strip(), host.strip(), job.strip()


def _lock_or_join(lock_file, folder) -> bool:
    """Take the lock of the open `lock_file`: True. False when this process's job (`JOB_ID_ENV`) already holds it.

    Raises:
        RunFolderBusy: another job, or a process of none, holds it.
    """
    job = os.environ.get(JOB_ID_ENV, "")
    for _ in range(50):  # a holder that has just taken the lock writes who it is a moment later
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pid, host, holder_job = _holder(lock_file)
            if pid:
                break
            time.sleep(0.1)
    if job and holder_job == job:
        return False
    holder = f"process {pid} on {host}" if pid.isdigit() else "another process"
    of_job = f" (job {holder_job}: its launchers on other machines go on with {JOB_ID_ENV}={holder_job})"
    raise RunFolderBusy(
        f"{folder} is in use by {holder}, which is training into it: wait for it to end, or choose another output "
        f"folder{of_job if holder_job else ''}"
    )


@contextmanager
def run_folder_lock(folder):
    """Hold the exclusive lock of the run folder `folder` (created if missing) inside the block; where this process's
    job (`JOB_ID_ENV`) already holds it, from another machine's launcher, run the block without it.

    Raises:
        RunFolderBusy: another process holds it for another job or none (the message names its pid and host).
    """
    key = _key(folder)
    if os.environ.get(HELD_BY_PARENT_ENV) == key:  # a worker of the process that holds it
        yield
        return
    if key in _held:
        _held[key][1] += 1
    else:
        created = not os.path.exists(key)
        Path(key).mkdir(parents=True, exist_ok=True)
        lock_file = open(Path(key) / LOCK_FILE, "a+")  # noqa: SIM115 - held across the block, closed below
        try:
            holds = _lock_or_join(lock_file, folder)
        except RunFolderBusy:
            lock_file.close()
            raise
        if not holds:  # another machine's launcher of this run holds it
            lock_file.close()
            yield
            return
        lock_file.truncate(0)
        lock_file.write(f"{os.getpid()}\n{socket.gethostname()}\n{os.environ.get(JOB_ID_ENV, '')}\n")
        lock_file.flush()
        _held[key] = [lock_file, 1, created]
    try:
        yield
    finally:
        _held[key][1] -= 1
        if _held[key][1] == 0:
            lock_file, _, created = _held.pop(key)
            lock_file.truncate(0)
            if created and os.listdir(key) == [LOCK_FILE]:  # a run that wrote nothing leaves no empty folder
                os.unlink(lock_file.name)
                os.rmdir(key)
            lock_file.close()  # closing the file releases the lock
