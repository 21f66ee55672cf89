"""The reference computations the method tests compare against: each paper's (or official code's) rule worked out
token by token with Python loops, independent of the package, and the random inputs they run on."""

import math
from typing import NamedTuple

import torch

B, T, V = 6, 9, 50


def random_inputs(seed=0, B=B, T=T):
    """Sequence advantages (row 0 zero), log-probs, entropies, deviations and a padded mask (row 1 one token)."""
    g = torch.Generator().manual_seed(seed)
    adv = torch.randn(B, generator=g)
    adv[0] = 0.0
    entropy = torch.rand(B, T, generator=g) * 3
    logps = -torch.rand(B, T, generator=g) * 8
    deviation = torch.rand(B, T, generator=g) * 0.5
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[1] = 1
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    return adv, logps, entropy, deviation, mask


def taco_loop(adv, logps, entropy, mask, alpha, lam):
    """TACO: r = -log p - H + log alpha; w = 1 - lam (1 - exp(-r)) in the tail (r > 0); A > 0 takes w A."""
    out = torch.zeros(mask.shape)
    for i in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            if not mask[i, t]:
                continue
            r = -logps[i, t].item() - entropy[i, t].item() + math.log(alpha)
            w = 1.0 if r <= 0 else 1 - lam * (1 - math.exp(-r))
            out[i, t] = adv[i] * w if adv[i] > 0 else adv[i]
    return out


def eapo_loop(adv, entropy, mask, kappa, quantiles):
    """EAPO: batch quantiles of H, h = clamp((H - q_lo) / (q_hi - q_lo), 0, 1), r = exp(kappa sign(A) h), w = r / mean r."""
    valid = sorted(entropy[i, t].item() for i in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[i, t])

    def q(p):  # linear interpolation between order statistics
        pos = p * (len(valid) - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, len(valid) - 1)
        return valid[lo] + (valid[hi] - valid[lo]) * (pos - lo)

    q_lo, q_hi = q(quantiles[0]), q(quantiles[1])
    out = torch.zeros(mask.shape)
    for i in range(mask.shape[0]):
        sign = int(adv[i] > 0) - int(adv[i] < 0)
        ratios = {}
        for t in range(mask.shape[1]):
            if mask[i, t]:
                h = min(max((entropy[i, t].item() - q_lo) / (q_hi - q_lo + 1e-8), 0.0), 1.0)
                ratios[t] = math.exp(kappa * sign * h)
        for t, r in ratios.items():
            out[i, t] = adv[i] * r / (sum(ratios.values()) / len(ratios))
    return out


def tide_loop(adv, deviation, entropy, mask, vocab_size, tau, kappa):
    """TIDE: s = d (H / log|V|)^kappa, w = T_i softmax(s / tau) over the response's valid tokens."""
    out = torch.zeros(mask.shape)
    for i in range(mask.shape[0]):
        scores = {}
        for t in range(mask.shape[1]):
            if mask[i, t]:
                gate = min(max(entropy[i, t].item() / math.log(vocab_size), 0.0), 1.0)
                scores[t] = deviation[i, t].item() * gate**kappa / tau
        z = sum(math.exp(s) for s in scores.values())
        for t, s in scores.items():
            out[i, t] = adv[i] * len(scores) * math.exp(s) / z
    return out


def unsampled_statistics(logp_BTV, ids_BT):
    """`1 - p_y` and `sum_{v != y} p_v^2` at each position, in float64 from the full log-probs: the sampled token's
    probability is set to 0 before the sums, never subtracted after them."""
    others_BTV = logp_BTV.double().exp().scatter(-1, ids_BT.unsqueeze(-1), 0.0)
    return others_BTV.sum(-1), others_BTV.square().sum(-1)


def otb_loop(rewards, groups, weights, mask, handle_zero_tail=True):
    """OTB's official rule (verl's `compute_optimal_token_baseline_advantage`, see tests/test_otb.py) with Python
    loops, in float64, from the per-token weights `w = 1 - 2 pi_t + sum_v pi_v^2` (as verl writes it, or as
    `(1 - pi_t)^2 + sum_{v != t} pi_v^2` from `unsampled_statistics`)."""
    rows, cols = mask.shape
    weight = [[0.0] * cols for _ in range(rows)]
    for i in range(rows):
        total = 0.0
        for t in range(cols):
            if mask[i, t]:
                total += float(weights[i, t])
            weight[i][t] = total
    lengths = [int(mask[i].sum()) for i in range(rows)]
    baseline = [[0.0] * cols for _ in range(rows)]
    for g in {int(x) for x in groups}:
        members = [i for i in range(rows) if int(groups[i]) == g]
        if len(members) == 1:
            continue
        for t in range(cols):
            num = sum(float(rewards[i]) * weight[i][t] for i in members if mask[i, t])
            den = sum(weight[i][t] for i in members if mask[i, t]) + 1e-8
            for i in members:
                baseline[i][t] = num / den
        if handle_zero_tail:
            ordered = sorted(lengths[i] for i in members)
            longest = [i for i in members if lengths[i] == ordered[-1]]
            if len(longest) == 1 and ordered[-1] > ordered[-2]:
                for t in range(ordered[-2], cols):
                    baseline[longest[0]][t] = 0.0
    return torch.tensor(
        [[(float(rewards[i]) - baseline[i][t]) if mask[i, t] else 0.0 for t in range(cols)] for i in range(rows)],
        dtype=torch.float64,
    )


class OTBBatch(NamedTuple):
    """OTB's inputs: raw rewards, prompt groups, the valid-token mask, the sampled tokens' rollout statistics as the
    trainer hands them to OTB (float32, by name) and their exact per-token weights (float64)."""

    rewards: torch.Tensor
    groups: torch.Tensor
    mask: torch.Tensor
    statistics: dict
    weights: torch.Tensor
    logps: torch.Tensor  # verl's inputs: the sampled token's log-prob and sum_v p_v^2
    sum_sq: torch.Tensor


def otb_batch(seed, groups=3, size=4, cols=10, vocab=30, sharpness=3.0):
    """OTB's inputs for the distributions of random logits (`sharpness` times standard normal; at 3 few tokens are
    near-certain), rewards and prompt groups in any row order."""
    g = torch.Generator().manual_seed(seed)
    rows = groups * size
    lengths = torch.randint(0, cols + 1, (rows,), generator=g)
    mask = torch.arange(cols).unsqueeze(0) < lengths.unsqueeze(1)
    logp_all = torch.log_softmax(torch.randn(rows, cols, vocab, generator=g, dtype=torch.float64) * sharpness, dim=-1)
    ids = torch.multinomial(logp_all.exp().view(-1, vocab), 1, generator=g).view(rows, cols)
    mass, others_sq = unsampled_statistics(logp_all, ids)
    rewards = torch.randint(0, 2, (rows,), generator=g).float() if seed % 2 else torch.randn(rows, generator=g)
    group_index = torch.arange(groups).repeat_interleave(size)[torch.randperm(rows, generator=g)]  # any row order
    statistics = {"rollout_unsampled_mass": mass.float(), "rollout_unsampled_sum_sq_probs": others_sq.float()}
    logps = logp_all.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    return OTBBatch(
        rewards, group_index, mask, statistics, mass.square() + others_sq, logps.float(), (2 * logp_all).exp().sum(-1)
    )


def stare_loop(advantages_B, logps_BT, mask_BT, batch_entropy, variant, ratio, w, m, target):
    """The official rule, token by token, in float64 (distinct surprisals: no ties to break)."""
    advantages_BT = [[float(advantages_B[i])] * mask_BT.size(1) for i in range(mask_BT.size(0))]
    return stare_token_loop(advantages_BT, logps_BT, mask_BT, batch_entropy, variant, ratio, w, m, target)


def stare_token_loop(advantages_BT, logps_BT, mask_BT, batch_entropy, variant, ratio, w, m, target):
    """The same on token advantages (the official loss reads its `advantages` tensor, per token)."""
    rows, cols = mask_BT.shape
    out = [[0.0] * cols for _ in range(rows)]
    gate_on = batch_entropy < target
    weight = {}
    for sign, factor in ((1, w), (-1, m)):
        if sign < 0 and variant != "C2":
            continue
        candidates = [
            (-float(logps_BT[i, t]), i, t)
            for i in range(rows)
            for t in range(cols)
            if mask_BT[i, t] and (float(advantages_BT[i][t]) > 0 if sign > 0 else float(advantages_BT[i][t]) < 0)
        ]
        if not candidates or ratio <= 0:
            continue
        k = min(max(1, int(len(candidates) * ratio + 0.999999)), len(candidates))
        for _, i, t in sorted(candidates, reverse=True)[:k]:
            weight[i, t] = factor
    for i in range(rows):
        for t in range(cols):
            if mask_BT[i, t]:
                out[i][t] = float(advantages_BT[i][t]) * (weight.get((i, t), 1.0) if gate_on else 1.0)
    return torch.tensor(out, dtype=torch.float64)


def gtpo_loop(adv, ids, mask, entropy, groups, pad_id, weight=2.0, threshold=0.7, scale=0.1, normalize=True):
    """GTPO's official rules (`build_conflict_mask` and the entropy step of `UnslothEfficientGTPO.forward` in
    winstonsmith1897/GTPO `gtpo/gtpo_training.py`), per group and per token, over each completion's valid tokens.
    `ids` are the completion ids as TRL gives them, padding included; `pad_id` is the official `PAD_ID`, which only
    excludes tokens. Past a completion's end the official keys read the row's other ids (TRL's padding): forwards in
    order, from the end backwards, as its rotation does. The run from the end is indexed by rank from the end, where
    the official code also tests for the pad id and counts the conflicts (rank k of either run)."""
    rows, cols = mask.shape
    sign = [int(adv[i] > 0) - int(adv[i] < 0) for i in range(rows)]
    tokens = [[int(ids[i, t]) for t in range(cols) if mask[i, t]] for i in range(rows)]
    padding = [[int(ids[i, t]) for t in range(cols) if not mask[i, t]] for i in range(rows)]

    def token(j, k, from_end):
        if k >= len(tokens[j]):  # past a completion's end: the ids TRL put there
            past = k - len(tokens[j])
            return padding[j][len(padding[j]) - 1 - past] if from_end else padding[j][past]
        return tokens[j][len(tokens[j]) - 1 - k] if from_end else tokens[j][k]

    out = torch.zeros(mask.shape)
    for i in range(rows):
        n = len(tokens[i])
        in_run = {False: [False] * n, True: [False] * n}
        if sign[i] != 0:
            members = [j for j in range(rows) if groups[j] == groups[i] and sign[j] != 0]
            for from_end in (False, True):
                run = True
                for k in range(n):
                    x = token(i, k, from_end)
                    in_pos = any(sign[j] > 0 and token(j, k, from_end) == x for j in members)
                    in_neg = any(sign[j] < 0 and token(j, k, from_end) == x for j in members)
                    run = run and in_pos and in_neg
                    # Officially the pad-id test reads the token at rank k from the start, in both directions.
                    in_run[from_end][k] = run and token(i, k, False) != pad_id
        mean_entropy = sum(float(entropy[i, t]) for t in range(cols) if mask[i, t]) / max(n, 1)
        conflicts = sum(1 for k in range(n) if in_run[False][k] or in_run[True][k])  # per rank, as officially
        count = max(conflicts, 1) if normalize else 1
        positions = [t for t in range(cols) if mask[i, t]]
        for k, t in enumerate(positions):
            delta = 1.0
            for hit in (in_run[False][k], in_run[True][n - 1 - k]):
                if hit:
                    delta *= weight if sign[i] > 0 else 0.0
            if mean_entropy <= threshold:
                out[i, t] = delta * (float(adv[i]) - scale * mean_entropy) / count
    return out


def hicra_loop(adv, ids, mask, texts, grams, alpha=0.2):
    """HICRA (arXiv 2509.03646): A + alpha |A| on the tokens whose text overlaps a strategic gram, found character by
    character: case-insensitive, whole words, any whitespace run between the gram's words."""

    def word_char(ch):
        return ch.isalnum() or ch == "_"

    def match_end(text, start, words):
        position = start
        for index, word in enumerate(words):
            if text[position : position + len(word)].lower() != word.lower():
                return None
            position += len(word)
            if index < len(words) - 1:
                if position >= len(text) or not text[position].isspace():
                    return None
                while position < len(text) and text[position].isspace():
                    position += 1
        if position < len(text) and word_char(text[position]):
            return None
        return position

    out = torch.zeros(mask.shape)
    for i in range(mask.shape[0]):
        positions = [t for t in range(mask.shape[1]) if mask[i, t]]
        pieces = [texts[int(ids[i, t])] for t in positions]
        text = "".join(pieces)
        marked = [False] * len(text)
        for gram in grams:
            words = gram.split()
            for start in range(len(text)):
                if start > 0 and word_char(text[start - 1]):
                    continue
                end = match_end(text, start, words)
                if end is not None:
                    for c in range(start, end):
                        marked[c] = True
        offset = 0
        for t, piece in zip(positions, pieces):
            planning = any(marked[offset : offset + len(piece)])
            offset += len(piece)
            a = float(adv[i])
            out[i, t] = a + alpha * abs(a) if planning else a
    return out


@torch.no_grad()
def hellinger_and_entropy_naive(
    hidden_NH,
    ref_hidden_NH,
    weight_VH,
    ref_weight_VH=None,
    bias_V=None,
    ref_bias_V=None,
    temperature=1.0,
    transform=None,
    ref_transform=None,
):
    """Squared Hellinger distance and policy entropy per token from both full `(N, V)` logit matrices (the streamed
    kernels' reference). `transform(logits, temperature)`: the model's scale, softcap and temperature; by default
    division by the temperature."""
    ref_weight_VH = weight_VH if ref_weight_VH is None else ref_weight_VH
    transform = transform if transform is not None else (lambda logits, temperature: logits / temperature)
    ref_transform = transform if ref_transform is None else ref_transform

    def log_probs(hidden, weight, bias, apply):
        logits = hidden.float() @ weight.float().T
        if bias is not None:
            logits = logits + bias.float()
        return torch.log_softmax(apply(logits, temperature), -1)

    logp_NV = log_probs(hidden_NH, weight_VH, bias_V, transform)
    logq_NV = log_probs(ref_hidden_NH, ref_weight_VH, ref_bias_V, ref_transform)
    deviation_N = (1.0 - torch.exp(0.5 * (logp_NV + logq_NV)).sum(-1)).clamp(0.0, 1.0)
    entropy_N = -(logp_NV.exp() * logp_NV).sum(-1)
    return deviation_N, entropy_N
