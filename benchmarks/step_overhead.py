"""Training-step overhead of each credit method relative to plain GRPO, measured in one run.

    python benchmarks/step_overhead.py --model tiny              # default: every registered method (--methods: a subset)
    python benchmarks/step_overhead.py --model smollm2           # SmolLM2-135M-Instruct (or --model /path/to/hf/folder)
    python benchmarks/step_overhead.py --model smollm2 --device cuda
    python benchmarks/step_overhead.py --model smollm2 --regime vllm   # a GPU step's shape, on CPU (below)
    python benchmarks/step_overhead.py --model smollm2 --regime real-vllm  # real vLLM (colocate), in the vLLM env

Timing: one process builds a trainer per method (`grpo` and every registered method -- `taco`, `eapo`, `tide` and the
papers' baselines -- or those given with `--methods`, and for the tiny model a second `grpo`, the control) from the
same model, data and seed, and runs each `trainer.train()` in its own thread. A
callback pauses a trainer after each chunk of `--steps` optimizer steps; the main thread releases them one at a
time, round-robin, `--repeats` times, so the methods take turns on the same cores and never run concurrently, and
machine-wide slowdowns hit them alike. Completions are forced to the full `max_completion_length`
(`min_new_tokens`), so every method processes the same number of tokens whatever its policy samples.
Memory: each method then trains a few steps alone in its own process.

`--regime vllm` models the step a GPU runs with vLLM, where sampling is cheap and the trainer's forwards dominate:
generation goes through TRL's non-`generate` branch, a `rollout_func` that hands out completions sampled once before
the run (from the initial model, exactly `--completion-length` tokens, with their log-probs plus N(0, 0.01) noise, as
an inference engine's differ), so generating costs almost nothing; `use_vllm` is switched on after construction (as
`tests/test_engines.py` does, minus the engine), so TRL runs its old-log-prob forward and its importance-sampling
correction; gradient checkpointing is on. Two controls: `grpo-control` (a second `grpo`) and `grpo_beta` (`grpo` with
`beta=0.04`: TRL's reference forward, the floor for TIDE, which needs a reference forward too). The optimizer is
plain SGD in this regime: the update is the same for every method, and a stateless one keeps a dozen trainers of
the model in one process's memory. Memory is not measured (`--memory` to measure it).

`--regime real-vllm` runs real vLLM (`use_vllm=True, vllm_mode="colocate"`: TRL's own sampling and weight sync), in
the environment `.ci/vllm` builds (vLLM's CPU build there; on a GPU, any vLLM TRL supports), round-robin as above.
The trainers share one colocated engine (`share_one_engine`: each syncs its weights into it before generating); on
CPU the shims of `tests/real_vllm/cpu_shims.py` apply. Completions are exactly `--completion-length` tokens (vLLM's
`min_tokens`); TRL's importance-sampling correction is on (its default), so its old-log-prob forward runs; plain SGD
(as in `--regime vllm`), no gradient checkpointing. `grpo-control` is the noise floor. Memory only with `--memory`: each
method then trains alone in its own process with its own colocated engine (the peak resident set includes vLLM's).

Reported per method, as ratios to `grpo`:

* step time: the median wall time of an optimizer step (callback `on_step_begin` -> `on_step_end`: generation,
  rewards, the method's statistics, forward/backward, optimizer), after one warm-up step; TRL's own logged
  `step_time` (generation + forward/backward, without the optimizer step) is reported next to it;
* credit time: the median per-step time spent in the method's own parts of the trainer, as a fraction of grpo's
  step time: the generation-batch statistics (rollout forward, deviation pass), the no-grad forward of each
  micro-batch that methods dropping tokens from the loss need with a tool mask, the streamed logit gap, and the
  reshaping itself
  (`_credit_stage`: the methods' functions and their metrics);
* extra forwards: the forwards the method added per optimizer step, as the trainer logs them (`credit/extra_forwards`,
  counted where they run: 0 where TRL's forward or `generate` was reused), with the deviation reference's
  (`credit/extra_reference_forwards`) as "+ N ref";
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

from trl_credit.methods import CREDIT_METHODS  # noqa: E402

METHODS = ["grpo", *sorted(CREDIT_METHODS)]
CONTROL = "grpo-control"  # a second, identical grpo worker: its ratio to grpo is the run's noise floor
BETA_CONTROL = "grpo_beta"  # grpo with TRL's KL term (beta = 0.04): its reference forward is TIDE's floor
BETA = 0.04
REAL_VLLM_METHODS = ["grpo", "taco", "eapo", "tide", "stare", "otb", "gtpo", "hicra"]  # the real-vLLM regime's default


def resolve_model(name: str) -> str:
    if name in ("tiny", ""):
        return "tiny"
    if name == "smollm2":
        try:
            from trl_credit.data import smollm2_135m_instruct_path
        except ImportError as err:
            sys.exit(f"--model smollm2 needs trl_credit.data.models ({err}); pass --model /path/to/a/local/hf/folder")
        return str(smollm2_135m_instruct_path())
    if not Path(name).is_dir():
        sys.exit(f"--model {name!r}: not 'tiny', 'smollm2' or a local folder")
    return name


# ------------------------------------------------------------------------------------------------ workers


def setup_worker(args):
    import warnings

    import torch

    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    sys.path.insert(0, str(_common.REPO_ROOT / "tests"))


def build_trainer(args, method: str, total_steps: int, callback):
    """The same model, data, seed and config for every method; `callback` gets the per-step timings."""
    import torch
    from conftest import length_reward, make_tiny_model, make_tiny_tokenizer, tiny_prompt_dataset
    from transformers import AutoTokenizer

    from trl_credit import CreditGRPOConfig, CreditGRPOTrainer

    if args.model == "tiny":
        tokenizer = make_tiny_tokenizer()
        model = make_tiny_model(tokenizer, seed=0, hidden_size=args.tiny_hidden)
    else:
        tokenizer = AutoTokenizer.from_pretrained(args.model)
        model = args.model  # by path: TRL (and TIDE's reference) load it
    prompts = tiny_prompt_dataset(n_prompts=num_prompts(args, total_steps))
    vllm = args.regime == "vllm"
    regime = dict(activation_checkpointing=True, optim="sgd") if vllm else dict(activation_checkpointing=False)
    generation_kwargs = {"min_new_tokens": args.completion_length}
    if args.regime == "real-vllm":
        # TRL's colocate set-up exports RANK, LOCAL_RANK and WORLD_SIZE for vLLM; transformers' TrainingArguments would
        # read LOCAL_RANK and wrap every later trainer of this process in DDP. Each starts as a fresh process would.
        for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
            os.environ.pop(name, None)
        regime = dict(
            activation_checkpointing=False,
            optim="sgd",
            use_vllm=True,
            vllm_mode="colocate",
            vllm_gpu_memory_utilization=0.3,
        )
        generation_kwargs = {"min_tokens": args.completion_length}  # vLLM's name for it
    config = CreditGRPOConfig(
        output_dir=f"/tmp/trl-credit-bench-{method}-{os.getpid()}",
        credit_method="grpo" if method in (CONTROL, BETA_CONTROL) else method,
        beta=BETA if method == BETA_CONTROL else 0.0,
        use_cpu=args.device != "cuda",
        bf16=False,
        seed=0,
        learning_rate=1e-5,
        per_device_train_batch_size=args.batch,
        num_generations=args.generations,
        max_completion_length=args.completion_length,
        generation_kwargs=generation_kwargs,
        max_steps=total_steps,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        dataloader_num_workers=0,
        model_init_kwargs={"dtype": torch.float32},
        disable_tqdm=True,
        **regime,
    )
    rollout_func = pool_rollout_func(json.loads(Path(args.rollouts).read_text())) if vllm else None
    trainer = CreditGRPOTrainer(
        model,
        reward_funcs=length_reward,
        args=config,
        train_dataset=prompts,
        processing_class=tokenizer,
        rollout_func=rollout_func,
    )
    if vllm:
        emulate_vllm(trainer)
    trainer.add_callback(callback)
    return trainer


def num_prompts(args, total_steps: int) -> int:
    return max(8, total_steps * args.batch // args.generations)


def make_pacer(chunk: int, pause):
    """A callback recording step times (after one warm-up step) and calling `pause()` every `chunk` steps."""
    from transformers import TrainerCallback

    class Pacer(TrainerCallback):
        def __init__(self):
            self.steps, self.trl_step_times, self.credit = [], [], []
            self.extra_forwards, self.reference_forwards = [], []
            self.start = self.hook_time = self.hook_at_start = 0.0

        def on_step_begin(self, *_, **__):
            self.hook_at_start = self.hook_time
            self.start = time.perf_counter()

        def on_log(self, _args, state, control, logs=None, **kwargs):
            if logs and "step_time" in logs and state.global_step > 1:
                self.trl_step_times.append(logs["step_time"])
            if logs and "credit/extra_forwards" in logs:
                self.extra_forwards.append(logs["credit/extra_forwards"])
                self.reference_forwards.append(logs.get("credit/extra_reference_forwards", 0.0))

        def on_step_end(self, _args, state, control, **kwargs):
            if state.global_step > 1:  # step 1 is warm-up (lazy initialisation, first allocations)
                self.steps.append(time.perf_counter() - self.start)
                self.credit.append(self.hook_time - self.hook_at_start)
            if (state.global_step - 1) % chunk == 0:
                pause(state.global_step)

    return Pacer()


def timing_worker(args) -> dict:
    """All methods in this one process, one thread each, released one chunk at a time, round-robin.

    Sharing a process removes process-to-process differences (heap layout, cache placement) that otherwise bias
    the ratios by several percent; the threads never run concurrently.
    """
    import queue
    import threading

    setup_worker(args)
    if args.regime == "real-vllm":
        share_one_engine(args)
    pacers, threads = {}, {}
    parts = instrument_parts(pacers)
    total_steps = 1 + args.steps * args.repeats
    paused, go = queue.Queue(), {m: threading.Event() for m in args.methods}

    for method in args.methods:

        def pause(step, _method=method):
            paused.put(_method)
            go[_method].wait()
            go[_method].clear()

        pacers[method] = make_pacer(args.steps, pause)
        trainer = build_trainer(args, method, total_steps, pacers[method])
        threads[method] = threading.Thread(target=trainer.train, name=method, daemon=True)
        threads[method].start()
        assert paused.get() == method  # warm-up step done; it waits for its first turn
    for round_index in range(args.repeats):
        for method in args.methods:
            go[method].set()
            assert paused.get() == method
        print(f"round {round_index + 1}/{args.repeats} done", file=sys.stderr, flush=True)
    for method in args.methods:
        go[method].set()
        threads[method].join()
    return {
        m: {
            "steps": p.steps,
            "trl_step_times": p.trl_step_times,
            "credit": p.credit,
            "extra_forwards": p.extra_forwards,
            "reference_forwards": p.reference_forwards,
            "parts": {k: v / max(len(p.steps) + 1, 1) for k, v in parts.get(m, {}).items()},
        }
        for m, p in pacers.items()
    }


PARTS = {  # the trainer's calls that are a method's own cost (none of them nests another) -> label
    "_generation_batch_statistics": "generation-batch statistics",
    "policy_logps_and_entropy": "no-grad micro-batch forward",
    "_policy_logit_gap": "streamed logit gap",
    "_credit_stage": "reshaping",
}


def instrument_parts(pacers: dict) -> dict:
    """Time the method's own parts of the trainer, per thread (= method): into its pacer's `hook_time` (per step)
    and into per-part totals (the breakdown)."""
    import threading

    from trl_credit.trainer import credit_trainer

    totals: dict = {}

    def wrap(owner, name):
        original = getattr(owner, name)

        def timed(*a, **k):
            start = time.perf_counter()
            try:
                return original(*a, **k)
            finally:
                method, elapsed = threading.current_thread().name, time.perf_counter() - start
                if method in pacers:
                    pacers[method].hook_time += elapsed
                    totals.setdefault(method, {}).setdefault(PARTS[name], 0.0)
                    totals[method][PARTS[name]] += elapsed

        setattr(owner, name, timed)

    for name in PARTS:
        wrap(credit_trainer.CreditGRPOTrainer, name)  # methods, looked up on the trainer at call time
    return totals


def memory_worker(args) -> dict:
    """One method in its own process: peak memory of a short run (1 warm-up + `--steps` steps)."""
    import torch

    setup_worker(args)
    if args.regime == "real-vllm":
        share_one_engine(args)  # one trainer, one engine; on CPU the shims
    cuda = args.device == "cuda"

    def pause(step):
        if step == 1 and cuda:
            torch.cuda.reset_peak_memory_stats()

    rss_before = _common.current_rss_bytes()
    trainer = build_trainer(args, args.worker, 1 + args.steps, make_pacer(1, pause))
    rss_built = _common.current_rss_bytes()
    trainer.train()
    result = {"peak_rss": _common.peak_rss_bytes(), "rss_before": rss_before, "rss_built": rss_built}
    if cuda:
        result["cuda_peak"] = torch.cuda.max_memory_allocated()
    return result


# ------------------------------------------------------------------------------------- vLLM regimes


def share_one_engine(args) -> None:
    """Real vLLM: every trainer of this process generates with one colocated engine (a dozen engines of a real model
    do not fit in memory). Each trainer syncs its own weights into the engine before it generates (TRL syncs at every
    new step) and the trainers take turns, so each generates with its own weights. On CPU, the shims of
    `tests/real_vllm/cpu_shims.py` first (live-weight linear layers, float32, eager)."""
    import trl.generation.vllm_generation as trl_vllm

    if args.device == "cpu":
        from real_vllm.cpu_shims import apply_colocate_shims

        apply_colocate_shims()
    engine_class, engines = trl_vllm.LLM, {}

    def shared_engine(*engine_args, **engine_kwargs):
        model = engine_kwargs["model"]
        if model not in engines:
            engines[model] = engine_class(*engine_args, **engine_kwargs)
        return engines[model]

    trl_vllm.LLM = shared_engine


class _NoEngine:
    """Stands in for TRL's `VLLMGeneration`: with a `rollout_func` generating, only `sync_weights` is reached."""

    def sync_weights(self):
        pass


def emulate_vllm(trainer) -> None:
    """What `use_vllm=True` sets up, minus the engine (TRL's private attributes, as tests/test_engines.py sets them):
    TRL's generation-batch and loss code then take their vLLM branch, old-log-prob forward and IS correction included."""
    trainer.use_vllm, trainer._last_loaded_step, trainer.vllm_generation = True, -1, _NoEngine()


def save_tiny_model(args, folder: str) -> str:
    from conftest import make_tiny_model, make_tiny_tokenizer

    tokenizer = make_tiny_tokenizer()
    make_tiny_model(tokenizer, seed=0, hidden_size=args.tiny_hidden).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def sample_rollouts(model, tokenizer, prompts, generations: int, completion_length: int, noise: float = 0.01) -> dict:
    """`generations` completions of exactly `completion_length` tokens per conversational prompt, sampled from `model`
    at temperature 1, with their log-probs plus N(0, noise) (an inference engine's differ from the trainer's): a pool
    for `pool_rollout_func`, keyed by the prompt's JSON."""
    import torch

    device = next(model.parameters()).device
    pool = {}
    for prompt in prompts:
        ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False)
        input_ids = torch.tensor([ids] * generations, device=device)
        with torch.no_grad():
            out = model.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                do_sample=True,
                temperature=1.0,
                max_new_tokens=completion_length,
                min_new_tokens=completion_length,
                pad_token_id=tokenizer.pad_token_id,
            )
            logp = torch.log_softmax(model(input_ids=out).logits[:, len(ids) - 1 : -1].float(), dim=-1)
        completions = out[:, len(ids) :]
        logps = logp.gather(-1, completions.unsqueeze(-1)).squeeze(-1)
        logps = logps + noise * torch.randn(completions.shape, device=device)
        pool[json.dumps(prompt)] = {
            "prompt_ids": ids,
            "completion_ids": completions.tolist(),
            "logprobs": logps.tolist(),
        }
    return pool


def pool_rollout_func(pool: dict):
    """A `rollout_func` that hands out pre-sampled completions: the k-th request of a prompt in a batch gets its
    k-th completion."""

    def rollout(prompts, trainer):
        seen: dict[str, int] = {}
        out = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
        for prompt in prompts:
            key = json.dumps(prompt)
            k = seen[key] = seen.get(key, -1) + 1
            out["prompt_ids"].append(pool[key]["prompt_ids"])
            out["completion_ids"].append(pool[key]["completion_ids"][k])
            out["logprobs"].append(pool[key]["logprobs"][k])
        return out

    return rollout


def write_rollouts(args, path: str) -> None:
    """The pool of this benchmark's prompts, sampled once from the initial model, as JSON (every worker reads it)."""
    import torch
    from conftest import tiny_prompt_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    prompts = [
        row["prompt"] for row in tiny_prompt_dataset(n_prompts=num_prompts(args, 1 + args.steps * args.repeats))
    ]
    Path(path).write_text(
        json.dumps(sample_rollouts(model, tokenizer, prompts, args.generations, args.completion_length))
    )


# ------------------------------------------------------------------------------------------------ parent


def run_worker(args, role: str, parallel: list | None = None):
    cmd = [sys.executable, __file__, *sys.argv[1:], "--resolved-model", args.model, "--worker", role]
    env = dict(os.environ)
    if args.regime == "real-vllm":
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM's CPU build asks for most of the memory otherwise
    if role == "timing":
        # One thread per method: glibc gives each its own malloc arena, which keeps its peak of freed activations;
        # a dozen trainers of a real model then outgrow a shared machine's memory. Two arenas serve them all.
        env.setdefault("MALLOC_ARENA_MAX", "2")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    if parallel is not None:
        parallel.append(proc)
        return proc
    return collect(proc, role)


def collect(proc, role):
    out, _ = proc.communicate()
    if proc.returncode != 0:
        sys.exit(f"worker {role} failed with exit code {proc.returncode}")
    return json.loads(out.strip().splitlines()[-1])


def run(args) -> dict:
    results = {m: {} for m in args.methods}
    if args.memory:
        # Memory: one process per method, in parallel for the tiny model, one after the other otherwise.
        parallel = [] if args.model == "tiny" else None
        procs = {m: run_worker(args, m, parallel) for m in args.methods}
        for method, proc in procs.items():
            results[method].update(collect(proc, method) if parallel is not None else proc)
        # The timing process holds every method's trainer at once: refuse rather than risk the shared machine's memory.
        # With real vLLM each memory process had its own engine, which the timing process shares: not counted again.
        needed = sum(r["peak_rss"] - r["rss_before"] for r in results.values()) + max(
            r["rss_before"] for r in results.values()
        )
        if args.regime != "real-vllm" and needed > 0.7 * _common.available_memory_bytes():
            sys.exit(
                f"timing needs ~{needed / 2**30:.1f} GiB in one process, more than 70% of the available memory; "
                "pass fewer --methods"
            )
    timings = run_worker(args, "timing")
    for method in args.methods:
        results[method].update(timings[method])
    return results


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
        if not args.memory:
            mem = growth = "not measured"
        elif args.device == "cuda":
            mem = f"{r['cuda_peak'] / 2**20:.0f} MiB, {r['cuda_peak'] / base['cuda_peak']:.2f}x"
            growth = "n/a"
        else:
            mem = f"{r['peak_rss'] / 2**20:.0f} MiB, {r['peak_rss'] / base['peak_rss']:.3f}x"
            g, g0 = r["peak_rss"] - r["rss_built"], base["peak_rss"] - base["rss_built"]
            growth = f"{g / 2**20:.0f} MiB ({(g - g0) / 2**20:+.0f})"
        forwards = f"{statistics.mean(r['extra_forwards']):g}" if r["extra_forwards"] else "not logged"
        if any(r["reference_forwards"]):
            forwards += f" + {statistics.mean(r['reference_forwards']):g} ref"
        rows.append(
            [
                f"`{method}`",
                f"{step / base_step:.3f}x",
                f"{trl / base_trl:.3f}x",
                f"{credit:.1%}",
                forwards,
                mem,
                growth,
            ]
        )
    breakdown = []
    for method in args.methods:
        for label, seconds in sorted(results[method].get("parts", {}).items()):
            breakdown.append(f"{method}: {label} {seconds / base_step:.1%} of a grpo step")
    args.breakdown = "; ".join(breakdown)
    header = [
        "method",
        "step time / grpo",
        "TRL `step_time` / grpo",
        "own hooks / grpo step",
        "extra forwards / step",
        "peak memory (ratio to grpo)",
        "peak growth in training (vs grpo)",
    ]
    if args.device == "cuda":
        header[5] = "`max_memory_allocated` (ratio to grpo)"
    return _common.markdown_table(header, rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="'tiny', 'smollm2' or a local HF model folder")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument(
        "--regime",
        default="generate",
        choices=["generate", "vllm", "real-vllm"],
        help="generate: TRL's plain `generate` path; vllm: a GPU step's shape; real-vllm: colocated vLLM (docstring)",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        default=None,
        choices=[*METHODS, BETA_CONTROL],
        help=f"default: every method (and '{BETA_CONTROL}' in the vllm regime)",
    )
    parser.add_argument(
        "--memory",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="measure each method's peak memory in its own process (default: on, off for --regime vllm)",
    )
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per turn (default: tiny 4, else 2)")
    parser.add_argument("--repeats", type=int, default=None, help="round-robin rounds (default: tiny 5, else 3)")
    parser.add_argument("--batch", type=int, default=8, help="per-device train batch (completions per step)")
    parser.add_argument("--generations", type=int, default=4, help="group size G")
    parser.add_argument("--completion-length", type=int, default=None, help="tokens (default: tiny 64, else 32)")
    parser.add_argument("--tiny-hidden", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument(
        "--control",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"also run '{CONTROL}', a second grpo worker (default: on for tiny)",
    )
    parser.add_argument("--worker", choices=[*METHODS, BETA_CONTROL, CONTROL, "timing"], help=argparse.SUPPRESS)
    parser.add_argument("--resolved-model", help=argparse.SUPPRESS)
    parser.add_argument("--rollouts", help=argparse.SUPPRESS)
    args = parser.parse_args()
    tiny = args.model == "tiny"
    vllm = args.regime == "vllm"
    real_vllm = args.regime == "real-vllm"
    if real_vllm and tiny:
        sys.exit("--regime real-vllm: pass --model smollm2 or a model folder (vLLM loads the model from disk)")
    args.steps = args.steps or (5 if tiny else 2)
    args.repeats = args.repeats or (10 if tiny else 3)
    args.completion_length = args.completion_length or (64 if tiny else 32)
    args.memory = not (vllm or real_vllm) if args.memory is None else args.memory
    default_methods = REAL_VLLM_METHODS if real_vllm else [*METHODS, *([BETA_CONTROL] if vllm else [])]
    args.methods = args.methods or default_methods
    control = args.control if args.control is not None else (tiny or vllm or real_vllm)
    if args.worker:
        args.model = args.resolved_model
        args.methods = [*args.methods, *([CONTROL] if control else [])]
        if "grpo" not in args.methods:
            args.methods.insert(0, "grpo")
        result = timing_worker(args) if args.worker == "timing" else memory_worker(args)
        print(json.dumps(result), flush=True)
        return
    if "grpo" not in args.methods:
        args.methods = ["grpo", *args.methods]
    if control:
        args.methods.append(CONTROL)
    label = args.model
    args.model = resolve_model(args.model)

    start = time.perf_counter()
    if vllm:
        setup_worker(args)
        if tiny:  # `beta != 0` makes TRL reload the reference from the model's path
            args.model = save_tiny_model(args, f"/tmp/trl-credit-bench-tiny-{os.getpid()}")
        args.rollouts = f"/tmp/trl-credit-bench-rollouts-{os.getpid()}.json"
        write_rollouts(args, args.rollouts)
        sys.argv += ["--rollouts", args.rollouts]
        print(f"rollouts sampled in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    results = run(args)
    elapsed = time.perf_counter() - start
    table = summarise(args, results)
    print(table)
    if args.no_write:
        return
    model_desc = (
        f"tiny random Qwen2 (tests/conftest.py, hidden {args.tiny_hidden}, 2 layers, vocab ~150)"
        if tiny
        else f"`{label}` ({Path(args.model).name})"  # the model's name, not where it sits on this machine
    )
    if vllm:
        command = " ".join(["python benchmarks/step_overhead.py", *sys.argv[1 : sys.argv.index("--rollouts")]])
    elif real_vllm:
        command = " ".join(["python benchmarks/step_overhead.py", *sys.argv[1:]])
    else:
        command = f"python benchmarks/step_overhead.py --model {label} --device {args.device}"
    schedule = (
        f"{args.repeats} round-robin rounds of {args.steps} optimizer steps per method (after 1 warm-up step), "
        f"median over the {args.repeats * args.steps} timed steps of each"
    )
    body = f"""`{command}`: {model_desc}; {args.batch} completions per
step (G = {args.generations}), exactly {args.completion_length} completion tokens each, {args.device.upper()}, {_common.machine_note(args.threads)}.
{schedule}; whole run {elapsed / 60:.1f} min. What each column measures: see the docstring
of `benchmarks/step_overhead.py` (peak memory on CPU = peak resident set of a process that trains only that method).

{table}
"""
    if args.breakdown:
        body += f"""
Inside the hooks (per step, includes the warm-up step's share): {args.breakdown}.
"""
    if CONTROL in args.methods:
        body += f"""
`{CONTROL}` is a second, identical `grpo` worker: its distance from 1.000x is this run's noise floor for the
step-time ratios. The "own hooks" column is timed inside each step: the method's cost without that noise."""
    if vllm:
        body += """

Regime: TRL's vLLM branch with a `rollout_func` of pre-sampled completions (generation costs almost nothing), TRL's
old-log-prob forward and importance-sampling correction, gradient checkpointing on, SGD (see the docstring)."""
    if real_vllm:
        import trl
        import vllm as vllm_module

        body += f"""

Regime: real vLLM {vllm_module.__version__} in colocate mode (TRL {trl.__version__}'s engine, sampling and weight
sync at every step, one engine shared by the trainers), TRL's importance-sampling correction on (its old-log-prob
forward runs), SGD, no gradient checkpointing; on CPU with the shims of `tests/real_vllm/cpu_shims.py` (live-weight
linear layers, float32, eager)."""
    if BETA_CONTROL in args.methods and "tide" in args.methods:
        tide_step = statistics.median(results["tide"]["steps"])
        body += f"""
`tide` / `{BETA_CONTROL}` step time: {tide_step / statistics.median(results[BETA_CONTROL]["steps"]):.3f}x (`{BETA_CONTROL}`
is `grpo` with `beta={BETA}`: TRL's reference forward)."""
    regime = "real_vllm" if real_vllm else "vllm" if vllm else ("tiny" if tiny else "model")
    section = (
        "step_overhead_" + regime + ("_tiny" if vllm and tiny else "") + ("_cuda" if args.device == "cuda" else "")
    )
    title = f"Step overhead vs GRPO: {'tiny model' if tiny else label}, {args.device.upper()}"
    if vllm:
        title += ", vLLM-shaped step (rollout_func, TRL's scoring forward, gradient checkpointing)"
    if real_vllm:
        title += ", real vLLM (colocate)"
    _common.write_section(section, title, body)


if __name__ == "__main__":
    main()
