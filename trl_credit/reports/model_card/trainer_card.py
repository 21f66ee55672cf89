"""The research card of a trainer's run: read off the trainer after training (`trainer_model_card`), written over the
card TRL writes through its `create_model_card` hook, from a notebook (`write_model_card`) or by the trainer itself at
each checkpoint, in `push_to_hub` and wherever its card is written (a class of `with_research_card`, which
`trl-credit grpo` trains with).

The library's trainers write TRL's card, with the methods' tags and paper; everything here reads public results of
the trainer (its arguments, state, data, rewards and the card TRL wrote), not its private attributes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence, Sized
from functools import cache
from pathlib import Path

from .card import BASE_TAGS, CreditModelCard, generate_credit_model_card
from .evaluation_results import load_eval_summaries
from .run_facts import (
    base_model_reference,
    first_training_prompt,
    read_reward_curve,
    read_training_setup,
    reward_functions,
)


def trainer_model_card(
    trainer,
    model_name: str | None = None,
    dataset_name: str | None = None,
    tags: Sequence[str] | None = None,
    trainer_name: str | None = None,
) -> CreditModelCard:
    """The card of a trl-credit trainer's run, read from the trainer after training; `CreditModelCard.save` it.

    Reads the base model from the policy's config, the set-up from `trainer.args` (clipping included), the number of
    processes, the reward functions with their weights and the number of training prompts, the methods of the stack
    and their hyperparameters from `trainer.args` (and, for a run resumed with another stack, which steps trained with
    which, from `trainer.run_record`), the reward curve from `trainer.state.log_history`, and any
    `trl-credit eval` summaries from `output_dir`. Writes the training plots to `output_dir/plots/` (see
    `trl_credit.reports.plots.save_training_plots`).

    Args:
        trainer: A `CreditGRPOTrainer` (or one of its method trainers).
        model_name: The card's title; defaults to the name of `output_dir`.
        dataset_name: The training data set, as `generate_credit_model_card` takes it.
        tags: Extra tags, after `trl`, `grpo`, `trl-credit` and the methods' names.
        trainer_name: The trainer the card says trained; defaults to `research_trainer_name(args.credit_method)`.
    """
    from transformers import is_wandb_available
    from trl.trainer.utils import get_comet_experiment_url, get_config_model_id, get_trackio_space_url

    from ...trainer.run_record import stacks_by_step
    from ..plots import save_training_plots

    args, state = trainer.args, trainer.state
    rewards = reward_functions(trainer.reward_func_names, args.reward_weights)
    policy = trainer.accelerator.unwrap_model(trainer.model)
    base_model, base_model_description = base_model_reference(get_config_model_id(policy.config))
    methods = [step.method for step in args.credit_stack]
    training_setup = read_training_setup(
        args,
        trainer.accelerator.num_processes,
        state.global_step,
        reward_funcs=rewards,
        num_train_prompts=len(trainer.train_dataset) if isinstance(trainer.train_dataset, Sized) else None,
    )
    # A run resumed with another method stack (`resume_with_other_method`): which steps trained with which.
    stacks = stacks_by_step(getattr(trainer, "run_record", None), state.global_step)
    if stacks:
        training_setup["credit_method_by_step"] = stacks
    wandb_url = None
    if is_wandb_available():
        import wandb

        wandb_url = wandb.run.url if wandb.run is not None else None
    return generate_credit_model_card(
        base_model=base_model,
        base_model_description=base_model_description,
        model_name=model_name or os.path.basename(os.path.normpath(args.output_dir)),
        hub_model_id=trainer.hub_model_id,
        dataset_name=dataset_name,
        method=args.credit_method,
        hyperparameters=args.credit_hyperparameters(),
        training_setup=training_setup,
        reward_curve=read_reward_curve(state.log_history, rewards),
        tags=list(dict.fromkeys([*BASE_TAGS, *(m.name for m in methods), *(tags or [])])),
        plots=save_training_plots(state.log_history, args.output_dir) if state.log_history else [],
        eval_summary=load_eval_summaries(args.output_dir) or None,
        wandb_url=wandb_url,
        trackio_url=get_trackio_space_url(),
        comet_url=get_comet_experiment_url(),
        trainer_name=trainer_name or research_trainer_name(args.credit_method),
        papers=[{**m.paper, "name": m.name} for m in methods if m.paper],
        example_prompt=first_training_prompt(trainer.train_dataset) if trainer.train_dataset is not None else None,
    )


def research_trainer_name(credit_method: str | Sequence[str]) -> str:
    """The trainer the research card names for `credit_method`: the method's, for a method with a trainer of its own
    (`TACOTrainer`, ...), else GRPO, which the card says the methods extend."""
    from ...methods import get_credit_method, parse_credit_methods
    from ...trainer import CreditGRPOTrainer, trainer_pair

    stack = "+".join(parse_credit_methods(credit_method))
    if trainer_pair(stack)[1] is CreditGRPOTrainer:
        return "GRPO"
    return get_credit_method(stack).display_name


def write_model_card(
    trainer, model_name: str | None = None, dataset_name: str | None = None, tags: Sequence[str] | None = None
) -> Path | None:
    """Write the research card of `trainer`'s run to `output_dir/README.md`, after training (from a notebook).

    TRL's card is written first, through the trainer's own `create_model_card`, for the tags TRL derives there
    (`unsloth`, `hf_jobs`, Trackio's, the model's); the research card replaces it with those tags. Returns the card's
    path, or `None` on a process other than the main one, which writes no card.
    """
    trainer.create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags)
    return _replace_trl_card(trainer, model_name, dataset_name)


def _replace_trl_card(trainer, model_name: str | None, dataset_name: str | None) -> Path | None:
    """Render the research card over the card TRL just wrote in `output_dir`, keeping TRL's tags."""
    from huggingface_hub import ModelCard

    if not trainer.is_world_process_zero():
        return None
    path = Path(trainer.args.output_dir) / "README.md"
    trl_tags = ModelCard.load(path).data.tags or []
    trainer_model_card(trainer, model_name=model_name, dataset_name=dataset_name, tags=trl_tags).save(path)
    return path


class ResearchCard:
    """Mixin of a trl-credit trainer whose card is the research card: its `create_model_card`, which TRL calls at each
    checkpoint and in `push_to_hub`, writes TRL's card, then the research card over it."""

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        super().create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags)
        _replace_trl_card(self, model_name, dataset_name)


@cache
def with_research_card(trainer_class: type) -> type:
    """`trainer_class` (a `CreditGRPOTrainer` or a subclass), under the same name, writing the research card wherever
    it writes its model card (`ResearchCard`); `trl-credit grpo` trains with it."""
    return type(
        trainer_class.__name__,
        (ResearchCard, trainer_class),
        {"__module__": __name__, "__doc__": f"[`{trainer_class.__name__}`] whose model card is the research card."},
    )
