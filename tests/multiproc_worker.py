"""Worker of `tests/test_multiprocess.py`, run by `accelerate launch --multi_gpu --num_processes 2` on CPU (gloo).

    accelerate launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no --dynamo_backend no \
        --main_process_port PORT tests/multiproc_worker.py OUT_DIR

(`accelerate launch --cpu` starts a single process unless mpirun is used; `--multi_gpu` starts two with
torchrun, and `use_cpu=True` makes accelerate pick the MULTI_CPU / gloo backend.)

One launch trains every method for a few steps on the tiny model, one after the other, and saves, per rank and per
generation batch, exactly what the trainer saw and produced: the rows, the sequence advantages, the statistics the
method read, the token advantages it returned, and (rank 0) the policy weights at that moment. Rank 0 also saves the
logged history. The test then recomputes everything single-process on the concatenation of both ranks' rows.

Finally it checks TIDE's statistics helpers on a model sharded with FSDP2 (`fully_shard` over a 2-rank CPU mesh)
against the unsharded model, and saves the differences.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

torch.set_num_threads(1)

from conftest import make_tiny_model, make_tiny_tokenizer, tiny_config, tiny_prompt_dataset  # noqa: E402

import trl_credit  # noqa: E402
from trl_credit import CreditGRPOTrainer  # noqa: E402
from trl_credit.statistics import hellinger_and_entropy  # noqa: E402

METHODS = ("grpo", "taco", "eapo", "tide")
STEPS = 3
ROW_KEYS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")


def char_reward(completions, **kwargs):
    """Varies within a group even when every completion has the maximal number of tokens."""
    return [float(len(c[0]["content"]) % 7) for c in completions]


def _cpu(tensor):
    return tensor.detach().to("cpu").clone()


class RecordingTrainer(CreditGRPOTrainer):
    """Saves what each credit hook received and returned; the computation itself is the parent's."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.records = []

    def _policy_state(self):
        if not self.accelerator.is_main_process:
            return None
        return {name: _cpu(value) for name, value in self.accelerator.unwrap_model(self.model).state_dict().items()}

    def _record(self, batch, advantages_BT, **stats):
        self.records.append(
            {
                "step": self.state.global_step,
                **{key: _cpu(batch[key]) for key in ROW_KEYS},
                "advantages_B": _cpu(batch["advantages"]),
                "advantages_BT": None if advantages_BT is None else _cpu(advantages_BT),
                "policy_state": self._policy_state(),
                **{name: _cpu(value) for name, value in stats.items()},
            }
        )

    def _generate_and_score_completions(self, inputs):
        batch = super()._generate_and_score_completions(inputs)
        if self.credit_method == "grpo":
            self._record(batch, None)
        return batch

    def _apply_credit(self, batch, methods, statistics, record_metrics=True):
        updates, statistic_BT = super()._apply_credit(batch, methods, statistics, record_metrics)
        if record_metrics:  # not the token-credit log's preview
            forward = {"logps_BT": statistics.get("policy_logps"), "entropy_BT": statistics.get("policy_entropy")}
            record = {**batch, "advantages": updates["credit_sequence_advantages"]}
            self._record(record, updates["advantages"], **{k: v for k, v in forward.items() if v is not None})
        return updates, statistic_BT


def train_all_methods(out: Path) -> None:
    tokenizer = make_tiny_tokenizer()
    for method in METHODS:
        args = tiny_config(
            method, out / method, max_steps=STEPS, taco_alpha=0.5,  # alpha 0.5: enough tail tokens to compare
        )
        trainer = RecordingTrainer(
            model=make_tiny_model(tokenizer), reward_funcs=char_reward, args=args,
            train_dataset=tiny_prompt_dataset(), processing_class=tokenizer,
        )
        assert trainer.accelerator.num_processes == 2, trainer.accelerator.state
        trainer.train()
        rank = trainer.accelerator.process_index
        reference_state = None
        if method == "tide" and rank == 0:
            reference = trainer.accelerator.unwrap_model(trainer.deviation_reference.model)
            reference_state = {name: _cpu(value) for name, value in reference.state_dict().items()}
        checksum = sum(p.detach().double().sum().item() for p in trainer.model.parameters())
        torch.save(
            {"records": trainer.records, "reference_state": reference_state, "checksum": checksum,
             "temperature": trainer.temperature, "args": {"taco_alpha": args.taco_alpha, "taco_lambda": args.taco_lambda,
             "eapo_kappa": args.eapo_kappa, "eapo_quantiles": args.eapo_quantiles, "tide_tau": args.tide_tau,
             "tide_kappa": args.tide_kappa}},
            out / f"{method}_rank{rank}.pt",
        )
        if rank == 0:
            (out / f"{method}_log_history.json").write_text(json.dumps(trainer.state.log_history))
        trainer.accelerator.wait_for_everyone()


@torch.no_grad()
def check_fsdp2_tide_helpers(out: Path, rank: int) -> None:
    """TIDE's `final_hidden` + `full_lm_head` on an FSDP2-sharded policy/reference equal the unsharded result."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from trl_credit.trainer.engines import final_hidden, full_lm_head, unsharded_root

    tokenizer = make_tiny_tokenizer()
    plain_policy, plain_reference = make_tiny_model(tokenizer, seed=1), make_tiny_model(tokenizer, seed=2)
    policy, reference = make_tiny_model(tokenizer, seed=1), make_tiny_model(tokenizer, seed=2)
    mesh = init_device_mesh("cpu", (2,))
    for model in (policy, reference):  # TRL/accelerate's TRANSFORMER_BASED_WRAP: each decoder layer, then the root
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    input_ids = torch.tensor([[7, 30, 31, 40, 41, 42, 43], [7, 50, 51, 52, 53, 54, 55]])
    attention_mask = torch.ones_like(input_ids)

    def statistics(policy_model, reference_model):
        with unsharded_root(policy_model), unsharded_root(reference_model):
            hidden = final_hidden(policy_model, input_ids=input_ids, attention_mask=attention_mask).flatten(0, 1)
            ref_hidden = final_hidden(reference_model, input_ids=input_ids, attention_mask=attention_mask).flatten(0, 1)
            with full_lm_head(policy_model) as (weight, bias), full_lm_head(reference_model) as (ref_weight, ref_bias):
                return hellinger_and_entropy(hidden, ref_hidden, weight, ref_weight, bias, ref_bias, vocab_chunk_size=32)

    head_was_sharded = isinstance(policy.lm_head.weight, DTensor)
    local_rows = policy.lm_head.weight.to_local().shape[0]
    deviation, entropy = statistics(policy, reference)
    want_deviation, want_entropy = statistics(plain_policy, plain_reference)
    # Outside the context the root is sharded again; the head alone is gathered by `full_lm_head`.
    with full_lm_head(policy) as (weight, _):
        full_head_equal = torch.equal(weight, plain_policy.lm_head.weight)
    uneven = _uneven_mask_statistics(policy, reference, input_ids, rank)
    result = {
        "uneven_mask_rows": uneven,
        "head_was_sharded": head_was_sharded,
        "local_head_rows": local_rows,
        "vocab": plain_policy.lm_head.weight.shape[0],
        "resharded_after": isinstance(policy.lm_head.weight, DTensor),
        "full_head_equal": full_head_equal,
        "deviation_max_diff": (deviation - want_deviation).abs().max().item(),
        "entropy_max_diff": (entropy - want_entropy).abs().max().item(),
        "deviation_mean": want_deviation.mean().item(),
    }
    (out / f"fsdp2_rank{rank}.json").write_text(json.dumps(result))


def _uneven_mask_statistics(policy, reference, input_ids, rank):
    """The trainer's deviation pass on FSDP2-sharded models, rank 1 holding no valid token at all: it must finish
    (every rank runs the same forwards and head gathers) and rank 0's values must be right."""
    from contextlib import nullcontext
    from types import SimpleNamespace

    from trl_credit.trainer.sources import deviation_and_entropy

    batch = {
        "prompt_ids": input_ids[:, :3], "prompt_mask": torch.ones_like(input_ids[:, :3]),
        "completion_ids": input_ids[:, 3:], "completion_mask": torch.ones_like(input_ids[:, 3:]) * (rank == 0),
    }
    context = SimpleNamespace(  # what the function reads of the trainer; one row per chunk: two chunks per rank
        accelerator=SimpleNamespace(unwrap_model=lambda model: model), model=policy, temperature=1.0,
        args=SimpleNamespace(gradient_checkpointing_kwargs=None, statistics_token_chunk_size=4, statistics_vocab_chunk_size=32),
        _forward_batch_size=lambda: 1,
    )
    reference_side = SimpleNamespace(model_and_context=lambda: (reference, nullcontext()))
    deviation_BT, _ = deviation_and_entropy(context, batch, reference_side)
    return int((deviation_BT > 0).sum())


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    expected_root = os.environ.get("TRL_CREDIT_EXPECTED_ROOT")
    if expected_root and not Path(trl_credit.__file__).resolve().is_relative_to(Path(expected_root).resolve()):
        raise RuntimeError(f"imported trl_credit from {trl_credit.__file__}, not from {expected_root}")
    train_all_methods(out)
    from accelerate import PartialState

    check_fsdp2_tide_helpers(out, PartialState().process_index)


if __name__ == "__main__":
    main()
