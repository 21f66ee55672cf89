"""Why the lab's oracle collapsed with several decisive forks: one lab run, traced step by step.

    python benchmarks/oracle_collapse.py --method oracle --seeds 4 --decisive 4 --horizon 32
    python benchmarks/oracle_collapse.py --method grpo --seeds 4 --decisive 4 --max_grad_norm 0

Trains one `mdp` run exactly as `trl-credit lab` does (`run_one`), with `LabTrainer` extended to record, per
optimizer step: the mean reward; the share of sampled completions with the right choice at each fork; each
response's advantage mass `sum_t |Â_t|` and its largest token advantage; the gradient norm before clipping (TRL's
`grad_norm`) and the norm of the parameter update the optimizer applied. `--max_grad_norm` and `--learning_rate`
vary the step size; `--oracle_floor` spreads some credit on the non-decisive tokens. Writes one JSON per run to
`--output_dir` and prints a table. The committed traces are the lines of `results/lab_oracle.jsonl` (results/README.md).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import shlex
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402, F401  (sets the offline environment and the repository import path)
import _results  # noqa: E402
import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

import trl_credit  # noqa: E402
import trl_credit.experiments.lab.lab_runs as lab_run  # noqa: E402
import trl_credit.experiments.lab.trainer as lab_trainer  # noqa: E402
from trl_credit.experiments.compare.compare_report import portable_command  # noqa: E402
from trl_credit.experiments.lab.tasks import FILLERS, ForkTask  # noqa: E402


def traced_trainer(trace: dict):
    """A `LabTrainer` that also records per-step advantage mass, fork choices and update norms into `trace`."""

    class TracedLabTrainer(lab_trainer.LabTrainer):
        def _record_micro_batch(self, model, inputs, loss):
            super()._record_micro_batch(model, inputs, loss)
            mask_BT = inputs["completion_mask"].bool()
            advantages = inputs["advantages"].detach().float()
            if advantages.dim() == 1:
                advantages = advantages.unsqueeze(1).expand(mask_BT.shape)
            mass_B = (advantages.abs() * mask_BT).sum(1)
            step = trace["steps"].setdefault(self.state.global_step, {"mass": [], "max": [], "right": [], "len": []})
            step["mass"] += mass_B.tolist()
            step["max"] += (advantages.abs() * mask_BT).amax(1).tolist()
            step["len"] += mask_BT.sum(1).tolist()
            task, tokens = self.lab_task, self.processing_class.convert_ids_to_tokens
            for row, completion_ids in enumerate(inputs["completion_ids"].tolist()):
                # A micro-batch is padded to its longest completion: positions past it hold no token.
                words = tokens(completion_ids) + ["<none>"] * (task.completion_length - len(completion_ids))
                right = [words[p] == task.right_choice([], j) for j, p in enumerate(task.fork_positions)]
                step["right"].append(right)
                step.setdefault("fork_tokens", []).append([words[p] for p in task.fork_positions])
                width = len(completion_ids)
                others = [p for p in range(width) if p not in task.fork_positions and mask_BT[row, p]]
                # Share of the other positions holding their template filler (FILLERS[p % 8], the prior's 0.9).
                template = [words[p] == FILLERS[p % len(FILLERS)] for p in others]
                step.setdefault("template", []).append(statistics.fmean(template) if template else math.nan)
                # Net credit on the tokens holding their template filler: GRPO's sums to about 0 over a group (its
                # advantages do), a reweighting that favours some tokens by their entropy need not.
                step.setdefault("template_credit", []).append(
                    sum(advantages[row, p].item() for p, is_template in zip(others, template) if is_template)
                )
                # Signed push toward fork j's right choice: credit on a right token, minus credit on a wrong one.
                credit = [
                    advantages[row, p].item() * mask_BT[row, p].item() if p < width else 0.0
                    for p in task.fork_positions
                ]
                step.setdefault("push", []).append([c if r else -c for c, r in zip(credit, right)])
                step.setdefault("token_credit", []).append(
                    {word: sum(c for c, p in zip(credit, task.fork_positions) if words[p] == word) for word in "LR"}
                )

    return TracedLabTrainer


class UpdateNorm(TrainerCallback):
    """The norm of each optimizer step's parameter change (what Adam and the clipping made of the gradient)."""

    def __init__(self, trace):
        self.trace, self.before = trace, None

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        self.before = [p.detach().clone() for p in model.parameters()]

    def on_step_end(self, args, state, control, model=None, **kwargs):
        change = sum(((p.detach() - b) ** 2).sum() for p, b in zip(model.parameters(), self.before))
        self.trace["update_norm"].append(float(change.sqrt()))

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "grad_norm" in logs:
            self.trace["grad_norm"].append(float(logs["grad_norm"]))
            self.trace["method_metrics"].append({k: v for k, v in logs.items() if "/" in k and "credit/" not in k})


def _every_fork(task, prompt, completion):
    return [position in task.fork_positions for position in range(len(completion))]


def _all_but_exonerated_forks(task, prompt, completion):
    """GRPO's broadcast credit, minus the blame on the right forks of a failure (they did not cause it)."""
    success = task.reward(prompt, completion) > 0
    right = {
        p
        for j, p in enumerate(task.fork_positions)
        if p < len(completion) and completion[p] == task.right_choice(prompt, j)
    }
    return [success or position not in right for position in range(len(completion))]


def _brief(metrics: dict) -> dict:
    """The method's logged quantiles and weights, rounded, for the step table."""
    return {k.split("/")[-1]: round(v, 3) for k, v in metrics.items() if k.endswith(("q_lo", "q_hi", "weight_mean"))}


LABELS = {"task": None, "all_forks": _every_fork, "exonerate": _all_but_exonerated_forks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--method", default="oracle")
    parser.add_argument("--seeds", type=int, nargs="+", default=[4])
    parser.add_argument("--horizon", type=int, default=32)
    parser.add_argument("--decisive", type=int, default=4)
    parser.add_argument("--max_steps", type=int, default=60)
    parser.add_argument("--learning_rate", type=float, default=2e-3)
    parser.add_argument("--max_grad_norm", type=float, default=1.0, help="TRL's default 1.0; 0 turns clipping off")
    parser.add_argument("--oracle_floor", type=float, default=0.0, help="0: the oracle as it was, no anchoring")
    parser.add_argument(
        "--credit_kwargs", type=json.loads, default=None, help="JSON hyperparameters of another method"
    )
    parser.add_argument(
        "--labels",
        choices=list(LABELS),
        default="task",
        help="which tokens the oracle credits: the task's decisive tokens, every fork of every response, or every "
        "token except a failure's right forks",
    )
    parser.add_argument("--output_dir", default="oracle_traces")
    parser.add_argument("--verbose", action="store_true", help="print every step")
    parser.add_argument(
        "--compare",
        nargs=2,
        metavar=("METHOD", "BASELINE"),
        help="only summarise the traces in --output_dir: METHOD against BASELINE on the same seeds (net credit on "
        "template tokens over the traced steps, template share at the last step), then exit",
    )
    args = parser.parse_args()
    if args.compare:
        compare_traces(Path(args.output_dir), *args.compare)
        return
    torch.set_num_threads(1)

    trace = {"steps": {}, "update_norm": [], "grad_norm": [], "method_metrics": []}
    lab_trainer.LabTrainer = traced_trainer(trace)  # run_one imports LabTrainer when it is called
    base_config = trl_credit.CreditGRPOConfig

    method_kwargs = (
        {"credit_kwargs": {"oracle_floor": args.oracle_floor}}
        if args.method == "oracle"
        else {"credit_kwargs": args.credit_kwargs}
        if args.credit_kwargs
        else {}
    )

    class TracedConfig(base_config):  # the run's step-size knobs, set where run_one builds its config
        def __init__(self, **kwargs):
            super().__init__(**kwargs, max_grad_norm=args.max_grad_norm, **method_kwargs)

    trl_credit.CreditGRPOConfig = TracedConfig
    if LABELS[args.labels] is not None:  # the oracle reads the labels the task's `decisive` gives LabTrainer
        ForkTask.decisive = LABELS[args.labels]
    original_trainer_init = lab_trainer.LabTrainer.__init__

    def with_update_norm(self, *a, callbacks=None, **kw):
        original_trainer_init(self, *a, callbacks=[*(callbacks or []), UpdateNorm(trace)], **kw)

    lab_trainer.LabTrainer.__init__ = with_update_norm

    for seed in args.seeds:
        for series in trace.values():
            series.clear()
        trace_one(args, seed, trace)


def trace_one(args, seed: int, trace: dict) -> None:
    config = lab_run.LabConfig(
        methods=[args.method],
        tasks=["mdp"],
        seeds=[seed],
        horizon=args.horizon,
        decisive=args.decisive,
        max_steps=args.max_steps,
        learning_rate=args.learning_rate,
        warm_up_steps=200,
        eval_samples=16,
        pass_k=[1, 4],
    )
    started = time.monotonic()
    record = lab_run.run_one("mdp", args.method, seed, config, "/tmp/oracle_collapse_work")
    steps = []
    for step, reward in enumerate(record["rewards"]):
        s = trace["steps"].get(step, {"mass": [0], "max": [0], "right": [[]]})
        steps.append(
            {
                "step": step + 1,
                "reward": reward,
                "right_per_fork": [round(statistics.fmean(fork), 3) for fork in zip(*s["right"]) if fork],
                "mass_mean": statistics.fmean(s["mass"]),
                "token_max": max(s["max"]),
                "template_share": round(statistics.fmean(s.get("template", [math.nan])), 3),
                "template_credit": round(sum(s.get("template_credit", [])), 3),
                "fork_tokens": [
                    dict(collections.Counter(fork).most_common(3)) for fork in zip(*s.get("fork_tokens", []))
                ],
                "push_toward_right": [round(sum(fork), 3) for fork in zip(*s.get("push", []))],
                "fork_credit_L": round(sum(c["L"] for c in s.get("token_credit", [])), 3),
                "fork_credit_R": round(sum(c["R"] for c in s.get("token_credit", [])), 3),
                "grad_norm": trace["grad_norm"][step] if step < len(trace["grad_norm"]) else None,
                "method_metrics": {  # the method's own logged statistics (e.g. EAPO's entropy quantiles)
                    k: v
                    for k, v in (trace["method_metrics"][step] if step < len(trace["method_metrics"]) else {}).items()
                    if k.startswith(f"{args.method}/")
                },
                "update_norm": trace["update_norm"][step] if step < len(trace["update_norm"]) else None,
            }
        )
    label = (
        f"{args.method}_k{args.decisive}_h{args.horizon}_s{seed}_lr{args.learning_rate:g}_clip{args.max_grad_norm:g}"
        + (f"_floor{args.oracle_floor:g}" if args.oracle_floor else "")
        + (f"_{args.labels}" if args.labels != "task" else "")
        + "".join(f"_{k}{v}" for k, v in (args.credit_kwargs or {}).items())
    )
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    result = {
        "command": portable_command("python benchmarks/oracle_collapse.py " + shlex.join(sys.argv[1:])),
        "seed": seed,
        "wall_seconds": round(time.monotonic() - started, 1),
        "final_reward": record["metrics"]["final_reward"],
        "mean_reward": record["metrics"]["mean_reward"],
        "avg@16": record["metrics"]["avg@16"],
        "steps": steps,
    }
    (out / f"{label}.json").write_text(json.dumps(result, separators=(",", ":")) + "\n")
    print(
        f"{label}: final reward {result['final_reward']:.3f}, mean reward {result['mean_reward']:.3f}, "
        f"avg@16 {result['avg@16']:.3f}, {result['wall_seconds']} s",
        flush=True,
    )
    if args.verbose:
        for s in steps:
            print(
                f"{s['step']:3d} r {s['reward']:.2f} right {s['right_per_fork']} mass {s['mass_mean']:.2f} "
                f"max {s['token_max']:.2f} template {s['template_share']} (credit {s['template_credit']}) forks {s['fork_tokens']} push {s['push_toward_right']} L {s['fork_credit_L']} "
                f"R {s['fork_credit_R']} {_brief(s['method_metrics'])} grad {s['grad_norm'] or 0:.3f} update {s['update_norm'] or 0:.4f}"
            )


def stored_traces(folder: Path, name: str) -> list[dict]:
    """The traces `NAME_*.json` in `folder`; where there is no such folder, those of the committed folder of that
    name (`eapo_template`, ...: the first part of a line's `file` in results/lab_oracle.jsonl)."""
    if folder.is_dir():
        return [json.loads(path.read_text()) for path in sorted(folder.glob(f"{name}_*.json"))]
    prefix = f"{folder.as_posix().rstrip('/')}/{name}_"
    rows = _results.read_lines("lab_oracle")
    return [row["json"] for row in rows if row["file"].startswith(prefix) and row["file"].endswith(".json")]


def compare_traces(folder: Path, method: str, baseline: str) -> None:
    """Paired per seed: the net credit on template tokens summed over the traced steps, and the template share at the
    last traced step, `method` − `baseline`, with 95 % t intervals."""
    from trl_credit.experiments.compare.stats import paired_difference

    def summaries(name: str) -> dict[int, tuple[float, float]]:
        traces = stored_traces(folder, name)
        return {
            t["seed"]: (sum(s["template_credit"] for s in t["steps"]), t["steps"][-1]["template_share"])
            for t in traces
        }

    ours, theirs = summaries(method), summaries(baseline)
    seeds = sorted(set(ours) & set(theirs))
    for seed in seeds:
        print(
            f"seed {seed}: template credit {ours[seed][0]:.1f} vs {theirs[seed][0]:.1f}, share {ours[seed][1]:.3f} vs {theirs[seed][1]:.3f}"
        )
    for index, label in (
        (0, "net credit on template tokens, summed over the traced steps"),
        (1, "template share at the last traced step"),
    ):
        method_values = {seed: ours[seed][index] for seed in seeds}
        baseline_values = {seed: theirs[seed][index] for seed in seeds}
        lower = sum(method_values[s] < baseline_values[s] for s in seeds)
        print(
            f"{label}: {method} − {baseline} {paired_difference(method_values, baseline_values).format()} "
            f"(95 % t, {len(seeds)} seeds; lower on {lower})"
        )


if __name__ == "__main__":
    main()
