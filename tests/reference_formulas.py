"""The reference computations the method tests compare against: each paper's (or official code's) rule worked out
token by token with Python loops, independent of the package, and the random inputs they run on."""

import math

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


def otb_loop(rewards, groups, logps, sum_sq, mask, handle_zero_tail=True):
    """OTB's official rule (verl's `compute_optimal_token_baseline_advantage`, see tests/test_otb.py) with Python
    loops, in float64."""
    rows, cols = mask.shape
    weight = [[0.0] * cols for _ in range(rows)]
    for i in range(rows):
        total = 0.0
        for t in range(cols):
            if mask[i, t]:
                total += (
                    1 - 2 * float(torch.tensor(float(logps[i, t]), dtype=torch.float64).exp()) + float(sum_sq[i, t])
                )
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


def otb_batch(seed, groups=3, size=4, cols=10, vocab=30):
    """OTB's inputs: rewards, prompt groups in any row order, and rollout statistics of real distributions (the sampled
    token's log-prob and sum_v p_v^2 of random logits)."""
    g = torch.Generator().manual_seed(seed)
    rows = groups * size
    lengths = torch.randint(0, cols + 1, (rows,), generator=g)
    mask = torch.arange(cols).unsqueeze(0) < lengths.unsqueeze(1)
    logp_all = torch.log_softmax(torch.randn(rows, cols, vocab, generator=g) * 3, dim=-1)
    ids = torch.multinomial(logp_all.exp().view(-1, vocab), 1, generator=g).view(rows, cols)
    logps = logp_all.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    sum_sq = (2 * logp_all).exp().sum(-1)
    rewards = torch.randint(0, 2, (rows,), generator=g).float() if seed % 2 else torch.randn(rows, generator=g)
    group_index = torch.arange(groups).repeat_interleave(size)[torch.randperm(rows, generator=g)]  # any row order
    return rewards, group_index, logps, sum_sq, mask


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
