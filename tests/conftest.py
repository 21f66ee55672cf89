"""Shared fixtures: tiny random causal LMs and tokenizers built in-process (no Hub access), a tiny-trainer factory,
and the credit-method registry restored after every test."""

from __future__ import annotations

import json
import os
import sys
import threading

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")  # also for `trl-credit grpo` run in-process, and for subprocesses

import pytest
import torch

torch.set_num_threads(1)  # two torch processes with 2 threads each on 2 cores run several times slower

from trl_credit.methods import CREDIT_METHODS as _REGISTRY  # noqa: E402  (after the environment above)

# The package's own methods, read before any test module registers its probes (test_architectures registers some at
# import, the lab's `oracle` arrives with its module): what the registry-driven path tests parametrise over.
PACKAGE_METHODS = tuple(sorted(_REGISTRY))

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
VOCAB_WORDS = (
    [str(i) for i in range(100)]
    + list("+-*/=()?.,:;")
    + [
        "what",
        "is",
        "the",
        "answer",
        "boxed",
        "\\boxed{",
        "}",
        "sum",
        "of",
        "and",
        "a",
        "b",
        "x",
        "y",
        "solve",
        "problem",
        "step",
        "so",
        "then",
        "final",
    ]
)


def make_tiny_vision_language_model(seed: int = 0):
    """A 2-layer random Qwen2-VL in eval mode (text weights drawn with std 0.5): 64 tokens (image 5, vision start 6
    and end 7, bos 1, eos 2), images of 2 x 2 patches of 3 x 2 x 2 values, each patch one image token."""
    import transformers

    text = dict(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_scaling={"type": "mrope", "mrope_section": [2, 1, 1]},
        max_position_embeddings=128,
        initializer_range=0.5,  # peaked next-token distributions, as `make_tiny_model`'s
    )
    vision = dict(
        depth=1,
        embed_dim=16,
        hidden_size=32,
        num_heads=2,
        in_channels=3,
        patch_size=2,
        spatial_merge_size=1,
        temporal_patch_size=1,
        mlp_ratio=2,
    )
    config = transformers.Qwen2VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=5,
        vision_start_token_id=6,
        vision_end_token_id=7,
        video_token_id=8,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(seed)
    return transformers.Qwen2VLForConditionalGeneration(config).eval()


def make_tiny_tokenizer():
    """A word-level tokenizer with a chat template, pad and eos tokens (vocabulary ~150)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<eos>", "<unk>", "<|user|>", "<|system|>", "<|assistant|>", "<|end|>"]
    vocab = {tok: i for i, tok in enumerate(specials + VOCAB_WORDS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split("<|end|>", behavior="isolated")]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        eos_token="<eos>",
        unk_token="<unk>",
        additional_special_tokens=specials[3:],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


# The families TRL trains whose output transform differs, each set far from the identity: Gemma-2's final-logit
# softcapping, Cohere's `logit_scale`, Granite's `logits_scaling` (`test_architectures.py`).
TINY_FAMILIES = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"final_logit_softcapping": 2.0, "head_dim": 8}),
    "cohere": ("CohereConfig", "CohereForCausalLM", {"logit_scale": 0.25}),
    "cohere2": ("Cohere2Config", "Cohere2ForCausalLM", {"logit_scale": 0.25, "head_dim": 8}),
    "granite": ("GraniteConfig", "GraniteForCausalLM", {"logits_scaling": 4.0}),
}


def make_tiny_model(tokenizer, seed: int = 0, hidden_size: int = 16, family: str = "qwen2"):
    """A 2-layer random causal LM of `family` (`TINY_FAMILIES`) sized to `tokenizer`.

    Weights are drawn with std 0.5 (not HF's 0.02) so that next-token distributions are peaked and
    varied, like a real model's, instead of uniformly flat: entropy quantiles and deviations then
    carry signal.
    """
    import transformers

    config_name, model_name, extra = TINY_FAMILIES[family]
    torch.manual_seed(seed)
    config = getattr(transformers, config_name)(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        initializer_range=0.5,
        **extra,
    )
    return getattr(transformers, model_name)(config)


@pytest.fixture
def tiny_tokenizer():
    return make_tiny_tokenizer()


@pytest.fixture
def tiny_model_dir(tmp_path, tiny_tokenizer):
    """A tiny model and tokenizer saved to disk, so that TRL can reload it (reference model, `--model_name_or_path`)."""
    path = tmp_path / "tiny-model"
    make_tiny_model(tiny_tokenizer).save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture
def process_group_of_one():
    """A gloo process group of this process alone, as a launcher would have made; destroyed after the test unless the
    code under test destroyed it."""
    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@torch.no_grad()
def naive_logprobs(model, batch, temperature, dtype=torch.float32):
    """Full-vocabulary log-probs `(B, T, V)` at the completion positions, from the model's own logits (no trainer code).

    The model's forward applies its own output transform (softcapping, logit scaling); the temperature divides it.
    """
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    num_tokens = batch["completion_ids"].size(1)
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -num_tokens - 1 : -1]
    return torch.log_softmax(logits.to(dtype) / temperature, dim=-1)


def sampled(logp_BTV, completion_ids):
    """The log-probs of the sampled tokens, `(B, T)`."""
    return logp_BTV.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)


def tiny_prompt_dataset(n_prompts: int = 8):
    """Conversational prompts of the kind the tiny tokenizer knows."""
    from datasets import Dataset

    prompts = [[{"role": "user", "content": f"what is {a} + {b} ?"}] for a in range(n_prompts) for b in (1,)]
    return Dataset.from_dict({"prompt": prompts, "solution": [str(a + 1) for a in range(n_prompts)]})


def length_reward(completions, **kwargs):
    """A reward that varies within groups, so advantages are non-zero."""
    return [float(len(c[0]["content"].split()) % 4) for c in completions]


# GTPO's entropy threshold (0.7 nats) filters every completion of a random tiny model (mean entropy ~3.3 nats).
TINY_MODEL_SETTINGS = {"gtpo": {"gtpo_entropy_threshold": 10.0}}


def tiny_config(method: str, output_dir, **overrides):
    """CPU-sane config for a 3-step run on the tiny model; `overrides` win, method hyperparameters in `credit_kwargs`."""
    from trl_credit import CreditGRPOConfig

    settings = dict(
        credit_method=method,
        use_cpu=True,
        bf16=False,
        activation_checkpointing=False,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        max_steps=3,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        learning_rate=5e-2,
        seed=0,
        dataloader_num_workers=0,
    )
    # Method hyperparameters go where a user sets them: `credit_kwargs`.
    from trl_credit.methods import CREDIT_METHODS

    method_fields = {name for m in CREDIT_METHODS.values() for name in m.argument_names}
    for name in str(method).split("+"):  # paper defaults that give a random tiny model no update at all
        for key, value in TINY_MODEL_SETTINGS.get(name.strip(), {}).items():
            overrides.setdefault(key, value)
    credit_kwargs = {key: overrides.pop(key) for key in list(overrides) if key in method_fields}
    if credit_kwargs:
        overrides["credit_kwargs"] = {**(overrides.get("credit_kwargs") or {}), **credit_kwargs}
    settings.update(overrides)
    return CreditGRPOConfig(output_dir=str(output_dir), **settings)


def tiny_trainer(
    args, trainer_class=None, *, model=None, tokenizer=None, reward_funcs=length_reward, train_dataset=None, **kwargs
):
    """A trainer (`CreditGRPOTrainer` unless `trainer_class`) of `args` on a fresh tiny model of `tokenizer` (a fresh
    one unless given) and `tiny_prompt_dataset()`, rewarded by `length_reward`: each replaceable; `kwargs` go to the
    trainer (`peft_config`, `rollout_func`, ...)."""
    from trl_credit import CreditGRPOTrainer

    tokenizer = make_tiny_tokenizer() if tokenizer is None else tokenizer
    return (trainer_class or CreditGRPOTrainer)(
        model=make_tiny_model(tokenizer) if model is None else model,
        reward_funcs=reward_funcs,
        args=args,
        train_dataset=tiny_prompt_dataset() if train_dataset is None else train_dataset,
        processing_class=tokenizer,
        **kwargs,
    )


def tiny_recipe(folder, model_dir, **settings):
    """A `trl-credit grpo --config` recipe in `folder` for a one-step CPU run of the model saved at `model_dir` on 8
    addition problems (JSONL); `settings` win. The run writes to `folder / "run"`."""
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "problems.jsonl"
    data.write_text(
        "".join(json.dumps({"question": f"what is {a} + 1 ?", "answer": str(a + 1)}) + "\n" for a in range(8))
    )
    recipe = {
        "model_name_or_path": model_dir,
        "dataset_name": str(data),
        "reward_funcs": ["format"],
        "output_dir": str(folder / "run"),
        "use_cpu": True,
        "bf16": False,
        "activation_checkpointing": False,
        "per_device_train_batch_size": 4,
        "num_generations": 4,
        "max_completion_length": 6,
        "max_steps": 1,
        "logging_steps": 1,
        "report_to": "none",
        "save_strategy": "no",
    }
    (folder / "recipe.yaml").write_text(yaml.safe_dump({**recipe, **settings}))
    return folder / "recipe.yaml"


@pytest.fixture(autouse=True)
def credit_method_registry():
    """The credit-method registry, restored after the test: what a test registers does not leak into the next one.

    A user module the test imported to register a method (`"examples/custom_credit_method.py:surprise_boost"`) is
    forgotten with its method, so that the next lookup imports, and registers, it again. Registrations by the package's
    own modules (the lab's oracle, on first import) stay: their module stays imported.
    """
    from trl_credit.methods import CREDIT_METHODS

    registered, modules = dict(CREDIT_METHODS), set(sys.modules)
    yield CREDIT_METHODS
    for name, method in list(CREDIT_METHODS.items()):
        module = method.function.__module__
        if name not in registered and not module.startswith("trl_credit."):
            del CREDIT_METHODS[name]
            if module not in modules:
                sys.modules.pop(module, None)
    CREDIT_METHODS.update(registered)


@pytest.fixture(scope="module")
def accelerator():
    """A CPU accelerator of one process, for code that gathers or reduces."""
    from accelerate import Accelerator

    return Accelerator(cpu=True)


@pytest.fixture
def no_model_loading(monkeypatch):
    """Any attempt to resolve or load a model, or to reach the Hub, fails the test: a bad input must be refused
    first."""
    import huggingface_hub.constants
    import transformers

    import trl_credit.data.models

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the bad input was refused")

    monkeypatch.setattr(trl_credit.data.models, "resolve_model_path", refuse)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.fixture
def make_trainer(tmp_path):
    """`make_trainer(method, **overrides)`: a trainer on a fresh tiny model, tokenizer and prompt dataset, rewarded by
    `length_reward`, with [`tiny_config`] (`overrides` win; `output_dir` defaults to `tmp_path / "out"`;
    `trainer_class` defaults to `CreditGRPOTrainer`)."""
    from trl_credit import CreditGRPOTrainer

    def build(method: str, trainer_class=CreditGRPOTrainer, output_dir=None, **overrides):
        return tiny_trainer(tiny_config(method, output_dir or tmp_path / "out", **overrides), trainer_class)

    return build


def train_changing_every_parameter(trainer):
    """Train `trainer` and assert that every trainable parameter changed (TRL's own trainer tests check the same)."""
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    unchanged = [
        name for name, p in trainer.model.named_parameters() if name in before and torch.equal(p, before[name])
    ]
    assert not unchanged, f"parameters that did not change: {unchanged}"
    return trainer


def on_threads_as_processes(run, parties: int = 2) -> list:
    """`[run(rank, gather) for rank in range(parties)]`, each rank on its own thread, where `gather(values)` returns
    every rank's values flattened and concatenated in rank order, as `CreditBatch.gather` does across processes (a
    collective: every rank must call it). A rank that raises breaks the others' wait, and its error is raised here."""
    barrier, slots, results, errors = threading.Barrier(parties), [None] * parties, [None] * parties, []

    def gather_for(rank):
        def gather(values_N):
            slots[rank] = values_N.float().flatten()
            barrier.wait()
            out = torch.cat(list(slots))
            barrier.wait()
            return out

        return gather

    def target(rank):
        try:
            results[rank] = run(rank, gather_for(rank))
        except Exception as error:  # the other ranks must not wait for this one forever
            errors.append(error)
            barrier.abort()

    threads = [threading.Thread(target=target, args=(rank,)) for rank in range(parties)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results
