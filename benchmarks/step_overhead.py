"""Training-step overhead of each credit method relative to plain GRPO, measured in one run.

    python benchmarks/step_overhead.py --model tiny              # default, ~3-4 min on 2 shared CPU cores
    python benchmarks/step_overhead.py --model smollm2           # SmolLM2-135M-Instruct (or --model /path/to/hf/folder)
    python benchmarks/step_overhead.py --model smollm2 --device cuda

One persistent worker process per method (`grpo`, `taco`, `eapo`, `tide`) builds the same model, data and seed
and starts `trainer.train()`. A callback pauses every worker after each chunk of `--steps` optimizer steps, and the
parent releases them one at a time, round-robin, `--repeats` times: the methods take turns on the same cores, so
machine-wide slowdowns hit them alike. Completions are forced to the full `max_completion_length`
(`min_new_tokens`), so every method processes the same number of tokens whatever its policy samples.

Reported per method, as ratios to `grpo`:

* step time: the median wall time of an optimizer step (callback `on_step_begin` -> `on_step_end`: generation,
  rewards, the method's statistics, forward/backward, optimizer), after one warm-up step; TRL's own logged
  `step_time` (generation + forward/backward, without the optimizer step) is reported next to it;
* credit time: the median per-step time spent in the method's own trainer hooks (EAPO: rollout-entropy forward +
  quantiles + reshaping; TIDE: policy and reference hidden-state forwards + streamed statistics + reshaping;
  TACO: reshaping inside the training forward), as a fraction of grpo's step time;
* peak memory. CPU: the worker's resident-set high-water mark (`VmHWM` of /proc/self/status) -- the whole process
  (Python, torch, TRL, model, optimizer state, activations, TIDE's reference copy), one process per method so
  nothing is shared; also the growth of that peak during training over the RSS after the trainer was built.
  CUDA: `torch.cuda.max_memory_allocated()` over the timed steps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402  (sets sys.path and offline environment)

METHODS = ["grpo", "taco", "eapo", "tide"]
HOOKS = {  # the trainer methods whose time is the method's own cost
    "taco": ["_taco_advantages"],
    "eapo": ["_eapo_advantages"],
    "tide": ["_tide_advantages"],
    "grpo": [],
}


def resolve_model(name: str) -> str:
    if name in ("tiny", ""):
        return "tiny"
    if name == "smollm2":
        try:
            from trl_credit.models import smollm2_135m_instruct_path
        except ImportError as err:
            sys.exit(f"--model smollm2 needs trl_credit.models ({err}); pass --model /path/to/a/local/hf/folder")
        return str(smollm2_135m_instruct_path())
    if not Path(name).is_dir():
        sys.exit(f"--model {name!r}: not 'tiny', 'smollm2' or a local folder")
    return name


# ------------------------------------------------------------------------------------------------ worker


def worker(args) -> None:
    """Train one method; after every chunk of steps report on stdout and wait for a line on stdin."""
    import warnings

    import torch

    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer, TrainerCallback
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()

    from trl_credit import CreditGRPOConfig, CreditGRPOTrainer

    sys.path.insert(0, str(_common.REPO_ROOT / "tests"))
    from conftest import length_reward, make_tiny_model, make_tiny_tokenizer, tiny_prompt_dataset

    method, cuda = args.worker, args.device == "cuda"
    total_steps = 1 + args.steps * args.repeats
    if args.model == "tiny":
        tokenizer = make_tiny_tokenizer()
        model = make_tiny_model(tokenizer, seed=0, hidden_size=args.tiny_hidden)
    else:
        tokenizer = AutoTokenizer.from_pretrained(args.model)
        model = args.model  # by path: TRL (and TIDE's reference) load it
    prompts = tiny_prompt_dataset(n_prompts=max(8, total_steps * args.batch // args.generations))
    config = CreditGRPOConfig(
        output_dir=f"/tmp/trl-credit-bench-{method}-{os.getpid()}", credit_method=method,
        use_cpu=not cuda, bf16=False, gradient_checkpointing=False, seed=0, learning_rate=1e-5,
        per_device_train_batch_size=args.batch, num_generations=args.generations,
        max_completion_length=args.completion_length, generation_kwargs={"min_new_tokens": args.completion_length},
        max_steps=total_steps, logging_steps=1, report_to="none", save_strategy="no", dataloader_num_workers=0,
        model_init_kwargs={"dtype": torch.float32}, disable_tqdm=True,
    )
    rss_before = _common.current_rss_bytes()
    trainer = CreditGRPOTrainer(model, reward_funcs=length_reward, args=config, train_dataset=prompts,
                                processing_class=tokenizer)
    rss_built = _common.current_rss_bytes()

    hook_time = [0.0]
    for name in HOOKS[method]:
        original = getattr(trainer, name)

        def timed(*a, _original=original, **k):
            start = time.perf_counter()
            try:
                return _original(*a, **k)
            finally:
                hook_time[0] += time.perf_counter() - start

        setattr(trainer, name, timed)

    class Pacer(TrainerCallback):
        def __init__(self):
            self.steps, self.trl_step_times, self.credit = [], [], []
            self.start = self.credit_at_start = 0.0

        def on_step_begin(self, *_, **__):
            self.credit_at_start = hook_time[0]
            self.start = time.perf_counter()

        def on_log(self, _args, state, control, logs=None, **kwargs):
            if logs and "step_time" in logs and state.global_step > 1:
                self.trl_step_times.append(logs["step_time"])

        def on_step_end(self, _args, state, control, **kwargs):
            if state.global_step > 1:  # step 1 is warm-up (lazy initialisation, first allocations)
                self.steps.append(time.perf_counter() - self.start)
                self.credit.append(hook_time[0] - self.credit_at_start)
            elif cuda:
                torch.cuda.reset_peak_memory_stats()
            if (state.global_step - 1) % args.steps == 0:
                report(final=False)
                sys.stdin.readline()  # wait for our turn

    pacer = Pacer()

    def report(final: bool):
        result = {"method": method, "final": final, "steps": pacer.steps, "trl_step_times": pacer.trl_step_times,
                  "credit": pacer.credit, "peak_rss": _common.peak_rss_bytes(), "rss_before": rss_before,
                  "rss_built": rss_built}
        if cuda:
            result["cuda_peak"] = torch.cuda.max_memory_allocated()
        print("RESULT " + json.dumps(result), flush=True)

    trainer.add_callback(pacer)
    trainer.train()
    report(final=True)


# ------------------------------------------------------------------------------------------------ parent


def run(args) -> dict:
    base_cmd = [sys.executable, __file__, *sys.argv[1:], "--resolved-model", args.model]
    workers = {}
    for method in args.methods:
        workers[method] = subprocess.Popen(
            [*base_cmd, "--worker", method], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
        )

    def wait_result(method):
        proc = workers[method]
        for line in proc.stdout:
            if line.startswith("RESULT "):
                return json.loads(line[len("RESULT "):])
        raise RuntimeError(f"worker {method} exited with {proc.wait()} before reporting")

    latest = {}
    # Start-up (imports, model build, warm-up step) happens in parallel; each worker then waits at its first pause.
    for method in args.methods:
        latest[method] = wait_result(method)
    for round_index in range(args.repeats):
        for method in args.methods:  # one method at a time: the others are blocked on stdin
            workers[method].stdin.write("go\n")
            workers[method].stdin.flush()
            latest[method] = wait_result(method)
        print(f"round {round_index + 1}/{args.repeats} done", file=sys.stderr, flush=True)
    for method in args.methods:
        workers[method].stdin.close()
        latest[method] = wait_result(method)  # the final report after train() returns
        workers[method].wait()
    return latest


def summarise(args, results) -> str:
    base = results["grpo"]
    base_step = statistics.median(base["steps"])
    base_trl = statistics.median(base["trl_step_times"]) if base["trl_step_times"] else float("nan")
    rows = []
    for method in args.methods:
        r = results[method]
        step = statistics.median(r["steps"])
        trl = statistics.median(r["trl_step_times"]) if r["trl_step_times"] else float("nan")
        credit = statistics.median(r["credit"]) / base_step
        if args.device == "cuda":
            mem = f"{r['cuda_peak'] / 2**20:.0f} MiB, {r['cuda_peak'] / base['cuda_peak']:.2f}x"
            growth = "n/a"
        else:
            mem = f"{r['peak_rss'] / 2**20:.0f} MiB, {r['peak_rss'] / base['peak_rss']:.3f}x"
            g, g0 = r["peak_rss"] - r["rss_built"], base["peak_rss"] - base["rss_built"]
            growth = f"{g / 2**20:.0f} MiB ({(g - g0) / 2**20:+.0f})"
        rows.append([f"`{method}`", f"{step / base_step:.3f}x", f"{trl / base_trl:.3f}x", f"{credit:.1%}", mem, growth])
    header = ["method", "step time / grpo", "TRL `step_time` / grpo", "own hooks / grpo step",
              "peak memory (ratio to grpo)", "peak growth in training (vs grpo)"]
    if args.device == "cuda":
        header[4] = "`max_memory_allocated` (ratio to grpo)"
    return _common.markdown_table(header, rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="'tiny', 'smollm2' or a local HF model folder")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per turn (default: tiny 4, else 2)")
    parser.add_argument("--repeats", type=int, default=None, help="round-robin rounds (default: tiny 5, else 3)")
    parser.add_argument("--batch", type=int, default=8, help="per-device train batch (completions per step)")
    parser.add_argument("--generations", type=int, default=4, help="group size G")
    parser.add_argument("--completion-length", type=int, default=None, help="tokens (default: tiny 64, else 32)")
    parser.add_argument("--tiny-hidden", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--worker", choices=METHODS, help=argparse.SUPPRESS)
    parser.add_argument("--resolved-model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    tiny = args.model == "tiny"
    args.steps = args.steps or (4 if tiny else 2)
    args.repeats = args.repeats or (5 if tiny else 3)
    args.completion_length = args.completion_length or (64 if tiny else 32)
    if args.worker:
        args.model = args.resolved_model
        return worker(args)
    if "grpo" not in args.methods:
        args.methods = ["grpo", *args.methods]
    label = args.model
    args.model = resolve_model(args.model)

    start = time.perf_counter()
    results = run(args)
    elapsed = time.perf_counter() - start
    table = summarise(args, results)
    print(table)
    if args.no_write:
        return
    model_desc = (f"tiny random Qwen2 (tests/conftest.py, hidden {args.tiny_hidden}, 2 layers, vocab ~150)" if tiny
                  else f"`{label}` ({args.model})")
    body = f"""`python benchmarks/step_overhead.py --model {label} --device {args.device}`: {model_desc}; {args.batch} completions per
step (G = {args.generations}), exactly {args.completion_length} completion tokens each, {args.device.upper()}, {_common.machine_note()}.
{args.repeats} round-robin rounds of {args.steps} optimizer steps per method (after 1 warm-up step), median over the
{args.repeats * args.steps} timed steps of each; whole run {elapsed / 60:.1f} min. What each column measures: see the docstring
of `benchmarks/step_overhead.py` (peak memory on CPU = the worker process's peak resident set, one process per method).

{table}"""
    section = "step_overhead_" + ("tiny" if tiny else "model") + ("_cuda" if args.device == "cuda" else "")
    title = f"Step overhead vs GRPO: {'tiny model' if tiny else label}, {args.device.upper()}"
    _common.write_section(section, title, body)


if __name__ == "__main__":
    main()
