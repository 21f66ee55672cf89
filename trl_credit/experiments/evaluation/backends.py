"""Generation backends of an evaluation: transformers `generate`, or vLLM when installed, behind one small protocol."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from .eval_config import EvalConfig, check_backend_available

logger = logging.getLogger(__name__)

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
        self.greedy = temperature == 0
        self._sampling = lambda n: SamplingParams(  # noqa: E731 - n varies per call
            n=n, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens, seed=seed
        )

    def generate(self, prompts: Sequence[list[dict]], n: int) -> list[list[Completion]]:
        # vLLM refuses n > 1 with greedy decoding: the one greedy completion stands for all n, as in transformers.
        outputs = self.llm.chat([list(p) for p in prompts], self._sampling(1 if self.greedy else n), use_tqdm=False)
        groups = [[Completion(o.text, len(o.token_ids)) for o in out.outputs] for out in outputs]
        return [group * n if self.greedy else group for group in groups]


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
