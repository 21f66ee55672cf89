"""Sampling evaluation of a model on a math data set: avg@n, unbiased pass@k, mean completion length.

For each problem, `n` completions are sampled (transformers `generate`, or vLLM when installed), each is checked
against the gold answer with `trl_credit.rewards.check_answers` (Math-Verify), and with `c` correct out of `n`:

- `avg@n` is the mean over problems of `c / n` (the expected accuracy of one sample);
- `pass@k` is the mean over problems of the unbiased estimator `1 - C(n - c, k) / C(n, k)` (Chen et al., 2021,
  https://huggingface.co/papers/2107.03374), computed in the numerically stable product form;
- `mean_completion_length` is the mean number of generated tokens per completion (EOS included, as in TRL).

Problems come from the source's held-out split unless another is given (`held_out_split`).
`run_evaluation` writes one JSON line per problem (`completions.jsonl`) and `summary.json` to the output folder;
`update_model_card` copies the summary into the evaluated model's folder and renders its trl-credit card again.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from ..data import SOURCES, PreparedDataset, hub_dataset_id, prepare_math_dataset
from ..rewards import DEFAULT_VERIFY_TIMEOUT_S, check_answers, tally

logger = logging.getLogger(__name__)

HELD_OUT_SPLIT = "test"  # the default of TRL's `ScriptArguments.dataset_test_split`


def held_out_split(dataset_name: str) -> str | None:
    """The split `trl-credit eval` and `trl-credit compare` evaluate on when none is given.

    `test` when the source has it, as in TRL (`dataset_test_split`). A named source published as a single split is
    evaluated on that split (AIME 2024 and OlympiadBench publish theirs as `train`); a Hub id that is not a named
    source is assumed to have a `test` split (loading it fails with the splits it has otherwise); a local file has a
    single split (`None`: the whole file).

    Raises:
        ValueError: a named source with several splits, none of them `test`: the split must be chosen.
    """
    spec = SOURCES.get(dataset_name)
    if spec is None:
        return HELD_OUT_SPLIT if hub_dataset_id(dataset_name) is not None else None
    if HELD_OUT_SPLIT in spec.splits:
        return HELD_OUT_SPLIT
    if len(spec.splits) == 1:
        return spec.splits[0]
    raise ValueError(
        f"{dataset_name} has no {HELD_OUT_SPLIT!r} split to evaluate on; choose one of {', '.join(spec.splits)}"
    )


# ---------------------------------------------------------------------------------------------------------------
# Estimators
# ---------------------------------------------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with `c` correct out of `n` samples: `1 - C(n - c, k) / C(n, k)`.

    Computed as `1 - prod_{i = n - c + 1}^{n} (1 - k / i)`, which never forms the binomial coefficients (they
    overflow floats for n in the hundreds).
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:  # every draw of k samples contains a correct one
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def summarize(num_correct: Sequence[int], n: int, ks: Sequence[int], completion_lengths: Sequence[int]) -> dict:
    """Aggregate metrics over problems.

    Args:
        num_correct: `P` counts, correct samples per problem.
        n: Samples per problem.
        ks: The k of each pass@k.
        completion_lengths: `P * n` generated token counts.

    Returns:
        `{"avg@n": ..., "pass@k": ... for k in ks, "mean_completion_length": ..., "num_problems": P}`.
    """
    if not num_correct:
        raise ValueError("no problem to summarise")
    metrics = {f"avg@{n}": sum(c / n for c in num_correct) / len(num_correct)}
    for k in ks:
        metrics[f"pass@{k}"] = sum(pass_at_k(n, c, k) for c in num_correct) / len(num_correct)
    metrics["mean_completion_length"] = sum(completion_lengths) / max(len(completion_lengths), 1)
    metrics["num_problems"] = len(num_correct)
    return metrics


# ---------------------------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class EvalConfig:
    """Configuration of `trl-credit eval`.

    Parameters that select the model and data:
        model_name_or_path (`str`): local folder, Hub id, or `smollm2-135m-instruct` (offline, see
            `trl_credit.data.models`).
        dataset_name (`str`): named source (`trl_credit.data.SOURCES`), local `.jsonl`/`.json`/`.parquet` file or
            Hub id.
        dataset_split (`str`, *optional*): defaults to the source's held-out split (`held_out_split`: `test`, or
            the only split of a source published as one).
        prompt_column, answer_column, system_prompt (`str`, *optional*): see `trl_credit.data.load_math_dataset`.
        num_problems (`int`, *optional*): evaluate a seeded random subset of this many problems.

    Parameters that control generation:
        n (`int`, *optional*, defaults to `4`): samples per problem.
        k (`list[int]`, *optional*): the k of pass@k; defaults to 1, 2, 4, ... up to n, and n.
        temperature (`float`, *optional*, defaults to `0.6`), top_p (`float`, *optional*, defaults to `0.95`):
            sampling parameters; temperature 0 is greedy decoding.
        max_new_tokens (`int`, *optional*, defaults to `512`), seed (`int`, *optional*, defaults to `0`).
        backend (`str`, *optional*, defaults to `"transformers"`): `"transformers"` or `"vllm"`.
        batch_size (`int`, *optional*, defaults to `8`): prompts per `generate` call (transformers backend).
        dtype (`str`, *optional*, defaults to `"auto"`): bfloat16 on GPU, float32 on CPU.

    Parameters that control scoring and output:
        verify_timeout (`float`, *optional*, defaults to `5.0`): seconds one answer check may take.
        output_dir (`str`, *optional*): defaults to `eval_results/<model>__<dataset>`.
        update_model_card (`bool`, *optional*, defaults to `True`): when the model is a folder with a trl-credit
            model card, copy the summary there as `eval_<dataset>_<split>.json` and render the card again with it.
    """

    model_name_or_path: str = field(
        metadata={"help": "Local model folder, Hub id, or `smollm2-135m-instruct` (offline)."}
    )
    dataset_name: str = field(
        metadata={
            "help": "Named source (gsm8k, math, math500, minerva, dapo-math-17k, aime24, aime25, amc23, "
            "olympiadbench, chain_sum), local .jsonl/.json/.parquet file, or Hub id."
        }
    )
    dataset_split: str | None = field(
        default=None,
        metadata={"help": "Split; defaults to the held-out one: test, or the only split of a one-split source."},
    )
    prompt_column: str | None = field(default=None, metadata={"help": "Problem column of a file or Hub data set."})
    answer_column: str | None = field(default=None, metadata={"help": "Answer column of a file or Hub data set."})
    system_prompt: str | None = field(default=None, metadata={"help": "Optional system message."})
    num_problems: int | None = field(default=None, metadata={"help": "Evaluate a seeded random subset of this size."})
    n: int = field(default=4, metadata={"help": "Samples per problem."})
    k: list[int] | None = field(
        default=None, metadata={"help": "k values of pass@k (each <= n); default 1, 2, 4, ..., n."}
    )
    temperature: float = field(default=0.6, metadata={"help": "Sampling temperature; 0 for greedy decoding."})
    top_p: float = field(default=0.95, metadata={"help": "Nucleus sampling probability mass, in (0, 1]."})
    max_new_tokens: int = field(default=512, metadata={"help": "Maximum generated tokens per completion."})
    seed: int = field(default=0, metadata={"help": "Seed of the problem subset and of sampling."})
    backend: Literal["transformers", "vllm"] = field(default="transformers", metadata={"help": "Generation backend."})
    batch_size: int = field(default=8, metadata={"help": "Prompts per generate call (transformers backend)."})
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = field(
        default="auto", metadata={"help": "Model dtype; auto = bfloat16 on GPU, float32 on CPU."}
    )
    vllm_gpu_memory_utilization: float = field(default=0.9, metadata={"help": "vLLM GPU memory fraction."})
    verify_timeout: float = field(default=DEFAULT_VERIFY_TIMEOUT_S, metadata={"help": "Seconds per answer check."})
    output_dir: str | None = field(
        default=None, metadata={"help": "Output folder; default eval_results/<model>__<dataset>."}
    )
    update_model_card: bool = field(
        default=True,
        metadata={"help": "Copy the summary into a trl-credit model folder and render its model card again with it."},
    )

    def __post_init__(self) -> None:
        for name in ("n", "max_new_tokens", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_problems is not None and self.num_problems < 1:
            raise ValueError(f"num_problems must be >= 1, got {self.num_problems}")
        if self.k is None:
            self.k = sorted({2**i for i in range(self.n.bit_length()) if 2**i <= self.n} | {self.n})
        bad = [k for k in self.k if not 1 <= k <= self.n]
        if bad:
            raise ValueError(f"every k must be between 1 and n={self.n}; got k={bad[0]}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.verify_timeout <= 0:
            raise ValueError(f"verify_timeout must be > 0, got {self.verify_timeout}")
        if not 0 < self.vllm_gpu_memory_utilization <= 1:
            raise ValueError(f"vllm_gpu_memory_utilization must be in (0, 1], got {self.vllm_gpu_memory_utilization}")
        if self.dataset_split is None:
            self.dataset_split = held_out_split(self.dataset_name)
        if self.output_dir is None:
            self.output_dir = str(
                Path("eval_results") / f"{_slug(self.model_name_or_path)}__{_slug(self.dataset_name)}"
            )


def _slug(name: str) -> str:
    """A file-name-safe short form of a model or data set reference (`/models/m1/` -> `m1`)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", Path(name).name or name)


def check_backend_available(backend: str) -> None:
    """Refuse `vllm` when it is not installed, before the data or the model is loaded."""
    if backend == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ValueError(
            "--backend vllm needs vLLM, which is not installed: pip install 'trl-credit[vllm]' (a GPU machine; "
            "vLLM 0.22-0.31 with transformers 5.17), or use --backend transformers"
        )


# ---------------------------------------------------------------------------------------------------------------
# Generation backends
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Completion:
    """One sampled completion: its text (special tokens removed) and its number of generated tokens."""

    text: str
    num_tokens: int


class GenerationBackend(Protocol):
    def generate(self, prompts: Sequence[list[dict]], n: int) -> list[list[Completion]]:
        """`n` completions for each of the `P` conversational prompts: a `P`-list of `n`-lists."""
        ...


class TransformersBackend:
    """Batched sampling with transformers `generate` (CPU or one GPU), prompts left-padded, seeded once.

    Args:
        model_name_or_path: Model folder or Hub id.
        temperature, top_p, max_new_tokens: Sampling parameters; `temperature=0` decodes greedily (once per
            prompt, the completion repeated `n` times).
        seed: Seed set before the first batch (results depend on the batch composition, as with any sampler).
        batch_size: Prompts per `generate` call (`batch_size * n` sequences).
        dtype: `"auto"` (bfloat16 on GPU, float32 on CPU) or a torch dtype name.
    """

    def __init__(
        self,
        model_name_or_path: str,
        *,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        seed: int,
        batch_size: int,
        dtype: str = "auto",
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if dtype == "auto":
            dtype = "bfloat16" if self.device == "cuda" else "float32"
        self.tokenizer = AutoTokenizer.from_pretrained(model_name_or_path, padding_side="left")
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(model_name_or_path, dtype=getattr(torch, dtype))
        self.model.to(self.device).eval()
        self.temperature, self.top_p, self.max_new_tokens = temperature, top_p, max_new_tokens
        self.seed, self.batch_size = seed, batch_size
        eos = self.model.generation_config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        self.stop_ids = set(eos) | {self.tokenizer.eos_token_id}

    def _num_tokens(self, ids: list[int]) -> int:
        """Generated tokens up to and including the first EOS (what TRL counts); all of them if none."""
        return next((i + 1 for i, token in enumerate(ids) if token in self.stop_ids), len(ids))

    def generate(self, prompts: Sequence[list[dict]], n: int) -> list[list[Completion]]:
        import torch
        from transformers import set_seed

        set_seed(self.seed)
        greedy = self.temperature == 0
        sampling = (
            {"do_sample": False}
            if greedy
            else {
                "do_sample": True,
                "temperature": self.temperature,
                "top_p": self.top_p,
                "top_k": 0,
                "num_return_sequences": n,
            }
        )
        results: list[list[Completion]] = []
        for start in range(0, len(prompts), self.batch_size):
            texts = [
                self.tokenizer.apply_chat_template(list(p), tokenize=False, add_generation_prompt=True)
                for p in prompts[start : start + self.batch_size]
            ]
            inputs = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
            with torch.inference_mode():
                output = self.model.generate(
                    **inputs, max_new_tokens=self.max_new_tokens, pad_token_id=self.tokenizer.pad_token_id, **sampling
                )
            generated = output[:, inputs["input_ids"].shape[1] :].tolist()  # (batch * samples, new tokens)
            per_prompt = 1 if greedy else n
            for i in range(len(texts)):
                group = []
                for ids in generated[i * per_prompt : (i + 1) * per_prompt]:
                    length = self._num_tokens(ids)
                    group.append(Completion(self.tokenizer.decode(ids[:length], skip_special_tokens=True), length))
                results.append(group * n if greedy else group)
            logger.info("generated %d / %d prompts", len(results), len(prompts))
        return results


class VLLMBackend:
    """Sampling with vLLM (`LLM.chat`), imported only when this backend is chosen."""

    def __init__(
        self,
        model_name_or_path: str,
        *,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        seed: int,
        dtype: str = "auto",
        gpu_memory_utilization: float = 0.9,
    ) -> None:
        check_backend_available("vllm")
        from vllm import LLM, SamplingParams

        self.llm = LLM(model=model_name_or_path, seed=seed, dtype=dtype, gpu_memory_utilization=gpu_memory_utilization)
        self._sampling = lambda n: SamplingParams(  # noqa: E731 - n varies per call
            n=n, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens, seed=seed
        )

    def generate(self, prompts: Sequence[list[dict]], n: int) -> list[list[Completion]]:
        outputs = self.llm.chat([list(p) for p in prompts], self._sampling(n), use_tqdm=False)
        return [[Completion(o.text, len(o.token_ids)) for o in out.outputs] for out in outputs]


def build_backend(config: EvalConfig, model_path: str) -> GenerationBackend:
    """Load the model into the configured backend."""
    common = dict(
        temperature=config.temperature,
        top_p=config.top_p,
        max_new_tokens=config.max_new_tokens,
        seed=config.seed,
        dtype=config.dtype,
    )
    if config.backend == "vllm":
        return VLLMBackend(model_path, gpu_memory_utilization=config.vllm_gpu_memory_utilization, **common)
    return TransformersBackend(model_path, batch_size=config.batch_size, **common)


# ---------------------------------------------------------------------------------------------------------------
# Running an evaluation
# ---------------------------------------------------------------------------------------------------------------


def prepare_eval_data(config: EvalConfig) -> PreparedDataset:
    """The evaluation problems (raises `ValueError` on an unknown source, bad split or missing column)."""
    return prepare_math_dataset(
        config.dataset_name,
        config.dataset_split,
        prompt_column=config.prompt_column,
        answer_column=config.answer_column,
        system_prompt=config.system_prompt,
        num_samples=config.num_problems,
        seed=config.seed,
    )


def run_evaluation(
    config: EvalConfig, *, prepared: PreparedDataset | None = None, backend: GenerationBackend | None = None
) -> dict:
    """Sample, score and aggregate; write `completions.jsonl` and `summary.json` to `config.output_dir`.

    Args:
        config: The evaluation settings.
        prepared: Already loaded problems (the CLI loads them before the model, to fail fast on bad input).
        backend: A generation backend; built from `config` (loading the model) when `None`.

    Returns:
        The summary: metrics (`avg@n`, `pass@k`, `mean_completion_length`, `num_problems`), scoring counters,
        dropped data rows, timings and the configuration.
    """
    from ..data.models import resolve_model_path

    prepared = prepared if prepared is not None else prepare_eval_data(config)
    problems = prepared.dataset
    if backend is None:
        backend = build_backend(config, resolve_model_path(config.model_name_or_path))

    started = time.monotonic()
    completions = backend.generate(list(problems["prompt"]), config.n)
    generation_s = time.monotonic() - started
    if len(completions) != len(problems) or any(len(group) != config.n for group in completions):
        raise RuntimeError(
            f"the backend returned {[len(g) for g in completions]} completions, expected {config.n} each"
        )

    texts = [c.text for group in completions for c in group]
    golds = [gold for gold in problems["solution"] for _ in range(config.n)]
    checks = check_answers(texts, golds, timeout_s=config.verify_timeout)

    output_dir = Path(config.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    num_correct, lengths = [], []
    with open(output_dir / "completions.jsonl", "w", encoding="utf-8") as f:
        for index, (problem, group) in enumerate(zip(problems, completions)):
            group_checks = checks[index * config.n : (index + 1) * config.n]
            correct = sum(check.correct for check in group_checks)
            num_correct.append(correct)
            lengths.extend(c.num_tokens for c in group)
            record = {
                "index": index,
                "problem": problem["problem"],
                "solution": problem["solution"],
                "num_correct": correct,
                **{f"pass@{k}": pass_at_k(config.n, correct, k) for k in config.k},
                "completions": [c.text for c in group],
                "completion_lengths": [c.num_tokens for c in group],
                "extracted_answers": [check.extracted for check in group_checks],
                "correct": [check.correct for check in group_checks],
                "statuses": [check.status for check in group_checks],
            }
            f.write(json.dumps(record, ensure_ascii=False) + "\n")

    summary = {
        "model": config.model_name_or_path,
        "dataset": config.dataset_name,
        "split": prepared.split,
        "n": config.n,
        **summarize(num_correct, config.n, config.k, lengths),
        "dropped_rows": prepared.num_dropped,
        "scoring": tally(checks),
        "generation_seconds": round(generation_s, 3),
        "config": asdict(config),
    }
    (output_dir / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    return summary


def update_model_card(config: EvalConfig, summary: dict) -> Path | None:
    """Add an evaluation to the card of the evaluated model, when it is a folder with a trl-credit model card.

    Writes `summary` to the model folder as `eval_<dataset>_<split>.json` (a later evaluation of the same split
    replaces it), where model cards look for results, then renders the card again (`README.md`: evaluation table and
    `model-index` metadata). Returns the card's path, or `None` when nothing was written: `update_model_card` is
    off, or the model is a Hub id or a folder without a card recorded by `trl_credit.reports.model_card.CreditModelCard`.

    Raises:
        ValueError: the folder's card record cannot be read back.
    """
    from ..reports.model_card import CARD_INPUTS_NAME, regenerate_model_card

    folder = Path(config.model_name_or_path).expanduser()
    if not config.update_model_card or not (folder / CARD_INPUTS_NAME).is_file():
        return None
    name = "_".join(_slug(part) for part in (config.dataset_name, summary.get("split")) if part)
    (folder / f"eval_{name}.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    return regenerate_model_card(folder)
