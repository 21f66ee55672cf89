"""The hooks `sitecustomize.py` runs in the processes of the multi-node test, and the test's reward function.

Imported only once a hooked module has been imported, possibly in the middle of TRL's own import: nothing here imports
TRL, DeepSpeed or the test helpers at module level.

Environment (set by `tests/real_vllm/test_multinode.py`):

* `MULTINODE_TEST_DIR`: the folder each training process writes `process<rank>.json` into (`MachineRecorder`), and
  the weight transport its safetensors (`pushed_weights/`);
* `MULTINODE_HOLD_MACHINE`: a machine rank whose training processes stop at the start of step 2, once `checkpoint-1`
  is saved, and wait there to be stopped (the resume test sends them SIGTERM); each writes `held_process<rank>`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

TEST_DIR = Path(os.environ.get("MULTINODE_TEST_DIR", "."))


def row_reward(completions, **kwargs):
    """From each completion's row in the generation batch (TRL gives process `RANK` the rows `RANK * n ... RANK * n + n
    - 1` of it): 2 on odd rows and 0 on even ones, plus row / 1000. Distinct within every prompt group whatever was
    generated, so every group's advantages are non-zero; and every group of two or more rows, a split one too, has
    rewards on both sides of any threshold between 0.5 and 1.5, so a method that sorts completions into correct and
    wrong (KTAE) finds both in every group on every process."""
    first = int(os.environ.get("RANK", "0")) * len(completions)
    return [2.0 * ((first + row) % 2) + (first + row) / 1000 for row in range(len(completions))]


def reload_weights_transport(vllm_client_module) -> None:
    """TRL 1.16 pushes weights to `trl vllm-serve` only through vLLM's NCCL weight-transfer engine (CUDA). On a CPU,
    `VLLMClient` instead saves the streamed tensors as safetensors in `MULTINODE_TEST_DIR/pushed_weights` and asks the
    server to load them (`/collective_rpc` `reload_weights`, the dev endpoint `trl vllm-serve` enables): the weights the
    server generates with after each push are the trainer's, as with NCCL."""
    import requests
    from safetensors.torch import save_file

    folder = TEST_DIR / "pushed_weights"

    def update_named_params(self, metadata, named_params):
        tensors = {name: tensor.detach().to("cpu").contiguous().clone() for name, tensor in named_params}
        assert [name for name, _, _ in metadata] == list(tensors)
        folder.mkdir(exist_ok=True)
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
        response = requests.post(
            f"{self.base_url}/collective_rpc",
            json={"method": "reload_weights", "kwargs": {"weights_path": str(folder)}},
            timeout=120,
        )
        response.raise_for_status()

    client = vllm_client_module.VLLMClient
    client.init_communicator = lambda self, device=0: None
    client.close_communicator = lambda self: None
    client.update_named_params = update_named_params


def skip_shm_comm_build(deepspeed_module) -> None:
    """DeepSpeed compiles a shared-memory comm op with g++ on first use on a CPU (1-2 min); without it, plain gloo."""
    deepspeed_module.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def record_consumed_credit(credit_trainer_module) -> None:
    """Every `CreditGRPOTrainer.train()` of this process runs under `MachineRecorder`, which saves what it recorded
    when training ends (and after each micro-batch, for a process that is stopped)."""
    trainer_class = credit_trainer_module.CreditGRPOTrainer
    train = trainer_class.train

    def recorded_train(self, *args, **kwargs):
        import pytest
        from multinode_recorder import MachineRecorder

        hold = os.environ.get("MULTINODE_HOLD_MACHINE")
        if hold is not None and hold == os.environ.get("GROUP_RANK"):
            self.add_callback(_hold_after_first_checkpoint())
        with pytest.MonkeyPatch.context() as monkeypatch:
            recorder = MachineRecorder(monkeypatch, self, TEST_DIR)
            try:
                return train(self, *args, **kwargs)
            finally:
                recorder.save()

    trainer_class.train = recorded_train


def _hold_after_first_checkpoint():
    """A callback that stops this process at the start of step 2 (after `checkpoint-1` is saved) until it is killed."""
    from transformers import TrainerCallback

    class HoldAfterFirstCheckpoint(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 1:
                (TEST_DIR / f"held_process{os.environ['RANK']}").write_text(str(os.getpid()))
                while True:
                    time.sleep(1)

    return HoldAfterFirstCheckpoint()
