"""What each registered method's credit path adds per GPU at the scale the papers train, measured by running the
package's code on torch's fake tensors (no weights, no GPU): Qwen2.5-32B and Qwen3-8B, completions of 16,384 tokens,
the shipped recipes' batch shapes, ZeRO-3 over 8 and 32 GPUs.

    python benchmarks/paper_scale.py              # the section "paper_scale" and docs/images/paper_scale.png
    python benchmarks/paper_scale.py --shapes all # every shipped recipe's batch shape, not only the 32B recipe's
    python benchmarks/paper_scale.py --tiny       # seconds: a tiny model, nothing written (tests/test_benchmarks.py)
    python benchmarks/paper_scale.py --validate   # the fake estimate against the same code on real tensors

What runs, per model and recipe shape (`_fake_scale.PaperScaleMode` counts every allocation, torch's
`FlopCounterMode` the matrix products and attention):

1. TRL's own old-log-prob forward (`GRPOTrainer._get_per_token_logps_and_entropies`, TRL's fused LM head) over the
   generation batch of one GPU (`per_device_train_batch_size x gradient_accumulation_steps` rows, in chunks of
   `per_device_train_batch_size`): once as GRPO runs it, and once inside the package's `recorded_rollout` for each
   way a stack records it (entropies; entropies and hidden states). What the records add is the difference.
2. The generation-batch statistics each stack asks for (`StatisticsSources._generation_batch_statistics`, the
   trainer's own method on a trainer-shaped host): the LM-head streams (`token_statistics`, `hellinger_and_entropy`)
   with each head gathered as under ZeRO-3 (`partition_like_zero3`: `full_lm_head` takes DeepSpeed's branch and the
   gathered copy is allocated), TIDE's reference forward (`model_parts.completion_hidden`), the batch's mean entropy.
3. The training forward's logit gap (`_policy_logit_gap` on one micro-batch, from the forward's hidden states).
4. Each method's own call (`CreditMethod.on_tensors`, through `run_stack`) on real tensors of the same shapes
   (`_method_inputs.method_batch`): the generation-stage methods on the generation batch, the training-forward ones on
   a micro-batch; `gather` returns the world size's copies of what it is given, as an all-gather over that many
   processes would hold.

The decoder's own weights, the batch and the hidden states of TRL's training forward exist before any measurement
and cost nothing; the reference model's ZeRO-3 shard is its parameter bytes / world size (DeepSpeed's partition).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections import Counter
from contextlib import nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
from _fake_scale import measured, partition_like_zero3  # noqa: E402
from _method_inputs import DISTINCT_IDS, arguments_for, method_batch  # noqa: E402

COMPLETION_TOKENS = 16_384
PROMPT_TOKENS = 512  # DAPO-Math prompts in the chat template are shorter; the prompt only adds to the forwards
WORLD_SIZES = (8, 32)
# From each model's config.json on the Hugging Face Hub (Qwen/Qwen2.5-32B, Qwen/Qwen3-8B), as transformers reads it.
# Qwen2.5-32B's embedding and LM head have 152,064 rows (its tokenizer 151,665 ids); Qwen3-8B's 151,936.
MODELS = {
    "Qwen2.5-32B": (
        "qwen2",
        dict(
            hidden_size=5120,
            intermediate_size=27648,
            num_hidden_layers=64,
            num_attention_heads=40,
            num_key_value_heads=8,
            vocab_size=152_064,
            max_position_embeddings=131_072,
            rope_theta=1_000_000.0,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
        ),
    ),
    "Qwen3-8B": (
        "qwen3",
        dict(
            hidden_size=4096,
            intermediate_size=12288,
            num_hidden_layers=36,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=151_936,
            max_position_embeddings=40_960,
            rope_theta=1_000_000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
        ),
    ),
}
TINY_MODEL = (
    "qwen2",
    dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1024,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    ),
)
PLOT = _common.REPO_ROOT / "docs" / "images" / "paper_scale.png"
# Where each statistic comes from in the papers' regime (vLLM server, TRL's importance-sampling correction on, so
# TRL runs its old-log-prob forward): trl_credit/trainer/statistics_sources.py.
SOURCES = {
    "policy_logps": "TRL's training forward",
    "policy_entropy": "TRL's training forward",
    "policy_logit_gap": "`token_statistics` stream over the training forward's hidden states",
    "rollout_logps": "TRL's old-log-prob forward",
    "rollout_entropy": "entropies of TRL's old-log-prob forward (recorded), or TIDE's stream",
    "rollout_unsampled_mass": "`token_statistics` stream over the old-log-prob forward's hidden states (recorded)",
    "rollout_unsampled_sum_sq_probs": "the same stream",
    "rollout_mean_entropy": "those entropies, all-reduced",
    "reference_deviation": "reference forward (`completion_hidden`) + `hellinger_and_entropy` over both heads",
}


def recipe_shapes() -> dict[tuple[int, int, int], list[str]]:
    """`(per_device_train_batch_size, num_generations, gradient_accumulation_steps)` of each shipped paper recipe
    (the configs/*.yaml that name a method), with the recipes of each shape."""
    import yaml

    shapes: dict[tuple[int, int, int], list[str]] = {}
    for path in sorted((_common.REPO_ROOT / "configs").glob("*.yaml")):
        recipe = yaml.safe_load(path.read_text())
        if "method" in recipe:
            shape = (
                recipe["per_device_train_batch_size"],
                recipe["num_generations"],
                recipe.get("gradient_accumulation_steps", 1),
            )
            shapes.setdefault(shape, []).append(path.name)
    return shapes


def build_model(spec, fake_mode=None):
    """A causal LM of `spec` in bfloat16: fake weights built under `fake_mode` (no memory, no time), else real random
    ones (`--validate`)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, fields = spec
    config = AutoConfig.for_model(model_type, **fields)
    config._attn_implementation = "sdpa"
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with fake_mode or nullcontext():
            model = AutoModelForCausalLM.from_config(config).eval()
    finally:
        torch.set_default_dtype(default)
    partition_like_zero3(model.get_output_embeddings().weight, ds_id=0)
    return model


def credit_config(method: str, shape, temperature: float = 1.0):
    """The trainer config of a recipe of `shape` with `method` (the recipes' own settings that size the batch)."""
    import tempfile

    from trl_credit.trainer.config import CreditGRPOConfig

    per_device, group, accumulation = shape
    return CreditGRPOConfig(
        output_dir=tempfile.gettempdir(),
        credit_method=method,
        per_device_train_batch_size=per_device,
        num_generations=group,
        gradient_accumulation_steps=accumulation,
        max_completion_length=COMPLETION_TOKENS,
        temperature=temperature,
        beta=0.0,
        use_vllm=True,
        vllm_mode="server",
        report_to=[],
        use_cpu=True,  # the config's device checks; the model's dtype is the recipes' bfloat16 all the same
        bf16=False,
    )


def trainer_class():
    from accelerate import Accelerator
    from trl import GRPOTrainer

    from trl_credit.trainer.statistics_sources import StatisticsSources

    class PaperScaleTrainer(StatisticsSources):
        """The statistics sources of `CreditGRPOTrainer` around a fake policy, with TRL's own scoring forward: what
        they read of a trainer, from one process (its gathers return the local tensors)."""

        _get_per_token_logps_and_entropies = GRPOTrainer._get_per_token_logps_and_entropies
        is_deepspeed_enabled = is_fsdp_enabled = False  # the heads are partitioned by `partition_like_zero3`
        rollout_func = tools = None
        use_transformers_continuous_batching = _is_vlm = False
        use_vllm = vllm_importance_sampling_correction = True  # the recipes' vLLM server, TRL's default correction
        num_iterations = 1

        def __init__(self, args, policy, reference=None):
            self.args, self.model, self.temperature = args, policy, args.temperature
            # In training mode, as `Trainer.training_step` leaves the policy while TRL generates and scores: the
            # statistics' own forwards then take `per_device_train_batch_size` rows at a time, as in a real run.
            policy.train()
            self.accelerator = Accelerator(cpu=True)
            self.forward_counts = Counter()
            self.stage_plan = args.stage_plan
            # The frozen reference as TRL's own reference model (prepared by TRL like the copy `beta = 0` makes, under
            # ZeRO-3 both are `prepare_deepspeed`'s partitioned model): accelerate cannot move fake weights.
            self.ref_model = reference
            self.deviation_reference = self._deviation_reference(None)

    return PaperScaleTrainer


def generation_batch(rows: int, group: int, vocab: int, completion_tokens: int, prompt_tokens: int, seed: int = 0):
    """One GPU's generation batch as TRL hands it over: `rows / group` prompts, each completion at the full length
    (the longest the recipes allow: the worst case for memory)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, vocab, (rows // group, prompt_tokens), generator=g).repeat_interleave(group, 0)
    return {
        "prompt_ids": prompts,
        "prompt_mask": torch.ones_like(prompts),
        "completion_ids": torch.randint(0, vocab, (rows, completion_tokens), generator=g),
        "completion_mask": torch.ones(rows, completion_tokens, dtype=torch.long),
    }


def scoring_forward(trainer, batch, fake_mode, real_limit):
    """TRL's old-log-prob forward of `batch` inside the trainer's `_recorded_rollout` (no record for GRPO):
    `(measurement, old_per_token_logps, the records)`."""
    import torch

    from trl_credit.trainer.batch_layout import sequence_inputs

    input_ids, attention_mask, _ = sequence_inputs(batch)
    # no_grad: TRL computes `old_per_token_logps` under it
    with torch.no_grad(), measured(fake_mode, real_limit) as cost, trainer._recorded_rollout() as records:
        logps_BT, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model,
            input_ids,
            attention_mask,
            batch["completion_ids"].size(1),
            batch_size=trainer.args.per_device_train_batch_size,
            compute_entropy=True,
        )
    return cost, logps_BT, records


def sources_costs(spec, shape, stacks, fake_mode, completion_tokens, prompt_tokens, real: bool = False) -> dict:
    """Per stack (a credit method's name, or "grpo"): the measured costs of its statistics on one GPU's batch (with
    `real`, on real weights and tensors throughout)."""
    from trl.trainer.utils import add_fused_lm_head

    trainer_type = trainer_class()
    policy = build_model(spec, None if real else fake_mode)
    add_fused_lm_head(policy, outputs=("log_probs", "entropy"))  # as `GRPOTrainer.__init__` adds it (temperature 1)
    reference = (
        build_model(spec, None if real else fake_mode) if any(plan(name, shape).deviation for name in stacks) else None
    )
    if reference is not None:
        partition_like_zero3(reference.get_output_embeddings().weight, ds_id=1)
    per_device, group, accumulation = shape
    batch = generation_batch(per_device * accumulation, group, spec[1]["vocab_size"], completion_tokens, prompt_tokens)
    costs, by_plan = {}, {}
    for name in stacks:
        trainer = trainer_type(credit_config(name, shape), policy, reference)
        stage_plan = trainer.stage_plan
        key = (stage_plan.generation_statistics, stage_plan.records_hidden)
        if key not in by_plan:
            by_plan[key] = stage_costs(trainer, batch, fake_mode, None if real else 64 << 20)
        costs[name] = by_plan[key]
        if reference is not None and stage_plan.deviation:
            parameters = reference.parameters()
            costs[name] = {**costs[name], "reference_bytes": sum(p.numel() * p.element_size() for p in parameters)}
    return costs


def plan(name, shape):
    return credit_config(name, shape).stage_plan


def stage_costs(trainer, batch, fake_mode, real_limit) -> dict:
    """The scoring forward with the stack's records, its generation-batch statistics and its training-forward
    logit gap (one micro-batch), each measured."""
    import torch

    stage_plan = trainer.stage_plan
    scoring, logps_BT, (generation, record) = scoring_forward(trainer, batch, fake_mode, real_limit)
    costs = {"scoring": scoring}
    if stage_plan.generation_statistics:
        batch = {**batch, "old_per_token_logps": logps_BT}
        with measured(fake_mode, real_limit) as costs["statistics"]:
            statistics = trainer._generation_batch_statistics(
                batch, stage_plan.generation_statistics, generation, record
            )
        del statistics
    del generation, record
    if stage_plan.records_hidden:
        rows = trainer.args.per_device_train_batch_size
        micro = {key: value[:rows] for key, value in batch.items()}
        length = micro["prompt_ids"].size(1) + micro["completion_ids"].size(1)
        with fake_mode if real_limit else nullcontext():  # the training forward's hidden states: TRL's
            hidden_BLH = torch.randn(rows, length, trainer.model.config.hidden_size, dtype=torch.bfloat16)
        with measured(fake_mode, real_limit) as costs["logit_gap"]:
            trainer._policy_logit_gap(micro, torch.cat([hidden_BLH]))  # as `_credit_training_forward` passes them
    return costs


def method_costs(shape, world: int, vocab: int, completion_tokens: int, fake_mode) -> dict:
    """Each registered method's own call on real tensors of one GPU's shapes, its gathers over `world` processes."""
    import torch

    from trl_credit.methods import CREDIT_METHODS

    per_device, group, accumulation = shape

    def gather(values):  # what an all-gather over `world` processes holds: each process's values, here the same
        return torch.cat([values] * world)

    costs = {}
    for name, method in sorted(CREDIT_METHODS.items()):
        in_forward = method.reads_training_forward(method.hyperparameters())
        rows = per_device if in_forward else per_device * accumulation
        # (the synthetic completions draw their ids from the first DISTINCT_IDS of the vocabulary)
        advantages_B, mask_BT, named = method_batch(
            rows, completion_tokens, min(group, rows), max(vocab, DISTINCT_IDS + 1)
        )
        incoming = None if method.estimates_advantages else advantages_B
        call = functools.partial(method.on_tensors, incoming, mask_BT, gather=gather, **arguments_for(method, named))
        with measured(fake_mode, real_limit=None) as costs[name]:
            call()
        costs[name].in_forward = in_forward
    return costs


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / 2**30:.2f} GiB" if num_bytes >= 2**29 else f"{num_bytes / 2**20:.0f} MiB"


def added_cost(name: str, sources: dict, grpo: dict, method, world: int, accumulation: int) -> dict:
    """The credit path's added peak bytes per GPU (and in which phase), its added FLOPs per generation batch."""
    scoring, statistics, gap = sources["scoring"], sources.get("statistics"), sources.get("logit_gap")
    record_held = max(0, scoring.held - grpo["scoring"].held)
    statistics_held = statistics.held if statistics else 0
    phases = {
        "old-log-prob forward with records": max(0, scoring.peak - grpo["scoring"].peak),
        "generation statistics": record_held + (statistics.peak if statistics else 0),
        "logit-gap stream": statistics_held + (gap.peak if gap else 0),
        "method call": (0 if method.in_forward else record_held) + statistics_held + method.peak,
    }
    phase = max(phases, key=phases.get)
    shard = sources.get("reference_bytes", 0) / world
    flops = (statistics.flops if statistics else 0) + accumulation * (gap.flops if gap else 0)
    return {
        "peak": shard + phases[phase],
        "phase": phase,
        "shard": shard,
        "record": record_held,
        "statistics_peak": statistics.peak if statistics else 0,
        "gap_peak": gap.peak if gap else 0,
        "method_peak": method.peak,
        "flops": flops,
        "grpo_flops": grpo["scoring"].flops,
    }


def measure(models: dict, shapes: dict, worlds, completion_tokens: int, prompt_tokens: int) -> list[dict]:
    """Every registered method's added cost (and GRPO's own old-log-prob forward) for every model, shape and world."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from trl_credit.methods import CREDIT_METHODS

    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    stacks = ["grpo", *sorted(CREDIT_METHODS)]
    method_runs = {}
    rows = []
    for model_name, spec in models.items():
        for shape in shapes:
            start = time.perf_counter()
            sources = sources_costs(spec, shape, stacks, fake_mode, completion_tokens, prompt_tokens)
            print(f"{model_name} {shape}: sources {time.perf_counter() - start:.0f} s", flush=True)
            for world in worlds:
                if (shape, world) not in method_runs:
                    start = time.perf_counter()
                    method_runs[shape, world] = method_costs(
                        shape, world, spec[1]["vocab_size"], completion_tokens, fake_mode
                    )
                    print(f"{shape} x {world}: methods {time.perf_counter() - start:.0f} s", flush=True)
                for name in sorted(CREDIT_METHODS):
                    cost = added_cost(
                        name, sources[name], sources["grpo"], method_runs[shape, world][name], world, shape[2]
                    )
                    rows.append({"model": model_name, "shape": shape, "world": world, "method": name, **cost})
                grpo = sources["grpo"]["scoring"]
                rows.append({"model": model_name, "shape": shape, "world": world, "method": "grpo", "grpo": grpo})
    return rows


def cost_table(rows: list[dict], shape) -> str:
    from trl_credit.methods import CREDIT_METHODS

    columns = sorted({(r["model"], r["world"]) for r in rows if r["shape"] == shape}, key=lambda c: (c[0], c[1]))
    at = {(r["model"], r["world"], r["method"]): r for r in rows if r["shape"] == shape}
    header = ["method"] + [f"{model}, {world} GPUs: added peak (phase) / added TFLOP" for model, world in columns]
    body = []
    for name in sorted(CREDIT_METHODS):
        cells = [f"`{name}`"]
        for model, world in columns:
            r = at[model, world, name]
            cells.append(f"{_gib(r['peak'])} ({r['phase']}) / {r['flops'] / 1e12:.1f}")
        body.append(cells)
    grpo = ["GRPO's own old-log-prob forward (peak / TFLOP)"]
    for model, world in columns:
        own = at[model, world, "grpo"]["grpo"]
        grpo.append(f"{_gib(own.peak)} / {own.flops / 1e12:.1f}")
    return _common.markdown_table(header, [*body, grpo])


def parts_table(rows: list[dict], shape, model: str, world: int) -> str:
    """Where one configuration's added bytes come from, per method."""
    from trl_credit.methods import CREDIT_METHODS
    from trl_credit.methods.batch import STATISTICS

    header = [
        "method",
        "statistics read (stage)",
        "source in this regime",
        "reference shard",
        "records kept from TRL's forward",
        "statistics peak",
        "logit-gap peak (micro-batch)",
        "method call peak",
        "added peak",
    ]
    body = []
    for r in rows:
        if r["shape"] != shape or r["model"] != model or r["world"] != world or r["method"] == "grpo":
            continue
        method = CREDIT_METHODS[r["method"]]
        reads = method.statistics_for(method.hyperparameters())
        stage = "training forward" if method.reads_training_forward(method.hyperparameters()) else "generation"
        sources = "; ".join(f"`{s}`: {SOURCES[s]}" for s in reads if s in STATISTICS) or "-"
        body.append(
            [
                f"`{r['method']}`",
                (", ".join(f"`{s}`" for s in reads) or "token ids only") + f" ({stage})",
                sources,
                *(_gib(r[key]) for key in ("shard", "record", "statistics_peak", "gap_peak", "method_peak", "peak")),
            ]
        )
    return _common.markdown_table(header, body)


def render_plot(rows: list[dict], shape, path: Path) -> None:
    """Added peak memory per GPU of every method, one bar per model and world size (log scale)."""
    from matplotlib.figure import Figure

    columns = sorted({(r["model"], r["world"]) for r in rows if r["shape"] == shape})
    names = sorted({r["method"] for r in rows if r["method"] != "grpo"})
    at = {(r["model"], r["world"], r["method"]): r for r in rows if r["shape"] == shape}
    figure = Figure(figsize=(11, 5.5), layout="constrained")
    ax = figure.subplots()
    width = 0.8 / len(columns)
    for index, (model, world) in enumerate(columns):
        heights = [max(at[model, world, name]["peak"], 1) / 2**30 for name in names]
        positions = [i + (index - (len(columns) - 1) / 2) * width for i in range(len(names))]
        ax.bar(positions, heights, width, label=f"{model}, ZeRO-3 over {world} GPUs")
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right")
    ax.set(yscale="log", ylabel="added peak memory per GPU (GiB)")
    per_device, group, accumulation = shape
    ax.set_title(
        f"What the credit path adds over GRPO per GPU: {per_device} x {accumulation} completions of "
        f"{COMPLETION_TOKENS:,} tokens (G = {group}), measured on fake tensors"
    )
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def paper_shape(shapes: dict):
    """The batch shape of the recipe at the papers' scale (the 32B one), else the first."""
    return next((shape for shape, recipes in shapes.items() if any("32b" in r for r in recipes)), next(iter(shapes)))


def section(rows: list[dict], shapes: dict, elapsed: float, load_before: float, load_after: float, args) -> str:
    largest = max((r for r in rows if r["method"] != "grpo"), key=lambda r: r["peak"])
    command = "python benchmarks/paper_scale.py" + (" --tiny" if args.tiny else "")
    if set(args.models) != set(MODELS) and not args.tiny:
        command += " --models " + " ".join(args.models)
    if args.shapes != "paper" and not args.tiny:
        command += f" --shapes {args.shapes}"
    tables = []
    for shape, recipes in shapes.items():
        per_device, group, accumulation = shape
        tables.append(
            f"### {per_device} completions per micro-batch x {accumulation} micro-batches, G = {group} "
            f"({', '.join(f'`configs/{r}`' for r in recipes)})\n\n{cost_table(rows, shape)}"
        )
    shape = paper_shape(shapes)
    model, world = largest["model"], max(r["world"] for r in rows)
    return f"""`{command}`; {_common.machine_note()}; whole run {elapsed / 60:.1f} min, load average {load_before:.1f} at
the start and {load_after:.1f} at the end. No GPU, no weights: the package's own code runs on torch's fake tensors
(`benchmarks/_fake_scale.py`; how: the docstring of `benchmarks/paper_scale.py`). Completions of {COMPLETION_TOKENS:,}
tokens (every one at that length: the worst case), prompts of {PROMPT_TOKENS} tokens, bfloat16 weights, the LM heads
gathered as under ZeRO-3, the method calls on real tensors with their gathers over the world size.

"Added peak" is the largest amount of memory the credit path holds per GPU above what GRPO holds at the same point of
the step, and the phase where it is reached; it includes TIDE's ZeRO-3 shard of its reference model. "Added TFLOP" counts
the matrix products and attention the credit path adds per generation batch of one GPU (torch's `FlopCounterMode`);
GRPO's own old-log-prob forward of that batch is in the last row for scale (its training step runs about three times
that again, forward and backward, not measured here).

Largest: `{largest["method"]}` adds {_gib(largest["peak"])} per GPU with {largest["model"]} over {largest["world"]} GPUs
({largest["shape"][0]} x {largest["shape"][2]} completions per GPU, G = {largest["shape"][1]}), in its {largest["phase"]}.

![added peak memory per GPU of every method](images/paper_scale.png)

{chr(10).join(tables)}

### Where the added bytes come from: {model}, {world} GPUs, {shape[0]} x {shape[2]} completions

{parts_table(rows, shape, model, world)}"""


# `--validate`: a size both a real and a fake run can do on this CPU.
VALIDATION_MODEL = (
    "qwen2",
    dict(
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=16_384,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    ),
)
VALIDATION_SHAPE, VALIDATION_TOKENS, VALIDATION_PROMPT = (2, 2, 2), 1024, 64


def resident_set_table() -> str:
    """The counter against the resident set, from a child process with the benchmark's allocator settings."""
    import subprocess

    from _method_inputs import MEMORY_ENV

    env = {**os.environ, **MEMORY_ENV}
    output = subprocess.run(
        [sys.executable, __file__, "--resident-set-worker"], env=env, capture_output=True, text=True, check=True
    )
    rows = json.loads(output.stdout.strip().splitlines()[-1])
    body = [
        [label, _gib(counted), _gib(resident), f"{counted / resident - 1:+.1%}" if resident else "-"]
        for label, counted, resident in rows
    ]
    return _common.markdown_table(
        ["call (real tensors)", "counted peak", "resident-set peak", "counted / resident - 1"], body
    )


def validation_section(table: str, worst: float, resident: str, elapsed: float, load_before: float) -> str:
    spec = VALIDATION_MODEL[1]
    per_device, group, accumulation = VALIDATION_SHAPE
    return f"""`python benchmarks/paper_scale.py --validate`; {_common.machine_note()}; {elapsed / 60:.1f} min, load average
{load_before:.1f} at the start.

Every stack of the paper-scale run, at a size this CPU can also run for real: a Qwen2-shaped model with hidden size
{spec["hidden_size"]}, {spec["num_hidden_layers"]} layers, V = {spec["vocab_size"]:,}, {per_device} x {accumulation} completions of
{VALIDATION_TOKENS:,} tokens (G = {group}), prompts of {VALIDATION_PROMPT}. Once on fake weights and tensors as above, once on
real random weights and real tensors, counted by the same dispatch mode: the largest relative difference of any
peak, held amount or FLOP count is **{worst:.2%}** (the fake run executes the same operations on the same shapes).

{table}

The counter against the machine: the same real calls in a process whose allocations of 64 KiB and more go back to
the kernel when freed (`_method_inputs.MEMORY_ENV`), counted peak against the resident-set high-water mark they
reach (`_method_inputs.extra_peak_bytes`). The method calls run at 64 x 2,048 tokens (16 x 2,048 in the training
forward), G = 4, their gathers over 2 processes. Allocations under 64 KiB stay in the heap and page rounding moves the
resident set by a few hundred KiB, so the small calls differ most in relative terms.

{resident}"""


def validate() -> str:
    """The same stacks measured on fake and on real weights and tensors (the same counting mode), phase by phase."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from trl_credit.methods import CREDIT_METHODS

    stacks = ["grpo", *sorted(CREDIT_METHODS)]
    runs = {}
    for real in (False, True):
        fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
        start = time.perf_counter()
        runs[real] = sources_costs(
            VALIDATION_MODEL, VALIDATION_SHAPE, stacks, fake_mode, VALIDATION_TOKENS, VALIDATION_PROMPT, real=real
        )
        print(f"validation, {'real' if real else 'fake'}: {time.perf_counter() - start:.0f} s", flush=True)
    body, worst = [], 0.0
    for name in stacks:
        for phase, fake in runs[False][name].items():
            if phase == "reference_bytes":
                continue
            true = runs[True][name][phase]
            for what in ("peak", "held", "flops"):
                error = getattr(fake, what) / getattr(true, what) - 1 if getattr(true, what) else 0.0
                worst = max(worst, abs(error))
            body.append(
                [
                    f"`{name}`",
                    phase,
                    f"{fake.peak:,} / {true.peak:,}",
                    f"{fake.held:,} / {true.held:,}",
                    f"{fake.flops:,} / {true.flops:,}",
                    fake.answered_reads,
                ]
            )
    header = [
        "stack",
        "phase",
        "peak bytes fake / real",
        "held bytes fake / real",
        "FLOPs fake / real",
        "answered reads",
    ]
    return _common.markdown_table(header, body), worst


def statistics_call(name: str, fake_mode):
    """The generation-batch statistics call of `name`'s stack on real weights at the validation size, ready to run."""
    from trl.trainer.utils import add_fused_lm_head

    policy = build_model(VALIDATION_MODEL)
    add_fused_lm_head(policy, outputs=("log_probs", "entropy"))
    reference = build_model(VALIDATION_MODEL) if plan(name, VALIDATION_SHAPE).deviation else None
    if reference is not None:
        partition_like_zero3(reference.get_output_embeddings().weight, ds_id=1)
    trainer = trainer_class()(credit_config(name, VALIDATION_SHAPE), policy, reference)
    per_device, group, accumulation = VALIDATION_SHAPE
    batch = generation_batch(
        per_device * accumulation, group, VALIDATION_MODEL[1]["vocab_size"], VALIDATION_TOKENS, VALIDATION_PROMPT
    )
    _, logps_BT, (generation, record) = scoring_forward(trainer, batch, fake_mode, None)
    batch = {**batch, "old_per_token_logps": logps_BT}
    names = trainer.stage_plan.generation_statistics
    return lambda: trainer._generation_batch_statistics(batch, names, generation, record)


def resident_set_check() -> list[list]:
    """Run in a process whose large allocations go back to the kernel when freed (`_method_inputs.MEMORY_ENV`): the
    counted peak of real calls against the resident-set high-water mark they reach (`extra_peak_bytes`)."""
    import torch
    from _method_inputs import extra_peak_bytes
    from torch._subclasses.fake_tensor import FakeTensorMode

    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    calls = {f"{name} generation statistics": statistics_call(name, fake_mode) for name in ("tide", "otb", "eapo")}
    rows = []
    for label, fn in calls.items():
        with measured(fake_mode, real_limit=None) as counted:
            fn()
        rows.append([label, counted.peak, extra_peak_bytes(fn)])
    for name, cost in method_costs((16, 4, 4), 2, 151_936, 2048, fake_mode).items():
        del cost
        rows.append([f"{name} method call", *_method_pair(name, fake_mode, torch)])
    return rows


def _method_pair(name, fake_mode, torch):
    from _method_inputs import extra_peak_bytes

    from trl_credit.methods import CREDIT_METHODS

    method = CREDIT_METHODS[name]
    rows = 16 if method.reads_training_forward(method.hyperparameters()) else 64
    advantages_B, mask_BT, named = method_batch(rows, 2048, 4)
    incoming = None if method.estimates_advantages else advantages_B
    gather = lambda values: torch.cat([values] * 2)  # noqa: E731
    call = functools.partial(method.on_tensors, incoming, mask_BT, gather=gather, **arguments_for(method, named))
    call()
    with measured(fake_mode, real_limit=None) as counted:
        call()
    return counted.peak, extra_peak_bytes(call)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="a tiny model and batch, in seconds; writes nothing")
    parser.add_argument("--validate", action="store_true", help="fake against real at a small size; writes nothing")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument(
        "--shapes",
        choices=["paper", "all"],
        default="paper",
        help="paper: the batch shape of the 32B recipe; all: every shipped recipe's (about 3x the time)",
    )
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--resident-set-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    if args.resident_set_worker:
        print(json.dumps(resident_set_check()))
        return
    if args.validate:
        start, load_before = time.perf_counter(), os.getloadavg()[0]
        table, worst = validate()
        resident = resident_set_table()
        body = validation_section(table, worst, resident, time.perf_counter() - start, load_before)
        print(body)
        if not args.no_write:
            _common.write_section("paper_scale_validation", "Paper scale: the fake estimate against real runs", body)
        return
    start, load_before = time.perf_counter(), os.getloadavg()
    if args.tiny:
        shapes, models, worlds, tokens, prompt = {(2, 2, 2): ["tiny"]}, {"tiny": TINY_MODEL}, (2,), 64, 16
    else:
        shapes, models = recipe_shapes(), {name: MODELS[name] for name in args.models}
        if args.shapes == "paper":
            shapes = {paper_shape(shapes): shapes[paper_shape(shapes)]}
        worlds, tokens, prompt = WORLD_SIZES, COMPLETION_TOKENS, PROMPT_TOKENS
    rows = measure(models, shapes, worlds, tokens, prompt)
    elapsed, load_after = time.perf_counter() - start, os.getloadavg()
    body = section(rows, shapes, elapsed, load_before[0], load_after[0], args)
    print(body)
    if not (args.tiny or args.no_write):
        render_plot(rows, paper_shape(shapes), PLOT)
        _common.write_section("paper_scale", "Paper scale: what each method adds per GPU, on fake tensors", body)
    return rows


if __name__ == "__main__":
    main()
