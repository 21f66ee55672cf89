"""Fake-but-realistic run folders for the token-view, plot and model-card tests.

`token_credit.jsonl` records come from the real record builder and the real TACO/EAPO functions on
random statistics; `trainer_state.json` mimics what TRL's GRPOTrainer logs (reward rising, entropy
falling, method diagnostics under their prefix).
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import torch

from trl_credit.methods.eapo import eapo_advantages
from trl_credit.methods.taco import taco_advantages, taco_tail_risk
from trl_credit.reports import token_view

WORDS = ["The", " sum", " of", " 3", " and", " 4", " is", " 7", ".", "\n", " so", " \\boxed{7}", " then", " x"]


def fake_token_credit_records(method: str = "taco", steps: int = 3, per_step: int = 4, seed: int = 0) -> list[dict]:
    """Records of `per_step` completions at each of `steps` steps, half with positive advantage."""
    generator = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    records = []
    for step in range(1, steps + 1):
        length = 12
        logps_BT = -torch.rand(per_step, length, generator=generator) * 8  # some deep-tail tokens
        entropy_BT = torch.rand(per_step, length, generator=generator) * 2
        mask_BT = torch.ones(per_step, length, dtype=torch.bool)
        mask_BT[0, -3:] = False  # one padded row
        rewards = [float(i % 2 == 0) for i in range(per_step)]
        mean = sum(rewards) / per_step
        advantages_B = torch.tensor([r - mean for r in rewards])
        if method == "taco":
            token_adv_BT = taco_advantages(
                advantages_B, mask_BT, policy_logps=logps_BT, policy_entropy=entropy_BT
            ).advantages_BT
            statistic_BT = taco_tail_risk(logps_BT, entropy_BT)
        else:
            token_adv_BT = eapo_advantages(
                advantages_B, mask_BT, rollout_entropy=entropy_BT, eapo_kappa=math.log(4)
            ).advantages_BT
            statistic_BT = entropy_BT / 2
        for row in range(per_step):
            tokens = [rng.choice(WORDS) for _ in range(length)]
            records.append(
                token_view.token_credit_record(
                    step=step,
                    method=method,
                    prompt="What is 3 + 4?",
                    completion="".join(tokens),
                    reward=rewards[row],
                    advantage=advantages_B[row],
                    token_ids=torch.arange(length),
                    token_advantages=token_adv_BT[row],
                    logps=logps_BT[row],
                    entropies=entropy_BT[row],
                    mask=mask_BT[row],
                    tokens=tokens,
                    statistic=statistic_BT[row],
                )
            )
    return records


def write_fake_trainer_state(
    path: Path, method: str = "taco", steps: int = 10, seed: int = 0, reward_funcs=("accuracy", "format")
) -> Path:
    """A `trainer_state.json` with TRL GRPO metrics and the method's diagnostics at every step."""
    rng = random.Random(seed)
    history = []
    for step in range(1, steps + 1):
        progress = step / steps
        entry = {
            "step": step,
            "epoch": progress,
            "loss": rng.uniform(-0.01, 0.01),
            "learning_rate": 1e-6 * (1 - progress),
            "reward": 0.2 + 0.5 * progress + rng.uniform(-0.05, 0.05),
            "reward_std": 0.3 + rng.uniform(0, 0.1),
            "entropy": 1.5 - 0.8 * progress,
            "completions/mean_length": 120 + 30 * progress,
        }
        for name in reward_funcs:
            entry[f"rewards/{name}/mean"] = 0.1 + 0.6 * progress
        if method == "taco":
            entry.update({"taco/mean_weight": 0.99, "taco/tail_fraction": 0.02, "taco/mean_tail_risk": -2.0})
        elif method == "eapo":
            entry.update(
                {
                    "eapo/mean_weight": 1.0,
                    "eapo/q_lo": 0.1,
                    "eapo/q_hi": 2.0 - progress,
                    "eapo/kappa": math.log(4) * (1 - progress),
                }
            )
        entry["credit/adv_abs_mean"] = 0.5
        history.append(entry)
    # Trainer.train() ends with a summary entry that has no per-step metrics: plots must skip it.
    history.append({"step": steps, "train_runtime": 12.3, "train_loss": 0.0, "total_flos": 0.0})
    state = {"global_step": steps, "max_steps": steps, "log_history": history}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(state, indent=2))
    return path


def folder_files(folder: Path) -> dict[str, bytes]:
    """Every file under `folder`, by relative path, with its bytes: to check that a command wrote nothing there."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
