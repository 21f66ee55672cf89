"""Two processes (gloo, CPU) compute the same token advantages and log the same metrics as one process, under
plain data parallelism, DeepSpeed ZeRO-2, DeepSpeed ZeRO-3 and FSDP2.

One `accelerate launch` per engine runs `tests/multiproc_worker.py`, which trains grpo, taco, eapo and tide for a
few steps with two processes and saves, per rank and per generation batch, the rows, the sequence advantages, the
token advantages and the policy weights. Here the two ranks' rows are concatenated and everything is recomputed in
this single process from full logits and `torch.quantile`, with the pure method functions: the token advantages must
match row for row, and every logged credit metric must equal the statistic over both ranks' tokens (and, for the
checks to mean something, differ from rank 0's own statistic).

| engine  | launch                                                                                              |
|---------|-----------------------------------------------------------------------------------------------------|
| `ddp`   | `--multi_gpu --num_processes 2` with `use_cpu=True`: MULTI_CPU, DDP over gloo (3 steps a method)    |
| `zero2` | accelerate config `distributed_type: DEEPSPEED`, `use_cpu: true`, DeepSpeed JSON `stage: 2` (2 steps) |
| `zero3` | the same with `stage: 3` and `stage3_param_persistence_threshold: 0`: the tiny model's LM head stays partitioned at every step, so TIDE's `full_lm_head` must gather it; plus a TIDE run with every completion of rank 1 masked, which must finish (the launch has a timeout) |
| `fsdp2` | accelerate config `distributed_type: FSDP`, `fsdp_version: 2`, `use_cpu: true`; accelerate only enables FSDP for accelerator devices, so the worker promotes the CPU processes' state to FSDP (`allow_fsdp_on_cpu`) |

The `ddp` launch also checks TIDE's statistics helpers on a model sharded by hand with FSDP2 `fully_shard`.

A `registry` launch (DDP) trains every path case (`trainer_helpers.path_cases`: GRPO, every registered method, the
documented stacks) with one group of 8 completions spread over both processes, `trainer_helpers.AdvantageRecorder`
on each process: the reference rules' generation stage over both processes' rows, the training-forward stage over
the process's own micro-batch. A newly registered method enters it without an edit.

Each launch runs once per module (the fixtures are module-scoped); select one engine with `-k zero3`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import make_tiny_model, make_tiny_tokenizer
from launch_helpers import accelerate_config, free_port, process_tree
from reference_credit import assert_credit_moved
from reference_formulas import gtpo_loop, hicra_loop, unsampled_statistics
from trainer_helpers import path_cases

from trl_credit.methods.eapo import eapo_advantages, eapo_kappa_schedule
from trl_credit.methods.otb import otb_advantages
from trl_credit.methods.stare import stare_advantages
from trl_credit.methods.taco import taco_advantages, taco_tail_risk
from trl_credit.methods.tide import tide_advantages

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "tests" / "multiproc_worker.py"
TOL = dict(atol=1e-4, rtol=1e-4)
ENGINES = ("ddp", "zero2", "zero3", "fsdp2")
METHODS = ("grpo", "taco", "eapo", "tide")
LAUNCH_TIMEOUT_S = 300  # a hang (a collective only one process reaches) fails the test instead of stalling CI


def launch(engine: str, out: Path, cases: tuple[str, ...] = (), timeout_s: float = LAUNCH_TIMEOUT_S) -> None:
    """`accelerate launch` the worker with 2 processes under `engine` (`registry`: DDP, training `cases`); fail on
    error or after `timeout_s`."""
    command = [sys.executable, "-m", "accelerate.commands.launch"]
    if engine in ("ddp", "registry"):
        command += [
            "--multi_gpu",
            "--num_processes",
            "2",
            "--num_machines",
            "1",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
        ]
    else:
        config_file = out / "accelerate.yaml"
        config_file.write_text(yaml.safe_dump(accelerate_config(engine, out)))
        command += ["--config_file", str(config_file), "--num_processes", "2"]
    command += ["--main_process_port", str(free_port()), str(WORKER), str(out / "runs"), engine, *cases]
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        CUDA_VISIBLE_DEVICES="",
        DS_ACCELERATOR="cpu",
        TRL_CREDIT_EXPECTED_ROOT=str(ROOT),
        # This checkout's trl_credit and the test helpers, ahead of any editable install of another checkout.
        PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]),
    )
    start = time.perf_counter()
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        for pid in process_tree(proc.pid):  # the launcher and both workers
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        stdout, stderr = proc.communicate()
        pytest.fail(f"{engine}: the 2-process launch hung for {timeout_s} s:\n{stdout[-3000:]}\n{stderr[-6000:]}")
    assert proc.returncode == 0, f"{engine} worker failed:\n{stdout[-4000:]}\n{stderr[-8000:]}"
    print(f"{engine}: 2-process launch took {time.perf_counter() - start:.1f} s")


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """`launched(engine)`: the run directory of that engine's launch, launched on first use in this module."""
    runs = {}

    def get(engine):
        if engine not in runs:
            out = tmp_path_factory.mktemp(f"multiproc_{engine}")
            launch(engine, out)
            runs[engine] = out / "runs"
        return runs[engine]

    return get


@pytest.fixture(scope="module", params=ENGINES)
def run_dir(request, launched):
    return launched(request.param)


def _load(run_dir, run):
    ranks = [torch.load(run_dir / f"{run}_rank{r}.pt", weights_only=False) for r in (0, 1)]
    history = json.loads((run_dir / f"{run}_log_history.json").read_text())
    return ranks, history


def _pad_right(tensors, width):
    return torch.cat([F.pad(t, (0, width - t.size(1))) for t in tensors])


def _log_entry(history, generation_step):
    """The log entry of the optimizer step that consumed the generation batch made at `generation_step`."""
    (entry,) = [e for e in history if e.get("step") == generation_step + 1 and "loss" in e]
    return entry


@torch.no_grad()
def _naive_logps(state_dict, record, temperature):
    """Full-vocabulary log-probs `(B, T, V)` of the completion tokens, from full logits (no trainer code)."""
    model = make_tiny_model(make_tiny_tokenizer())
    model.load_state_dict(state_dict)
    model.eval()
    input_ids = torch.cat([record["prompt_ids"], record["completion_ids"]], dim=1)
    attention_mask = torch.cat([record["prompt_mask"], record["completion_mask"]], dim=1)
    completion_len = record["completion_ids"].size(1)
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -completion_len - 1 : -1]
    return torch.log_softmax(logits.float() / temperature, dim=-1)


def _entropy(logp_BTV):
    return -(logp_BTV.exp() * logp_BTV).sum(-1)


def _paired_batches(ranks):
    """Per generation step: (rank-0 record, rank-1 record), with the rank-0 policy weights used by both."""
    records = [r["records"] for r in ranks]
    assert len(records[0]) == len(records[1]) > 0
    for r0, r1 in zip(*records):
        assert r0["step"] == r1["step"]
        yield r0, r1


def _concat(r0, r1, key):
    width = max(r0[key].size(1), r1[key].size(1))
    return _pad_right([r0[key], r1[key]], width)


def _weights(advantages_B, advantages_BT, mask_BT):
    """Â / A over the valid tokens whose |A| exceeds 1e-3 of the largest |A| or |Â| (docs/metrics.md)."""
    valid_BT = mask_BT.bool()
    incoming_BT = advantages_B.unsqueeze(1).expand_as(advantages_BT)
    if not valid_BT.any():
        return advantages_BT[valid_BT]
    largest = max(incoming_BT[valid_BT].abs().max().item(), advantages_BT[valid_BT].abs().max().item())
    kept_BT = valid_BT & (incoming_BT.abs() > 1e-3 * largest)
    return (advantages_BT / torch.where(kept_BT, incoming_BT, 1.0))[kept_BT]


def _check_weight_metrics(entry, prefix, advantages_B, advantages_BT, mask_BT):
    weights_N = _weights(advantages_B, advantages_BT, mask_BT)
    if weights_N.numel() == 0:  # no advantage above the floor: no weight is defined, TRL logs None
        assert entry[f"{prefix}/mean_weight"] is None and entry[f"{prefix}/weight_max"] is None
        return
    assert entry[f"{prefix}/mean_weight"] == pytest.approx(weights_N.mean().item(), abs=1e-5)
    assert entry[f"{prefix}/weight_max"] == pytest.approx(weights_N.max().item(), abs=1e-5)
    assert entry[f"{prefix}/weight_std"] == pytest.approx(weights_N.std(unbiased=False).item(), abs=1e-4)
    valid = mask_BT.bool()
    shift_N = (advantages_BT - advantages_B.unsqueeze(1))[valid]
    assert entry[f"{prefix}/mean_shift"] == pytest.approx(shift_N.mean().item(), abs=1e-5)
    assert entry["credit/adv_abs_mean"] == pytest.approx(advantages_BT[valid].abs().mean().item(), abs=1e-5)


# ------------------------------------------------------------------------------- every registered method, DDP

REGISTRY_CASES = tuple(case.values[0] for case in path_cases())
REGISTRY_TIMEOUT_S = 30 * len(REGISTRY_CASES)  # ~4 s a case on 2 idle cores


@pytest.fixture(scope="module")
def registry_run(tmp_path_factory):
    """One DDP launch training every path case (`trainer_helpers.path_cases`: GRPO, every registered method, the
    documented stacks), one group of 8 completions spread over both processes, under `AdvantageRecorder`."""
    out = tmp_path_factory.mktemp("multiproc_registry")
    launch("registry", out, REGISTRY_CASES, timeout_s=REGISTRY_TIMEOUT_S)
    return out / "runs"


@pytest.mark.parametrize("method", path_cases())
def test_every_registered_method_on_two_processes_equals_the_reference(registry_run, method):
    """Each process's consumed advantages and loss mask equal the reference rules (`reference_credit.py`) at 1e-5:
    the generation stage over both processes' rows (a group's sums, EAPO's quantiles, STARE's gate mean), the
    training-forward stage over this process's micro-batch; the replicas stay equal, and credit moved."""
    results = [json.loads((registry_run / f"registry_{method}_rank{rank}.json").read_text()) for rank in (0, 1)]
    for rank, result in enumerate(results):
        assert not result["failures"], f"rank {rank}:\n" + "\n".join(result["failures"])
        assert result["checked_batches"] == result["expected_batches"] > 0
    assert results[0]["checksum"] == pytest.approx(results[1]["checksum"], abs=1e-9)
    moved = sum(r["moved_tokens"] for r in results) / max(sum(r["valid_tokens"] for r in results), 1)
    if method == "grpo":
        assert moved == 0.0, "GRPO's advantages differ from its own broadcast A_i"
    else:
        assert_credit_moved(method, moved)
    print(
        f"\n[two processes] {method}: max |consumed - reference| = "
        f"{max(r['max_difference'] for r in results):.2e}, moved share = {moved:.3f}"
    )


# ------------------------------------------------------------------------------------ every engine, every method


def test_both_processes_trained_every_method_in_sync(run_dir):
    for method in METHODS:
        ranks, history = _load(run_dir, method)
        # The replicas (gathered whole under ZeRO-3 and FSDP2) are equal after training.
        assert ranks[0]["checksum"] == pytest.approx(ranks[1]["checksum"], abs=1e-9)
        steps = ranks[0]["max_steps"]
        assert [e["step"] for e in history if "loss" in e] == list(range(1, steps + 1))
        assert len(ranks[0]["records"]) == steps  # one credit computation per step
        # Each rank generated its own half of every generation batch.
        for r0, r1 in _paired_batches(ranks):
            assert r0["prompt_ids"].size(0) == r1["prompt_ids"].size(0) == 4
            # TRL normalised the sequence advantages over the gathered batch: each group of 4 sums to ~0.
            both = torch.cat([r0["advantages_B"], r1["advantages_B"]])
            assert both.view(-1, 4).sum(-1).abs().max() < 1e-4


def test_the_engine_was_in_effect(run_dir):
    """The launch really trained under its engine, and the tensors the checks rely on were really sharded."""
    vocab = len(make_tiny_tokenizer())
    for method in METHODS:
        for rank in _load(run_dir, method)[0]:
            info, layouts = rank["engine"], rank["head_layouts"]
            engine = info["name"]
            assert layouts and {where for where, _ in layouts} >= {"generation"}
            if engine == "ddp":
                assert info["distributed_type"] == "MULTI_CPU"
            elif engine in ("zero2", "zero3"):
                assert info["distributed_type"] == "DEEPSPEED" and info["zero_stage"] == int(engine[-1])
            else:
                assert info["distributed_type"] == "FSDP" and info["fsdp_version"] == 2
            for where, layout in layouts:
                if engine == "zero3":  # partitioned at every generation batch and every credit computation
                    assert layout["shape"] == (0,) and layout["ds_shape"][0] == vocab, (method, where, layout)
                elif engine == "fsdp2" and where == "generation":  # between steps: sharded by rows
                    assert layout["dtensor"] and layout["local_shape"][0] < vocab, (method, layout)
                elif engine in ("ddp", "zero2"):
                    assert layout["shape"][0] == vocab and not layout["dtensor"]
            if method == "tide" and engine in ("zero3", "fsdp2"):  # TIDE's reference is sharded as well
                head = info["reference_head"]
                assert (head["shape"] == (0,)) if engine == "zero3" else (head["local_shape"][0] < vocab), head


def check_eapo(ranks, history, require_discriminating=True):
    args, temperature = ranks[0]["args"], ranks[0]["temperature"]
    discriminating = False
    for r0, r1 in _paired_batches(ranks):
        entropies = [_entropy(_naive_logps(r0["policy_state"], r, temperature)) for r in (r0, r1)]
        width = max(e.size(1) for e in entropies)
        entropy_BT = _pad_right(entropies, width)
        mask_BT = _concat(r0, r1, "completion_mask")
        advantages_B = torch.cat([r0["advantages_B"], r1["advantages_B"]])
        valid_N = entropy_BT[mask_BT.bool()]
        q_lo, q_hi = (torch.quantile(valid_N, q).item() for q in args["eapo_quantiles"])
        kappa = eapo_kappa_schedule(args["eapo_kappa"], r0["step"], 0)
        # Single process, whole batch, quantiles taken inside the pure function.
        expected_BT = eapo_advantages(
            advantages_B, mask_BT, rollout_entropy=entropy_BT, eapo_kappa=kappa, eapo_quantiles=args["eapo_quantiles"]
        ).advantages_BT
        got_BT = _concat(r0, r1, "advantages_BT")
        torch.testing.assert_close(got_BT, expected_BT, **TOL)

        entry = _log_entry(history, r0["step"])
        assert entry["eapo/q_lo"] == pytest.approx(q_lo, abs=1e-5)
        assert entry["eapo/q_hi"] == pytest.approx(q_hi, abs=1e-5)
        _check_weight_metrics(entry, "eapo", advantages_B, expected_BT, mask_BT)
        rank0_q_lo = torch.quantile(entropies[0][r0["completion_mask"].bool()], args["eapo_quantiles"][0]).item()
        discriminating |= abs(rank0_q_lo - q_lo) > 1e-4
    assert discriminating or not require_discriminating, (
        "rank 0's own quantile never differed from the global one: the test proves nothing"
    )


def check_taco(ranks, history, require_discriminating=True):
    args, temperature = ranks[0]["args"], ranks[0]["temperature"]
    alpha, lam = args["taco_alpha"], args["taco_lambda"]
    discriminating = False
    for r0, r1 in _paired_batches(ranks):
        # On-policy with one iteration, the training forward's policy is the generation-time policy.
        logps, entropies = [], []
        for r in (r0, r1):
            logp_BTV = _naive_logps(r0["policy_state"], r, temperature)
            logps.append(logp_BTV.gather(-1, r["completion_ids"].unsqueeze(-1)).squeeze(-1))
            entropies.append(_entropy(logp_BTV))
            torch.testing.assert_close(r["logps_BT"], logps[-1], **TOL)  # the trainer's training-forward statistics
            torch.testing.assert_close(r["entropy_BT"], entropies[-1], **TOL)
        width = max(r["completion_ids"].size(1) for r in (r0, r1))
        logp_BT, entropy_BT = _pad_right(logps, width), _pad_right(entropies, width)
        mask_BT = _concat(r0, r1, "completion_mask")
        advantages_B = torch.cat([r0["advantages_B"], r1["advantages_B"]])
        expected_BT = taco_advantages(
            advantages_B, mask_BT, policy_logps=logp_BT, policy_entropy=entropy_BT, taco_alpha=alpha, taco_lambda=lam
        ).advantages_BT
        torch.testing.assert_close(_concat(r0, r1, "advantages_BT"), expected_BT, **TOL)

        entry = _log_entry(history, r0["step"])
        valid = mask_BT.bool()
        tail = taco_tail_risk(logp_BT, entropy_BT, alpha) > 0
        positive = valid & (advantages_B > 0).unsqueeze(1)
        assert entry["taco/tail_fraction"] == pytest.approx(tail[valid].float().mean().item(), abs=1e-5)
        assert entry["taco/pos_adv_fraction"] == pytest.approx(positive[valid].float().mean().item(), abs=1e-5)
        if positive.any():
            want = (tail & positive).sum().item() / positive.sum().item()
            assert entry["taco/tail_fraction_pos"] == pytest.approx(want, abs=1e-5)
        else:  # no positive-advantage token on either rank: NaN, which TRL's log turns into None
            assert entry["taco/tail_fraction_pos"] is None
        _check_weight_metrics(entry, "taco", advantages_B, expected_BT, mask_BT)
        n0 = r0["completion_mask"].size(0)
        rank0_tail = tail[:n0][valid[:n0]].float().mean().item()
        discriminating |= abs(rank0_tail - entry["taco/tail_fraction"]) > 1e-4
    assert discriminating or not require_discriminating, (
        "rank 0's own tail fraction never differed from the global one: the test proves nothing"
    )


def check_tide(ranks, history, require_discriminating=True):
    args, temperature = ranks[0]["args"], ranks[0]["temperature"]
    reference_state = ranks[0]["reference_state"]
    discriminating = False
    for r0, r1 in _paired_batches(ranks):
        deviations, entropies = [], []
        for r in (r0, r1):
            logp = _naive_logps(r0["policy_state"], r, temperature)
            logq = _naive_logps(reference_state, r, temperature)
            deviations.append((1 - torch.exp(0.5 * (logp + logq)).sum(-1)).clamp(0, 1))
            entropies.append(_entropy(logp))
        width = max(d.size(1) for d in deviations)
        deviation_BT, entropy_BT = _pad_right(deviations, width), _pad_right(entropies, width)
        mask_BT = _concat(r0, r1, "completion_mask")
        advantages_B = torch.cat([r0["advantages_B"], r1["advantages_B"]])
        vocab = len(make_tiny_tokenizer())
        expected_BT = tide_advantages(
            advantages_B,
            mask_BT,
            reference_deviation=deviation_BT,
            rollout_entropy=entropy_BT,
            vocab_size=vocab,
            tide_tau=args["tide_tau"],
            tide_kappa=args["tide_kappa"],
        ).advantages_BT
        torch.testing.assert_close(_concat(r0, r1, "advantages_BT"), expected_BT, **TOL)

        entry = _log_entry(history, r0["step"])
        valid = mask_BT.bool()
        assert entry["tide/mean_deviation"] == pytest.approx(deviation_BT[valid].mean().item(), abs=1e-5)
        _check_weight_metrics(entry, "tide", advantages_B, expected_BT, mask_BT)
        n0 = r0["completion_mask"].size(0)
        discriminating |= abs(deviation_BT[:n0][valid[:n0]].mean().item() - entry["tide/mean_deviation"]) > 1e-4
    assert discriminating or not require_discriminating, (
        "rank 0's own mean deviation never differed from the global one: the test proves nothing"
    )


def test_eapo_two_processes_equal_single_process(run_dir):
    check_eapo(*_load(run_dir, "eapo"))


def test_taco_two_processes_equal_single_process(run_dir):
    check_taco(*_load(run_dir, "taco"))


def test_tide_two_processes_equal_single_process(run_dir):
    check_tide(*_load(run_dir, "tide"))


def test_otb_groups_spread_over_two_processes_equal_single_process(launched):
    """One group of 8 completions, 4 on each process: the baselines sum over both ranks' rows."""
    ranks, history = _load(launched("ddp"), "otb")
    temperature, discriminating = ranks[0]["temperature"], False
    for r0, r1 in _paired_batches(ranks):
        groups = torch.cat([r0["credit_group_index"], r1["credit_group_index"]])
        assert groups.unique().numel() == 1  # the group straddles the processes
        mass, others_sq = [], []
        for r in (r0, r1):
            logp = _naive_logps(r0["policy_state"], r, temperature)
            for values, statistic in zip((mass, others_sq), unsampled_statistics(logp, r["completion_ids"])):
                values.append(statistic)
        width = max(t.size(1) for t in mass)
        mask_BT = _concat(r0, r1, "completion_mask").bool()
        rewards = torch.cat([r0["credit_rewards"], r1["credit_rewards"]])
        expected_BT = otb_advantages(
            None,
            mask_BT,
            rewards_B=rewards,
            group_index_B=groups,
            rollout_unsampled_mass=_pad_right(mass, width),
            rollout_unsampled_sum_sq_probs=_pad_right(others_sq, width),
        ).advantages_BT
        torch.testing.assert_close(_concat(r0, r1, "advantages_BT"), expected_BT, **TOL)
        entry = _log_entry(history, r0["step"])
        valid = mask_BT.bool()
        baselines = torch.where(valid, rewards.unsqueeze(1) - expected_BT, 0.0)
        assert entry["otb/mean_baseline"] == pytest.approx(baselines[valid].mean().item(), abs=1e-4)
        n0 = r0["completion_mask"].size(0)
        rank0_alone = otb_advantages(
            None,
            mask_BT[:n0, : mass[0].size(1)],
            rewards_B=rewards[:n0],
            group_index_B=groups[:n0],
            rollout_unsampled_mass=mass[0],
            rollout_unsampled_sum_sq_probs=others_sq[0],
        ).advantages_BT
        discriminating |= not torch.allclose(rank0_alone, expected_BT[:n0, : mass[0].size(1)], **TOL)
    assert discriminating, "rank 0's own baselines never differed from the global ones: the test proves nothing"


def test_gtpo_groups_spread_over_two_processes_equal_single_process(launched):
    """One group of 8 completions, 4 on each process: the conflicts are taken over both ranks' rows."""
    ranks, history = _load(launched("ddp"), "gtpo")
    temperature, pad_id, discriminating = ranks[0]["temperature"], make_tiny_tokenizer().pad_token_id, False
    for r0, r1 in _paired_batches(ranks):
        groups = torch.cat([r0["credit_group_index"], r1["credit_group_index"]])
        assert groups.unique().numel() == 1  # the group straddles the processes
        entropy = [_entropy(_naive_logps(r0["policy_state"], r, temperature)) for r in (r0, r1)]
        width = max(t.size(1) for t in entropy)
        mask_BT = _concat(r0, r1, "completion_mask").bool()
        ids_BT = torch.cat(
            [F.pad(r["completion_ids"], (0, width - r["completion_ids"].size(1)), value=pad_id) for r in (r0, r1)]
        )
        advantages_B = torch.cat([r0["advantages_B"], r1["advantages_B"]])
        threshold = ranks[0]["args"]["gtpo_entropy_threshold"]
        expected_BT = gtpo_loop(
            advantages_B, ids_BT, mask_BT, _pad_right(entropy, width), groups, pad_id, 2.0, threshold
        )
        torch.testing.assert_close(_concat(r0, r1, "advantages_BT"), expected_BT, **TOL)
        # The same advantages on the rollout entropy the trainer logged: what each process read.
        torch.testing.assert_close(_concat(r0, r1, "rollout_entropy_BT"), _pad_right(entropy, width) * mask_BT, **TOL)
        n0 = r0["completion_mask"].size(0)
        width0 = entropy[0].size(1)
        rank0_alone = gtpo_loop(
            advantages_B[:n0],
            ids_BT[:n0, :width0],
            mask_BT[:n0, :width0],
            entropy[0],
            groups[:n0],
            pad_id,
            2.0,
            threshold,
        )
        discriminating |= not torch.allclose(rank0_alone, expected_BT[:n0, :width0], **TOL)
        entry = _log_entry(history, r0["step"])
        assert 0.0 <= entry["gtpo/conflict_fraction"] <= 1.0
    assert discriminating, "rank 0's own conflicts never differed from the global ones: the test proves nothing"


def test_hicra_two_processes_equal_single_process(launched):
    """HICRA's planning tokens on each process's rows, a group spread over both, equal the loop on both ranks' rows."""
    ranks, history = _load(launched("ddp"), "hicra")
    grams = ranks[0]["args"]["hicra_grams"]
    texts = {i: " " + token for token, i in make_tiny_tokenizer().get_vocab().items()}
    planned = 0
    for r0, r1 in _paired_batches(ranks):
        mask_BT = _concat(r0, r1, "completion_mask").bool()
        ids_BT = _concat(r0, r1, "completion_ids")
        advantages_B = torch.cat([r0["advantages_B"], r1["advantages_B"]])
        expected_BT = hicra_loop(advantages_B, ids_BT, mask_BT, texts, grams, ranks[0]["args"]["hicra_alpha"])
        torch.testing.assert_close(_concat(r0, r1, "advantages_BT"), expected_BT, **TOL)
        planned += int((expected_BT != advantages_B.unsqueeze(1) * mask_BT).sum())
        assert 0.0 <= _log_entry(history, r0["step"])["hicra/planning_fraction"] <= 1.0
    assert planned > 0, "no planning token was amplified: the test proves nothing"


def test_stare_gate_reads_both_processes_and_selects_per_process(launched):
    """The gate's entropy is the mean over both ranks' tokens; the top-k runs on each rank's micro-batch alone."""
    ranks, history = _load(launched("ddp"), "stare")
    args, temperature = ranks[0]["args"], ranks[0]["temperature"]
    for r0, r1 in _paired_batches(ranks):
        entropies = [_entropy(_naive_logps(r0["policy_state"], r, temperature)) for r in (r0, r1)]
        masks = [r["completion_mask"].bool() for r in (r0, r1)]
        batch_entropy = torch.cat([e[m] for e, m in zip(entropies, masks)]).mean().item()
        entry = _log_entry(history, r0["step"])
        assert entry["stare/batch_entropy"] == pytest.approx(batch_entropy, abs=1e-4)
        assert entries_differ(entropies[0][masks[0]].mean().item(), batch_entropy)
        assert entry["stare/gate_on"] == 1.0
        for r in (r0, r1):
            logps = _naive_logps(r0["policy_state"], r, temperature)
            logps = logps.gather(-1, r["completion_ids"].unsqueeze(-1)).squeeze(-1)
            mask_BT = r["completion_mask"].bool()
            stare_settings = {name: value for name, value in args.items() if name.startswith("stare_")}
            expected_BT = stare_advantages(
                r["advantages_B"],
                mask_BT,
                policy_logps=logps,
                rollout_mean_entropy=torch.full(mask_BT.shape, batch_entropy),
                **stare_settings,
            ).advantages_BT
            torch.testing.assert_close(r["advantages_BT"], expected_BT, **TOL)


def entries_differ(a: float, b: float) -> bool:
    return abs(a - b) > 1e-4


# ------------------------------------------------------------------------------------------- engine-specific


def test_zero3_tide_finishes_when_one_process_has_no_valid_token(launched):
    """ZeRO-3, head partitioned: every completion of rank 1 masked, so each chunk of its deviation pass holds no
    valid position while rank 0 streams several one-token chunks. Both ranks ran every forward and head gather
    (the launch finished within its timeout), and the advantages and metrics are still the single-process ones."""
    ranks, history = _load(launched("zero3"), "tide_uneven")
    records = [rank["records"] for rank in ranks]
    assert len(records[0]) == len(records[1]) == ranks[0]["max_steps"]
    assert all(not r["completion_mask"].any() and not r["advantages_BT"].any() for r in records[1])
    assert all(r["completion_mask"].sum() > 1 for r in records[0])  # several one-token chunks on rank 0
    assert any(r["advantages_BT"].abs().sum() > 0 for r in records[0])
    assert ranks[0]["checksum"] == pytest.approx(ranks[1]["checksum"], abs=1e-9)
    assert {layout["shape"] for _, layout in ranks[1]["head_layouts"]} == {(0,)}
    # Only rank 0's tokens count, so the global statistic is rank 0's own: nothing to discriminate.
    check_tide(ranks, history, require_discriminating=False)


def test_fsdp2_sharded_tide_statistics_equal_unsharded(launched):
    """FSDP2 (`fully_shard` by hand, 2-rank CPU mesh): TIDE's helpers see the whole LM head and root parameters."""
    run_dir = launched("ddp")
    for rank in (0, 1):
        result = json.loads((run_dir / f"fsdp2_rank{rank}.json").read_text())
        assert result["head_was_sharded"] and result["local_head_rows"] < result["vocab"]
        assert result["resharded_after"]  # the root is sharded again after TIDE's statistics
        assert result["full_head_equal"]
        assert result["deviation_max_diff"] < 1e-5 and result["entropy_max_diff"] < 1e-5
        assert result["deviation_mean"] > 0.1  # distinct policy and reference: the comparison is not trivial
        # Rank 1 had no valid token: both ranks still finished the deviation pass; only rank 0 has values.
        assert (result["uneven_mask_rows"] > 0) == (rank == 0)
