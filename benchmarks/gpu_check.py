"""GPU check: a few bf16 training steps of every credit method on SmolLM2-135M-Instruct; step time and peak memory.

    python benchmarks/gpu_check.py                       # SmolLM2-135M from trl_credit.models, on CUDA, bf16
    python benchmarks/gpu_check.py --model /path/to/hf-model --steps 4 --output gpu_check.json
    python benchmarks/gpu_check.py --device cpu --tiny --steps 1     # smoke run of this script without a GPU

One GPU, one process. Each method trains `--steps` optimizer steps (8 prompts x 4 completions x 64 tokens by default)
with plain Transformers generation; the first step (warm-up, kernel compilation) is reported separately. It prints one
line per method: mean step time after the first, first step time, peak allocated and reserved CUDA memory, and the
method's mean weight; `--output` also writes them as JSON. Expected wall time on one H100/H200: about 1-2 minutes.

Needs trl 1.16, transformers >= 5.17, accelerate, datasets and this package importable; no network (the model is a
local folder). Nothing here touches the Hugging Face Hub.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

METHODS = ("grpo", "taco", "eapo", "tide")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="local HF model folder (default: trl_credit.models.smollm2_135m_instruct_path())")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of grpo,taco,eapo,tide")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps per method (the first is warm-up)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--generations", type=int, default=4, help="completions per prompt")
    parser.add_argument("--max_completion_length", type=int, default=64)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="use the test suite's tiny random model (smoke runs)")
    parser.add_argument("--output", help="also write the results as JSON to this file")
    args = parser.parse_args(argv)
    unknown = set(args.methods.split(",")) - set(METHODS)
    if unknown:
        parser.error(f"unknown methods {sorted(unknown)}; choose from {METHODS}")
    return args


def resolve_model(args) -> str | None:
    """The model folder, or None for `--tiny`; exits with a clear message when there is none."""
    if args.tiny:
        return None
    if args.model:
        return args.model
    try:
        from trl_credit.models import smollm2_135m_instruct_path
    except ImportError:
        sys.exit("gpu_check: trl_credit.models.smollm2_135m_instruct_path is not available; pass --model PATH")
    return str(smollm2_135m_instruct_path())


def check_device(device: str) -> None:
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit(
            "gpu_check: CUDA is not available (torch "
            f"{torch.__version__}, cuda build {torch.version.cuda}). Run it on a GPU machine, or pass "
            "`--device cpu --tiny --steps 1` for a smoke run of the script."
        )


def arithmetic_dataset(n: int, seed: int = 0):
    from datasets import Dataset

    rng = random.Random(seed)
    pairs = [(rng.randint(1, 9), rng.randint(1, 9)) for _ in range(n)]
    prompts = [[{"role": "user", "content": f"What is {a} + {b}? Answer with the number only."}] for a, b in pairs]
    return Dataset.from_dict({"prompt": prompts, "answer": [str(a + b) for a, b in pairs]})


def last_number_reward(completions, answer, **kwargs):
    import re

    rewards = []
    for completion, want in zip(completions, answer):
        numbers = re.findall(r"-?\d+", completion[0]["content"])
        rewards.append(1.0 if numbers and numbers[-1] == want else 0.0)
    return rewards


def load_model_and_tokenizer(model_path, device):
    if model_path is None:  # the tests' tiny model: this script's own smoke test
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from conftest import make_tiny_model, make_tiny_tokenizer

        tokenizer = make_tiny_tokenizer()
        return make_tiny_model(tokenizer), tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def run_method(method, args, model_path, output_dir):
    from transformers import TrainerCallback

    from trl_credit import CreditGRPOConfig, CreditGRPOTrainer

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times, self._start = [], None

        def on_step_begin(self, *_, **__):
            if args.device == "cuda":
                torch.cuda.synchronize()
            self._start = time.perf_counter()

        def on_step_end(self, *_, **__):
            if args.device == "cuda":
                torch.cuda.synchronize()
            self.times.append(time.perf_counter() - self._start)

    model, tokenizer = load_model_and_tokenizer(model_path, args.device)
    batch = args.prompts * args.generations
    config = CreditGRPOConfig(
        output_dir=str(output_dir / method), credit_method=method, use_cpu=args.device == "cpu",
        bf16=args.device == "cuda", gradient_checkpointing=False, per_device_train_batch_size=batch,
        num_generations=args.generations, max_completion_length=args.max_completion_length, max_steps=args.steps,
        learning_rate=1e-6, logging_steps=1, report_to="none", save_strategy="no", seed=0, dataloader_num_workers=0,
    )
    timer = StepTimer()
    trainer = CreditGRPOTrainer(
        model=model, reward_funcs=last_number_reward, args=config, processing_class=tokenizer,
        train_dataset=arithmetic_dataset(max(64, args.prompts * args.steps)), callbacks=[timer],
    )
    if args.device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    logs = [e for e in trainer.state.log_history if "loss" in e]
    weights = [e.get(f"{method}/mean_weight") for e in logs if e.get(f"{method}/mean_weight") is not None]
    result = {
        "method": method,
        "steps": len(timer.times),
        "first_step_s": timer.times[0],
        "step_s": statistics.mean(timer.times[1:]) if len(timer.times) > 1 else timer.times[0],
        "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30 if args.device == "cuda" else None,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30 if args.device == "cuda" else None,
        "mean_weight": statistics.mean(weights) if weights else None,
        "reward": statistics.mean(e["reward"] for e in logs) if logs else None,
    }
    del trainer, model
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return result


def _fmt(value, spec):
    return "-" if value is None else format(value, spec)


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    check_device(args.device)
    model_path = resolve_model(args)
    if args.device == "cpu":
        torch.set_num_threads(min(2, torch.get_num_threads()))
    print(f"gpu_check: model={model_path or 'tiny'} device={args.device} torch={torch.__version__}", flush=True)
    if args.device == "cuda":
        print(f"gpu_check: {torch.cuda.get_device_name(0)}", flush=True)
    results = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for method in args.methods.split(","):
            results.append(run_method(method, args, model_path, Path(tmp)))
            r = results[-1]
            print(
                f"{method:5s} step {r['step_s']:.3f} s (first {r['first_step_s']:.2f} s)  "
                f"peak alloc {_fmt(r['peak_allocated_gib'], '.2f')} GiB  reserved {_fmt(r['peak_reserved_gib'], '.2f')} GiB  "
                f"mean weight {_fmt(r['mean_weight'], '.4f')}  reward {_fmt(r['reward'], '.3f')}",
                flush=True,
            )
    print(f"gpu_check: total {time.perf_counter() - start:.1f} s", flush=True)
    if args.output:
        Path(args.output).write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
