"""Helpers shared by the benchmark scripts: repo import path, interleaved timing, memory, the results file.

Every number the scripts report is a ratio of two measurements taken in the same run, interleaved and
repeated (median), because the machine's cores are shared and absolute timings drift.
"""

from __future__ import annotations

import os
import re
import statistics
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # `python benchmarks/x.py` puts benchmarks/ first, not the repo root
    sys.path.insert(0, str(REPO_ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

RESULTS = REPO_ROOT / "docs" / "benchmarks.md"
_HEADER = """# Benchmarks

Every number here is a **ratio of two measurements taken in the same run**, interleaved (round-robin over the
variants) and repeated, with the median reported: the benchmark machines share their cores, so absolute
timings drift by tens of percent while same-run ratios stay put. Each section is written by one script in
`benchmarks/` (`python benchmarks/<name>.py`) and rewritten only by it; the command and machine are noted in it.
"""


def interleaved_medians(fns: dict, repeats: int, inner: int = 1, warmup: int = 1) -> dict[str, float]:
    """Median seconds per call of each function, calling them round-robin `repeats` times (`inner` calls each)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(inner):
                fn()
            samples[name].append((time.perf_counter() - start) / inner)
    return {name: statistics.median(values) for name, values in samples.items()}


def paired_ratios(fns: dict, reference: str, repeats: int, inner: int = 1, warmup: int = 1) -> dict[str, float]:
    """Median over rounds of (time of each function / time of `reference` in the same round).

    Each round calls every function `inner` times, round-robin; pairing each sample with the reference
    measured moments before cancels the slow drifts of a shared machine.
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    ratios = {name: [] for name in fns}
    for _ in range(repeats):
        times = {}
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(inner):
                fn()
            times[name] = time.perf_counter() - start
        for name in fns:
            ratios[name].append(times[name] / times[reference])
    return {name: statistics.median(values) for name, values in ratios.items()}


def peak_rss_bytes() -> int:
    """This process's resident-set high-water mark (`VmHWM`), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("VmHWM not found in /proc/self/status")


def current_rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("VmRSS not found in /proc/self/status")


def available_memory_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("MemAvailable not found in /proc/meminfo")


def machine_note(threads: int | None = None) -> str:
    """One line describing the machine; `threads` = the torch threads the measuring process used."""
    import platform

    import torch

    threads = torch.get_num_threads() if threads is None else threads
    return f"{platform.machine()}, {os.cpu_count()} CPU cores (shared), torch {torch.__version__}, {threads} torch thread(s)"


def markdown_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def write_section(name: str, title: str, body: str) -> None:
    """Replace (or append) this script's section of docs/benchmarks.md, leaving the others untouched."""
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    section = f"{begin}\n## {title}\n\n{body.strip()}\n{end}"
    text = RESULTS.read_text() if RESULTS.exists() else _HEADER
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: section, text) if pattern.search(text) else text.rstrip() + "\n\n" + section + "\n"
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)
    print(f"wrote section '{name}' of {RESULTS.relative_to(REPO_ROOT)}")
