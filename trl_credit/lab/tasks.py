"""Procedural tasks whose decisive tokens are known, for measuring where a credit method puts the advantage.

Every task shares one word-level vocabulary (`VOCABULARY`) and completions of `COMPLETION_LENGTH` tokens. A task
defines, for a prompt:

- `prior(prompt, position)`: the next-token distribution of the *base policy* at a completion position. The lab's
  tiny model is distilled from it before RL (`trl_credit.lab.model.warm_up`), so the starting policy is known.
- `reward(prompt, completion)`: 1.0 for a success, else 0.0.
- `decisive(prompt, completion)`: per completion token, whether it decided the reward. Credit precision
  (`trl_credit.lab.metrics.credit_precision`) is the share of the advantage mass on these tokens.
- `implausible(prompt, completion)`: per completion token, whether it is a rare token that the reward ignores.

The three tasks:

- `needle`: a key token among filler tokens. The prompt `find kX` names a key; the reward is 1 when the completion
  contains `kX` anywhere. Decisive: the occurrences of `kX`. Every position has the same prior, so no position is
  special; only the token is.
- `fork`: one position where one choice leads to success. Completions follow a low-entropy template of fillers,
  except at `FORK_POSITION`, where the base policy picks `L` or `R` with probability 0.3 each. The prompt `go kX`
  asks for `L` when X is even, `R` when odd. Decisive: the fork position, in successes and failures alike (a
  failure is caused by the wrong choice there). The fork is the high-entropy position.
- `rare`: a rare, implausible token inside correct responses. Like `needle` (reward: the key appears), but on a
  template prior (the template filler has probability 0.85 at each position), and the base policy emits `z` with
  probability 0.001 at every position: deep in its tail, below TACO's threshold `alpha * exp(-H)` (0.0046 at the
  prior's entropy, 0.78 nats, with `alpha = 0.01`), while every other token is above it. `z` never changes the
  reward. TACO's claim is that GRPO reinforces such tokens when they happen to occur
  in positive responses; `trl_credit.lab.run` tracks the policy's probability of `z` in correct responses.
"""

from __future__ import annotations

from collections.abc import Sequence

SPECIAL_TOKENS = ("<pad>", "<eos>", "<unk>")
PROMPT_WORDS = ("find", "go")
KEYS = ("k0", "k1", "k2", "k3")
CHOICES = ("L", "R")
FILLERS = tuple(f"f{i}" for i in range(8))
RARE_TOKEN = "z"
VOCABULARY = (*SPECIAL_TOKENS, *PROMPT_WORDS, *KEYS, *CHOICES, *FILLERS, RARE_TOKEN)

COMPLETION_LENGTH = 8
FORK_POSITION = 3
TEMPLATE_PROBABILITY = 0.9  # probability of the template filler at a non-fork position of the `fork` prior


def _template(position: int) -> str:
    return FILLERS[position % len(FILLERS)]


def _spread(mass: float, tokens: Sequence[str]) -> dict[str, float]:
    return {token: mass / len(tokens) for token in tokens}


def _key_of(prompt: Sequence[str]) -> str:
    keys = [token for token in prompt if token in KEYS]
    if len(keys) != 1:
        raise ValueError(f"a lab prompt names exactly one key of {KEYS}; got {' '.join(prompt)!r}")
    return keys[0]


class LabTask:
    """A procedural task: prompts, base-policy prior, reward and ground-truth token labels.

    Prompts and completions are sequences of vocabulary words (the lab tokenizer maps each word to one token).
    """

    name: str
    prompt_word: str

    def prompts(self) -> list[str]:
        """The distinct prompts of the task, e.g. `["find k0", ..., "find k3"]`."""
        return [f"{self.prompt_word} {key}" for key in KEYS]

    def prior(self, prompt: Sequence[str], position: int) -> dict[str, float]:
        """The base policy's next-token distribution at completion `position` (probabilities summing to 1)."""
        raise NotImplementedError

    def reward(self, prompt: Sequence[str], completion: Sequence[str]) -> float:
        raise NotImplementedError

    def decisive(self, prompt: Sequence[str], completion: Sequence[str]) -> list[bool]:
        raise NotImplementedError

    def implausible(self, prompt: Sequence[str], completion: Sequence[str]) -> list[bool]:
        return [token == RARE_TOKEN for token in completion]


class NeedleTask(LabTask):
    """`needle`: reward 1 when the prompt's key appears; decisive tokens are its occurrences."""

    name, prompt_word = "needle", "find"
    KEY_PROBABILITY = 0.04  # per key and position in the prior; 8 positions give a success rate of 1 - 0.96^8 ~ 0.28

    def prior(self, prompt, position):
        return {**_spread(1.0 - len(KEYS) * self.KEY_PROBABILITY, FILLERS), **dict.fromkeys(KEYS, self.KEY_PROBABILITY)}

    def reward(self, prompt, completion):
        return float(_key_of(prompt) in completion)

    def decisive(self, prompt, completion):
        key = _key_of(prompt)
        return [token == key for token in completion]


class ForkTask(LabTask):
    """`fork`: reward 1 when the token at `FORK_POSITION` is `L` (even key) or `R` (odd key), the decisive position."""

    name, prompt_word = "fork", "go"
    CHOICE_PROBABILITY = 0.3  # per choice at the fork in the prior

    @staticmethod
    def correct_choice(prompt: Sequence[str]) -> str:
        return CHOICES[KEYS.index(_key_of(prompt)) % 2]

    def prior(self, prompt, position):
        if position == FORK_POSITION:
            choices = dict.fromkeys(CHOICES, self.CHOICE_PROBABILITY)
            return {**_spread(1.0 - sum(choices.values()), FILLERS), **choices}
        template = _template(position)
        others = [filler for filler in FILLERS if filler != template]
        return {**_spread(1.0 - TEMPLATE_PROBABILITY, others), template: TEMPLATE_PROBABILITY}

    def reward(self, prompt, completion):
        return float(len(completion) > FORK_POSITION and completion[FORK_POSITION] == self.correct_choice(prompt))

    def decisive(self, prompt, completion):
        return [position == FORK_POSITION for position in range(len(completion))]


class RareTokenTask(LabTask):
    """`rare`: `needle`'s reward on a template prior where `z` (never rewarded) has probability 0.001."""

    name, prompt_word = "rare", "find"
    TEMPLATE_PROBABILITY = 0.85
    KEY_PROBABILITY = 0.02  # success rate of the prior 1 - 0.98^8 ~ 0.15
    RARE_PROBABILITY = 0.001

    def prior(self, prompt, position):
        template = _template(position)
        others = [filler for filler in FILLERS if filler != template]  # ~0.0099 each: not in TACO's tail
        rest = 1.0 - self.TEMPLATE_PROBABILITY - len(KEYS) * self.KEY_PROBABILITY - self.RARE_PROBABILITY
        return {
            **_spread(rest, others), template: self.TEMPLATE_PROBABILITY,
            **dict.fromkeys(KEYS, self.KEY_PROBABILITY), RARE_TOKEN: self.RARE_PROBABILITY,
        }

    def reward(self, prompt, completion):
        return float(_key_of(prompt) in completion)

    def decisive(self, prompt, completion):
        key = _key_of(prompt)
        return [token == key for token in completion]


TASKS: dict[str, LabTask] = {task.name: task for task in (NeedleTask(), ForkTask(), RareTokenTask())}


def get_task(name: str) -> LabTask:
    """The task called `name`; raises `ValueError` naming the known tasks otherwise."""
    if name not in TASKS:
        raise ValueError(f"unknown lab task {name!r}; choose from {', '.join(TASKS)}")
    return TASKS[name]
