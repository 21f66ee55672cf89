"""EAPO's motivating observation on a real model: does resampling from a high-entropy position change the outcome more?

    python benchmarks/eapo_resample.py                      # 24 problems x 4 continuations per cut, ~6 min
    python benchmarks/eapo_resample.py --problems 8 --continuations 2 --max_new_tokens 32   # a quick look

No training. SmolLM2-135M-Instruct (offline, `trl_credit.data.models`) answers `--problems` two-term chain sums
(`trl_credit.data`, test split) once each, sampled at `--temperature` (0.7; no top-k/top-p). For each response, the
full-vocabulary entropy of the sampling distribution at every response token is taken from one forward; the response is cut at
its highest-entropy token (the first and last tokens excluded) and, separately, at the lowest-entropy token within 4
tokens of it (so both branches redraw about as much of the response), and `--continuations` continuations are
sampled from each cut (the cut token itself resampled). Each continuation is graded like the original
(`trl_credit.rewards.check_answers`: the boxed answer, else the last number).

Reported, separately for originally correct and incorrect responses: the success rate of the continuations from
each branch point, and the paired difference high - low per response, each as mean ± 95 % t interval over
responses. EAPO (arXiv 2609.33781, Qwen3-4B-Base) reports -18.8 points for correct responses and +9.3 for
incorrect ones: high-entropy tokens are where a correct response could have gone wrong, and an incorrect one right.
Stores the run as the line of `results/eapo_resample.jsonl` whose `page` is `--page` (default
`docs/eapo_resample/report.md`), and renders that page.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _results  # noqa: E402

EXPERIMENT = "eapo_resample"  # results/eapo_resample.jsonl
WINDOW = 4  # tokens between the high- and the low-entropy cut, at most


def _sample(
    model, tokenizer, prefixes: list[list[int]], max_new_tokens: list[int], seed: int, temperature: float
) -> list[list[int]]:
    """One sampled continuation per prefix (left-padded batch), each cut at its own budget and at the first eos."""
    import torch

    torch.manual_seed(seed)
    width = max(len(p) for p in prefixes)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prefixes])
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prefixes])
    with torch.no_grad():
        output = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            do_sample=True,
            temperature=temperature,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max(max_new_tokens),
            pad_token_id=pad,
            eos_token_id=tokenizer.eos_token_id,
        )
    continuations = []
    for row, budget in zip(output[:, width:].tolist(), max_new_tokens):
        row = row[:budget]
        continuations.append(row[: row.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in row else row)
    return continuations


def _entropies(model, prompt_ids: list[int], response_ids: list[int], temperature: float) -> list[float]:
    """Entropy (nats) of the policy's sampling distribution (at `temperature`) at each response token."""
    import torch

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt_ids + response_ids])).logits[0].float() / temperature
    logps = torch.log_softmax(logits[len(prompt_ids) - 1 : len(prompt_ids) + len(response_ids) - 1], dim=-1)
    return (-(logps.exp() * logps).sum(-1)).tolist()


def _graded(tokenizer, golds: list[str], rows: list[list[int]]) -> list[bool]:
    from trl_credit.rewards import check_answers

    texts = tokenizer.batch_decode(rows, skip_special_tokens=True)
    return [check.correct for check in check_answers(texts, golds)]


def run(args) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_credit.data import load_math_dataset, smollm2_135m_instruct_path

    torch.set_num_threads(args.threads)
    path = smollm2_135m_instruct_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    rows = load_math_dataset("chain_sum", split="test", num_samples=args.problems, seed=args.seed)
    prompts = [tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True) for row in rows]
    prompts = [list(p["input_ids"]) if isinstance(p, dict) or hasattr(p, "keys") else list(p) for p in prompts]
    golds = [str(row["solution"]) for row in rows]

    responses = _sample(
        model, tokenizer, prompts, [args.max_new_tokens] * len(prompts), seed=args.seed, temperature=args.temperature
    )
    correct = _graded(tokenizer, golds, responses)
    records = []
    for index, (prompt, response, gold, ok) in enumerate(zip(prompts, responses, golds, correct)):
        if len(response) < 4:
            continue  # no two branch points
        entropies = _entropies(model, prompt, response, args.temperature)
        # Branch points: not the first token (its entropy is the opening's, and a cut there redraws everything), not
        # the last (eos or the budget's end). The low-entropy cut is taken within WINDOW tokens of the high one, so
        # the two branches redraw about as much of the response.
        candidates = range(1, len(response) - 1)
        high = max(candidates, key=entropies.__getitem__)
        nearby = [t for t in candidates if t != high and abs(t - high) <= WINDOW]
        low = min(nearby, key=entropies.__getitem__)
        prefixes, budgets = [], []
        for cut in (high, low):
            prefixes += [prompt + response[:cut]] * args.continuations
            budgets += [args.max_new_tokens - cut] * args.continuations
        continuations = _sample(
            model, tokenizer, prefixes, budgets, seed=args.seed * 100_000 + index, temperature=args.temperature
        )
        full = [response[: high if i < args.continuations else low] + c for i, c in enumerate(continuations)]
        grades = _graded(tokenizer, [gold] * len(full), full)
        records.append(
            {
                "problem": index,
                "correct": ok,
                "length": len(response),
                "high": {
                    "position": high,
                    "entropy": entropies[high],
                    "success": sum(grades[: args.continuations]) / args.continuations,
                },
                "low": {
                    "position": low,
                    "entropy": entropies[low],
                    "success": sum(grades[args.continuations :]) / args.continuations,
                },
            }
        )
        print(
            f"eapo_resample: problem {index} ({'correct' if ok else 'incorrect'}): high-entropy cut at {high} "
            f"({entropies[high]:.2f} nats) -> {records[-1]['high']['success']:.2f}, low at {low} "
            f"({entropies[low]:.3f} nats) -> {records[-1]['low']['success']:.2f}",
            flush=True,
        )
    return {"records": records, "responses_correct": sum(correct), "responses": len(correct)}


def summarize(records: list[dict]) -> dict:
    from trl_credit.experiments.compare.stats import t_interval

    summary = {}
    for label, want in (("correct", True), ("incorrect", False)):
        group = [r for r in records if r["correct"] == want]
        high = [r["high"]["success"] for r in group]
        low = [r["low"]["success"] for r in group]
        summary[label] = {
            "responses": len(group),
            "high": t_interval(high).format(),
            "low": t_interval(low).format(),
            "high_minus_low": t_interval([h - lo for h, lo in zip(high, low)]).format(),
            "mean_entropy_high": t_interval([r["high"]["entropy"] for r in group]).format(),
            "mean_entropy_low": t_interval([r["low"]["entropy"] for r in group]).format(),
        }
    return summary


def render(summary: dict, result: dict, command: str, seconds: float, args) -> str:
    lines = [
        "# Resampling from high- and low-entropy tokens (SmolLM2-135M-Instruct, chain sums)",
        "",
        f"Command: `{command}`; {seconds / 60:.1f} min of wall time, seed {args.seed}, {args.threads} torch "
        f"thread(s).",
        "",
        f"{result['responses']} problems, one response each (temperature {args.temperature}, at most "
        f"{args.max_new_tokens} tokens):"
        f" {result['responses_correct']} correct. Each response is cut at its highest-entropy token (not the first or "
        f"last) and at the lowest-entropy token within {WINDOW} tokens of it, and {args.continuations} continuations are sampled from each cut. Cells: mean "
        "± 95 % t half-width over responses of the continuations' success rate.",
        "",
        "| responses | n | success from the high-entropy cut | from the low-entropy cut | high − low (paired) "
        "| entropy at the cuts (nats), high / low |",
        "|---|---|---|---|---|---|",
    ]
    for label in ("correct", "incorrect"):
        s = summary[label]
        lines.append(
            f"| originally {label} | {s['responses']} | {s['high']} | {s['low']} | {s['high_minus_low']} | "
            f"{s['mean_entropy_high']} / {s['mean_entropy_low']} |"
        )
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", type=int, default=24, help="chain-sum test problems (one response each)")
    parser.add_argument("--continuations", type=int, default=4, help="continuations sampled per cut")
    parser.add_argument("--max_new_tokens", type=int, default=48, help="token budget of a response")
    parser.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (and of the entropy)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--page", default="docs/eapo_resample/report.md", help="the report page (and results line)")
    return parser


def render_page(row: dict) -> str:
    """The report page of a stored run (its settings read from its command)."""
    args = build_parser().parse_args(shlex.split(row["command"])[2:])
    return render(summarize(row["records"]), row, row["command"], row["wall_seconds"], args)


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    for name in ("problems", "continuations", "max_new_tokens", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    if not args.temperature > 0:
        parser.error("--temperature must be > 0")
    started = time.monotonic()
    result = run(args)
    seconds = time.monotonic() - started
    command = shlex.join(["python", "benchmarks/eapo_resample.py", *(sys.argv[1:] if argv is None else argv)])
    row = {"page": args.page, **result, "summary": summarize(result["records"]), "command": command}
    row["wall_seconds"] = seconds
    rows = [old for old in _results.read_lines(EXPERIMENT) if old["page"] != args.page]
    _results.write_lines(EXPERIMENT, [*rows, row])
    page = _results.REPO_ROOT / args.page
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(render_page(row))
    print(render_page(row))


if __name__ == "__main__":
    main()
