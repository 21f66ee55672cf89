"""Test fixture of `tests/real_vllm/test_multinode.py`: Python imports this module at the start of every process that
`examples/slurm_multinode.sh` launches there (this folder is on their PYTHONPATH): each node's `trl-credit grpo`,
`accelerate launch` and training processes, and the `trl vllm-serve` server.

Without `MULTINODE_TEST_DIR` in the environment it does nothing. With it, it runs a function of `multinode_fixture.py`
right after each module of `AFTER_IMPORT` is imported in this process (nothing is imported early, so a process that
never imports them pays nothing):

* `trl.generation.vllm_client`: `reload_weights_transport`, the server's weight transport on a CPU (TRL's is NCCL);
* `deepspeed`: `skip_shm_comm_build`, DeepSpeed's shared-memory op, compiled with g++ on first use, left out;
* `trl_credit.trainer.credit_trainer`: `record_consumed_credit`, every `CreditGRPOTrainer.train()` under the recorder
  of what TRL's loss consumed and of the prompt groups each process holds.
"""

import importlib.abc
import os
import sys

AFTER_IMPORT = {
    "trl.generation.vllm_client": "reload_weights_transport",
    "deepspeed": "skip_shm_comm_build",
    "trl_credit.trainer.credit_trainer": "record_consumed_credit",
}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds the modules of `AFTER_IMPORT` with the other finders and runs their hook once the module has executed."""

    def find_spec(self, name, path, target=None):
        if name not in AFTER_IMPORT:
            return None
        for finder in sys.meta_path:
            spec = None if finder is self else getattr(finder, "find_spec", lambda *a: None)(name, path, target)
            if spec is not None and spec.loader is not None:
                break
        else:
            return None
        execute = spec.loader.exec_module

        def execute_then_hook(module):
            execute(module)
            import multinode_fixture

            getattr(multinode_fixture, AFTER_IMPORT[name])(module)

        spec.loader.exec_module = execute_then_hook
        return spec


if os.environ.get("MULTINODE_TEST_DIR"):
    sys.meta_path.insert(0, _AfterImport())
