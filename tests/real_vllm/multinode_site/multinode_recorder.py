"""`MachineRecorder`: what a training process of the multi-node test checked and consumed, saved for the test."""

from __future__ import annotations

import json
import os
from pathlib import Path

from trainer_helpers import TwoProcessRecorder


class MachineRecorder(TwoProcessRecorder):
    """[`TwoProcessRecorder`] on one training process of several machines: the advantages and loss mask TRL's loss
    consumed against the reference rules, the generation stage over every process's rows (gathered over both
    machines). It also keeps, for the test:

    * `generation_batches`: per generation batch, how the policy's LM head is stored (partitioned under ZeRO-3: shape
      `(0,)`);
    * `consumed`: per micro-batch, the step, the rows (prompt and completion ids, the trainer's prompt group
      `credit_group_index`) and the advantages TRL's loss consumed.

    Everything goes to `process<rank>.json` in `folder` after each micro-batch and when training ends.
    """

    def __init__(self, monkeypatch, trainer, folder: Path):
        super().__init__(monkeypatch, trainer)
        self.path = Path(folder) / f"process{trainer.accelerator.process_index}.json"
        self.generation_batches, self.consumed = [], []

    def on_generation(self, batch, rollout_logps_BT, mask_BT):
        super().on_generation(batch, rollout_logps_BT, mask_BT)
        head = self.trainer.accelerator.unwrap_model(self.trainer.model).get_output_embeddings().weight
        self.generation_batches.append({"step": self.trainer.state.global_step, "head_shape": list(head.shape)})

    def _check(self, inputs, expected_rows):
        super()._check(inputs, expected_rows)
        self.consumed.append(
            {
                "step": self.trainer.state.global_step,
                "prompt_ids": inputs["prompt_ids"].tolist(),
                "completion_ids": inputs["completion_ids"].tolist(),
                "completion_mask": inputs["completion_mask"].tolist(),
                "group_index": inputs["credit_group_index"].tolist(),
                "advantages": inputs["advantages"].tolist(),
            }
        )
        self.save()

    def save(self) -> None:
        accelerator = self.trainer.accelerator
        plugin = accelerator.state.deepspeed_plugin
        result = {
            "process_index": accelerator.process_index,
            "num_processes": accelerator.num_processes,
            "machine_rank": int(os.environ.get("GROUP_RANK", "-1")),
            "distributed_type": str(accelerator.distributed_type.value),
            "zero_stage": plugin.zero_stage if plugin is not None else None,
            "failures": self.failures,
            "checked_batches": self.checked_batches,
            "max_difference": self.max_difference,
            "moved_tokens": self.moved_tokens,
            "valid_tokens": self.valid_tokens,
            "ill_conditioned": self.ill_conditioned,
            "tie_swaps": self.tie_swaps,
            "generation_batches": self.generation_batches,
            "consumed": self.consumed,
        }
        partial = self.path.with_suffix(".partial")
        partial.write_text(json.dumps(result))
        partial.replace(self.path)  # a process stopped mid-write leaves the previous file whole
