"""Sampling evaluation of a model on a math data set: avg@n, unbiased pass@k, mean completion length.

For each problem, `n` completions are sampled (transformers `generate`, or vLLM when installed), each is checked
against the gold answer with `trl_credit.rewards.check_answers` (Math-Verify), and with `c` correct out of `n`:

- `avg@n` is the mean over problems of `c / n` (the expected accuracy of one sample);
- `pass@k` is the mean over problems of the unbiased estimator `1 - C(n - c, k) / C(n, k)` (Chen et al., 2021,
  https://huggingface.co/papers/2107.03374), computed in the numerically stable product form;
- `mean_completion_length` is the mean number of generated tokens per completion (EOS included, as in TRL).

Problems come from the source's held-out split unless another is given (`held_out_split`). `eval_config`
holds `EvalConfig`, `estimators` the two estimators, `backends` the generation backends, and `evaluate`
`run_evaluation`, which
writes one JSON line per problem (`completions.jsonl`) and `summary.json` to the output folder, and
`update_model_card`, which copies the summary into the evaluated model's folder and renders its trl-credit card again.
"""

from .backends import Completion, GenerationBackend, TransformersBackend, VLLMBackend, build_backend
from .estimators import pass_at_k, summarize
from .eval_config import HELD_OUT_SPLIT, EvalConfig, check_backend_available, held_out_split
from .evaluate import prepare_eval_data, run_evaluation, update_model_card

__all__ = [
    "HELD_OUT_SPLIT",
    "Completion",
    "EvalConfig",
    "GenerationBackend",
    "TransformersBackend",
    "VLLMBackend",
    "build_backend",
    "check_backend_available",
    "held_out_split",
    "pass_at_k",
    "prepare_eval_data",
    "run_evaluation",
    "summarize",
    "update_model_card",
]
