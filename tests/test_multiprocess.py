"""Two processes (gloo, CPU) compute the same token advantages and log the same metrics as one process.

One `accelerate launch` of `tests/multiproc_worker.py` trains grpo, taco, eapo and tide for a few steps with two
processes and saves, per rank and per generation batch, the rows, the sequence advantages, the token advantages and
the policy weights. Here the two ranks' rows are concatenated and everything is recomputed in this single process
from full logits and `torch.quantile`, with the pure method functions: the token advantages must match row for row,
and every logged credit metric must equal the statistic over both ranks' tokens (and, for the checks to mean
something, differ from rank 0's own statistic).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import make_tiny_model, make_tiny_tokenizer

from trl_credit.methods import eapo_advantages, eapo_kappa_schedule, taco_advantages, taco_tail_risk, tide_advantages

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "tests" / "multiproc_worker.py"
TOL = dict(atol=1e-4, rtol=1e-4)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("multiproc")
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", str(_free_port()), str(WORKER), str(out),
    ]
    env = dict(
        os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
        CUDA_VISIBLE_DEVICES="", TRL_CREDIT_EXPECTED_ROOT=str(ROOT),
        # This checkout's trl_credit and the test helpers, ahead of any editable install of another checkout.
        PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]),
    )
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"worker failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    print(f"2-process launch took {time.perf_counter() - start:.1f} s")
    return out


def _load(run_dir, method):
    ranks = [torch.load(run_dir / f"{method}_rank{r}.pt", weights_only=False) for r in (0, 1)]
    history = json.loads((run_dir / f"{method}_log_history.json").read_text())
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
    nonzero_BT = mask_BT.bool() & (advantages_B != 0).unsqueeze(1)
    return (advantages_BT / torch.where(advantages_B != 0, advantages_B, 1.0).unsqueeze(1))[nonzero_BT]


def _check_weight_metrics(entry, prefix, advantages_B, advantages_BT, mask_BT):
    weights_N = _weights(advantages_B, advantages_BT, mask_BT)
    if weights_N.numel() == 0:  # every advantage is zero: no weight is defined, TRL logs None
        assert entry[f"{prefix}/mean_weight"] is None and entry[f"{prefix}/weight_max"] is None
        return
    assert entry[f"{prefix}/mean_weight"] == pytest.approx(weights_N.mean().item(), abs=1e-5)
    assert entry[f"{prefix}/weight_max"] == pytest.approx(weights_N.max().item(), abs=1e-5)
    assert entry[f"{prefix}/weight_std"] == pytest.approx(weights_N.std(unbiased=False).item(), abs=1e-4)
    valid = mask_BT.bool()
    assert entry["credit/adv_abs_mean"] == pytest.approx(advantages_BT[valid].abs().mean().item(), abs=1e-5)


def test_both_processes_trained_every_method_in_sync(run_dir):
    for method in ("grpo", "taco", "eapo", "tide"):
        ranks, history = _load(run_dir, method)
        assert ranks[0]["checksum"] == pytest.approx(ranks[1]["checksum"], abs=1e-9)  # DDP kept the replicas equal
        assert [e["step"] for e in history if "loss" in e] == [1, 2, 3]
        # Each rank generated its own half of every generation batch.
        for r0, r1 in _paired_batches(ranks):
            assert r0["prompt_ids"].size(0) == r1["prompt_ids"].size(0) == 4
            # TRL normalised the sequence advantages over the gathered batch: each group of 4 sums to ~0.
            both = torch.cat([r0["advantages_B"], r1["advantages_B"]])
            assert both.view(-1, 4).sum(-1).abs().max() < 1e-4


def test_eapo_two_processes_equal_single_process(run_dir):
    ranks, history = _load(run_dir, "eapo")
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
        expected_BT = eapo_advantages(advantages_B, entropy_BT, mask_BT, kappa=kappa, quantiles=args["eapo_quantiles"])
        got_BT = _concat(r0, r1, "advantages_BT")
        torch.testing.assert_close(got_BT, expected_BT, **TOL)

        entry = _log_entry(history, r0["step"])
        assert entry["eapo/q_lo"] == pytest.approx(q_lo, abs=1e-5)
        assert entry["eapo/q_hi"] == pytest.approx(q_hi, abs=1e-5)
        _check_weight_metrics(entry, "eapo", advantages_B, expected_BT, mask_BT)
        rank0_q_lo = torch.quantile(entropies[0][r0["completion_mask"].bool()], args["eapo_quantiles"][0]).item()
        discriminating |= abs(rank0_q_lo - q_lo) > 1e-4
    assert discriminating, "rank 0's own quantile never differed from the global one: the test proves nothing"


def test_taco_two_processes_equal_single_process(run_dir):
    ranks, history = _load(run_dir, "taco")
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
        expected_BT = taco_advantages(advantages_B, logp_BT, entropy_BT, mask_BT, alpha=alpha, lam=lam)
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
    assert discriminating, "rank 0's own tail fraction never differed from the global one: the test proves nothing"


def test_tide_two_processes_equal_single_process(run_dir):
    ranks, history = _load(run_dir, "tide")
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
            advantages_B, deviation_BT, entropy_BT, mask_BT, vocab, tau=args["tide_tau"], kappa=args["tide_kappa"]
        )
        torch.testing.assert_close(_concat(r0, r1, "advantages_BT"), expected_BT, **TOL)

        entry = _log_entry(history, r0["step"])
        valid = mask_BT.bool()
        assert entry["tide/mean_deviation"] == pytest.approx(deviation_BT[valid].mean().item(), abs=1e-5)
        _check_weight_metrics(entry, "tide", advantages_B, expected_BT, mask_BT)
        n0 = r0["completion_mask"].size(0)
        discriminating |= abs(deviation_BT[:n0][valid[:n0]].mean().item() - entry["tide/mean_deviation"]) > 1e-4
    assert discriminating, "rank 0's own mean deviation never differed from the global one: the test proves nothing"


def test_fsdp2_sharded_tide_statistics_equal_unsharded(run_dir):
    """FSDP2 (`fully_shard`, 2-rank CPU mesh): TIDE's helpers see the whole LM head and root parameters."""
    for rank in (0, 1):
        result = json.loads((run_dir / f"fsdp2_rank{rank}.json").read_text())
        assert result["head_was_sharded"] and result["local_head_rows"] < result["vocab"]
        assert result["resharded_after"]  # the root is sharded again after TIDE's statistics
        assert result["full_head_equal"]
        assert result["deviation_max_diff"] < 1e-5 and result["entropy_max_diff"] < 1e-5
        assert result["deviation_mean"] > 0.1  # distinct policy and reference: the comparison is not trivial
        # Rank 1 had no valid token: both ranks still finished the deviation pass; only rank 0 has values.
        assert (result["uneven_mask_rows"] > 0) == (rank == 0)
