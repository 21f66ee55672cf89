"""Procedural tasks whose decisive tokens are known, for measuring where a credit method puts the advantage.

Every task shares one word-level vocabulary (`VOCABULARY`). A task is built by `get_task(name, horizon, decisive)`:
completions of `horizon` tokens (`COMPLETION_LENGTH` = 8 by default) and, for `fork` and `mdp`, `decisive`
decisive positions.
A task defines, for a prompt:

- `prior(prompt, position, previous)`: the next-token distribution of the *base policy* at a completion position,
  given the previous completion token (`None` at the first position). The lab's tiny model is distilled from it
  before RL (`trl_credit.experiments.lab.model.warm_up`), so the starting policy is known.
- `reward(prompt, completion)`: 1.0 for a success, else 0.0.
- `decisive(prompt, completion)`: per completion token, whether it decided the reward. Credit precision
  (`trl_credit.experiments.lab.metrics.credit_precision`) is the share of the advantage mass on these tokens, and the `oracle`
  credit method (`trl_credit.experiments.lab.oracle`) gives the advantage to these tokens only.
- `implausible(prompt, completion)`: per completion token, whether it is a rare token that the reward ignores.
- `tail_positions(prompt, completion)`: where the probability of that rare token is probed (`trl_credit.experiments.lab.lab_runs`).

The tasks:

- `needle`: a key token among filler tokens. The prompt `find kX` names a key; the reward is 1 when the completion
  contains `kX` anywhere. Decisive: the occurrences of `kX`. Every position has the same prior, so no position is
  special; only the token is. The per-position prior does not depend on the horizon, so longer completions succeed
  more often under it (1 - 0.96^H).
- `fork`: `decisive` positions (forks, evenly spaced; one at position `FORK_POSITION` = 3 for 8 tokens) where one of
  `L`, `R` is right; the reward is 1 when every fork is right. Completions follow a low-entropy template of fillers
  elsewhere. The prompt `go kX` sets the right choice at fork j: `L` when X + j is even, `R` when odd. The base
  policy picks the right choice with probability `0.3 ** (1 / decisive)`, so its success rate is 0.3 whatever the
  number of forks, and the wrong choice and the fillers share the rest 3 : 4 (0.3 each for one fork: the base policy
  does not know which is right). Decisive: every fork of a success, and the wrong forks of a failure (what caused
  it; with one fork, the fork in successes and failures alike). The forks are the high-entropy positions.
- `mdp`: `fork` where the right choice depends on the fork only (`L`, `R`, `L`, ... for every prompt): a sequential
  decision process of `horizon` steps whose `decisive` steps each have one optimal action. The policy need not
  read the prompt, so what limits learning is credit assignment, not carrying the key over the completion.
- `rare`: a rare, implausible token inside correct responses. Like `needle` (reward: the key appears), but on a
  template prior (the template filler has probability 0.85 at each position), and the base policy emits `z` with
  probability 0.001 at every position: deep in its tail, below TACO's threshold `alpha * exp(-H)` (0.0046 at the
  prior's entropy, 0.78 nats, with `alpha = 0.01`), while every other token is above it. `z` never changes the
  reward. TACO's claim is that GRPO reinforces such tokens when they happen to occur in positive responses;
  `trl_credit.experiments.lab.lab_runs` tracks the policy's probability of `z` in correct responses. `z` occurs in failures as often
  as in successes, so its credit is as often negative as positive.
- `hitch`: `rare`'s template prior and reward, with each key at 0.005 per position (just above TACO's threshold,
  0.0046) and `z` at 0.0015 (deep in the tail, and below STAPO's 0.002); right after `z` the base policy emits the
  prompt's key with probability 0.9 (the template filler takes 0.085, the other fillers the rest). `z` is never
  rewarded itself, but a completion with `z` almost always succeeds and one without rarely does (0.08 at 16
  tokens): `z` co-occurs with success, and choosing it raises the chance of success, so GRPO has a reason to
  reinforce it. (A `z` whose choice cannot change the reward, as in `rare`, gets zero expected policy gradient.)
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

COMPLETION_LENGTH = 8  # the default horizon
MAX_HORIZON = 512
FORK_POSITION = 3  # the fork of the default `fork` task (8 tokens, one fork)
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

    Args:
        horizon: completion length in tokens, 1 to `MAX_HORIZON`.
        decisive: number of decisive positions, for tasks that have a fixed number of them (`fork`, `mdp`); others
            accept only 1.
    """

    name: str
    prompt_word: str
    max_decisive = 1  # tasks whose decisive tokens are occurrences of a token, not a number of positions
    min_horizon = 1
    reward_floor = 0.0  # the reward of a failure: a run whose reward ends here has collapsed

    def __init__(self, horizon: int = COMPLETION_LENGTH, decisive: int = 1):
        if not self.min_horizon <= horizon <= MAX_HORIZON:
            raise ValueError(
                f"horizon of {self.name} must be between {self.min_horizon} and {MAX_HORIZON}, got {horizon}"
            )
        if self.max_decisive == 1 and decisive != 1:
            raise ValueError(f"decisive sets the number of forks of fork and mdp; {self.name} takes 1, got {decisive}")
        if not 1 <= decisive <= min(self.max_decisive, horizon):
            raise ValueError(f"decisive of {self.name} must be between 1 and the horizon ({horizon}), got {decisive}")
        self.completion_length = horizon
        self.decisive_count = decisive

    def prompts(self) -> list[str]:
        """The distinct prompts of the task, e.g. `["find k0", ..., "find k3"]`."""
        return [f"{self.prompt_word} {key}" for key in KEYS]

    def prior(self, prompt: Sequence[str], position: int, previous: str | None = None) -> dict[str, float]:
        """The base policy's next-token distribution at completion `position` after `previous` (sums to 1)."""
        raise NotImplementedError

    def reward(self, prompt: Sequence[str], completion: Sequence[str]) -> float:
        raise NotImplementedError

    def decisive(self, prompt: Sequence[str], completion: Sequence[str]) -> list[bool]:
        raise NotImplementedError

    def implausible(self, prompt: Sequence[str], completion: Sequence[str]) -> list[bool]:
        return [token == RARE_TOKEN for token in completion]

    def tail_positions(self, prompt: Sequence[str], completion: Sequence[str]) -> list[bool]:
        """Where the rare token's probability is probed: every position, unless the task places it."""
        return [True] * len(completion)


class NeedleTask(LabTask):
    """`needle`: reward 1 when the prompt's key appears; decisive tokens are its occurrences."""

    name, prompt_word = "needle", "find"
    KEY_PROBABILITY = 0.04  # per key and position in the prior; 8 positions give a success rate of 1 - 0.96^8 ~ 0.28

    def prior(self, prompt, position, previous=None):
        return {
            **_spread(1.0 - len(KEYS) * self.KEY_PROBABILITY, FILLERS),
            **dict.fromkeys(KEYS, self.KEY_PROBABILITY),
        }

    def reward(self, prompt, completion):
        return float(_key_of(prompt) in completion)

    def decisive(self, prompt, completion):
        key = _key_of(prompt)
        return [token == key for token in completion]


class ForkTask(LabTask):
    """`fork`: reward 1 when every fork holds its right choice; the forks are the decisive positions."""

    name, prompt_word = "fork", "go"
    max_decisive = MAX_HORIZON
    BASE_SUCCESS = 0.3  # success rate of the prior, whatever the number of forks

    def __init__(self, horizon: int = COMPLETION_LENGTH, decisive: int = 1):
        super().__init__(horizon, decisive)
        k = decisive
        # Evenly spaced, each in the middle of its 1/k of the completion (position 3 for 8 tokens and one fork).
        self.fork_positions = tuple((2 * j * horizon + horizon - k) // (2 * k) for j in range(k))
        self.right_probability = self.BASE_SUCCESS ** (1 / k)

    def right_choice(self, prompt: Sequence[str], fork: int = 0) -> str:
        return CHOICES[(KEYS.index(_key_of(prompt)) + fork) % 2]

    def correct_choice(self, prompt: Sequence[str]) -> str:
        """The right choice at the first fork."""
        return self.right_choice(prompt, 0)

    def prior(self, prompt, position, previous=None):
        if position in self.fork_positions:
            right = self.right_choice(prompt, self.fork_positions.index(position))
            wrong = CHOICES[1 - CHOICES.index(right)]
            rest = 1.0 - self.right_probability
            return {**_spread(rest * 4 / 7, FILLERS), right: self.right_probability, wrong: rest * 3 / 7}
        template = _template(position)
        others = [filler for filler in FILLERS if filler != template]
        return {**_spread(1.0 - TEMPLATE_PROBABILITY, others), template: TEMPLATE_PROBABILITY}

    def reward(self, prompt, completion):
        if len(completion) <= self.fork_positions[-1]:
            return 0.0
        return float(all(completion[p] == self.right_choice(prompt, j) for j, p in enumerate(self.fork_positions)))

    def decisive(self, prompt, completion):
        # A success needs every fork; a failure is caused by its wrong forks only, not by the right ones.
        success = self.reward(prompt, completion) > 0
        wrong = {
            p
            for j, p in enumerate(self.fork_positions)
            if p < len(completion) and completion[p] != self.right_choice(prompt, j)
        }
        return [
            position in self.fork_positions and (success or position in wrong) for position in range(len(completion))
        ]


class MDPTask(ForkTask):
    """`mdp`: `fork` where the right choice at fork j is the same for every prompt (`L` for even j, `R` for odd)."""

    name = "mdp"

    def right_choice(self, prompt: Sequence[str], fork: int = 0) -> str:
        return CHOICES[fork % 2]


class RareTokenTask(NeedleTask):
    """`rare`: `needle`'s reward on a template prior where `z` (never rewarded) has probability 0.001."""

    name = "rare"
    TEMPLATE_PROBABILITY = 0.85
    KEY_PROBABILITY = 0.02  # success rate of the prior 1 - 0.98^8 ~ 0.15
    RARE_PROBABILITY = 0.001

    def prior(self, prompt, position, previous=None):
        template = _template(position)
        others = [filler for filler in FILLERS if filler != template]  # ~0.0099 each: not in TACO's tail
        rest = 1.0 - self.TEMPLATE_PROBABILITY - len(KEYS) * self.KEY_PROBABILITY - self.RARE_PROBABILITY
        return {
            **_spread(rest, others),
            template: self.TEMPLATE_PROBABILITY,
            **dict.fromkeys(KEYS, self.KEY_PROBABILITY),
            RARE_TOKEN: self.RARE_PROBABILITY,
        }


class HitchTask(RareTokenTask):
    """`hitch`: `rare` with `z` at 0.0015, after which the base policy emits the prompt's key with probability 0.9."""

    name = "hitch"
    KEY_PROBABILITY = 0.005  # just above TACO's threshold (0.0046); success of the prior ~ 0.1 at 16 tokens
    RARE_PROBABILITY = 0.0015
    KEY_AFTER_RARE = 0.9

    def prior(self, prompt, position, previous=None):
        if previous != RARE_TOKEN:
            return super().prior(prompt, position, previous)
        template = _template(position)
        others = [filler for filler in FILLERS if filler != template]
        rest = 1.0 - self.KEY_AFTER_RARE - self.TEMPLATE_PROBABILITY * (1.0 - self.KEY_AFTER_RARE)
        return {
            **_spread(rest, others),
            template: self.TEMPLATE_PROBABILITY * (1.0 - self.KEY_AFTER_RARE),
            _key_of(prompt): self.KEY_AFTER_RARE,
        }


TASKS: dict[str, type[LabTask]] = {
    task.name: task for task in (NeedleTask, ForkTask, MDPTask, RareTokenTask, HitchTask)
}


def get_task(name: str, horizon: int = COMPLETION_LENGTH, decisive: int = 1) -> LabTask:
    """The task called `name` with completions of `horizon` tokens; raises `ValueError` naming the known tasks."""
    if name not in TASKS:
        raise ValueError(f"unknown lab task {name!r}; choose from {', '.join(TASKS)}")
    return TASKS[name](horizon, decisive)
