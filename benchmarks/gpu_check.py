"""GPU check in one call: the streamed kernels' CUDA branch against float64, and a few bf16 training steps of every
credit method in two regimes, with step times, peak memory and same-run ratios to GRPO.

    python3 benchmarks/gpu_check.py --wheels .whl --model .whl/smollm2 --output gpu_check.json   # on the GPU machine
    python benchmarks/gpu_check.py --device cpu --tiny --steps 2 --prompts 2 --max_completion_length 4   # smoke run

`--wheels DIR`: where trl, datasets or math-verify cannot be imported (the GPU image has torch, transformers,
accelerate, peft, pyarrow and pandas but none of those), install the wheels in DIR with
`python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site DIR/*.whl` and run again with
`PYTHONPATH=/tmp/site`. `--fetch-wheels DIR` (on a machine with the package index, in an environment where the check
runs) downloads those wheels: trl, datasets, math-verify and every dependency of theirs that the image's packages do
not bring, at the versions installed here, for `--python-version` (the image's 3.12); it prints their sizes and
refuses more than the GPU machine's 64 MiB carry limit (docs/benchmarks.md, "GPU check").

`--model DIR`: a local Hugging Face folder. One with a config and a tokenizer but no weights (the carry limit of the
GPU machine keeps SmolLM2-135M's 269 MB of bf16 weights off it) gets random weights of that architecture, saved to
a temporary folder first (TRL reloads the reference of `beta != 0` from the model's path); the step times and memory
stay those of the architecture, the rewards mean nothing. Default: `trl_credit.data.models.smollm2_135m_instruct_path()`.

What runs, in this order, each part printing as it ends:

1. kernels: `token_statistics` and `hellinger_and_entropy` (`trl_credit/trainer/lm_head_statistics.py`) on bf16 hidden states and
   LM heads of the model's sizes, whose CUDA branch multiplies in bf16 with float32 output
   (`torch.mm(..., out_dtype=torch.float32)`), against the same math in float64 on the same values, with the
   model's logit transform and a softcap; max abs errors and the time of each call.
2. regime `generate`: TRL's plain `generate` path, every method plus `grpo_beta` (`grpo` with `beta=0.04`) and a
   second `grpo` at the end (`grpo-again`: the drift of the run).
3. regime `vllm`: TRL's vLLM branch emulated as `benchmarks/step_overhead.py --regime vllm` does it (a `rollout_func`
   of completions sampled once, `use_vllm` switched on, so TRL runs its old-log-prob forward and its IS
   correction), gradient checkpointing on; `grpo`, `grpo_beta`, `taco`, `eapo`, `tide` and `grpo-again`
   (`--vllm-methods`).

Each method trains `--steps` optimizer steps in bf16; the first step (warm-up, kernel compilation) is left out of
the mean. Per method: mean step time, its ratio to `grpo`'s in the same regime, peak allocated and reserved CUDA
memory over its run, and the mean weight it logged. Runs are skipped, and said so, once `--budget-s` is spent.
Expected wall time on one H200: about 4-6 minutes with the defaults (not measured: no GPU was lent when this was
written). Nothing here but `--fetch-wheels` touches the network. The exit status is 1 when a kernel's error exceeds
1e-3 or any run failed, 0 otherwise.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

BENCHMARKS = Path(__file__).resolve().parent
REPO_ROOT = BENCHMARKS.parent
NEEDED = ("trl", "datasets", "math_verify")  # what the GPU image lacks (import names)
CARRIED = ("trl", "datasets", "math-verify")  # their distributions: what `--fetch-wheels` downloads, with their deps
# What the GPU image has (docs/benchmarks.md): the dependencies these bring are not carried.
IMAGE_HAS = ("torch", "transformers", "accelerate", "peft", "safetensors", "tokenizers", "pyarrow", "pandas")
CARRY_LIMIT_MIB = 64  # all files that reach the GPU machine
SITE = "/tmp/site"
INSTALLED_MARK = "GPU_CHECK_WHEELS_INSTALLED"  # set for the second run: the wheels are on its path
CONTROLS = ("grpo_beta", "grpo-again")
VLLM_METHODS = ("grpo", "grpo_beta", "taco", "eapo", "tide", "grpo-again")


def all_methods() -> list[str]:
    from trl_credit.methods import CREDIT_METHODS

    return ["grpo", *sorted(CREDIT_METHODS), *CONTROLS]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", help="local HF model folder (default: trl_credit.data.models.smollm2_135m_instruct_path())"
    )
    parser.add_argument("--tiny", action="store_true", help="use the test suite's tiny random model (smoke runs)")
    parser.add_argument("--wheels", help="folder of wheels to install into /tmp/site when trl & co. are missing")
    parser.add_argument(
        "--fetch-wheels", metavar="DIR", help="download the wheels --wheels installs into DIR, print their sizes, exit"
    )
    parser.add_argument("--python-version", default="3.12", help="the Python the fetched wheels are for (the image's)")
    parser.add_argument(
        "--methods", help="comma-separated methods of the generate regime (default: all, with controls)"
    )
    parser.add_argument("--vllm-methods", default=",".join(VLLM_METHODS), help="methods of the vllm regime")
    parser.add_argument("--regimes", default="generate,vllm", help="comma-separated subset of generate,vllm")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps per method (the first is warm-up)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--generations", type=int, default=4, help="completions per prompt")
    parser.add_argument("--max_completion_length", type=int, default=128)
    parser.add_argument("--kernel-tokens", type=int, default=4096, help="tokens of the kernel check")
    parser.add_argument("--budget-s", type=float, default=420.0, help="skip the runs that would start after this")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--output", help="also write the results as JSON to this file")
    return parser.parse_args(argv)


def check_device(device: str) -> None:
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit(
            "gpu_check: CUDA is not available (torch "
            f"{torch.__version__}, cuda build {torch.version.cuda}). Run it on a GPU machine, or pass "
            "`--device cpu --tiny --steps 2` for a smoke run of the script."
        )


def ensure_packages(wheels: str | None, argv: list[str]) -> None:
    """Install the carried wheels and run this script again with them on the path, where trl & co. are missing."""
    missing = [name for name in NEEDED if importlib.util.find_spec(name) is None]
    if not missing:
        return
    if os.environ.get(INSTALLED_MARK):
        sys.exit(f"gpu_check: {', '.join(missing)} still not importable after installing the wheels of --wheels")
    if wheels is None:
        sys.exit(f"gpu_check: {', '.join(missing)} not importable; pass --wheels DIR (see docs/benchmarks.md)")
    found = sorted(str(p) for p in Path(wheels).glob("*.whl"))
    if not found:
        sys.exit(f"gpu_check: no wheels in {wheels}")
    start = time.perf_counter()
    pip = (sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--upgrade", "--target", SITE)
    subprocess.run([*pip, *found], check=True)
    print(f"gpu_check: installed {len(found)} wheels into {SITE} in {time.perf_counter() - start:.0f} s", flush=True)
    path = os.pathsep.join([SITE, str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path, **{INSTALLED_MARK: "1"})
    sys.exit(subprocess.run([sys.executable, __file__, *argv], env=env).returncode)


def requirement_closure(roots) -> dict[str, str]:
    """`{distribution: version}` of the installed distributions `roots` need, transitively, with the extras they
    ask for (`fsspec[http]`) and the markers of this interpreter."""
    from importlib.metadata import PackageNotFoundError, distribution

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    found, seen, todo = {}, set(), [Requirement(root) for root in roots]
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        extras = frozenset(requirement.extras)
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            continue  # a requirement whose marker excludes it here is never installed
        found[name] = dist.version
        for line in dist.requires or []:
            nested = Requirement(line)
            if nested.marker is None or any(nested.marker.evaluate({"extra": e}) for e in ("", *extras)):
                todo.append(nested)
    return found


def carried_distributions() -> dict[str, str]:
    """What the GPU image lacks: trl, datasets, math-verify and their dependencies the image's packages do not bring."""
    image = requirement_closure(IMAGE_HAS)
    return {name: version for name, version in requirement_closure(CARRIED).items() if name not in image}


def fetch_wheels(folder: str, python_version: str) -> None:
    """Download the carried distributions' wheels (no sdists: nothing is built on the GPU machine) into `folder`."""
    carried = carried_distributions()
    missing = [name for name in CARRIED if name not in carried]
    if missing:
        sys.exit(f"gpu_check: --fetch-wheels needs {', '.join(missing)} installed here (their versions are carried)")
    pins = [f"{name}=={version}" for name, version in sorted(carried.items())]
    print(f"gpu_check: fetching wheels for Python {python_version}: {' '.join(pins)}", flush=True)
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"),
            *("--python-version", python_version, "--implementation", "cp", "-d", folder),
            *("--platform", "manylinux_2_28_x86_64", "--platform", "manylinux2014_x86_64"),
            *pins,
        ],
        check=True,
    )
    wheels = sorted(Path(folder).glob("*.whl"))
    total = sum(p.stat().st_size for p in wheels)
    for wheel in wheels:
        print(f"  {wheel.stat().st_size / 2**20:6.2f} MiB  {wheel.name}")
    print(f"gpu_check: {len(wheels)} wheels, {total / 2**20:.1f} MiB in {folder}", flush=True)
    if total > CARRY_LIMIT_MIB * 2**20:
        sys.exit(f"gpu_check: the wheels in {folder} exceed the GPU machine's {CARRY_LIMIT_MIB} MiB carry limit")


# --------------------------------------------------------------------------------------------------- kernels


def kernel_check(config, device: str, num_tokens: int) -> dict:
    """Streamed statistics on bf16 inputs of the model's sizes against float64 math on the same values."""
    from trl_credit.trainer.lm_head_statistics import LogitTransform, hellinger_and_entropy, token_statistics

    half = torch.bfloat16 if device == "cuda" else torch.float32  # the CUDA-only kernel takes bf16 operands
    hidden_size, vocab_size = config.hidden_size, config.vocab_size
    generator = torch.Generator(device="cpu").manual_seed(0)

    def draw(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=generator)).to(device=device, dtype=half)

    hidden, ref_hidden = draw(num_tokens, hidden_size), draw(num_tokens, hidden_size)
    weight = draw(vocab_size, hidden_size, scale=hidden_size**-0.5 * 3)  # logits of std ~3, peaked like a model's
    ref_weight = (weight.float() + 0.1 * draw(vocab_size, hidden_size, scale=hidden_size**-0.5).float()).to(half)
    ids = torch.randint(0, vocab_size, (num_tokens,), generator=generator).to(device)
    results = {"tokens": num_tokens, "vocab": vocab_size, "hidden": hidden_size, "dtype": str(half)}
    for name, transform in (("plain", LogitTransform()), ("softcap", LogitTransform(scale=0.5, softcap=5.0))):
        want_z = transform(hidden.double() @ weight.double().T, 0.7)
        want_logp = torch.log_softmax(want_z, dim=-1)
        want_logq = torch.log_softmax(transform(ref_hidden.double() @ ref_weight.double().T, 0.7), dim=-1)
        want_entropy = -(want_logp.exp() * want_logp).sum(-1)
        want_deviation = (1 - torch.exp(0.5 * (want_logp + want_logq)).sum(-1)).clamp(0, 1)
        want_logps = want_logp.gather(1, ids.unsqueeze(1)).squeeze(1)
        want_gap = want_z.gather(1, ids.unsqueeze(1)).squeeze(1) - want_z.amax(-1)
        del want_z, want_logp, want_logq
        timed = {}
        for label, call in (
            (
                "token_statistics",
                lambda: token_statistics(hidden, weight, ids, temperature=0.7, transform=transform),
            ),
            (
                "hellinger_and_entropy",
                lambda: hellinger_and_entropy(
                    hidden, ref_hidden, weight, ref_weight, temperature=0.7, transform=transform
                ),
            ),
        ):
            call()  # warm-up
            synchronize(device)
            start = time.perf_counter()
            out = call()
            synchronize(device)
            timed[label] = (time.perf_counter() - start, out)
        logps, entropy, logit_gap, _, _ = timed["token_statistics"][1]
        deviation, entropy2 = timed["hellinger_and_entropy"][1]
        errors = {
            "logps": (logps.double() - want_logps).abs().max().item(),
            "entropy": (entropy.double() - want_entropy).abs().max().item(),
            "logit_gap": (logit_gap.double() - want_gap).abs().max().item(),
            "deviation": (deviation.double() - want_deviation).abs().max().item(),
            "entropy_hellinger": (entropy2.double() - want_entropy).abs().max().item(),
        }
        results[name] = {"max_abs_error": errors, "seconds": {k: v[0] for k, v in timed.items()}}
        print(
            f"kernels [{name}] N={num_tokens} V={vocab_size} H={hidden_size} {half}: max abs error vs float64 "
            + ", ".join(f"{k} {v:.1e}" for k, v in errors.items())
            + "; "
            + ", ".join(f"{k} {v[0] * 1e3:.1f} ms" for k, v in timed.items()),
            flush=True,
        )
    results["ok"] = all(e < 1e-3 for part in ("plain", "softcap") for e in results[part]["max_abs_error"].values())
    return results


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


# -------------------------------------------------------------------------------------------------- training


def arithmetic_dataset(n: int, seed: int = 0):
    from datasets import Dataset

    rng = random.Random(seed)
    pairs = [(rng.randint(1, 9), rng.randint(1, 9)) for _ in range(n)]
    prompts = [[{"role": "user", "content": f"What is {a} + {b}? Answer with the number only."}] for a, b in pairs]
    return Dataset.from_dict({"prompt": prompts, "answer": [str(a + b) for a, b in pairs]})


def arithmetic_reward(completions, answer, **kwargs):
    """1 for the right last number, plus a tenth of the share of digits: it varies within a group even for a random
    model, so the advantages are not all zero."""
    import re

    rewards = []
    for completion, want in zip(completions, answer):
        text = completion[0]["content"]
        numbers = re.findall(r"-?\d+", text)
        digits = sum(ch.isdigit() for ch in text) / max(len(text), 1)
        rewards.append(float(bool(numbers) and numbers[-1] == want) + 0.1 * digits)
    return rewards


def materialise_model(args, folder: Path) -> tuple[str, bool]:
    """`(path, random_weights)`: a folder TRL can load (and reload as the reference) by path."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if args.tiny:  # the tests' tiny model: this script's own smoke test
        sys.path.insert(0, str(REPO_ROOT / "tests"))
        from conftest import make_tiny_model, make_tiny_tokenizer

        tokenizer = make_tiny_tokenizer()
        make_tiny_model(tokenizer, hidden_size=64).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        return str(folder), True
    source = Path(args.model) if args.model else None
    if source is None:
        from trl_credit.data import smollm2_135m_instruct_path

        source = Path(smollm2_135m_instruct_path())
    if any(source.glob("*.safetensors")) or any(source.glob("*.bin")):
        return str(source), False
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(source)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16 if args.device == "cuda" else torch.float32)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(source).save_pretrained(folder)
    return str(folder), True


def run_method(method: str, regime: str, args, model_path: str, output_dir: Path, pool) -> dict:
    from step_overhead import emulate_vllm, pool_rollout_func
    from transformers import AutoTokenizer, TrainerCallback

    from trl_credit import CreditGRPOConfig, CreditGRPOTrainer

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times, self._start = [], None

        def on_step_begin(self, *_, **__):
            synchronize(args.device)
            self._start = time.perf_counter()

        def on_step_end(self, *_, **__):
            synchronize(args.device)
            self.times.append(time.perf_counter() - self._start)

    cuda = args.device == "cuda"
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    batch = args.prompts * args.generations
    vllm = regime == "vllm"
    config = CreditGRPOConfig(
        output_dir=str(output_dir / f"{regime}-{method}"),
        credit_method="grpo" if method in CONTROLS else method,
        beta=0.04 if method == "grpo_beta" else 0.0,
        use_cpu=not cuda,
        bf16=cuda,
        activation_checkpointing=vllm,
        per_device_train_batch_size=batch,
        num_generations=args.generations,
        max_completion_length=args.max_completion_length,
        generation_kwargs={"min_new_tokens": args.max_completion_length},  # every method scores the same tokens
        max_steps=args.steps,
        learning_rate=1e-6,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=0,
        dataloader_num_workers=0,
        disable_tqdm=True,
        model_init_kwargs={"dtype": torch.bfloat16 if cuda else torch.float32},
    )
    timer = StepTimer()
    trainer = CreditGRPOTrainer(
        model=model_path,
        reward_funcs=arithmetic_reward,
        args=config,
        processing_class=tokenizer,
        train_dataset=arithmetic_dataset(args.prompts * args.steps),
        callbacks=[timer],
        rollout_func=pool_rollout_func(pool) if vllm else None,
    )
    if vllm:
        emulate_vllm(trainer)
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    logs = [e for e in trainer.state.log_history if "loss" in e]
    name = config.credit_method
    weights = [e[f"{name}/mean_weight"] for e in logs if e.get(f"{name}/mean_weight") is not None]
    timed = timer.times[1:] or timer.times
    result = {
        "regime": regime,
        "method": method,
        "steps": len(timer.times),
        "first_step_s": timer.times[0],
        "step_s": statistics.mean(timed),
        "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30 if cuda else None,
        "mean_weight": statistics.mean(weights) if weights else None,
        "reward": statistics.mean(e["reward"] for e in logs) if logs else None,
        "finite_loss": all(math.isfinite(e["loss"]) for e in logs),
    }
    del trainer
    if cuda:
        torch.cuda.empty_cache()
    return result


def vllm_pool(args, model_path: str) -> dict:
    """Completions sampled once from the initial model for the vllm regime's `rollout_func`."""
    from step_overhead import sample_rollouts
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(args.device).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    torch.manual_seed(0)
    prompts = arithmetic_dataset(args.prompts * args.steps)["prompt"]
    pool = sample_rollouts(model, tokenizer, prompts, args.generations, args.max_completion_length)
    del model
    return pool


def _fmt(value, spec):
    return "-" if value is None else format(value, spec)


def main(argv=None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.fetch_wheels:
        fetch_wheels(args.fetch_wheels, args.python_version)
        sys.exit(0)
    check_device(args.device)
    ensure_packages(args.wheels, argv)  # the second run finds them importable and goes on
    sys.path[:0] = [str(BENCHMARKS), str(REPO_ROOT)]
    import _common  # noqa: F401  (the offline environment)

    if args.device == "cpu":
        torch.set_num_threads(min(2, torch.get_num_threads()))
    start = time.perf_counter()
    regimes = args.regimes.split(",")
    methods = {
        "generate": args.methods.split(",") if args.methods else all_methods(),
        "vllm": args.vllm_methods.split(","),
    }
    unknown = {m for r in regimes for m in methods.get(r, [r])} - set(all_methods())
    if unknown or set(regimes) - set(methods):
        sys.exit(f"gpu_check: unknown methods or regimes {sorted(unknown | (set(regimes) - set(methods)))}")
    print(
        f"gpu_check: torch {torch.__version__}, device {args.device}"
        + (f" ({torch.cuda.get_device_name(0)})" if args.device == "cuda" else ""),
        flush=True,
    )
    report = {"runs": [], "skipped": []}
    with tempfile.TemporaryDirectory() as tmp:
        model_path, random_weights = materialise_model(args, Path(tmp) / "model")
        from transformers import AutoConfig

        print(f"gpu_check: model {model_path}" + (" (random weights)" if random_weights else ""), flush=True)
        report["model"], report["random_weights"] = model_path, random_weights
        # One call on a lent GPU: a failing part is reported and the others still run.
        try:
            report["kernels"] = kernel_check(AutoConfig.from_pretrained(model_path), args.device, args.kernel_tokens)
        except Exception as err:  # noqa: BLE001
            report["kernels"] = {"ok": False, "error": repr(err)}
            print(f"gpu_check: kernel check FAILED: {err!r}", flush=True)
        for regime in regimes:
            pool = vllm_pool(args, model_path) if regime == "vllm" else None
            for method in methods[regime]:
                if time.perf_counter() - start > args.budget_s:
                    report["skipped"].append(f"{regime}/{method}")
                    continue
                try:
                    r = run_method(method, regime, args, model_path, Path(tmp), pool)
                except Exception as err:  # noqa: BLE001
                    report["failed"] = [*report.get("failed", []), f"{regime}/{method}: {err!r}"]
                    print(f"[{regime}] {method}: FAILED {err!r}", flush=True)
                    continue
                report["runs"].append(r)
                base = next((x for x in report["runs"] if x["regime"] == regime and x["method"] == "grpo"), None)
                r["ratio_to_grpo"] = None if base is None else r["step_s"] / base["step_s"]
                print(
                    f"[{regime}] {method:13s} step {r['step_s']:.3f} s ({_fmt(r['ratio_to_grpo'], '.3f')}x grpo; first "
                    f"{r['first_step_s']:.2f} s)  peak alloc {_fmt(r['peak_allocated_gib'], '.2f')} GiB  reserved "
                    f"{_fmt(r['peak_reserved_gib'], '.2f')} GiB  mean weight {_fmt(r['mean_weight'], '.4f')}  "
                    f"reward {_fmt(r['reward'], '.3f')}  finite loss {r['finite_loss']}",
                    flush=True,
                )
    report["wall_s"] = time.perf_counter() - start
    if report["skipped"]:
        print(
            f"gpu_check: skipped (over --budget-s {args.budget_s:.0f} s): {', '.join(report['skipped'])}", flush=True
        )
    print(
        f"gpu_check: kernels {'ok' if report['kernels']['ok'] else 'FAILED or error above 1e-3'}; "
        f"{len(report.get('failed', []))} failed runs; total {report['wall_s']:.0f} s",
        flush=True,
    )
    if args.output:
        Path(args.output).write_text(json.dumps(report, indent=2))
    return report


def exit_status(report: dict) -> int:
    """1 when a kernel is off or any run failed: the one call on a lent GPU must not read as a pass."""
    return 0 if report["kernels"]["ok"] and not report.get("failed") else 1


if __name__ == "__main__":
    sys.exit(exit_status(main()))
