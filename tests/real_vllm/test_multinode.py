"""The multi-node recipe run for real on one machine: `examples/slurm_multinode.sh` with `LAUNCH=local` starts, on
127.0.0.1, a `trl vllm-serve` server and two training "machines", each `trl-credit grpo` re-launched through
`accelerate launch --num_machines 2 --machine_rank 0|1` with one process (gloo, DeepSpeed on CPU, `use_cpu`), in
`vllm_mode="server"`, on the shipped ZeRO-3 server recipe (`configs/tide_qwen2.5_32b_zero3.yaml`, the script's
default) cut down to a tiny model by flags.

Every registered method that reads other processes' rows (`reads_other_processes`: it calls `CreditBatch.gather`, or
reads a statistic the trainer takes over every process) and each one's first documented stack train with prompt
groups split between the machines; on each process, `MachineRecorder` (`multinode_site/`) checks the advantages and
loss mask TRL's loss consumed against the reference rules of `tests/reference_credit.py` over both machines' rows,
and, for a method that gathers, that the rules on one machine's rows alone would give other advantages (STARE reads
the batch's mean entropy only for its gate, on in both with the settings where it moves credit).
One run is stopped on machine 1 after `checkpoint-1` and resumed on both; while it is stopped, another run into its
folder is refused.

What a CPU needs here and a GPU cluster does not lives in `multinode_site/` (named and explained there), put on the
launched processes' PYTHONPATH: vLLM's server gets the trainer's weights through `reload_weights` (TRL's transport is
NCCL), and DeepSpeed's shared-memory op is not compiled.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from conftest import PACKAGE_METHODS
from launch_helpers import accelerate_config, free_port, process_tree
from reference_credit import MOVING_SETTINGS, assert_credit_moved, random_reference_batch
from trainer_helpers import DOCUMENTED_STACKS, moving_settings

from real_vllm.cpu_shims import vllm_dist_info
from trl_credit.methods import CREDIT_METHODS, apply_credit_method
from trl_credit.methods.batch import ROLLOUT_MEAN_ENTROPY

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "slurm_multinode.sh"
SITE = Path(__file__).resolve().parent / "multinode_site"
RECIPE = ROOT / "configs" / "tide_qwen2.5_32b_zero3.yaml"
RUN_TIMEOUT_S = 900
STEPS = 2
# The recipe cut down to the tiny model on the CPU: 2 steps of 3 prompts x 4 completions, 6 rows a process, so the
# second prompt's group is split between the machines. Each machine's launcher checks that generation batch with the
# two processes of its accelerate config, as TRL derives it in them (6 rows alone would hold a partial group).
TINY_RUN = {
    "use_cpu": "true",
    "bf16": "false",
    "activation_checkpointing": "false",
    "per_device_train_batch_size": "6",
    "num_generations": "4",
    "gradient_accumulation_steps": "1",
    "max_completion_length": "8",
    "max_steps": str(STEPS),
    "learning_rate": "0.05",
    "save_steps": "1",
    "report_to": "none",
    "seed": "0",
    "log_token_credit": "true",
    "reward_funcs": "multinode_fixture:row_reward",
}


def gathers(name: str) -> bool:
    """Whether registered method `name` calls `CreditBatch.gather` (other processes' values) on a batch where it moves
    credit."""
    method = CREDIT_METHODS[name]
    hyperparameters = method.hyperparameters(MOVING_SETTINGS[name])
    statistics = method.statistics_for(hyperparameters)
    batch, gathered = random_reference_batch(), []
    advantages_B, mask_BT, named = batch.package_inputs()
    named = {key: value for key, value in named.items() if key not in batch.statistics or key in statistics}
    apply_credit_method(
        name,
        advantages_B,
        mask_BT,
        **named,
        **hyperparameters,
        gather=lambda values: gathered.append(values) or values,
    )
    return bool(gathered)


def reads_other_processes(name: str) -> bool:
    """Whether registered method `name`'s result depends on other processes' rows, in the settings where it moves
    credit: it gathers, or reads a statistic the trainer takes over every process (`rollout_mean_entropy`)."""
    method = CREDIT_METHODS[name]
    statistics = method.statistics_for(method.hyperparameters(MOVING_SETTINGS[name]))
    return gathers(name) or ROLLOUT_MEAN_ENTROPY in statistics


READING_OTHER_PROCESSES = [name for name in PACKAGE_METHODS if reads_other_processes(name)]
# Each such method's first documented stack; one of them under ZeRO-2, the rest under ZeRO-3.
STACKS = [
    stack
    for name in READING_OTHER_PROCESSES
    for stack in [next((s for s in DOCUMENTED_STACKS if name in s.split("+")), None)]
    if stack is not None
]
CASES = [(case, 3) for case in READING_OTHER_PROCESSES + STACKS[:-1]] + [(case, 2) for case in STACKS[-1:]]


@pytest.fixture(scope="module")
def machines(tmp_path_factory, vllm_model_dir):
    """What every launch shares: the tiny model, 16 addition problems, the CPU accelerate configs (ZeRO-2, ZeRO-3 with
    the LM head partitioned at every step) and the runs launched so far, by name (`launch_case`)."""
    vllm_dist_info()
    folder = tmp_path_factory.mktemp("multinode")
    problems = folder / "problems.jsonl"
    problems.write_text(
        "".join(json.dumps({"question": f"what is {a} + 1 ?", "answer": str(a + 1)}) + "\n" for a in range(16))
    )
    configs = {}
    for stage in (2, 3):
        config = accelerate_config(f"zero{stage}", folder)
        config["deepspeed_config"]["deepspeed_multinode_launcher"] = "standard"  # torchrun on each node, as zero3.yaml
        configs[stage] = folder / f"zero{stage}.yaml"
        configs[stage].write_text(yaml.safe_dump(config))
    return {"folder": folder, "model": vllm_model_dir, "problems": problems, "configs": configs, "runs": {}}


def recipe_for(case: str, folder: Path) -> Path:
    """The shipped recipe with its method swapped for `case` (a method or a stack): TIDE's own settings dropped, the
    settings under which `case` moves credit on the tiny model added; everything else is the recipe's."""
    recipe = yaml.safe_load(RECIPE.read_text())
    tide_settings = set(CREDIT_METHODS["tide"].argument_names)
    recipe = {key: value for key, value in recipe.items() if key not in tide_settings}
    recipe.update(method=case, generation_kwargs={"seed": 0}, **moving_settings(case))  # seeded vLLM sampling
    path = folder / f"recipe_{case}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def start_script(machines, name: str, case: str, zero: int, output_dir: Path, *flags: str, **env) -> subprocess.Popen:
    """`examples/slurm_multinode.sh` with `LAUNCH=local` on 127.0.0.1, in a session of its own; what its processes
    record goes to `runs/<name>`, its output to `runs/<name>/script.log`."""
    folder = machines["folder"] / "runs" / name
    folder.mkdir(parents=True)
    arguments = [f"--{key}={value}" for key, value in TINY_RUN.items()]
    arguments += ["--dataset_name", str(machines["problems"]), "--output_dir", str(output_dir), *flags]
    environment = {key: value for key, value in os.environ.items() if key != "TRL_CREDIT_JOB_ID"}
    environment.update(
        PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),  # this environment's commands
        PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests"), str(SITE)]),
        OMP_NUM_THREADS="1",
        VLLM_CPU_KVCACHE_SPACE="1",
        TRL_EXPERIMENTAL_SILENCE="1",
        CUDA_VISIBLE_DEVICES="",
        MULTINODE_TEST_DIR=str(folder),
        LAUNCH="local",
        NODELIST="127.0.0.1 127.0.0.1 127.0.0.1",
        GPUS_PER_NODE="1",
        ACCELERATE_BASE=str(machines["configs"][zero]),
        VLLM_ARGS="--gpu_memory_utilization 0.1 --dtype float32 --enforce_eager true",
        MODEL=machines["model"],
        RECIPE=str(recipe_for(case, folder)),
        RUN_DIR=str(folder / "launch"),
        VLLM_PORT=str(free_port()),
        MAIN_PORT=str(free_port()),
        VLLM_GROUP_PORT=str(free_port()),
        VLLM_SERVER_TIMEOUT="600",
        **env,
    )
    log = open(folder / "script.log", "w")  # noqa: SIM115 - the child holds it; closed with the process
    process = subprocess.Popen(
        ["bash", str(SCRIPT), *arguments],
        cwd=ROOT,
        env=environment,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    process.folder, process.started = folder, time.monotonic()
    return process


def finish(process: subprocess.Popen, timeout_s: float = RUN_TIMEOUT_S) -> str:
    """Wait for the script (stopped with everything it started after `timeout_s`); its output."""
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop(process.pid, signal.SIGTERM)  # the script's trap stops its machines and its server
        time.sleep(20)
        stop(process.pid, signal.SIGKILL)
        process.wait()
        pytest.fail(f"the multi-node script ran past {timeout_s} s:\n{tail(process)}")
    print(f"\n[multi-node] {process.folder.name}: script took {time.monotonic() - process.started:.0f} s")
    return (process.folder / "script.log").read_text()


def stop(pid: int, sig: int) -> None:
    """Send `sig` to `pid` and every process it started, at once (as SLURM stops a node's job step)."""
    for member in process_tree(pid):
        try:
            os.kill(member, sig)
        except ProcessLookupError:
            pass


def tail(process) -> str:
    return (process.folder / "script.log").read_text()[-6000:]


def launch_case(machines, case: str, zero: int) -> Path:
    """The records of `case` trained under ZeRO-`zero` by the script (launched once per module)."""
    name = f"{case}-zero{zero}"
    if name not in machines["runs"]:
        process = start_script(machines, name, case, zero, machines["folder"] / "runs" / name / "out")
        finish(process)
        assert process.returncode == 0, tail(process)
        machines["runs"][name] = process.folder
    return machines["runs"][name]


def same_record(got: dict, want: dict) -> bool:
    """Two token-credit records are of one completion, its texts and ids equal and its numbers within 1e-5."""
    numbers = ("reward", "advantage", "weights", "logps", "entropies", "statistic")
    if {k: v for k, v in got.items() if k not in numbers} != {k: v for k, v in want.items() if k not in numbers}:
        return False
    return all(
        got[key] == want[key] or (got[key] is not None and got[key] == pytest.approx(want[key], abs=1e-5))
        for key in numbers
    )


def process_records(folder: Path) -> list[dict]:
    records = [json.loads((folder / f"process{rank}.json").read_text()) for rank in (0, 1)]
    return records


@pytest.mark.parametrize(("case", "zero"), [pytest.param(c, z, id=f"{c}-zero{z}") for c, z in CASES])
def test_methods_reading_other_processes_across_two_machines(machines, case, zero):
    """Both machines' launchers trained one run (one process each, DeepSpeed ZeRO-`zero`, generations from the
    server); on each process the advantages and loss mask TRL's loss consumed equal the reference rules over both
    machines' rows at every step, credit moved on each, and a prompt group was split between the machines."""
    folder = launch_case(machines, case, zero)
    records = process_records(folder)
    for rank, record in enumerate(records):
        assert (record["process_index"], record["machine_rank"], record["num_processes"]) == (rank, rank, 2)
        assert (record["distributed_type"], record["zero_stage"]) == ("DEEPSPEED", zero)
        assert not record["failures"], f"process {rank}:\n" + "\n".join(record["failures"])
        assert record["checked_batches"] == STEPS and [c["step"] for c in record["consumed"]] == list(range(STEPS))
        if zero == 3:  # the policy's LM head stays partitioned at every generation batch
            assert {tuple(batch["head_shape"]) for batch in record["generation_batches"]} == {(0,)}
        assert_credit_moved(f"{case} on process {rank}", record["moved_tokens"] / max(record["valid_tokens"], 1))
    if any(gathers(name) for name in case.split("+")):  # the check tells both machines' rows from one machine's
        assert max(record["one_machine_difference"] for record in records) > 1e-3, "the test proves nothing"
    for step in range(STEPS):
        prompts = {}  # each prompt group's prompts, over both machines
        machines_of = {}
        for rank, record in enumerate(records):
            consumed = record["consumed"][step]
            for group, prompt in zip(consumed["group_index"], consumed["prompt_ids"], strict=True):
                prompts.setdefault(group, set()).add(tuple(token for token in prompt if token != 0))
                machines_of.setdefault(group, set()).add(rank)
        assert all(len(group_prompts) == 1 for group_prompts in prompts.values()), prompts  # a group is one prompt
        assert sorted(machines_of) == [0, 1, 2] and machines_of[1] == {0, 1}, machines_of  # group 1 is split
    print(
        f"[multi-node] {case} (ZeRO-{zero}): "
        + "; ".join(
            f"process {rank}: max |consumed - reference| = {r['max_difference']:.2e}, "
            f"moved share = {r['moved_tokens'] / max(r['valid_tokens'], 1):.3f}, "
            f"max |carried - one machine's reference| = {r['one_machine_difference']:.2e}"
            for rank, r in enumerate(records)
        )
    )


def test_a_run_stopped_on_one_machine_resumes_on_both_and_owns_its_folder(machines):
    """Machine 1 is stopped with SIGTERM after `checkpoint-1` (its processes wait at the start of step 2 until then);
    while it waits, a second run into the folder is refused on both of its machines; then both machines resume from
    `checkpoint-1`: every step's token-credit records appear once, equal to the uninterrupted run's, and the advantages
    consumed at the resumed step equal that run's on each process."""
    case, zero = CASES[0]
    uninterrupted = launch_case(machines, case, zero)
    output_dir = machines["folder"] / "runs" / "resumed-out"
    first = start_script(
        machines, "interrupted", case, zero, output_dir, TRL_CREDIT_JOB_ID="job-a", MULTINODE_HOLD_MACHINE="1"
    )
    held = first.folder / "held_process1"
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not (held.exists() and (output_dir / "checkpoint-1" / "trainer_state.json").exists()):
        assert first.poll() is None, f"the run ended before machine 1 was held:\n{tail(first)}"
        assert time.monotonic() < deadline, tail(first)
        time.sleep(0.5)

    second = start_script(machines, "refused", case, zero, output_dir, TRL_CREDIT_JOB_ID="job-b")
    refused = finish(second)
    assert second.returncode == 2, refused[-4000:]
    assert refused.count(f"--output_dir {output_dir} is in use by process") == 2, refused[-4000:]  # both launchers
    assert refused.count("(job job-a: its launchers on other machines go on with TRL_CREDIT_JOB_ID=job-a)") == 2

    machine_1 = int((first.folder / "launch" / "machine1.pid").read_text())
    stop(machine_1, signal.SIGTERM)
    finish(first)
    assert first.returncode != 0  # machine 0 stopped too: its peer is gone
    assert not (output_dir / "checkpoint-2").exists()

    resumed = start_script(
        machines, "resumed", case, zero, output_dir, "--resume_from_checkpoint", str(output_dir / "checkpoint-1")
    )
    finish(resumed)
    assert resumed.returncode == 0, tail(resumed)

    def token_credit(folder):
        return [json.loads(line) for line in (folder / "token_credit.jsonl").read_text().splitlines()]

    records, reference = token_credit(output_dir), token_credit(uninterrupted / "out")
    assert sorted({r["step"] for r in reference}) == list(range(1, STEPS + 1))
    assert len(records) == len(reference)
    for got, want in zip(records, reference, strict=True):  # each step once, in order, as the uninterrupted run's
        assert same_record(got, want), (got, want)
    for rank, (got, want) in enumerate(zip(process_records(resumed.folder), process_records(uninterrupted))):
        assert not got["failures"], f"process {rank}:\n" + "\n".join(got["failures"])
        first_resumed = got["consumed"][0]
        assert first_resumed["step"] == 1
        expected = want["consumed"][1]
        for key in ("prompt_ids", "completion_ids", "completion_mask"):
            assert first_resumed[key] == expected[key], (rank, key)
        difference = (torch.tensor(first_resumed["advantages"]) - torch.tensor(expected["advantages"])).abs().max()
        assert difference <= 1e-6, (rank, difference)
        print(f"[multi-node] resumed step 2, process {rank}: max |resumed - uninterrupted| = {difference:.2e}")
