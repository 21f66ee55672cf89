"""The lab's policy: a word-level tokenizer over the task vocabulary and a tiny Qwen2 trained from scratch.

Before RL, `warm_up` distils a freshly initialised model into the task's base-policy prior (soft cross-entropy on
sampled completions), so every method starts from the same, known policy: one where the key, the fork choice and
the rare token have the probabilities the task states. That takes a few seconds on one CPU thread.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch

from .tasks import VOCABULARY, LabTask


def make_tokenizer():
    """One token per vocabulary word, split on whitespace; `<pad>`, `<eos>`, `<unk>` are the special tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel(vocab={word: i for i, word in enumerate(VOCABULARY)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def make_model(tokenizer, seed: int, hidden_size: int = 32, num_layers: int = 2, max_length: int = 32):
    """A randomly initialised Qwen2 causal LM sized to `tokenizer` (about 30k parameters at the defaults).

    `max_length`: the longest prompt + completion it must handle (RoPE has no parameters: it does not change them).
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max(32, max_length),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    return Qwen2ForCausalLM(config)


class PriorTargets:
    """The task's prior as `(V,)` probability rows, cached by (prompt, position, previous token)."""

    def __init__(self, task: LabTask, tokenizer):
        self.task, self.tokenizer, self._rows = task, tokenizer, {}

    def row(self, prompt: str, position: int, previous: str | None) -> torch.Tensor:
        key = (prompt, position, previous)
        if key not in self._rows:
            row = torch.zeros(len(self.tokenizer))
            for word, probability in self.task.prior(prompt.split(), position, previous).items():
                row[self.tokenizer.convert_tokens_to_ids(word)] = probability
            self._rows[key] = row
        return self._rows[key]

    def table(self, prompt: str, completion: Sequence[str]) -> torch.Tensor:
        """`(len(completion), V)`: the prior at each position of `completion`, given the tokens before it."""
        previous = [None, *completion[:-1]]
        return torch.stack([self.row(prompt, t, previous[t]) for t in range(len(completion))])


def sample_prior(task: LabTask, prompt: str, rng: random.Random) -> list[str]:
    """One completion (a list of words) drawn from the task's prior."""
    words, completion = prompt.split(), []
    for position in range(task.completion_length):
        distribution = task.prior(words, position, completion[-1] if completion else None)
        completion.append(rng.choices(list(distribution), weights=list(distribution.values()))[0])
    return completion


def warm_up(
    model, tokenizer, task: LabTask, seed: int, steps: int = 300, batch_size: int = 64, learning_rate: float = 1e-2
) -> float:
    """Distil `model` into the task's prior; return the final mean KL(prior || model) per position, in nats.

    Contexts are completions sampled from the prior; the targets are the prior's full distributions (soft labels),
    which converge much faster than the sampled next tokens would.
    """
    rng = random.Random(seed)
    prompts = task.prompts()
    targets = PriorTargets(task, tokenizer)
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)
    model.train()
    kl = float("nan")
    for _ in range(steps):
        batch_prompts = [rng.choice(prompts) for _ in range(batch_size)]
        completions = [sample_prior(task, prompt, rng) for prompt in batch_prompts]
        sequences = [prompt.split() + completion for prompt, completion in zip(batch_prompts, completions)]
        input_ids = torch.tensor([tokenizer.convert_tokens_to_ids(words) for words in sequences])
        prompt_length = input_ids.size(1) - task.completion_length
        # The logits at position p predict token p + 1: completion token t is predicted at prompt_length - 1 + t.
        logits_BTV = model(input_ids=input_ids).logits[:, prompt_length - 1 : -1]
        target_BTV = torch.stack([targets.table(p, c) for p, c in zip(batch_prompts, completions)])
        logps_BTV = torch.log_softmax(logits_BTV.float(), dim=-1)
        cross_entropy = -(target_BTV * logps_BTV).sum(-1).mean()
        # Cross-entropy barely sees tail probabilities (a 0.001 token fit at 0.004 costs 0.003 nats); a squared
        # error on the log-probabilities of the prior's support calibrates the tail as well.
        support_BTV = target_BTV > 0
        log_error = ((logps_BTV - torch.log(target_BTV.clamp(min=1e-30))) ** 2)[support_BTV].mean()
        optimizer.zero_grad()
        (cross_entropy + log_error).backward()
        optimizer.step()
        entropy = -(target_BTV * torch.log(target_BTV.clamp(min=1e-30))).sum(-1).mean()
        kl = (cross_entropy - entropy).item()
    model.eval()
    return kl


@torch.no_grad()
def token_probability(
    model,
    tokenizer,
    sequences: Sequence[Sequence[str]],
    prompt_length: int,
    word: str,
    positions: Sequence[Sequence[bool]] | None = None,
) -> float:
    """Mean probability the model gives to `word` at the completion positions of `sequences` (prompt + completion).

    `positions`: per sequence and completion position, whether it counts (default: every position).
    """
    input_ids = torch.tensor(
        [tokenizer.convert_tokens_to_ids(list(words)) for words in sequences], device=model.device
    )
    logits_BTV = model(input_ids=input_ids).logits[:, prompt_length - 1 : -1]
    probs_BT = torch.softmax(logits_BTV.float(), dim=-1)[..., tokenizer.convert_tokens_to_ids(word)]
    if positions is None:
        return probs_BT.mean().item()
    counted_BT = torch.tensor(positions, dtype=torch.bool, device=probs_BT.device)
    return probs_BT[counted_BT].mean().item()


@torch.no_grad()
def sample_completions(model, tokenizer, prompt: str, n: int, seed: int, length: int) -> list[list[str]]:
    """`n` completions of `length` tokens of `prompt` sampled at temperature 1 (no top-k/top-p), as lists of words."""
    torch.manual_seed(seed)
    input_ids = torch.tensor([tokenizer.convert_tokens_to_ids(prompt.split())], device=model.device).repeat(n, 1)
    output = model.generate(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=length,
        pad_token_id=tokenizer.pad_token_id,
    )
    completions = []
    for ids in output[:, input_ids.size(1) :].tolist():
        words = tokenizer.convert_ids_to_tokens(ids)
        completions.append(words[: words.index("<eos>")] if "<eos>" in words else words)
    return completions
