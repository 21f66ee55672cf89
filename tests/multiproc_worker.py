"""Worker of `tests/test_multiprocess.py`: 2 CPU processes (gloo) train every method under one distributed engine.

    accelerate launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no --dynamo_backend no \
        --main_process_port PORT tests/multiproc_worker.py OUT_DIR ddp
    accelerate launch --config_file ZERO3.yaml --num_processes 2 --main_process_port PORT \
        tests/multiproc_worker.py OUT_DIR zero3                                          # zero2, zero3, fsdp2
    accelerate launch --multi_gpu ... tests/multiproc_worker.py OUT_DIR registry CASE [CASE ...]

(`accelerate launch --cpu` starts a single process unless mpirun is used; `--multi_gpu` starts two with
torchrun, and `use_cpu=True` makes accelerate pick the MULTI_CPU / gloo backend. The DeepSpeed and FSDP2 configs,
written by the test, say `use_cpu: true` as well.)

One launch trains grpo, taco, eapo and tide for a few steps on the tiny model, one after the other, and saves, per
rank and per generation batch, exactly what the trainer saw and produced: the rows, the sequence advantages, the
statistics the method read, the token advantages it returned, and the policy weights at generation time (gathered
whole under ZeRO-3 and FSDP2). Rank 0 also saves the logged history. The test then recomputes everything
single-process on the concatenation of both ranks' rows.

* `ddp`: then checks TIDE's statistics helpers on a model sharded with FSDP2 (`fully_shard` over a 2-rank CPU
  mesh) against the unsharded model, and saves the differences.
* `registry` (DDP): trains each named case (a registered method or a `+` stack, in the settings where it moves
  credit, `trainer_helpers.moving_settings`) with one group of 8 completions spread over both processes, under
  `trainer_helpers.AdvantageRecorder` on each process: its generation stage runs on both processes' rows (gathered
  here), its training-forward stage on this process's micro-batch. Each process saves what it checked and every
  difference it found (kept, not raised: a process that stopped would leave the other waiting in a collective).
* `zero3`: records, at every generation batch and every credit computation, that the policy's LM head is
  partitioned (the test's DeepSpeed config sets `stage3_param_persistence_threshold: 0`), then trains TIDE once
  more with every completion of rank 1 masked (`tide_uneven`): rank 1 has no valid token in any chunk of the
  deviation pass while rank 0 has several, and the run must still finish.
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

import pytest  # noqa: E402
from conftest import make_tiny_model, make_tiny_tokenizer, tiny_config, tiny_trainer  # noqa: E402
from trainer_helpers import TwoProcessRecorder, moving_settings  # noqa: E402
from trl import GRPOTrainer  # noqa: E402

import trl_credit  # noqa: E402
from trl_credit import CreditGRPOTrainer  # noqa: E402
from trl_credit.methods import CREDIT_METHODS  # noqa: E402
from trl_credit.trainer.lm_head_statistics import hellinger_and_entropy  # noqa: E402

METHODS = ("grpo", "taco", "eapo", "tide")
ENGINES = ("ddp", "zero2", "zero3", "fsdp2", "registry")
STEPS = {"ddp": 3, "zero2": 2, "zero3": 2, "fsdp2": 2, "registry": 2}
ROW_KEYS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "credit_group_index", "credit_rewards")
# Under DDP only (they add a launch's worth of time): OTB with every group spread over both processes, STARE with its
# gate on (the tiny model's entropy is far above the paper's 0.3-nat target).
DDP_ONLY = {
    "otb": {"num_generations": 8},
    "stare": {"stare_target_entropy": 100.0, "stare_variant": "C2", "stare_top_p_ratio": 0.3},
    # GTPO with every group spread over both processes; a cooler sampling makes completions share their first tokens.
    "gtpo": {"num_generations": 8, "gtpo_entropy_threshold": 10.0, "temperature": 0.3},
    "hicra": {"num_generations": 8, "hicra_grams": ["1", "2", "3", "the", "so then"]},
}


def char_reward(completions, **kwargs):
    """Varies within a group even when every completion has the maximal number of tokens."""
    return [float(len(c[0]["content"]) % 7) for c in completions]


def _cpu(tensor):
    return tensor.detach().to("cpu").clone()


def full_state_dict(model) -> dict[str, torch.Tensor]:
    """The whole state dict on every process: ZeRO-3 partitions are gathered, FSDP2 DTensors assembled (collective
    under both, so every process calls it at the same point)."""
    from torch.distributed.tensor import DTensor

    params = list(model.parameters())
    if any(hasattr(p, "ds_id") for p in params):
        import deepspeed

        with deepspeed.zero.GatheredParameters(params):
            return {name: _cpu(value) for name, value in model.state_dict().items()}
    return {
        name: _cpu(value.full_tensor() if isinstance(value, DTensor) else value)
        for name, value in model.state_dict().items()
    }


def head_layout(model) -> dict:
    """How the LM head's weight is stored on this process right now."""
    from torch.distributed.tensor import DTensor

    weight = model.get_output_embeddings().weight
    layout = {"shape": tuple(weight.shape), "ds_shape": tuple(getattr(weight, "ds_shape", ())), "dtensor": False}
    if isinstance(weight, DTensor):
        layout.update(dtensor=True, local_shape=tuple(weight.to_local().shape))
    return layout


class RecordingTrainer(CreditGRPOTrainer):
    """Saves what each credit hook received and returned; the computation itself is the parent's."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.records = []
        self.head_layouts = []  # (where, layout) at every generation batch and credit computation
        self._generation_policy = None

    def _unwrapped(self):
        return self.accelerator.unwrap_model(self.model)

    def _record(self, batch, advantages_BT, **stats):
        self.records.append(
            {
                "step": self.state.global_step,
                **{key: _cpu(batch[key]) for key in ROW_KEYS},
                "advantages_B": _cpu(batch["advantages"]),
                "advantages_BT": None if advantages_BT is None else _cpu(advantages_BT),
                # On-policy with one micro-batch per generation batch: also the policy of the training forward.
                "policy_state": self._generation_policy if self.accelerator.is_main_process else None,
                **{name: _cpu(value) for name, value in stats.items()},
            }
        )

    def _generate_and_score_completions(self, inputs):
        self.head_layouts.append(("generation", head_layout(self._unwrapped())))
        self._generation_policy = full_state_dict(self._unwrapped())  # every process: a collective when sharded
        batch = super()._generate_and_score_completions(inputs)
        if self.args.credit_method == "grpo":
            self._record(batch, None)
        return batch

    def _credit_stage(self, batch, steps, statistics, last_stage, record_metrics=True):
        self.head_layouts.append(("credit", head_layout(self._unwrapped())))
        credit = super()._credit_stage(batch, steps, statistics, last_stage, record_metrics)
        statistics = {**{name: batch[key] for name, key in self.stage_plan.batch_statistics.items()}, **statistics}
        if record_metrics:  # not the token-credit log's preview
            forward = {
                "logps_BT": statistics.get("policy_logps"),
                "entropy_BT": statistics.get("policy_entropy"),
                "unsampled_mass_BT": statistics.get("rollout_unsampled_mass"),
                "unsampled_sum_sq_probs_BT": statistics.get("rollout_unsampled_sum_sq_probs"),
                "rollout_logps_BT": statistics.get("rollout_logps"),
                "rollout_entropy_BT": statistics.get("rollout_entropy"),
            }
            record = {**batch, "advantages": credit.batch.sequence_advantages_B}
            self._record(record, credit.batch.advantages_BT, **{k: v for k, v in forward.items() if v is not None})
        return credit


class _MaskRankOneCompletions(GRPOTrainer):
    """Rank 1's completions all masked once TRL has built the batch, before any credit statistic: what TRL's
    `mask_truncated_completions` does to a process whose completions are all truncated (the loss normaliser is
    recounted the same way)."""

    def _generate_and_score_completions(self, inputs):
        batch = super()._generate_and_score_completions(inputs)
        if self.accelerator.process_index == 1:
            batch["completion_mask"] = torch.zeros_like(batch["completion_mask"])
        batch["num_items_in_batch"] = self.accelerator.gather(batch["completion_mask"].sum()).sum()
        return batch


class UnevenRecordingTrainer(RecordingTrainer, _MaskRankOneCompletions):
    """`RecordingTrainer` above `CreditGRPOTrainer` above the masking layer above TRL's `GRPOTrainer`."""


def train_registry_case(out: Path, case: str) -> None:
    """One path case on two processes under `TwoProcessRecorder`; what each process checked goes to a JSON file."""
    tokenizer = make_tiny_tokenizer()
    rank = int(os.environ["RANK"])
    result = {"failures": []}
    with pytest.MonkeyPatch.context() as monkeypatch:
        try:
            args = tiny_config(
                case, out / case, max_steps=STEPS["registry"], num_generations=8, **moving_settings(case)
            )
            trainer = tiny_trainer(args, tokenizer=tokenizer, reward_funcs=char_reward)
            recorder = TwoProcessRecorder(monkeypatch, trainer)
            trainer.train()
            final_state = full_state_dict(trainer.accelerator.unwrap_model(trainer.model))
            result.update(
                failures=recorder.failures,
                checked_batches=recorder.checked_batches,
                expected_batches=args.max_steps * args.gradient_accumulation_steps,
                max_difference=recorder.max_difference,
                moved_tokens=recorder.moved_tokens,
                valid_tokens=recorder.valid_tokens,
                ill_conditioned=recorder.ill_conditioned,
                checksum=sum(value.double().sum().item() for value in final_state.values()),
            )
        except Exception as error:  # raised on both processes alike (a config error): the next case still runs
            result["failures"].append(f"{type(error).__name__}: {error}"[:2000])
    (out / f"registry_{case}_rank{rank}.json").write_text(json.dumps(result))


def train_method(out: Path, engine: str, method: str, run_name: str | None = None, uneven: bool = False) -> None:
    run_name = run_name or method
    tokenizer = make_tiny_tokenizer()
    overrides = dict(max_steps=STEPS[engine])
    if method == "taco":
        overrides.update(taco_alpha=0.5)  # enough tail tokens to compare
    overrides.update(DDP_ONLY.get(method, {}))
    if uneven:  # one-token chunks: rank 0 streams several, rank 1 none
        overrides.update(statistics_token_chunk_size=1)
    args = tiny_config(method, out / run_name, **overrides)
    trainer_class = UnevenRecordingTrainer if uneven else RecordingTrainer
    trainer = tiny_trainer(args, trainer_class, tokenizer=tokenizer, reward_funcs=char_reward)
    accelerator = trainer.accelerator
    assert accelerator.num_processes == 2, accelerator.state
    engine_info = {"name": engine, "distributed_type": str(accelerator.distributed_type.value)}
    if engine.startswith("zero"):
        assert trainer.is_deepspeed_enabled
        engine_info["zero_stage"] = accelerator.state.deepspeed_plugin.zero_stage
    if engine == "fsdp2":
        assert trainer.is_fsdp_enabled and accelerator.state.fsdp_plugin.fsdp_version == 2
        engine_info["fsdp_version"] = 2
    trainer.train()
    rank = accelerator.process_index
    reference_state = None
    if method == "tide":  # every process: gathering a partitioned or sharded reference is collective
        reference_state = full_state_dict(accelerator.unwrap_model(trainer.deviation_reference.model))
        engine_info["reference_head"] = head_layout(accelerator.unwrap_model(trainer.deviation_reference.model))
        if rank != 0:
            reference_state = None
    final_state = full_state_dict(trainer._unwrapped())
    checksum = sum(value.double().sum().item() for value in final_state.values())
    torch.save(
        {
            "records": trainer.records,
            "reference_state": reference_state,
            "checksum": checksum,
            "engine": engine_info,
            "max_steps": args.max_steps,
            "head_layouts": trainer.head_layouts,
            "temperature": trainer.temperature,
            "args": {
                name: value
                for m in ("taco", "eapo", "tide", *DDP_ONLY)
                for name, value in CREDIT_METHODS[m]
                .hyperparameters(
                    {k: v for k, v in (args.credit_kwargs or {}).items() if k in CREDIT_METHODS[m].argument_names}
                )
                .items()
            },
        },
        out / f"{run_name}_rank{rank}.pt",
    )
    if rank == 0:
        (out / f"{run_name}_log_history.json").write_text(json.dumps(trainer.state.log_history))
    accelerator.wait_for_everyone()
    del trainer


@torch.no_grad()
def check_fsdp2_tide_helpers(out: Path, rank: int) -> None:
    """TIDE's `final_hidden` + `full_lm_head` on an FSDP2-sharded policy/reference equal the unsharded result."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from trl_credit.trainer.model_parts import final_hidden, full_lm_head, unsharded_root

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
            ref_hidden = final_hidden(reference_model, input_ids=input_ids, attention_mask=attention_mask).flatten(
                0, 1
            )
            with full_lm_head(policy_model) as (weight, bias), full_lm_head(reference_model) as (ref_weight, ref_bias):
                return hellinger_and_entropy(
                    hidden, ref_hidden, weight, ref_weight, bias, ref_bias, vocab_chunk_size=32
                )

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
    from collections import Counter
    from contextlib import nullcontext
    from types import SimpleNamespace

    from trl_credit.trainer.statistics_sources import StatisticsSources

    batch = {
        "prompt_ids": input_ids[:, :3],
        "prompt_mask": torch.ones_like(input_ids[:, :3]),
        "completion_ids": input_ids[:, 3:],
        "completion_mask": torch.ones_like(input_ids[:, 3:]) * (rank == 0),
    }
    # What the deviation pass reads of the trainer; one row per chunk: two chunks per rank.
    context = StatisticsSources()
    context.accelerator = SimpleNamespace(unwrap_model=lambda model: model)
    context.model = policy
    context.temperature = 1.0
    context.args = SimpleNamespace(
        gradient_checkpointing_kwargs=None, statistics_token_chunk_size=4, statistics_vocab_chunk_size=32
    )
    context._forward_batch_size = lambda: 1
    context.forward_counts = Counter()  # the deviation pass counts its forwards there
    context.deviation_reference = SimpleNamespace(model_and_context=lambda policy: (reference, nullcontext()))
    deviation_BT, _ = context._deviation_and_entropy(batch)
    return int((deviation_BT > 0).sum())


def allow_fsdp_on_cpu() -> None:
    """Let accelerate's FSDP path run on CPU processes (gloo).

    Accelerate turns `ACCELERATE_USE_FSDP` into `DistributedType.FSDP` only for accelerator device types
    (`MULTI_GPU`, `MULTI_XPU`, ...), never for `MULTI_CPU`, so on a CPU machine it would silently train with DDP.
    This keeps everything else of accelerate's FSDP2 path (its plugin from the launch config, `fsdp2_prepare_model`,
    TRL's `prepare_fsdp` for TIDE's reference) and only promotes the CPU processes' state to FSDP.
    """
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    original_init = AcceleratorState.__init__

    def init(self, *args, fsdp_plugin=None, **kwargs):
        original_init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = fsdp_plugin
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    AcceleratorState.__init__ = init


def main() -> None:
    out = Path(sys.argv[1])
    engine = sys.argv[2] if len(sys.argv) > 2 else "ddp"
    if engine not in ENGINES:
        raise SystemExit(f"unknown engine {engine!r}; one of {ENGINES}")
    out.mkdir(parents=True, exist_ok=True)
    expected_root = os.environ.get("TRL_CREDIT_EXPECTED_ROOT")
    if expected_root and not Path(trl_credit.__file__).resolve().is_relative_to(Path(expected_root).resolve()):
        raise RuntimeError(f"imported trl_credit from {trl_credit.__file__}, not from {expected_root}")
    if engine == "registry":
        for case in sys.argv[3:]:
            train_registry_case(out, case)
        return
    if engine.startswith("zero"):
        import deepspeed

        # Pure gloo: skips DeepSpeed's shared-memory comm op, which it would first compile with g++ (1-2 min).
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    if engine == "fsdp2":
        allow_fsdp_on_cpu()
    for method in METHODS:
        train_method(out, engine, method)
    if engine == "zero3":
        train_method(out, engine, "tide", run_name="tide_uneven", uneven=True)
    if engine == "ddp":
        from accelerate import PartialState

        for method in DDP_ONLY:
            train_method(out, engine, method)
        check_fsdp2_tide_helpers(out, PartialState().process_index)


if __name__ == "__main__":
    main()
    # A gloo group still alive at interpreter shutdown can abort the process after every case passed ("terminate
    # called without an active exception", pytorch#190489); the CLI ends its trainer the same way.
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
