"""Helpers of the tests that launch processes (`tests/test_multiprocess.py`, `tests/real_vllm/test_multinode.py`):
a free port, accelerate configs for CPU processes, and the tree of processes a launcher started."""

from __future__ import annotations

import json
import socket
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def deepspeed_config(stage: int) -> dict:
    """DeepSpeed JSON for CPU processes; "auto" fields are filled from the training arguments by transformers."""
    zero = {"stage": stage, "offload_optimizer": {"device": "none"}, "offload_param": {"device": "none"}}
    if stage == 3:  # default 100k elements: the tiny model's head would stay whole after its first gather
        zero["stage3_param_persistence_threshold"] = 0
    return {
        "zero_optimization": zero,
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": False},
        "fp16": {"enabled": False},
    }


def accelerate_config(engine: str, directory: Path) -> dict:
    """An accelerate config for 2 CPU processes (`use_cpu: true`)."""
    config = {
        "compute_environment": "LOCAL_MACHINE",
        "num_machines": 1,
        "num_processes": 2,
        "machine_rank": 0,
        "use_cpu": True,
        "rdzv_backend": "static",
        "same_network": True,
    }
    if engine in ("zero2", "zero3"):
        stage = int(engine[-1])
        ds_config = directory / f"ds_zero{stage}.json"
        ds_config.write_text(json.dumps(deepspeed_config(stage), indent=2))
        # With a DeepSpeed JSON, accelerate refuses inline ZeRO keys and `mixed_precision` in the YAML.
        config.update(
            distributed_type="DEEPSPEED",
            deepspeed_config={
                "deepspeed_config_file": str(ds_config),
                "zero3_init_flag": stage == 3,
            },
        )
    elif engine == "fsdp2":
        config.update(
            distributed_type="FSDP",
            mixed_precision="no",
            fsdp_config={
                "fsdp_version": 2,
                "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                "fsdp_reshard_after_forward": True,
                "fsdp_state_dict_type": "FULL_STATE_DICT",
                "fsdp_cpu_ram_efficient_loading": False,
                "fsdp_offload_params": False,
                "fsdp_activation_checkpointing": False,
            },
        )
    else:
        raise ValueError(engine)
    return config


def process_tree(pid: int) -> list[int]:
    """`pid` and all its descendants (Linux `/proc`): torch's elastic agent starts the workers in new sessions, so
    killing the launcher's process group would leave them running, holding the output pipes open."""
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    tree, stack = [], [pid]
    while stack:
        tree.append(stack.pop())
        stack.extend(children.get(tree[-1], []))
    return tree
