"""The scaling and official-code benchmarks: every registered method runs in them, the memory probe measures what a
call allocates, and the official functions are taken out of a clone's files as they are written there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import PACKAGE_METHODS

from trl_credit.methods import CREDIT_METHODS

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture
def benchmarks(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import _method_inputs
    import official
    import scaling

    return _method_inputs, scaling, official


@pytest.mark.parametrize("name", PACKAGE_METHODS)
def test_scaling_runs_every_registered_method_on_its_own_statistics(benchmarks, name):
    _method_inputs, scaling, _ = benchmarks
    calls = scaling.method_calls(8, 32, 4)
    assert set(calls) == {"floor", *CREDIT_METHODS}
    result = calls[name]()
    assert result.advantages_BT.shape == (8, 32) and torch.isfinite(result.advantages_BT).all()
    _, _, named = _method_inputs.method_batch(8, 32, 4)
    method = CREDIT_METHODS[name]
    given = _method_inputs.arguments_for(method, named)
    from trl_credit.methods.batch import STATISTICS

    assert {k for k in given if k in STATISTICS} == set(method.statistics_for(method.hyperparameters()))


def test_memory_probe_measures_an_allocation(benchmarks):
    """In a process with the benchmark's allocator settings, a call that holds 64 MiB reads as 64 MiB (+ page noise),
    one that allocates nothing as about 0."""
    _method_inputs, _, _ = benchmarks
    script = textwrap.dedent(
        f"""
        import json, sys, torch
        sys.path.insert(0, {str(BENCHMARKS)!r})
        from _method_inputs import extra_peak_bytes
        held = extra_peak_bytes(lambda: torch.ones(16 * 2**20))  # 16 Mi floats = 64 MiB
        freed = extra_peak_bytes(lambda: float(torch.ones(16 * 2**20).sum()))  # freed before the probe returns
        nothing = extra_peak_bytes(lambda: None)
        print(json.dumps([held, freed, nothing]))
        """
    )
    env = {**os.environ, **_method_inputs.MEMORY_ENV}
    output = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    held, freed, nothing = json.loads(output.stdout.strip().splitlines()[-1])
    mib = 2**20
    assert 64 * mib <= held < 72 * mib and 64 * mib <= freed < 72 * mib  # the peak counts, freed or not
    assert nothing < 2 * mib


def test_official_functions_are_extracted_from_the_clone_as_written(benchmarks, tmp_path):
    _, _, official = benchmarks
    source = tmp_path / "core_algos.py"
    source.write_text(
        textwrap.dedent(
            """
            import verl_only_module  # never imported by the benchmark
            SCALE: float = 3.0

            @register_adv_est("x")  # verl's registry: dropped
            @torch.no_grad()
            def weighted(values: torch.Tensor, config: ActorConfig) -> torch.Tensor:
                return values * SCALE + config["shift"]

            def unrelated():
                raise AssertionError
            """
        )
    )
    namespace = official.extract(source, ["SCALE", "weighted"], {"torch": torch})
    values = torch.tensor([1.0, -2.0], requires_grad=True)
    out = namespace["weighted"](values, {"shift": 0.5})
    assert out.tolist() == [3.5, -5.5] and not out.requires_grad  # torch.no_grad kept
    assert "unrelated" not in namespace
    with pytest.raises(SystemExit, match=r"no top-level \['missing'\]"):
        official.extract(source, ["missing"], {})


def test_actor_blocks_run_as_functions_of_the_loop_variables(benchmarks, tmp_path):
    _, _, official = benchmarks
    actor = tmp_path / "dp_actor.py"
    actor.write_text(
        textwrap.dedent(
            """
            class Actor:
                def update_policy(self, advantages, response_mask, old_log_prob):
                    if adv_reweight_enable:
                        print("a different block under the same flag, which changes no loop variable")
                    for step in range(2):
                        if adv_reweight_enable:
                            advantages = advantages * (0.5 + 0.5 * old_log_prob.exp())
                        elif tampo_mask_enable:
                            response_mask = response_mask * 0
            """
        )
    )
    block = official.actor_block(actor, "adv_reweight_enable", {"torch": torch})
    arguments = dict.fromkeys(official.BLOCK_ARGUMENTS)
    logp = torch.log(torch.tensor([0.5, 1.0]))
    arguments.update(advantages=torch.tensor([2.0, 2.0]), old_log_prob=logp, response_mask=torch.ones(2))
    advantages, mask = block(**arguments)
    assert advantages.tolist() == [1.5, 2.0] and mask.tolist() == [1.0, 1.0]
    tampo = official.actor_block(actor, "tampo_mask_enable", {"torch": torch})
    assert tampo(**arguments)[1].tolist() == [0.0, 0.0]
    with pytest.raises(SystemExit, match="no `if stapo_enable` block"):
        official.actor_block(actor, "stapo_enable", {})


def test_a_missing_clone_is_named_with_its_clone_command(benchmarks, tmp_path):
    _, _, official = benchmarks
    with pytest.raises(SystemExit, match="git clone https://github.com/xiuyilou/TACO"):
        official.official_functions(tmp_path)


def test_guard_benchmark_times_the_trainers_guard_hooks(monkeypatch):
    """`guard_overhead.py` times the guard's two hooks as the trainer calls them: on a non-finite gradient they stop
    training, so what it reports is the cost of the checks that run."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import guard_overhead

    from trl_credit.trainer.run_safety import NonFiniteTrainingError

    ratios = guard_overhead.main(["--model", "tiny", "--no-write", "--repeats", "2"])
    assert 0 < ratios["guard"] < 1 and 0.5 < ratios["step-again"] < 2
    model, optimizer, input_ids = guard_overhead.build("tiny", 1, 4)
    step, guard_hooks = guard_overhead.timed_parts(model, optimizer, input_ids)
    step()
    guard_hooks()  # finite
    next(model.parameters()).grad[0] = float("nan")
    with pytest.raises(NonFiniteTrainingError, match="the gradient norm is not finite"):
        guard_hooks()


@pytest.fixture
def paper_scale(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import _fake_scale
    import paper_scale

    return _fake_scale, paper_scale


def test_paper_scale_counts_what_an_operation_allocates_on_real_and_fake_tensors(paper_scale):
    """A new tensor counts its bytes until it is freed, a view nothing; a fake tensor the same bytes as a real one."""
    _fake_scale, _ = paper_scale
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    for limit in (None, 1 << 20):  # all real; anything above 1 MiB fake
        with _fake_scale.measured(fake_mode, real_limit=limit) as cost:
            kept = torch.ones(1024, 1024)  # 4 MiB
            view = kept.t()
            freed = kept * 2  # 4 MiB more, then freed
            del freed
        assert isinstance(kept, FakeTensor) == (limit is not None) and view.shape == (1024, 1024)
        assert (cost.peak, cost.held) == (8 << 20, 4 << 20)


def test_paper_scale_zeroes_a_real_buffer_that_fake_values_are_copied_into(paper_scale):
    """Fake values written into a real buffer write nothing: the buffer must read the same on every run (zeros), or a
    recorder's `torch.equal` of two such buffers depends on the memory they reused (a flaky cost)."""
    _fake_scale, _ = paper_scale
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    garbage = torch.full((64, 64), float("nan"))
    del garbage  # its memory is free for the next allocation of that size
    with _fake_scale.measured(fake_mode, real_limit=1 << 20):
        buffer = torch.empty(64, 64)
        buffer.copy_(torch.ones(2048, 1024)[:64, :64])  # the source is fake (8 MiB): nothing is written
    assert not isinstance(buffer, FakeTensor) and torch.equal(buffer, torch.zeros(64, 64))


def test_paper_scale_measures_the_same_on_fake_and_on_real_tensors(paper_scale):
    """TIDE's statistics (reference forward, both LM heads gathered and streamed) and the logit-gap stream, run by the
    package's own code on a tiny model: the fake run counts the same bytes and FLOPs as the real one."""
    _, paper_scale = paper_scale
    from torch._subclasses.fake_tensor import FakeTensorMode

    runs = [
        paper_scale.sources_costs(
            paper_scale.TINY_MODEL,
            (2, 2, 2),
            ["grpo", "tide", "minp_support"],
            FakeTensorMode(allow_non_fake_inputs=True),
            64,
            16,
            real=real,
        )
        for real in (False, True)
    ]
    fake, real = runs
    assert fake["tide"]["statistics"].flops > 0 and fake["minp_support"]["logit_gap"].peak > 0
    for name in fake:
        for phase, cost in fake[name].items():
            other = real[name][phase]
            if phase == "reference_bytes":
                assert cost == other > 0
                continue
            assert (cost.peak, cost.held, cost.flops) == (other.peak, other.held, other.flops), (name, phase)


def test_paper_scale_tiny_run_covers_every_registered_method(tmp_path):
    output = subprocess.run(
        [sys.executable, str(BENCHMARKS / "paper_scale.py"), "--tiny"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout
    table = output.split("added TFLOP |")[1].split("\n\n")[0]  # the table of added costs
    rows = {line.split("|")[1].strip(" `"): line for line in table.splitlines() if line.startswith("| `")}
    assert set(rows) == set(PACKAGE_METHODS)
    assert "(generation statistics)" in rows["tide"] and "(logit-gap stream)" in rows["minp_support"]
