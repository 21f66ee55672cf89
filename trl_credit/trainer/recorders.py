"""What the trainer records from forwards TRL runs anyway, so that a statistic costs no second policy forward.

Each recorder is a context manager that hooks the policy (or its backbone) for the duration of one TRL call and is
removed after it: the final hidden states of a forward (`recorded_final_hidden`), the hidden states `generate`
scored each sampled token with (`recorded_generation_hidden`), and the entropies and hidden states of TRL's
old-log-prob forward (`recorded_scoring_forward`), both set up for a batch's generation by `recorded_rollout`.
`statistics_sources` decides which record covers a batch. Each takes the module it hooks (`policy`: the unwrapped
policy, whose backbone is hooked; `model`: the module TRL's scoring forward calls).
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import torch

from ..methods import GENERATION_STATISTICS, ROLLOUT_LOGPS, ROLLOUT_UNSAMPLED
from .batch_layout import valid_mask
from .model_parts import backbone
from .trl_compat import output_cache

# Generation statistics of the rollout policy's full next-token distribution (beyond the sampled token's log-prob).
ROLLOUT_DISTRIBUTION = tuple(name for name in GENERATION_STATISTICS if name != ROLLOUT_LOGPS)


@contextmanager
def _policy_backbone_hook(policy, hook):
    """Run `hook(module, args, output)` after every forward of the policy's backbone inside the block."""
    handle = backbone(policy).register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


@contextmanager
def recorded_final_hidden(policy, enabled: bool = True):
    """Yield a list that receives the `(b, L, H)` final hidden states (detached) of every forward of the policy's
    backbone run inside the block, in call order; TRL's fused LM head calls the backbone once per row chunk, so
    concatenating the list gives the batch's hidden states. Records nothing when not `enabled`."""
    recorded = []
    hook = lambda module, args, output: recorded.append(output.last_hidden_state.detach())  # noqa: E731
    with _policy_backbone_hook(policy, hook) if enabled else nullcontext():
        yield recorded


class GenerationHidden:
    """The final hidden states with which `generate` scored each token it sampled, read from the policy's backbone.

    `generate` runs the backbone with a KV cache: the prefill (one call, or one per chunk with `prefill_chunk_size`)
    covers the prompt, then each decoding step covers the one token it just sampled. Laid end to end, the calls
    cover the padded sequence position by position, as one forward over prompt + completion does; a call's last
    position scores the next token, so only that position of each call is kept (`B x H` per decoding step, not the
    prompt's hidden states). `tests/test_architectures.py` checks the statistics built on them against the model's
    own logits. TRL's scoring forwards pass `use_cache=False` and return no cache, so they are not recorded.
    """

    def __init__(self):
        self.length = 0  # sequence positions covered so far
        self.last_positions: list[int] = []
        self.last_hidden: list[torch.Tensor] = []  # (B, H) each

    def __call__(self, module, args, output):
        if output_cache(output) is None:
            return
        self.length += output.last_hidden_state.size(1)
        self.last_positions.append(self.length - 1)
        self.last_hidden.append(output.last_hidden_state[:, -1].detach())

    def completion_hidden(self, batch) -> torch.Tensor | None:
        """`(B, T, H)` hidden states that scored each completion token, or None when the record does not cover the
        batch (nothing recorded, other rows, a decoding mode that is not one token per step)."""
        valid_BT = valid_mask(batch)
        prompt_len, completion_len = batch["prompt_ids"].size(1), batch["completion_ids"].size(1)
        # The hidden state at position p predicts token p + 1: completion token t is scored at prompt_len - 1 + t.
        if prompt_len - 1 not in self.last_positions:
            return None
        first = self.last_positions.index(prompt_len - 1)
        scoring = self.last_hidden[first : first + completion_len]
        generated = len(scoring)  # below completion_len only where TRL padded the completions further
        if self.last_positions[first : first + generated] != list(range(prompt_len - 1, prompt_len - 1 + generated)):
            return None
        if any(hidden.size(0) != valid_BT.size(0) for hidden in scoring) or valid_BT[:, generated:].any():
            return None
        return torch.nn.functional.pad(torch.stack(scoring, dim=1), (0, 0, 0, completion_len - generated))


@contextmanager
def recorded_generation_hidden(policy, enabled: bool):
    """Yield a `GenerationHidden` that records the policy's backbone during `generate` inside the block (or None
    when not `enabled`)."""
    record = GenerationHidden() if enabled else None
    with _policy_backbone_hook(policy, record) if enabled else nullcontext():
        yield record


class ScoringForward:
    """The policy's fused-LM-head forwards (`model(..., fused_lm_head=True)`) run inside a block, as TRL's
    `_get_per_token_logps_and_entropies` makes them: one call per row chunk. Each call keeps the per-position
    log-probs and entropies the fused head computed (TRL's policy head always computes both, at the sampling
    temperature and with the model's output transform) and, when `keep_hidden`, the backbone's final hidden states
    aligned with them (position p scores token p + 1).

    Inside `_generate_and_score_completions` such calls are TRL's old-log-prob forward and, with PEFT and `beta != 0`,
    its reference forward (adapter disabled, same module): `statistics` tells them apart by the log-probs TRL returned.
    """

    def __init__(self, keep_hidden: bool):
        self.keep_hidden = keep_hidden
        self.calls: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = []
        self._hidden = None  # the backbone's output of the call in progress

    def backbone_hook(self, module, args, output):
        if self.keep_hidden:
            self._hidden = output.last_hidden_state.detach()

    def model_hook(self, module, args, kwargs, output):
        hidden, self._hidden = self._hidden, None
        if not kwargs.get("fused_lm_head") or getattr(output, "entropy", None) is None:
            return
        log_probs = output.log_probs.detach()
        if hidden is not None:
            hidden = hidden[:, : log_probs.size(1)]  # unshifted labels: the last position scores nothing
        self.calls.append((log_probs, output.entropy.detach(), hidden))

    def statistics(self, batch) -> tuple[torch.Tensor, list[torch.Tensor] | None] | None:
        """`(entropy_BT, hidden states or None)` of the consecutive calls whose log-probs are exactly the batch's
        `old_per_token_logps` (the rows TRL scored, in order), or None when no such calls were recorded. The hidden
        states are each call's `(b, T, H)`, in row order (`batch_layout.rows_of` reads rows of them), not concatenated:
        the batch's states, 10 GiB for a 32B model's generation batch at 16k tokens, are held once."""
        old_BT = batch.get("old_per_token_logps")
        if old_BT is None:
            return None
        num_rows, num_tokens = old_BT.shape
        for first in range(len(self.calls)):
            last, rows = first, 0
            while last < len(self.calls) and rows < num_rows:
                rows += self.calls[last][0].size(0)
                last += 1
            calls = self.calls[first:last]
            if rows != num_rows or any(
                c[0].size(1) < num_tokens or (self.keep_hidden and c[2] is None) for c in calls
            ):
                continue
            logps_BT = torch.cat([c[0][:, -num_tokens:] for c in calls])
            if torch.equal(logps_BT, old_BT):
                entropy_BT = torch.cat([c[1][:, -num_tokens:] for c in calls]).float()
                hidden_chunks = [c[2][:, -num_tokens:] for c in calls] if self.keep_hidden else None
                return entropy_BT, hidden_chunks
        return None


@contextmanager
def recorded_scoring_forward(model, policy, enabled: bool, keep_hidden: bool):
    """Yield a `ScoringForward` that records the fused-LM-head forwards of `model` (the module TRL's scoring forward
    calls) inside the block, with the final hidden states of `policy`'s backbone (or None when not `enabled`)."""
    if not enabled:
        yield None
        return
    record = ScoringForward(keep_hidden)
    handle = model.register_forward_hook(record.model_hook, with_kwargs=True)
    try:
        with _policy_backbone_hook(policy, record.backbone_hook):
            yield record
    finally:
        handle.remove()


@contextmanager
def recorded_rollout(
    model,
    policy,
    statistics: tuple[str, ...],
    one_generate_call: bool,
    scoring_forward: bool,
    keep_hidden: bool,
):
    """Yield `(GenerationHidden or None, ScoringForward or None)`: the records of TRL's generation of a batch inside
    the block that the generation-batch `statistics` can use. `generate` is recorded where TRL samples in one call
    (`one_generate_call`); TRL's old-log-prob forward where it runs one (`scoring_forward`) and a statistic reads the
    rollout policy's full distribution (keeping its hidden states when `keep_hidden` or for the `ROLLOUT_UNSAMPLED` statistics).
    Nothing without `statistics`."""
    if not statistics:
        yield None, None
        return
    score = scoring_forward and any(name in ROLLOUT_DISTRIBUTION for name in statistics)
    keep_hidden = keep_hidden or any(name in ROLLOUT_UNSAMPLED for name in statistics)
    with (
        recorded_generation_hidden(policy, one_generate_call) as generation,
        recorded_scoring_forward(model, policy, score, keep_hidden) as scoring,
    ):
        yield generation, scoring
