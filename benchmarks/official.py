"""Each method beside its official code: time and extra peak memory on the same batches, one process, interleaved.

    python benchmarks/official.py --official_root DIR          # ~4 min on 2 shared CPU cores (load 10-18)
    python benchmarks/official.py --official_root DIR --quick  # small sizes, nothing written

DIR holds the official repositories, cloned by the user (nothing of them is vendored here):

    git clone https://github.com/xiuyilou/TACO DIR/TACO            # TACO, AR-Lopti, STAPO, TAMPO, min-p, Clip-Cov
    git clone https://github.com/wgcyeo/EAPO DIR/EAPO
    git clone https://github.com/winstonsmith1897/GTPO DIR/GTPO
    git clone https://github.com/hp-luo/STARE DIR/STARE
    git clone https://github.com/verl-project/verl DIR/verl         # OTB
    git clone https://github.com/xiaolizh1/KTAE DIR/KTAE              # KTAE (tests/test_ktae.py reads it too)

Importing verl needs Ray, omegaconf and more; instead the official functions are taken out of the user's files at run
time with `ast` (only the named functions and constants, compiled with postponed annotations) and run on plain
tensors, their module's imports supplied (`torch`, `numpy`, verl's `masked_mean`/`masked_sum` from the same clone).
The TACO repository's AR-Lopti, STAPO, TAMPO and min-p are blocks inside its actor's update loop
(`verl/workers/actor/dp_actor.py`), not functions: each block's statements are compiled as the body of a function of
the loop's variables. GTPO's `build_conflict_mask` prints debugging output (every token, as text) and is timed twice:
as it is (to /dev/null) and with its `print` statements removed; the latter is the algorithm's cost.

Per method and size, round-robin (ours first, the other two in alternating order, our rule alone last): ours
(`CreditMethod.on_tensors`, checks and metrics included), the official code, the official code again under another
name (the control: its ratio to the first is this run's noise floor), and our registered function alone on the batch
`on_tensors` hands it (ours minus it is what the input and result checks cost);
the ratio of the fastest calls, and the median of the per-round ratios. Extra peak memory as in `scaling.py`: resident-set
high-water mark above the resident set before the call, in a child process whose large allocations go back to the
kernel when freed. Hyperparameters: the official defaults (ours share them).
"""

from __future__ import annotations
import __future__

import argparse
import ast
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import time
import types
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
from _method_inputs import MEMORY_ENV, arguments_for, extra_peak_bytes, method_batch  # noqa: E402

SIZES = [(64, 2048, 4), (256, 4096, 16)]
QUICK_SIZES = [(16, 256, 4)]
# GTPO's official mask counts token ids in bincounts of vocabulary x length entries per prompt group (at 151k x 4k, 5 GB
# per count; at 49k x 512, ~8 s per group on the shared CPU), so it runs at SmolLM2's vocabulary and a short length.
GTPO_SIZES = [(8, 256, 4)]
GTPO_VOCAB = 49_152
QUICK_GTPO_SIZES = [(8, 128, 4)]
# KTAE's official code loops in Python over each group's token ids (~30 s a call at 256 x 4,096): 3 rounds, one size.
KTAE_SIZES = [(256, 4096, 16)]
QUICK_KTAE_SIZES = [(16, 256, 4)]
CLONES = {
    "TACO": "https://github.com/xiuyilou/TACO",
    "EAPO": "https://github.com/wgcyeo/EAPO",
    "GTPO": "https://github.com/winstonsmith1897/GTPO",
    "STARE": "https://github.com/hp-luo/STARE",
    "verl": "https://github.com/verl-project/verl",
    "KTAE": "https://github.com/xiaolizh1/KTAE",
}


def _source(root: Path, clone: str, relative: str) -> Path:
    path = root / clone / relative
    if not path.is_file():
        raise SystemExit(
            f"--official_root {root}: {path} not found; clone it with `git clone {CLONES[clone]} {root / clone}`"
        )
    return path


def _compile(nodes: list, path: Path, namespace: dict) -> dict:
    code = compile(
        ast.Module(body=nodes, type_ignores=[]), str(path), "exec", flags=__future__.annotations.compiler_flag
    )
    exec(code, namespace)
    return namespace


def extract(path: Path, names: list[str], namespace: dict) -> dict:
    """`namespace` with the top-level functions, classes and constants `names` of `path` defined in it (decorators
    other than `torch.*` dropped: they register the function in verl's tables; a function's own imports from verl
    dropped: the namespace supplies what they name)."""
    found = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names:
            node.body = [statement for statement in node.body if not _imports_verl(statement)]
            node.decorator_list = [d for d in node.decorator_list if ast.unparse(d).startswith("torch.")]
            found[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and target.id in names:
                    found[target.id] = node
    missing = [name for name in names if name not in found]
    if missing:
        raise SystemExit(f"{path}: no top-level {missing}; is it the official repository's file?")
    return _compile([found[name] for name in names], path, namespace)


def _imports_verl(statement) -> bool:
    return isinstance(statement, ast.ImportFrom) and (statement.module or "").startswith("verl")


def ktae_official(root: Path, base: dict):
    """KTAE's official advantage function (`compute_ktae_outcome_advantage_and_keytokens` of its `core_algos.py`),
    `fn(token_level_rewards, responses, eos_mask, index) -> (advantages, returns)`, with the class `ComputeKeyTokens`
    and the functions of `compute_key_tokens.py` it imports (the namespace, returned as `fn.namespace`, holds them)."""
    names = ["compute_Cohen", "fisher_exact_test", "calculate_ig", "compute_tf", "ComputeKeyTokens"]
    namespace = extract(_source(root, "KTAE", "verl/workers/actor/compute_key_tokens.py"), names, dict(base))
    core = _source(root, "KTAE", "verl/trainer/ppo/core_algos.py")
    function = extract(core, ["compute_ktae_outcome_advantage_and_keytokens"], namespace)[
        "compute_ktae_outcome_advantage_and_keytokens"
    ]
    function.namespace = namespace
    return function


class _NoPrints(ast.NodeTransformer):
    def visit_Expr(self, node):
        call = node.value
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "print":
            return ast.copy_location(ast.Pass(), node)
        return node


def _assigns_loop_state(statement) -> bool:
    targets = statement.targets if isinstance(statement, ast.Assign) else []
    return any(isinstance(t, ast.Name) and t.id in ("advantages", "response_mask") for t in targets)


def _actor_blocks(path: Path) -> dict[str, ast.If]:
    """The `if` blocks of the actor's update loop that change `advantages` or `response_mask`, by the flag that guards
    them (`elif` chains followed)."""
    blocks = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.If) and any(_assigns_loop_state(s) for s in node.body):
            test = node.test.values[0] if isinstance(node.test, ast.BoolOp) else node.test
            if isinstance(test, ast.Name):
                blocks.setdefault(test.id, node)
    return blocks


BLOCK_ARGUMENTS = [
    "advantages",
    "old_log_prob",
    "log_prob",
    "entropy",
    "response_mask",
    "outputs",
    "self",
    "micro_batch_metrics",
    "_adv_alpha",
    "support_set_min_p",
]


def actor_block(path: Path, flag: str, namespace: dict):
    """The statements under `if <flag>` of the actor, as `block(**BLOCK_ARGUMENTS) -> (advantages, response_mask)`."""
    blocks = _actor_blocks(path)
    if flag not in blocks:
        raise SystemExit(f"{path}: no `if {flag}` block; is it the TACO repository's actor?")
    body = blocks[flag].body + [ast.parse("return advantages, response_mask").body[0]]
    arguments = ast.arguments(
        posonlyargs=[], args=[ast.arg(name) for name in BLOCK_ARGUMENTS], kwonlyargs=[], kw_defaults=[], defaults=[]
    )
    function = ast.FunctionDef(name=f"block_{flag}", args=arguments, body=body, decorator_list=[], returns=None)
    function.type_params = []
    ast.fix_missing_locations(function)
    return _compile([function], path, namespace)[f"block_{flag}"]


def official_functions(root: Path) -> dict:
    """Official implementations, by our method name: `fn(batch) -> result`, where batch is `method_batch`'s."""
    import numpy as np
    import torch

    base = {"torch": torch, "np": np, "math": math, "defaultdict": defaultdict, "Any": object, "Optional": object}
    taco_core = _source(root, "TACO", "verl/trainer/ppo/core_algos.py")
    verl_F = types.SimpleNamespace(
        **extract(_source(root, "TACO", "verl/utils/torch_functional.py"), ["masked_sum", "masked_mean"], dict(base))
    )
    taco_ns = extract(
        taco_core,
        ["compute_taco_token_advantages", "agg_loss", "compute_policy_loss_clip_cov"],
        {**base, "verl_F": verl_F, "AlgoConfig": type("AlgoConfig", (), {})},
    )
    actor = _source(root, "TACO", "verl/workers/actor/dp_actor.py")
    flags = ("adv_reweight_enable", "stapo_enable", "tampo_mask_enable", "calculate_support_minp")
    blocks = {flag: actor_block(actor, flag, dict(base)) for flag in flags}
    eapo_ns = extract(
        _source(root, "EAPO", "src/trainers/eapo_trainer.py"),
        [
            "EAPO_ENTROPY_QUANTILES",
            "EAPO_NORMALIZATION_EPS",
            "_linear_quantile",
            "normalize_token_entropies",
            "eapo_token_advantages",
        ],
        dict(base),
    )
    gtpo_path = _source(root, "GTPO", "gtpo/gtpo_training.py")
    gtpo_ns = extract(gtpo_path, ["W_RAW", "PAD_ID", "build_conflict_mask"], dict(base))
    quiet_tree = _NoPrints().visit(ast.parse(gtpo_path.read_text()))
    quiet_node = next(n for n in quiet_tree.body if isinstance(n, ast.FunctionDef) and n.name == "build_conflict_mask")
    gtpo_quiet_ns = _compile([quiet_node], gtpo_path, {**base, "W_RAW": gtpo_ns["W_RAW"]})
    stare_ns = extract(
        _source(root, "STARE", "verl/trainer/ppo/core_algos.py"), ["compute_stare_token_weights"], dict(base)
    )
    otb_ns = extract(
        _source(root, "verl", "verl/trainer/ppo/core_algos.py"),
        ["compute_optimal_token_baseline_advantage"],
        dict(base),
    )
    ktae_function = ktae_official(root, dict(base))

    def ktae(b):
        rewards_BT = torch.zeros(b["mask_BT"].shape)
        rewards_BT[:, 0] = b["rewards_B"]  # the official score is the row's sum
        return ktae_function(rewards_BT, b["completion_ids_BT"], b["mask_BT"].float(), b["group_index_B"].numpy())

    def token_advantages(b):
        return b["advantages_B"].unsqueeze(1) * b["mask_BT"].float()

    def block_call(flag, b, **extra):
        arguments = dict.fromkeys(BLOCK_ARGUMENTS)
        arguments.update(
            advantages=token_advantages(b),
            old_log_prob=b["rollout_logps"],
            log_prob=b["policy_logps"],
            entropy=b["policy_entropy"],
            response_mask=b["mask_BT"].float(),
            outputs={
                "entropys": b["policy_entropy"],
                "sampled_logits": b["policy_logit_gap"],
                "max_logits": torch.zeros_like(b["policy_logit_gap"]),
            },
            self=types.SimpleNamespace(config={}),
            micro_batch_metrics={},
            _adv_alpha=0.1,
            support_set_min_p=0.1,
        )
        arguments.update(extra)
        return blocks[flag](**arguments)

    clip_cov_config = types.SimpleNamespace(
        policy_loss=types.SimpleNamespace(clip_cov_ratio=0.0002, clip_cov_lb=1.0, clip_cov_ub=5.0),
        clip_ratio=0.2,
        clip_ratio_low=0.2,
        clip_ratio_high=0.2,
        global_batch_info={},
    )

    def gtpo(b, namespace):
        # As the official forward calls it: once per prompt group, its completions' ids and mask.
        namespace["PAD_ID"] = b["pad_token_id"]  # the module constant the official script sets for its tokenizer
        groups = b["group_index_B"].unique()
        outputs = []
        for group in groups:
            rows = b["group_index_B"] == group
            advantages = b["advantages_B"][rows]
            outputs.append(
                namespace["build_conflict_mask"](
                    b["completion_ids_BT"][rows], b["mask_BT"][rows], advantages > 0, advantages < 0, b["vocab_size"]
                )
            )
        return outputs

    def gtpo_printing(b):
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
            return gtpo(b, gtpo_ns)

    def otb(b):
        rows = torch.arange(b["mask_BT"].size(0))
        last = b["mask_BT"].sum(1) - 1
        rewards_BT = torch.zeros(b["mask_BT"].shape)
        rewards_BT[rows, last] = b["rewards_B"]
        return otb_ns["compute_optimal_token_baseline_advantage"](
            rewards_BT,
            b["mask_BT"].float(),
            b["group_index_B"].numpy(),
            b["rollout_logps"],
            b["sum_pi_squared"],
        )

    return {
        "taco": lambda b: taco_ns["compute_taco_token_advantages"](
            b["policy_logps"], b["policy_entropy"], token_advantages(b), b["mask_BT"].float(), alpha=0.01, lambda_=0.9
        ),
        "ar_lopti": lambda b: block_call("adv_reweight_enable", b),
        "stapo": lambda b: block_call("stapo_enable", b),
        "tampo": lambda b: block_call("tampo_mask_enable", b),
        "minp_support": lambda b: block_call("calculate_support_minp", b),
        "clip_cov": lambda b: taco_ns["compute_policy_loss_clip_cov"](
            b["rollout_logps"], b["policy_logps"], token_advantages(b), b["mask_BT"].float(), config=clip_cov_config
        ),
        "eapo": lambda b: eapo_ns["eapo_token_advantages"](
            b["advantages_B"],
            eapo_ns["normalize_token_entropies"](b["rollout_entropy"], b["mask_BT"]),
            b["mask_BT"],
            kappa=math.log(4.0),
        ),
        "gtpo": lambda b: gtpo(b, gtpo_quiet_ns),
        "gtpo (official as is, prints to /dev/null)": gtpo_printing,
        "stare": lambda b: stare_ns["compute_stare_token_weights"](
            b["policy_logps"], token_advantages(b), b["mask_BT"].float(), {"stare": {"enabled": True}}
        ),
        "otb": otb,
        "ktae": ktae,
    }


OFFICIAL_OF = {"gtpo (official as is, prints to /dev/null)": "gtpo"}
OFFICIAL_SOURCE = {
    "taco": "TACO `compute_taco_token_advantages`",
    "ar_lopti": "TACO actor, `adv_reweight_enable` block",
    "stapo": "TACO actor, `stapo_enable` block",
    "tampo": "TACO actor, `tampo_mask_enable` block",
    "minp_support": "TACO actor, `calculate_support_minp` block",
    "clip_cov": "TACO `compute_policy_loss_clip_cov` (the whole loss)",
    "eapo": "EAPO `normalize_token_entropies` + `eapo_token_advantages`",
    "gtpo": "GTPO `build_conflict_mask` per group, its prints removed",
    "gtpo (official as is, prints to /dev/null)": "GTPO `build_conflict_mask` per group, as is",
    "stare": "STARE `compute_stare_token_weights`",
    "otb": "verl `compute_optimal_token_baseline_advantage`",
    "ktae": "KTAE `compute_ktae_outcome_advantage_and_keytokens` (GRPO's advantage and `ComputeKeyTokens` per group)",
}


def batch_for(rows: int, length: int, group_size: int, vocab: int) -> dict:
    import torch

    advantages_B, mask_BT, named = method_batch(rows, length, group_size, vocab_size=vocab)
    # STARE's gate on (mean entropy below its 0.3 target), as the official code's default controller state
    valid_BT = mask_BT.bool()
    named["rollout_mean_entropy"] = torch.where(valid_BT, 0.2, 0.0)
    # verl's OTB input `sum_pi_squared` of the same distributions: the sampled token's square and the others'
    sum_pi_squared = named["rollout_logps"].exp().square() + named["rollout_unsampled_sum_sq_probs"]
    return {"advantages_B": advantages_B, "mask_BT": mask_BT, "sum_pi_squared": sum_pi_squared, **named}


def pair_calls(official: dict, batch: dict, names: list[str]) -> dict:
    """For each name: (ours, official, control, our rule alone) callables on `batch`."""
    from trl_credit.methods import CREDIT_METHODS

    named = {k: v for k, v in batch.items() if k not in ("advantages_B", "mask_BT", "sum_pi_squared")}
    pairs = {}
    for name in names:
        method = CREDIT_METHODS[OFFICIAL_OF.get(name, name)]
        incoming = None if method.estimates_advantages else batch["advantages_B"]
        arguments = arguments_for(method, named)
        pairs[name] = (
            lambda m=method, a=incoming, kw=arguments: m.on_tensors(a, batch["mask_BT"], **kw),
            lambda fn=official[name]: fn(batch),
            lambda fn=official[name]: fn(batch),
            rule_alone(method, incoming, batch["mask_BT"], arguments),
        )
    return pairs


def rule_alone(method, incoming, mask_BT, arguments):
    """Our registered function without the checks `on_tensors` runs around it: called on the batch that `on_tensors`
    hands it, built and checked once here, outside the timing. Ours minus this is what the checks cost."""
    from trl_credit.methods.registry import _tensor_stack  # what `on_tensors` runs: the batch the function sees

    _, seen_batch, _ = _tensor_stack([method], incoming, mask_BT, arguments).results[-1]
    hyperparameters = method.hyperparameters({k: v for k, v in arguments.items() if k in method.argument_names})
    return lambda: method.function(seen_batch, **hyperparameters)


def jobs(args) -> list[tuple[list[str], tuple[int, int, int], int]]:
    names = [n for n in OFFICIAL_SOURCE if not n.startswith(("gtpo", "ktae"))]
    gtpo = ["gtpo", "gtpo (official as is, prints to /dev/null)"]
    sizes = QUICK_SIZES if args.quick else SIZES
    gtpo_sizes = QUICK_GTPO_SIZES if args.quick else GTPO_SIZES
    ktae_sizes = QUICK_KTAE_SIZES if args.quick else KTAE_SIZES
    every = [(names, size, 151_936) for size in sizes] + [(gtpo, size, GTPO_VOCAB) for size in gtpo_sizes]
    every += [(["ktae"], size, 151_936) for size in ktae_sizes]
    return [(chosen, size, vocab) for chosen, size, vocab in _only(every, args.methods)]


def _only(every, methods):
    """The jobs' methods among `methods` (all without it), jobs left without one dropped."""
    for names, size, vocab in every:
        chosen = [n for n in names if not methods or OFFICIAL_OF.get(n, n) in methods]
        if chosen:
            yield chosen, size, vocab


def memory_worker(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    official = official_functions(Path(args.official_root))
    for names, size, vocab in jobs(args):
        pairs = pair_calls(official, batch_for(*size, vocab), names)
        for name, (ours, theirs, _, _) in pairs.items():
            for side, fn in (("ours", ours), ("official", theirs)):
                fn()
                print(json.dumps({"size": list(size), "name": name, "side": side, "bytes": extra_peak_bytes(fn)}))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--official_root", required=True, help="folder holding the clones TACO, EAPO, GTPO, STARE, verl"
    )
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke test; writes nothing")
    parser.add_argument(
        "--methods", nargs="+", default=None, help="only these methods (all by default); writes nothing"
    )
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--memory-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    if args.memory_worker:
        memory_worker(args)
        return
    official = official_functions(Path(args.official_root))  # fails early, naming the missing clone
    start, load_before = time.perf_counter(), os.getloadavg()
    results = []
    for names, size, vocab in jobs(args):
        pairs = pair_calls(official, batch_for(*size, vocab), names)
        repeats = args.repeats if not {"gtpo", "ktae"} & set(names) else 3
        for fns in pairs.values():
            for fn in fns:
                fn()
        samples = {name: [[], [], [], []] for name in pairs}
        for round_index in range(repeats):
            for name, fns in pairs.items():
                # Ours first, then the official code and its control in alternating order: each of the two follows
                # ours (and pays for the switch of function) in half the rounds; our rule alone last.
                for index in (0, 1, 2, 3) if round_index % 2 else (0, 2, 1, 3):
                    begin = time.perf_counter()
                    fns[index]()
                    samples[name][index].append(time.perf_counter() - begin)
        for name, (ours, theirs, control, alone) in samples.items():
            results.append(
                {
                    "name": name,
                    "size": size,
                    "vocab": vocab,
                    "ours_s": statistics.median(ours),
                    "official_s": statistics.median(theirs),
                    # Minimum times: on a shared machine the least-disturbed call of each is the steadiest estimate.
                    "ratio": min(ours) / min(theirs),
                    "control": min(control) / min(theirs),
                    "alone": min(alone) / min(theirs),
                    "checks_s": min(ours) - min(alone),
                    "median_ratio": statistics.median(o / t for o, t in zip(ours, theirs)),
                }
            )
            print(results[-1], flush=True)
    command = [
        sys.executable,
        __file__,
        "--official_root",
        args.official_root,
        "--memory-worker",
        "--threads",
        str(args.threads),
    ]
    output = subprocess.run(
        command + (["--quick"] if args.quick else []) + (["--methods", *args.methods] if args.methods else []),
        env={**os.environ, **MEMORY_ENV},
        capture_output=True,
        text=True,
    )
    if output.returncode:
        raise RuntimeError(f"memory worker failed:\n{output.stderr[-3000:]}")
    memory = {}
    for line in output.stdout.splitlines():
        if line.startswith("{"):
            entry = json.loads(line)
            memory[(tuple(entry["size"]), entry["name"], entry["side"])] = entry["bytes"]
    elapsed, load_after = time.perf_counter() - start, os.getloadavg()

    def mib(value):
        return f"{value / 2**30:.2f} GiB" if value >= 2**30 else f"{value / 2**20:.1f} MiB"

    rows = []
    for r in results:
        ours_bytes = memory[(r["size"], r["name"], "ours")]
        their_bytes = memory[(r["size"], r["name"], "official")]
        b, t, g = r["size"]
        rows.append(
            [
                f"`{r['name']}`" if r["name"] in OFFICIAL_OF.values() or "(" not in r["name"] else r["name"],
                OFFICIAL_SOURCE[r["name"]],
                f"{b} x {t:,}, G = {g}, V = {r['vocab']:,}",
                f"{r['ratio']:.2f}x",
                f"{r['control']:.2f}x",
                f"{r['median_ratio']:.2f}x",
                f"{r['alone']:.2f}x",
                f"{r['checks_s'] * 1e3:.1f} ms",
                f"{r['ours_s'] * 1e3:.1f} ms / {r['official_s'] * 1e3:.1f} ms",
                f"{ours_bytes / their_bytes:.2f}x" if their_bytes else "-",
                f"{mib(ours_bytes)} / {mib(their_bytes)}",
            ]
        )
    table = _common.markdown_table(
        [
            "method",
            "official code",
            "batch",
            "time ours / official (fastest calls)",
            "control / official",
            "median per-round ratio",
            "our rule alone / official (fastest calls)",
            "our checks (fastest calls)",
            "times (ours / official)",
            "extra peak memory ours / official",
            "extra peak memory (ours / official)",
        ],
        rows,
    )
    only = f" --methods {' '.join(args.methods)}" if args.methods else ""
    body = f"""`python benchmarks/official.py --official_root DIR{" --quick" if args.quick else ""}{only}` (DIR: the clones named in the
script's docstring); {_common.machine_note()}; whole run {elapsed / 60:.1f} min; load average {load_before[0]:.1f} at the
start, {load_after[0]:.1f} at the end (2 cores shared with other jobs).

Same batches for both (`benchmarks/_method_inputs.py`), one process, {args.repeats} rounds (3 for GTPO and KTAE),
each calling ours, then the official code and the official code again (the control) in alternating order, then our
rule alone (the registered function on the batch `on_tensors` hands it, without the checks around it). The time
ratio is that of the fastest call of each (the least disturbed on a shared machine); the median of the per-round
ratios is given beside it. The control's distance from 1.00x is this run's noise floor. Ours is `CreditMethod.on_tensors`
as the trainer runs it (input and result checks, metrics); the official code as its repository runs it (metrics
with `.item()` where it logs them). Extra peak memory: measured once per side in a child process (see the docstring).

{table}"""
    print(body)
    if not (args.no_write or args.quick or args.methods):
        _common.write_section("official", "Beside the official code", body)


if __name__ == "__main__":
    main()
