"""`LabTrainer`: the real `CreditGRPOTrainer`, plus the task's ground truth and a record of the advantages its loss consumed.

Nothing in the product is patched. `_AdvantageRecorder` is a `GRPOTrainer` subclass placed between
`CreditGRPOTrainer` and TRL's `GRPOTrainer` in the method resolution order:

    LabTrainer -> CreditGRPOTrainer -> _AdvantageRecorder -> GRPOTrainer

- Its `_generate_and_score_completions` runs right after TRL's, before the credit stack: it labels every completion
  token from the task (decisive, implausible) and adds the labels to the batch (`lab_decisive`,
  `lab_implausible`), so TRL's shuffle and split keep them aligned with their rows.
- The decisive labels also travel as the statistic `TASK_DECISIVE`, under its batch key (`statistic_key`): that is
  what the `oracle` method (`trl_credit.experiments.lab.oracle`, registered by importing this module) reads.
- Its `_compute_loss` receives exactly the dict `CreditGRPOTrainer` hands to TRL's loss, and reads
  `inputs["advantages"]` after TRL's `_compute_loss` returns: that is the tensor the loss multiplied (`(B,)` for
  GRPO, `(B, T)` for the credit methods; TACO fills it in during that very forward). It also takes the gradient
  norm of each micro-batch's loss (one extra backward of the tiny model, outside the optimizer's gradients).
"""

from __future__ import annotations

import torch
from trl import GRPOTrainer

from trl_credit import CreditGRPOTrainer
from trl_credit.trainer.batch_layout import loss_weights, statistic_key

from . import oracle  # noqa: F401  (registers the `oracle` credit method)
from .metrics import add_sums, credit_mass
from .statistics import TASK_DECISIVE
from .tasks import LabTask

DECISIVE_KEY, IMPLAUSIBLE_KEY = "lab_decisive", "lab_implausible"


class _AdvantageRecorder(GRPOTrainer):
    lab_task: LabTask

    def _generate_and_score_completions(self, inputs):
        batch = super()._generate_and_score_completions(inputs)
        batch[DECISIVE_KEY], batch[IMPLAUSIBLE_KEY] = self._labels(batch)
        batch[statistic_key(TASK_DECISIVE)] = batch[DECISIVE_KEY].float()  # the ground truth, for the credit stack
        return batch

    def _compute_loss(self, model, inputs):
        loss = super()._compute_loss(model, inputs)
        self._record_micro_batch(model, inputs, loss)
        return loss

    @torch.no_grad()
    def _labels(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """`(B, T)` decisive and implausible labels of the batch's completions, from the task."""
        tokens = self.processing_class.convert_ids_to_tokens
        pad = self.processing_class.pad_token
        decisive, implausible = [], []
        for prompt_ids, completion_ids in zip(batch["prompt_ids"].tolist(), batch["completion_ids"].tolist()):
            prompt = [word for word in tokens(prompt_ids) if word != pad]
            completion = tokens(completion_ids)
            decisive.append(self.lab_task.decisive(prompt, completion))
            implausible.append(self.lab_task.implausible(prompt, completion))
        device = batch["completion_ids"].device
        return torch.tensor(decisive, device=device), torch.tensor(implausible, device=device)

    def _record_micro_batch(self, model, inputs, loss) -> None:
        mask_BT = loss_weights(inputs)
        decisive_BT, implausible_BT = inputs[DECISIVE_KEY], inputs[IMPLAUSIBLE_KEY]
        advantages = inputs["advantages"]
        add_sums(self.lab_decisive, credit_mass(advantages, mask_BT, decisive_BT))
        add_sums(self.lab_implausible, credit_mass(advantages, mask_BT, implausible_BT))
        parameters = [p for p in model.parameters() if p.requires_grad]
        gradients = torch.autograd.grad(loss, parameters, retain_graph=True, allow_unused=True)
        norm = torch.sqrt(sum((g.float() ** 2).sum() for g in gradients if g is not None)).item()
        self.lab_grad_norms.setdefault(self.state.global_step, []).append(norm)


class LabTrainer(CreditGRPOTrainer, _AdvantageRecorder):
    """`CreditGRPOTrainer` on a lab task: the task's decisive tokens reach the credit stack (for `oracle`), and the
    credit mass on labelled tokens and the micro-batch gradient norms are recorded.

    Args:
        lab_task: The task whose `decisive` and `implausible` labels are applied to every micro-batch.
        *args, **kwargs: As for `CreditGRPOTrainer`.

    After `train()`: `lab_decisive` and `lab_implausible` hold accumulated `credit_mass` sums, `lab_grad_norms`
    maps each optimizer step (0-based) to its micro-batch gradient norms.
    """

    def __init__(self, *args, lab_task: LabTask, **kwargs):
        self.lab_task = lab_task
        self.lab_decisive: dict[str, float] = {}
        self.lab_implausible: dict[str, float] = {}
        self.lab_grad_norms: dict[int, list[float]] = {}
        super().__init__(*args, **kwargs)

    supplied_statistics = (*CreditGRPOTrainer.supplied_statistics, TASK_DECISIVE)
