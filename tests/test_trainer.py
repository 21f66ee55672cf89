"""Training runs through TRL's own loss: every method, loss type and batching option.

An independent recorder wraps TRL's `GRPOTrainer` methods (which `CreditGRPOTrainer` reaches through
`super()`): at generation time it recomputes each method's statistics the plain way (full logits, torch
quantiles), and at loss time it checks that the advantages TRL's `_compute_loss` actually consumed are
the specification's per-token loops (`test_methods`) over those statistics. This also guards the TRL version: if TRL stopped
reading `inputs["advantages"]` after the training forward, or stopped accepting `(B, T)`, these fail.
"""

import math
import warnings

import pytest
import torch
from conftest import (
    length_reward,
    make_tiny_model,
    make_tiny_tokenizer,
    tiny_config,
    tiny_prompt_dataset,
    tiny_trainer,
)
from trainer_helpers import AdvantageRecorder, assert_all_params_changed, engine_rollout
from trl import GRPOTrainer

from trl_credit import (
    CreditGRPOConfig,
    CreditGRPOTrainer,
    EAPOConfig,
    EAPOTrainer,
    TACOConfig,
    TACOTrainer,
    TIDEConfig,
    TIDETrainer,
)
from trl_credit.methods import CREDIT_METHODS
from trl_credit.rewards import AccuracyReward, completion_text, extract_answer
from trl_credit.trainer.trl_compat import torch_fused_head

METHODS = ["grpo", "taco", "eapo", "tide"]
LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo"]


def run_training(monkeypatch, tmp_path, method, model=None, trainer_cls=CreditGRPOTrainer, args=None, **overrides):
    tokenizer = make_tiny_tokenizer()
    model = make_tiny_model(tokenizer) if model is None else model
    args = tiny_config(method, tmp_path / "out", **overrides) if args is None else args
    trainer = tiny_trainer(args, trainer_cls, model=model, tokenizer=tokenizer)
    recorder = AdvantageRecorder(monkeypatch, trainer)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    after = dict(trainer.model.named_parameters())
    return trainer, recorder, before, after


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("method", METHODS)
def test_every_method_trains_with_every_loss_type(monkeypatch, tmp_path, method, loss_type):
    extra = {"epsilon_high": 5.0} if loss_type == "cispo" else {}
    trainer, recorder, before, after = run_training(monkeypatch, tmp_path, method, loss_type=loss_type, **extra)
    assert recorder.checked_batches == 3
    assert_all_params_changed(before, after)
    logged = trainer.state.log_history[0]
    if method != "grpo":
        assert math.isfinite(logged[f"{method}/mean_weight"])


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(
    "options",
    [
        {"num_iterations": 2},
        {"gradient_accumulation_steps": 2, "per_device_train_batch_size": 2},
        {"steps_per_generation": 2},  # off-policy micro-batches: TRL runs the old-log-prob forward
        {"top_entropy_quantile": 0.5},
    ],
    ids=["num_iterations", "grad_accum", "steps_per_generation", "top_entropy"],
)
def test_batching_options(monkeypatch, tmp_path, method, options):
    trainer, recorder, before, after = run_training(monkeypatch, tmp_path, method, **options)
    assert recorder.checked_batches >= 3
    assert_all_params_changed(before, after)


@pytest.mark.parametrize("method", METHODS)
def test_beta_with_reference_model(monkeypatch, tmp_path, tiny_model_dir, method):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    trainer, recorder, before, after = run_training(monkeypatch, tmp_path, method, model=model, beta=0.1)
    assert trainer.ref_model is not None
    if method == "tide":
        assert trainer.deviation_reference.model is None  # TRL's own reference is reused, not copied again
    assert recorder.checked_batches == 3
    assert_all_params_changed(before, after)


@pytest.mark.parametrize("method", METHODS)
def test_mask_truncated_completions(monkeypatch, tmp_path, method):
    # Completions of 3 tokens from a random model are almost all truncated: their rows must carry no credit.
    trainer, recorder, _, _ = run_training(
        monkeypatch, tmp_path, method, mask_truncated_completions=True, max_completion_length=3
    )
    assert recorder.checked_batches == 3
    assert all(math.isfinite(entry.get("loss", 0.0)) for entry in trainer.state.log_history)


@pytest.mark.parametrize(
    "method,neutral",
    [
        ("grpo", {}),
        ("taco", {"taco_lambda": 0.0}),
        ("eapo", {"eapo_kappa": 0.0}),
        ("tide", {"tide_kappa": 0.0, "tide_tau": 1e6}),
    ],
)
def test_parity_with_grpo_trainer(tmp_path, method, neutral):
    """A neutral setting of each method gives GRPOTrainer's losses, gradient norms and final weights."""
    tokenizer = make_tiny_tokenizer()
    dataset = tiny_prompt_dataset()
    common = dict(max_steps=2, num_iterations=2, learning_rate=1e-2)

    credit = CreditGRPOTrainer(
        model=make_tiny_model(tokenizer),
        reward_funcs=length_reward,
        processing_class=tokenizer,
        args=tiny_config(method, tmp_path / "credit", **common, **neutral),
        train_dataset=dataset,
    )
    credit.train()
    plain_args = tiny_config("grpo", tmp_path / "plain", **common)
    plain = GRPOTrainer(
        model=make_tiny_model(tokenizer),
        reward_funcs=length_reward,
        processing_class=tokenizer,
        args=plain_args,
        train_dataset=dataset,
    )
    with torch_fused_head():  # TRL 1.15 has no fused head without Triton: the fallback the credit trainer uses
        plain.train()
    for got, want in zip(credit.state.log_history[:-1], plain.state.log_history[:-1]):
        assert got["loss"] == pytest.approx(want["loss"], abs=1e-6)
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-4)
    for (name, p_credit), (_, p_plain) in zip(credit.model.named_parameters(), plain.model.named_parameters()):
        torch.testing.assert_close(p_credit, p_plain, atol=1e-6, rtol=1e-5, msg=name)


def test_the_pairs_are_importable_by_qualified_name_and_pickle(tmp_path):
    """training_args.bin pickles the config: each pair's classes live where their qualified name says."""
    import pickle

    from trl_credit.trainer import pairs, trainer_pair

    for config_cls, trainer_cls in [(TACOConfig, TACOTrainer), (EAPOConfig, EAPOTrainer), (TIDEConfig, TIDETrainer)]:
        assert getattr(pairs, config_cls.__qualname__) is config_cls and config_cls.__module__ == pairs.__name__
        assert getattr(pairs, trainer_cls.__qualname__) is trainer_cls and trainer_cls.__module__ == pairs.__name__
        assert trainer_cls.config_class is config_cls and config_cls.__doc__ and trainer_cls.__doc__
        assert trainer_pair(trainer_cls._pinned_method) == (config_cls, trainer_cls)
    config = TACOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, taco_alpha=0.05)
    copy = pickle.loads(pickle.dumps(config))
    assert type(copy) is TACOConfig and copy.credit_kwargs == config.credit_kwargs == {
        "taco_alpha": 0.05,
        "taco_lambda": 0.9,
    }
    assert trainer_pair("eapo+taco") == (CreditGRPOConfig, CreditGRPOTrainer)


def test_the_stack_is_planned_again_only_when_its_fields_change_and_not_pickled(tmp_path):
    """The config resolves its stack once; validating it again (as the trainer does) plans it again only when
    `credit_method` or `credit_kwargs` changed since, even in place, and checks the new values. The pickle
    (training_args.bin) leaves the plan, which holds the methods' functions, out: the copy plans it again."""
    import pickle

    from trl_credit.methods import SettingError

    config = CreditGRPOConfig(
        output_dir=str(tmp_path),
        credit_method="eapo+taco",
        credit_kwargs={"taco_alpha": 0.1},
        use_cpu=True,
        bf16=False,
    )
    plan = config.stage_plan
    config.validate_credit_fields()
    assert config.stage_plan is plan
    config.credit_kwargs["taco_alpha"] = 0.3
    config.validate_credit_fields()
    assert config.stage_plan is not plan and config.credit_stack[1].hyperparameters["taco_alpha"] == 0.3
    copy = pickle.loads(pickle.dumps(config))
    assert "_stage_plan" not in vars(copy) and copy.credit_stack[1].hyperparameters == {
        "taco_alpha": 0.3,
        "taco_lambda": 0.9,
    }
    config.credit_kwargs["taco_alpha"] = "a lot"
    with pytest.raises(SettingError, match="^taco_alpha must be a number, got 'a lot'"):
        config.validate_credit_fields()


def test_single_method_trainers_use_their_configs_and_paper_metadata(tmp_path):
    tokenizer = make_tiny_tokenizer()
    for trainer_cls, config_cls, method in [
        (TACOTrainer, TACOConfig, "taco"),
        (EAPOTrainer, EAPOConfig, "eapo"),
        (TIDETrainer, TIDEConfig, "tide"),
    ]:
        args = config_cls(
            output_dir=str(tmp_path / method),
            use_cpu=True,
            bf16=False,
            activation_checkpointing=False,
            per_device_train_batch_size=4,
            num_generations=4,
            max_completion_length=4,
            report_to="none",
        )
        assert args.credit_method == method and args.epsilon_high == 0.28
        trainer = tiny_trainer(args, trainer_cls, tokenizer=tokenizer)
        assert method in trainer._tag_names and trainer._paper["id"]
        with pytest.raises(ValueError, match=f"trains with credit_method='{method}'"):
            other = "taco" if method != "taco" else "eapo"
            trainer_cls(
                model=make_tiny_model(tokenizer),
                reward_funcs=length_reward,
                processing_class=tokenizer,
                args=tiny_config(other, tmp_path / "x"),
                train_dataset=tiny_prompt_dataset(),
            )


@pytest.mark.parametrize(
    "settings, expected",
    [
        ({}, True),  # TRL's default
        ({"activation_checkpointing": False}, False),
        ({"gradient_checkpointing": False}, False),
        ({"activation_checkpointing": True, "gradient_checkpointing": True}, True),
    ],
)
def test_activation_checkpointing_is_one_setting_on_every_transformers_release(tmp_path, settings, expected):
    # transformers < 5.23 has only `gradient_checkpointing`; the config takes the current name on every release and
    # both names end up holding what trains.
    args = CreditGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", **settings)
    assert (args.activation_checkpointing, args.gradient_checkpointing) == (expected, expected)


def test_activation_checkpointing_and_its_old_name_disagreeing_is_refused(tmp_path):
    with pytest.raises(ValueError, match="activation_checkpointing is True but gradient_checkpointing"):
        CreditGRPOConfig(
            output_dir=str(tmp_path),
            use_cpu=True,
            bf16=False,
            activation_checkpointing=True,
            gradient_checkpointing=False,
        )


def test_plain_grpo_config_is_refused(tmp_path):
    from trl import GRPOConfig

    with pytest.raises(TypeError) as refused:
        tiny_trainer(GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False))
    assert str(refused.value) == (
        "CreditGRPOTrainer needs a CreditGRPOConfig (or TACOConfig, EAPOConfig, TIDEConfig), got GRPOConfig"
    )


@pytest.mark.parametrize(
    "method,settings,message",
    [
        ("ppo", {}, "unknown credit method 'ppo'; registered: grpo, "),
        (
            "taco+eapo",
            {},
            r"must come before methods that read the training forward \(taco: training forward, eapo: generation batch\)",
        ),
        ("taco", {"taco_alpha": 0.0}, r"taco_alpha must be in \(0, 1\]"),
        ("taco", {"taco_lambda": 1.2}, r"taco_lambda must be in \[0, 1\]"),
        ("eapo", {"eapo_kappa": -0.1}, "eapo_kappa must be finite and >= 0"),
        ("eapo", {"eapo_kappa_decay_steps": -1}, "eapo_kappa_decay_steps must be >= 0"),
        ("eapo", {"eapo_quantiles": [0.9, 0.1]}, "eapo_quantiles must be two values"),
        ("tide", {"tide_tau": 0.0}, "tide_tau must be finite and > 0"),
        ("tide", {"tide_distance": "kl"}, "tide_distance must be one of"),
        ("tide", {"tide_reference": "base"}, "tide_reference must be one of"),
        ("grpo", {"statistics_vocab_chunk_size": 0}, "statistics_vocab_chunk_size must be an integer >= 1"),
        ("grpo", {"credit_kwargs": "{boost: 2}"}, "credit_kwargs must be a JSON object"),
        ("taco", {"taco_alpha": "a lot"}, "taco_alpha must be a number, got 'a lot'"),
        ("eapo", {"eapo_kappa_decay_steps": 2.5}, "eapo_kappa_decay_steps must be an integer, got 2.5"),
        ("grpo", {"max_steps": 0}, "max_steps must be an integer >= 1, or -1"),
        ("grpo", {"max_steps": -5}, "max_steps must be an integer >= 1, or -1"),
        ("grpo", {"max_completion_length": 0}, "max_completion_length must be an integer >= 1"),
        ("grpo", {"per_device_train_batch_size": 0}, "per_device_train_batch_size must be an integer >= 1"),
        ("grpo", {"credit_kwargs": "[2.0]"}, "credit_kwargs must be a mapping"),
        (
            "grpo",
            {"credit_kwargs": {"boost": 2.0}},
            "boost is not a hyperparameter of 'grpo'",
        ),
        ("eapo", {"taco_alpha": 0.5}, "taco_alpha belongs to credit method 'taco', which is not in the stack 'eapo'"),
        (
            "eapo",
            {"credit_kwargs": {"eapo_kapa": 0.5}},
            "eapo_kapa is not a hyperparameter of 'eapo'; did you mean 'eapo_kappa'",
        ),
    ],
)
def test_config_validation_names_bad_value(tmp_path, method, settings, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(method, tmp_path, **settings)


def test_a_hyperparameter_lands_in_credit_kwargs_whichever_way_it_is_given(tmp_path):
    cpu = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False)
    config = CreditGRPOConfig(**cpu, credit_method="taco", credit_kwargs={"taco_alpha": 0.5})
    assert config.credit_kwargs == {"taco_alpha": 0.5, "taco_lambda": 0.9}  # resolved, the default included
    assert TACOConfig(**cpu, taco_alpha=0.5).credit_kwargs == config.credit_kwargs
    assert TACOConfig(**cpu, credit_kwargs={"taco_alpha": "0.5"}).credit_kwargs == config.credit_kwargs
    assert config.credit_stack[0].hyperparameters == config.credit_kwargs
    # Given both ways, even at its default value, nothing says which should win.
    with pytest.raises(ValueError, match=r"taco_alpha is set twice: TACOConfig\(taco_alpha=0.01\) and credit_kwargs"):
        TACOConfig(**cpu, taco_alpha=0.01, credit_kwargs={"taco_alpha": 0.5})
    with pytest.raises(ValueError, match="TACOConfig trains credit_method 'taco', got 'eapo'; use CreditGRPOConfig"):
        TACOConfig(**cpu, credit_method="eapo")
    with pytest.raises(AttributeError, match=r"no field 'taco_alpha'.*config.credit_kwargs\['taco_alpha'\]"):
        _ = config.taco_alpha


def test_a_method_dropping_tokens_under_a_generation_normaliser_warns_once(tmp_path):
    tokenizer = make_tiny_tokenizer()

    def build(loss_type):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            tiny_trainer(tiny_config("stapo", tmp_path / loss_type, loss_type=loss_type), tokenizer=tokenizer)
        return [str(w.message) for w in caught if "still count in the normaliser" in str(w.message)]

    for loss_type in ("dapo", "cispo"):
        (message,) = build(loss_type)
        assert f"loss_type={loss_type!r}" in message and "loss_type='bnpo'" in message and "stapo drop" in message
    assert build("bnpo") == []


def test_eapo_kappa_decays_linearly(monkeypatch, tmp_path):
    trainer, recorder, _, _ = run_training(monkeypatch, tmp_path, "eapo", eapo_kappa_decay_steps=2)
    kappas = [entry["eapo/kappa"] for entry in trainer.state.log_history if "eapo/kappa" in entry]
    assert kappas == pytest.approx([math.log(4), math.log(4) / 2, 0.0])


def test_tide_old_reference_tracks_previous_policy(monkeypatch, tmp_path):
    trainer, recorder, before, after = run_training(monkeypatch, tmp_path, "tide", tide_reference="old")
    deviations = [
        entry["tide/mean_deviation"] for entry in trainer.state.log_history if "tide/mean_deviation" in entry
    ]
    assert deviations[0] == pytest.approx(0.0, abs=1e-6)  # nothing has moved before the first batch
    assert deviations[1] > 0
    assert_all_params_changed(before, after)


@pytest.mark.parametrize(
    "method",
    sorted(
        name
        for name, m in CREDIT_METHODS.items()
        if m.function.__module__.startswith("trl_credit.methods.") and m.statistics_for(m.hyperparameters())
    ),
)
def test_a_non_finite_statistic_at_a_valid_position_raises_for_every_method(monkeypatch, tmp_path, method):
    """One LM-head row set to NaN once the batch is generated: every statistic computed from then on is NaN."""
    original = GRPOTrainer._generate_and_score_completions

    def generate_then_break_the_head(trainer_self, inputs):
        batch = original(trainer_self, inputs)
        with torch.no_grad():
            trainer_self.model.get_output_embeddings().weight[3] = float("nan")
        return batch

    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", generate_then_break_the_head)
    tokenizer = make_tiny_tokenizer()
    trainer = CreditGRPOTrainer(
        model=make_tiny_model(tokenizer),
        reward_funcs=length_reward,
        processing_class=tokenizer,
        args=tiny_config(method, tmp_path, max_steps=1),
        train_dataset=tiny_prompt_dataset(),
    )
    with pytest.raises(
        ValueError, match=rf"credit method '{method}': statistic '\w+' has NaN or inf at valid positions"
    ):
        trainer.train()


class _ObservedAccuracy(AccuracyReward):
    """The package's accuracy reward, keeping the completion texts it scored (to count their answers by hand)."""

    def __call__(self, completions, solution, **kwargs):
        self.texts = [*getattr(self, "texts", []), *(completion_text(c) for c in completions)]
        return super().__call__(completions, solution, **kwargs)


def test_the_trainers_warnings_point_at_the_line_that_built_it(tmp_path):
    """The normaliser warning (raised in `__init__`) and the hub_token warning (in `_check_args`, one call below) name
    the user's line that built the trainer, as TRL's warnings do. Not in the mutation runs' selection: mutmut's
    trampolines add a frame between a mutated function and its caller, so there it would fail unmutated; its four
    stack-level mutants are killed by hand (docs/testing.md)."""
    tokenizer = make_tiny_tokenizer()
    args = tiny_config("stapo", tmp_path / "out", loss_type="dapo", hub_token="hf_not_a_real_token")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        CreditGRPOTrainer(
            model=make_tiny_model(tokenizer),
            reward_funcs=length_reward,
            args=args,
            train_dataset=tiny_prompt_dataset(),
            processing_class=tokenizer,
        )
    for phrase in ("still count in the normaliser", "hub_token is pickled"):
        (warning,) = [w for w in caught if phrase in str(w.message)]
        assert warning.filename == __file__, (phrase, warning.filename, warning.lineno)


def test_unscored_answers_are_logged_from_the_rewards_that_count_them(tmp_path):
    """A run with only the user's rewards logs no counters; the accuracy reward's counts are its own answers'."""
    tokenizer = make_tiny_tokenizer()

    def run(reward_funcs):
        args = tiny_config("grpo", tmp_path, max_steps=2)
        trainer = tiny_trainer(args, tokenizer=tokenizer, reward_funcs=reward_funcs)
        trainer.train()
        return [entry for entry in trainer.state.log_history if "reward" in entry]

    assert not [
        key for entry in run([length_reward]) for key in entry if key in ("rewards/no_answer", "rewards/timeouts")
    ]
    accuracy = _ObservedAccuracy()
    logged = run([length_reward, accuracy])
    no_answer = sum(extract_answer(text) is None for text in accuracy.texts)
    assert sum(entry["rewards/no_answer"] for entry in logged) == no_answer

    # Counted during an evaluation, they are the evaluation's (`eval_...`), not the next training log's.
    accuracy = _ObservedAccuracy()
    args = tiny_config("grpo", tmp_path, max_steps=1, per_device_eval_batch_size=4)
    trainer = tiny_trainer(
        args, tokenizer=tokenizer, reward_funcs=[length_reward, accuracy], eval_dataset=tiny_prompt_dataset()
    )
    evaluated = trainer.evaluate()
    assert evaluated["eval_rewards/no_answer"] == sum(extract_answer(text) is None for text in accuracy.texts)
    assert "rewards/no_answer" not in trainer._metrics["train"]


# ------------------------------------------------------------------------------------- forwards the methods add


class _ToolMasked(CreditGRPOTrainer):
    """An all-ones tool mask on the generation batch, as TRL's tool loop adds one: TRL folds it into its loss mask
    before its forward, so a method that drops tokens needs one no-grad forward of each micro-batch."""

    def _generate_and_score_completions(self, inputs):
        batch = super()._generate_and_score_completions(inputs)
        batch["tool_mask"] = torch.ones_like(batch["completion_mask"])
        return batch


@pytest.mark.parametrize(
    "method,setting,per_step",
    [
        ("taco", {}, 0),  # TRL's loss forward
        ("eapo", {}, 0),  # the hidden states `generate` computed
        ("eapo", {"rollout_func": engine_rollout}, 1),  # no scoring forward to reuse: one forward of the batch
        (
            "stapo",
            {"trainer_class": _ToolMasked, "gradient_accumulation_steps": 2, "per_device_train_batch_size": 2},
            2,
        ),
    ],
    ids=["taco", "eapo-generate", "eapo-rollout_func", "stapo-tool_mask"],
)
def test_extra_forwards_logged_are_the_policy_forwards_that_ran(monkeypatch, tmp_path, method, setting, per_step):
    """`credit/extra_forwards` against the no-grad scoring forwards of the policy counted on the module itself (TRL
    runs none in these set-ups: no old-log-prob forward, no reference forward), step by step."""
    from transformers import TrainerCallback

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.16
    setting = dict(setting)
    trainer_class, rollout_func = setting.pop("trainer_class", CreditGRPOTrainer), setting.pop("rollout_func", None)
    tokenizer = make_tiny_tokenizer()
    trainer = tiny_trainer(
        tiny_config(method, tmp_path / "out", max_steps=2, **setting),
        trainer_class,
        tokenizer=tokenizer,
        rollout_func=rollout_func,
    )
    forwards, per_step_counts = [], []

    def count(module, args, kwargs, output):
        if kwargs.get("fused_lm_head") and not torch.is_grad_enabled():
            forwards.append(1)

    class StepCounts(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            per_step_counts.append(len(forwards))
            forwards.clear()

    trainer.model.register_forward_hook(count, with_kwargs=True)
    trainer.add_callback(StepCounts())
    trainer.train()
    logged = [
        entry["credit/extra_forwards"] for entry in trainer.state.log_history if "credit/extra_forwards" in entry
    ]
    assert per_step_counts == [per_step, per_step]
    assert logged == per_step_counts


def test_tide_logs_its_reference_forward_apart(tmp_path):
    tokenizer = make_tiny_tokenizer()
    trainer = tiny_trainer(tiny_config("tide", tmp_path / "out", max_steps=2), tokenizer=tokenizer)
    reference_backbone = trainer.deviation_reference.model_and_context(trainer.model)[0].model
    # One forward of the reference over a batch is two calls of its backbone with a KV cache: each distinct prompt,
    # then the completions on the repeated cache.
    cached_calls = []
    reference_backbone.register_forward_hook(
        lambda module, args, kwargs, output: cached_calls.append(1) if kwargs.get("use_cache") else None,
        with_kwargs=True,
    )
    trainer.train()
    entries = [entry for entry in trainer.state.log_history if "credit/extra_forwards" in entry]
    assert [entry["credit/extra_forwards"] for entry in entries] == [0, 0]  # the policy side from `generate`
    assert [entry["credit/extra_reference_forwards"] for entry in entries] == [1, 1]
    assert len(cached_calls) == 2 * 2


def test_the_loss_forward_of_a_method_dropping_tokens_scores_the_buffered_micro_batch(monkeypatch, make_trainer):
    """The float copy of the completion mask that takes the weights changes nothing in TRL's forward: the attention
    mask has the buffered batch's dtype and values, and the log-probs TRL's loss reads are bitwise those of TRL's
    scoring of the buffered micro-batch."""
    trainer = make_trainer("stapo", max_steps=2, stapo_prob_threshold=0.05, stapo_entropy_quantile=0.5)
    original_compute_loss, original_scoring = GRPOTrainer.compute_loss, GRPOTrainer._get_per_token_logps_and_entropies
    buffered, compared = [], []

    def compute_loss(trainer_self, model, inputs, *args, **kwargs):
        buffered.append(dict(inputs))
        return original_compute_loss(trainer_self, model, inputs, *args, **kwargs)

    def scoring(trainer_self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        logps_BT, entropy_BT, aux = original_scoring(
            trainer_self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
        )
        if torch.is_grad_enabled():  # the loss forward
            batch = buffered[-1]
            want_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
            with torch.no_grad():
                want_BT = original_scoring(trainer_self, model, input_ids, want_mask, logits_to_keep)[0]
            assert attention_mask.dtype == want_mask.dtype and torch.equal(attention_mask, want_mask)
            compared.append(torch.equal(logps_BT.detach(), want_BT))
        return logps_BT, entropy_BT, aux

    monkeypatch.setattr(GRPOTrainer, "compute_loss", compute_loss)
    monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies", scoring)
    trainer.train()
    assert compared and all(compared)
    assert any(entry.get("stapo/dropped_fraction", 0) > 0 for entry in trainer.state.log_history)
