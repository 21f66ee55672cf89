"""No command writes over a file it reads, or over another command's (another run's) files.

A command that writes one file (`inspect`'s page and PNG) refuses a path that is one of its inputs, or an existing
file of another kind than it writes (`RUN/token_credit.jsonl` is no HTML page). A command that writes into a folder
(`eval`, `lab`, `compare`) refuses one that holds files it would write but is not its own (`FOLDER_OUTPUTS`: a lab's
`summary.json` is not an evaluation's). `plot` writes the PNGs of a run's card only for that run.
"""

from __future__ import annotations

from pathlib import Path

from . import UsageError

# The files each command writes at the top of its output folder, and the one of them that marks a folder as its own.
FOLDER_OUTPUTS = {
    "eval": (("completions.jsonl", "summary.json"), "completions.jsonl"),
    "lab": (("results.json", "summary.json", "report.md"), "results.json"),
    "compare": (("report.md", "report.html"), "report.html"),
}
RUN_FILES = ("trainer_state.json",)  # a training run's folder, at its top or in a checkpoint-N


def check_output_file(path, inputs, kind: str, suffixes: tuple[str, ...], shown: str) -> None:
    """Refuse writing `kind` ("an HTML page", written as one of `suffixes`) to `path` when it is one of the files
    `inputs`, a folder, or an existing file of another kind."""
    path = Path(path)
    if any(path.resolve() == Path(source).resolve() for source in inputs):
        raise UsageError(f"{shown} {path} is a file this command reads: writing {kind} there would replace it")
    if path.is_dir():
        raise UsageError(f"{shown} {path} is a folder: give the path of {kind} to write")
    if path.exists() and path.suffix.lower() not in suffixes:
        raise UsageError(
            f"{shown} {path} exists and is not {kind} ({'/'.join(suffixes)}): writing {kind} there would replace "
            "it; choose another path"
        )


def check_output_folder(command: str, folder, shown: str = "--output_dir") -> None:
    """Refuse a `trl-credit <command>` output folder that is a file, or that holds files the command writes there
    without being one of its folders."""
    folder = Path(folder)
    if folder.is_file():
        raise UsageError(f"{shown} {folder} is a file, not a folder")
    written, own = FOLDER_OUTPUTS[command]
    taken = [name for name in written if (folder / name).is_file()]
    if taken and not (folder / own).is_file():
        owner = next(
            (f"trl-credit {name}'s" for name, (_, mark) in FOLDER_OUTPUTS.items() if (folder / mark).is_file()),
            "another command's",
        )
        raise UsageError(
            f"{shown} {folder} holds {owner} {', '.join(taken)}, which trl-credit {command} would replace: choose "
            "another folder"
        )


def is_run_folder(folder) -> bool:
    """Whether `folder` holds a training run (its trainer state, at its top or in a checkpoint)."""
    folder = Path(folder)
    return any((folder / name).is_file() for name in RUN_FILES) or any(folder.glob("checkpoint-*/trainer_state.json"))


def check_plot_folder(output, runs, shown: str = "--output") -> None:
    """Refuse writing plots into a file, or into the `plots/` folder of a run's card unless the plots are of that run
    alone (its own plots, as its card shows them)."""
    output = Path(output)
    if output.is_file():
        raise UsageError(f"{shown} {output} is a file, not a folder")
    owner = output.parent
    if output.name == "plots" and is_run_folder(owner):
        if [Path(run).resolve() for run in runs] != [owner.resolve()]:
            raise UsageError(
                f"{shown} {output} holds the plots of {owner}'s model card, which plots of other runs would replace: "
                "pass --output FOLDER"
            )
