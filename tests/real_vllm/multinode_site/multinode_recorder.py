"""`MachineRecorder`: what a training process of the multi-node test checked and consumed, saved for the test."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from trainer_helpers import TwoProcessRecorder


class MachineRecorder(TwoProcessRecorder):
    """[`TwoProcessRecorder`] on one training process of several machines: the advantages and loss mask TRL's loss
    consumed against the reference rules, the generation stage over every process's rows (gathered over both
    machines). It also keeps, for the test:

    * `generation_batches`: per generation batch, how the policy's LM head is stored (partitioned under ZeRO-3: shape
      `(0,)`);
    * `consumed`: per micro-batch, the step, the rows (prompt and completion ids, the trainer's prompt group
      `credit_group_index`) and the advantages TRL's loss consumed.

    * `one_machine_difference`: the largest difference between the generation stage's advantages the batch carries
      into the loss and the reference rules run on this process's rows alone: above the tolerance, the comparison
      would notice a reduction that stayed on one machine.

    Everything goes to `process<rank>.json` in `folder` after each micro-batch and when training ends.
    """

    def __init__(self, monkeypatch, trainer, folder: Path):
        super().__init__(monkeypatch, trainer)
        self.path = Path(folder) / f"process{trainer.accelerator.process_index}.json"
        self.generation_batches, self.consumed = [], []
        self.one_machine, self.one_machine_expected, self.one_machine_difference = False, None, 0.0

    def _expect_generation(self, batch):
        """The reference rules on this process's rows alone, then over every process's rows (what is checked)."""
        if self.generation_stage and self.reference_model is None:  # no policy copy to refresh twice
            rewards_B, rows = self._rewards_B, batch["completion_ids"].size(0)
            first = super().first_local_row(rows)
            self.one_machine, self._rewards_B = True, rewards_B[first : first + rows]
            try:
                super()._expect_generation(batch)
                self.one_machine_expected = self.expected
            finally:
                self.one_machine, self._rewards_B = False, rewards_B
        super()._expect_generation(batch)

    def gather_rows(self, rows):
        return rows if self.one_machine else super().gather_rows(rows)

    def first_local_row(self, rows):
        return 0 if self.one_machine else super().first_local_row(rows)

    def _expect_training_forward(self, inputs):
        if self.one_machine_expected is not None:
            expected, self.expected = self.expected, self.one_machine_expected
            try:
                alone = [rows[0] for rows in self._rows(inputs)]
            finally:
                self.expected = expected
            base_BT = torch.stack([row["base_mask"] for row in alone])
            alone_BT = torch.stack([row["advantages_BT"] for row in alone]) * base_BT
            carried_BT = inputs["advantages"].double().cpu() * base_BT
            difference = (carried_BT - alone_BT).abs().max().item()
            self.one_machine_difference = max(self.one_machine_difference, difference)
        return super()._expect_training_forward(inputs)

    def on_generation(self, batch, rollout_logps_BT, mask_BT):
        if self.one_machine:
            return
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
            "one_machine_difference": self.one_machine_difference,
            "generation_batches": self.generation_batches,
            "consumed": self.consumed,
        }
        partial = self.path.with_suffix(".partial")
        partial.write_text(json.dumps(result))
        partial.replace(self.path)  # a process stopped mid-write leaves the previous file whole
