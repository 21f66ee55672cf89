"""Model cards for models trained with trl-credit, and the list of files a Hub push uploads.

The card follows TRL's own (`trl.trainer.utils.generate_model_card`): the same sections in the same order (quick
start, training procedure, framework versions, citations). It adds what trained: the base model (a Hub id, a local
folder's name, or the offline SmolLM2 de-quantised from a GGUF), a one-line result (the mean training reward at the
first and last logged steps, labelled with the reward functions whose weighted sum it is, and the evaluation
results), the training set-up (reward functions and weights, number of training prompts, learning rate, steps,
batch, generation, loss and clipping settings), each method of the stack with its own hyperparameters, the method papers next to
GRPO's and TRL's citations, the training data, the training curves and, when `trl-credit eval` summaries are given,
an evaluation table and the same numbers as `model-index` metadata, which the Hub renders as evaluation results. The
quick-start snippet prompts the model with the first training prompt when one is given.

- `run_facts`: what trained, read from a trainer's arguments and logs (secrets redacted);
- `evaluation_results`: the `trl-credit eval` summaries of a run folder, as a table and as `model-index` metadata;
- `card`: rendering (`generate_credit_model_card`), `CreditModelCard` (which saves its inputs next to it, in
  `_trl_credit_card.json`, skipped by a Hub push, so that `regenerate_model_card` can render the card again once
  `trl-credit eval` has added results) and `collect_upload_folder`;
- `trainer_card`: `trainer_model_card` (all of it read off a trainer after training), `write_model_card` (the card
  of a run, from a notebook) and `with_research_card` (a trainer class that writes it wherever TRL writes its card,
  as `trl-credit grpo` trains). A library trainer alone writes TRL's card, with its methods' tags and paper.

The Jinja template is `model_cards/credit_model_card.md.j2` at the top of the source tree, installed in the package
`trl_credit.model_cards` and read with `card_template()`.
"""

from .card import (
    CARD_INPUTS_NAME,
    DEFAULT_QUICK_START_QUESTION,
    CreditModelCard,
    card_template,
    collect_upload_folder,
    generate_credit_model_card,
    regenerate_model_card,
)
from .evaluation_results import eval_metrics, eval_results, eval_table, load_eval_summaries
from .run_facts import base_model_reference, first_training_prompt, format_hyperparameters, scrub_secrets
from .trainer_card import (
    ResearchCard,
    research_trainer_name,
    trainer_model_card,
    with_research_card,
    write_model_card,
)

__all__ = [
    "CARD_INPUTS_NAME",
    "DEFAULT_QUICK_START_QUESTION",
    "CreditModelCard",
    "ResearchCard",
    "base_model_reference",
    "card_template",
    "collect_upload_folder",
    "eval_metrics",
    "eval_results",
    "eval_table",
    "first_training_prompt",
    "format_hyperparameters",
    "generate_credit_model_card",
    "load_eval_summaries",
    "regenerate_model_card",
    "research_trainer_name",
    "scrub_secrets",
    "trainer_model_card",
    "with_research_card",
    "write_model_card",
]
