"""Running the credit lab: every (task, method, seed) trains the same warmed-up tiny model with `CreditGRPOTrainer`.

`run_one` trains one policy and measures it; `run_lab` runs the grid, writes `results.json` (one record per run)
and `report.md` (mean ± 95 % t interval over seeds, each method's paired difference to `grpo` on the same seed and,
when the grid has `oracle` and `grpo`, the fraction of the broadcast-to-oracle gap each method closes).
"""

from __future__ import annotations

import functools
import json
import math
import random
import statistics
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from .lab_config import LabConfig, method_credit_kwargs
from .lab_report import render_report, summarize
from .metrics import (
    mean_of_edges,
    precision,
    steps_until_solved,
    within_step_spread,
)
from .tasks import RARE_TOKEN, get_task

# ---------------------------------------------------------------------------------------------------------------
# One run
# ---------------------------------------------------------------------------------------------------------------


def _probe_sequences(task, seed: int, count: int = 64) -> list[list[str]]:
    """Prompt + completion word lists drawn from the prior and kept only when correct: "positive responses"."""
    from .model import sample_prior

    rng = random.Random(10_000 + seed)
    sequences = []
    while len(sequences) < count:
        prompt = rng.choice(task.prompts())
        completion = sample_prior(task, prompt, rng)
        if task.reward(prompt.split(), completion) > 0:
            sequences.append(prompt.split() + completion)
    return sequences


def token_reward(task, tokenizer):
    """The reward function `LabTrainer` trains with: `task.reward` of each completion's tokens up to `<eos>`.

    It scores the generated token ids, not the decoded text: decoding drops special tokens (`<pad>`, `<unk>`) that a
    drifting policy may emit, which would shift every later position of a `fork` or `mdp` completion, while the
    decisive labels (`LabTrainer._labels`) keep the token positions. Then a success could be labelled a failure.
    """

    def reward(prompts, completions, completion_ids, **kwargs):
        rewards = []
        for prompt, ids in zip(prompts, completion_ids):
            words = tokenizer.convert_ids_to_tokens(list(ids))
            words = words[: words.index(tokenizer.eos_token)] if tokenizer.eos_token in words else words
            rewards.append(task.reward(prompt.split(), words))
        return rewards

    return reward


def run_one(task_name: str, method: str, seed: int, config: LabConfig, work_dir: str | Path) -> dict:
    """Warm up a fresh tiny model on the task's prior, train it with `method`, and measure it.

    Returns:
        A JSON-able record: the run's identity, its per-step `reward`, `entropy` and `step_time` series, and the
        metrics (credit precision on decisive and implausible tokens, steps until solved, probability of the rare
        token in correct responses, gradient-norm spread across micro-batches, avg@n and pass@k).
    """
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback, set_seed

    from trl_credit import CreditGRPOConfig

    from ..evaluation import pass_at_k
    from .model import make_model, make_tokenizer, sample_completions, token_probability, warm_up
    from .trainer import LabTrainer

    task = get_task(task_name, config.horizon, config.decisive)
    started = time.monotonic()
    set_seed(seed)
    tokenizer = make_tokenizer()
    prompt_length = len(task.prompts()[0].split())
    model = make_model(tokenizer, seed, max_length=prompt_length + task.completion_length)
    warm_up_kl = (
        warm_up(model, tokenizer, task, seed, steps=config.warm_up_steps) if config.warm_up_steps else math.nan
    )
    probe = _probe_sequences(task, seed)
    probed = [task.tail_positions(words[:prompt_length], words[prompt_length:]) for words in probe]

    def rare(model) -> float:
        return token_probability(model, tokenizer, probe, prompt_length, RARE_TOKEN, probed)

    rare_probability = [(0, rare(model))]

    class RareTokenProbe(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step % 10 == 0 or state.global_step == state.max_steps:
                rare_probability.append((state.global_step, rare(model)))

    completions_per_step = config.prompts_per_step * config.num_generations
    args = CreditGRPOConfig(
        output_dir=str(work_dir),
        credit_method=method,
        seed=seed,
        use_cpu=True,
        bf16=False,
        activation_checkpointing=False,
        per_device_train_batch_size=completions_per_step // config.micro_batches,
        gradient_accumulation_steps=config.micro_batches,
        num_generations=config.num_generations,
        max_completion_length=task.completion_length,
        max_steps=config.max_steps,
        learning_rate=config.learning_rate,
        lr_scheduler_type="constant",
        temperature=1.0,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        dataloader_num_workers=0,
        disable_tqdm=True,
        credit_kwargs=method_credit_kwargs(method, config.credit_kwargs) or None,
    )

    dataset = Dataset.from_dict({"prompt": task.prompts() * 64})
    trainer = LabTrainer(
        model=model,
        reward_funcs=token_reward(task, tokenizer),
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[RareTokenProbe()],
        lab_task=task,
    )
    trainer.remove_callback(PrinterCallback)  # one line per step on stdout: the lab prints its own summary
    trainer.train()

    history = [entry for entry in trainer.state.log_history if "reward" in entry]
    rewards = [entry["reward"] for entry in history]
    entropies = [entry["entropy"] for entry in history if "entropy" in entry]
    step_times = [entry["step_time"] for entry in history if "step_time" in entry]

    policy = trainer.accelerator.unwrap_model(trainer.model).eval()
    counts = []
    for index, prompt in enumerate(task.prompts()):
        completions = sample_completions(
            policy, tokenizer, prompt, config.eval_samples, seed=seed * 1000 + index, length=task.completion_length
        )
        counts.append(sum(int(task.reward(prompt.split(), c) > 0) for c in completions))
    n = config.eval_samples
    entropy_start, entropy_end = mean_of_edges(entropies)
    decisive_pos, decisive_neg = precision(trainer.lab_decisive, "pos"), precision(trainer.lab_decisive, "neg")
    implausible_pos = precision(trainer.lab_implausible, "pos")
    spread = within_step_spread([trainer.lab_grad_norms[step] for step in sorted(trainer.lab_grad_norms)])
    rare_start, rare_end = rare_probability[0][1], rare_probability[-1][1]
    solved_at = steps_until_solved(rewards, config.solved_threshold, config.solved_window)
    del trainer, policy, model
    return {
        "task": task_name,
        "method": method,
        "seed": seed,
        "steps": len(rewards),
        "warm_up_kl": warm_up_kl,
        "rewards": [round(r, 4) for r in rewards],
        "entropies": [round(h, 4) for h in entropies],
        "mean_step_time": statistics.fmean(step_times) if step_times else None,
        "rare_probability": rare_probability,
        "metrics": {
            "final_reward": mean_of_edges(rewards, 10)[1],
            "mean_reward": statistics.fmean(rewards),
            "steps_until_solved": solved_at,
            # An unsolved run counts as solved one step after the budget: a lower bound, so gaps can be taken.
            "steps_until_solved_censored": solved_at if solved_at is not None else len(rewards) + 1,
            "decisive_precision_pos": decisive_pos["precision"],
            "decisive_lift_pos": decisive_pos["lift"],
            "decisive_uniform_pos": decisive_pos["uniform"],
            "decisive_precision_neg": decisive_neg["precision"],
            "decisive_lift_neg": decisive_neg["lift"],
            "decisive_uniform_neg": decisive_neg["uniform"],
            "implausible_lift_pos": implausible_pos["lift"],
            "implausible_rows_pos": implausible_pos["rows"],
            "rare_prob_start": rare_start,
            "rare_prob_end": rare_end,
            "rare_prob_growth": rare_end / rare_start if rare_start > 0 else math.nan,
            "entropy_start": entropy_start,
            "entropy_end": entropy_end,
            f"avg@{n}": statistics.fmean(c / n for c in counts),
            **{f"pass@{k}": statistics.fmean(pass_at_k(n, c, k) for c in counts) for k in config.pass_k},
            "grad_norm_var": spread["grad_norm_var"],
            "grad_norm_cv": spread["grad_norm_cv"],
        },
        "wall_seconds": round(time.monotonic() - started, 2),
    }


def _settings(config: LabConfig) -> dict:
    """The settings every run of a `results.json` shares: those that select the runs and the folder apart."""
    grid = ("methods", "tasks", "seeds", "output_dir", "overwrite_output_dir")
    return {k: v for k, v in asdict(config).items() if k not in grid}


def previous_records(config: LabConfig) -> list[dict]:
    """The runs of `OUTPUT_DIR/results.json` trained with `config`'s settings, which the lab does not repeat.

    Raises:
        ValueError: it holds runs with other settings, and `overwrite_output_dir` is off.
    """
    results_path = Path(config.output_dir) / "results.json"
    previous = json.loads(results_path.read_text()) if results_path.is_file() else {}
    # Settings added after a results.json was written count at their defaults.
    settings, previous_settings = _settings(config), {**_settings(LabConfig()), **previous.get("settings", {})}
    if previous_settings == settings:
        return previous.get("runs", [])
    differ = sorted(k for k in settings if previous_settings.get(k) != settings[k])
    if previous.get("runs") and not config.overwrite_output_dir:
        raise ValueError(
            f"{results_path} holds {len(previous['runs'])} runs with other settings ({', '.join(differ)}): pass "
            "--overwrite_output_dir true to replace them, or their settings to add runs to them"
        )
    return []


def run_lab(config: LabConfig, command: str = "trl-credit lab", log=None) -> dict:
    """Run every (task, method, seed), write `results.json` and `report.md` to `config.output_dir`; return the summary.

    Runs already in `results.json` (same task, method, seed and training settings) are not repeated.
    """
    log = log or functools.partial(print, flush=True)
    output_dir = Path(config.output_dir)
    records = previous_records(config)
    output_dir.mkdir(parents=True, exist_ok=True)
    results_path = output_dir / "results.json"
    settings = _settings(config)
    done = {(r["task"], r["method"], r["seed"]) for r in records}
    for task in config.tasks:
        for seed in config.seeds:
            for method in config.methods:
                if (task, method, seed) in done:
                    continue
                with tempfile.TemporaryDirectory() as work_dir:
                    record = run_one(task, method, seed, config, work_dir)
                records.append(record)
                results_path.write_text(json.dumps({"settings": settings, "runs": records}, indent=1) + "\n")
                m = record["metrics"]
                log(
                    f"lab: {task} {method} seed {seed}: reward {m['final_reward']:.3f}, solved at "
                    f"{m['steps_until_solved']}, precision+ {m['decisive_precision_pos']:.3f} "
                    f"(lift {m['decisive_lift_pos']:.2f}), {record['wall_seconds']:.0f} s"
                )
    wanted = [
        r for r in records if r["task"] in config.tasks and r["method"] in config.methods and r["seed"] in config.seeds
    ]
    summary = summarize(wanted, config)
    (output_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (output_dir / "report.md").write_text(render_report(summary, config, wanted, command) + "\n")
    return summary
