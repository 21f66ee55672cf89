"""What an evaluation runs: `EvalConfig` (model, data set, split, samples, sampling, backend) and the held-out split
of a data source.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ...data import SOURCES, hub_dataset_id
from ...rewards import DEFAULT_VERIFY_TIMEOUT_S

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
        if not 0 <= self.temperature < math.inf:  # also NaN
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.verify_timeout <= 0:
            raise ValueError(f"verify_timeout must be > 0, got {self.verify_timeout}")
        if not 0 < self.vllm_gpu_memory_utilization <= 1:
            raise ValueError(f"vllm_gpu_memory_utilization must be in (0, 1], got {self.vllm_gpu_memory_utilization}")
        if self.dataset_split is None:
            self.dataset_split = held_out_split(self.dataset_name)
        if self.output_dir is None:
            self.output_dir = str(Path("eval_results") / f"{slug(self.model_name_or_path)}__{slug(self.dataset_name)}")


def slug(name: str) -> str:
    """A file-name-safe short form of a model or data set reference (`/models/m1/` -> `m1`)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", Path(name).name or name)


def check_backend_available(backend: str) -> None:
    """Refuse `vllm` when it is not installed, before the data or the model is loaded."""
    from ...data.models import check_vllm_installed

    if backend == "vllm":
        check_vllm_installed("--backend vllm", alternative=", or use --backend transformers")
