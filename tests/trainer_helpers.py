"""Helpers shared by the trainer tests (test_trainer, test_engines, test_architectures, test_extending).

- `AdvantageRecorder` wraps TRL's `GRPOTrainer` methods (which `CreditGRPOTrainer` reaches through `super()`): at
  generation time it recomputes each method's statistics the plain way (full logits, torch quantiles), and at loss
  time it checks that the advantages TRL's `_compute_loss` consumed are the specification's per-token loops over
  those statistics.
- `assert_all_params_changed`: TRL's own check that a short run trained every trainable parameter.
- `FakeVLLMGeneration` and `make_rollout_func`: TRL's vLLM path on a CPU, a `rollout_func` sampling from the policy
  with log-probs perturbed like an inference engine's, and a stand-in for the weight sync.
"""

import torch
from conftest import naive_logprobs, sampled
from reference_formulas import eapo_loop, taco_loop, tide_loop
from trl import GRPOTrainer

from trl_credit.methods.eapo import eapo_kappa_schedule


def _row_key(prompt_ids, completion_ids):
    return tuple(prompt_ids.tolist()) + (-1,) + tuple(completion_ids.tolist())


def _inputs(batch):
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    mask = batch["completion_mask"] * batch["tool_mask"] if "tool_mask" in batch else batch["completion_mask"]
    return input_ids, attention_mask, mask


class AdvantageRecorder:
    """Expected token advantages computed outside the trainer, checked where TRL consumes them."""

    def __init__(self, monkeypatch, trainer):
        self.trainer = trainer
        self.expected = {}
        self.checked_batches = 0
        self.expected_taco = None
        original_generate = GRPOTrainer._generate_and_score_completions
        original_compute_loss = GRPOTrainer.compute_loss
        original_loss = GRPOTrainer._compute_loss

        def generate(trainer_self, inputs):
            batch = original_generate(trainer_self, inputs)
            self._expect_generation(batch)
            return batch

        def compute_loss(trainer_self, model, inputs, *args, **kwargs):
            # Before the trainer's `_compute_loss` starts: its training forward is the only one TRL's loss sees.
            self.expected_taco = self._expect_taco(inputs) if trainer.args.credit_method == "taco" else None
            return original_compute_loss(trainer_self, model, inputs, *args, **kwargs)

        def inner_loss(trainer_self, model, inputs):
            loss = original_loss(trainer_self, model, inputs)
            self._check(inputs, self.expected_taco)
            return loss

        monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", generate)
        monkeypatch.setattr(GRPOTrainer, "compute_loss", compute_loss)
        monkeypatch.setattr(GRPOTrainer, "_compute_loss", inner_loss)

    @torch.no_grad()
    def _expect_generation(self, batch):
        trainer, args = self.trainer, self.trainer.args
        if trainer.args.credit_method not in ("eapo", "tide"):
            return
        _, _, mask = _inputs(batch)
        logp_policy = naive_logprobs(trainer.model, batch, trainer.temperature)
        entropy = -(logp_policy.exp() * logp_policy).sum(-1)
        hp = args.credit_hyperparameters()
        if not mask.any():
            expected = torch.zeros(mask.shape)  # every token masked: no statistic
        elif trainer.args.credit_method == "eapo":
            kappa = eapo_kappa_schedule(hp["eapo_kappa"], trainer.state.global_step, hp["eapo_kappa_decay_steps"])
            expected = eapo_loop(batch["advantages"], entropy, mask, kappa, hp["eapo_quantiles"])
        else:
            reference = trainer.deviation_reference.model_and_context()[0]
            logp_ref = naive_logprobs(reference, batch, trainer.temperature)
            deviation = (1 - torch.exp(0.5 * (logp_policy + logp_ref)).sum(-1)).clamp(0, 1)
            vocab = logp_policy.size(-1)
            expected = tide_loop(
                batch["advantages"], deviation, entropy, mask, vocab, hp["tide_tau"], hp["tide_kappa"]
            )
        for i in range(mask.size(0)):
            self.expected[_row_key(batch["prompt_ids"][i], batch["completion_ids"][i])] = expected[i]

    @torch.no_grad()
    def _expect_taco(self, inputs):
        trainer = self.trainer
        _, _, mask = _inputs(inputs)
        logp_all = naive_logprobs(trainer.model, inputs, trainer.temperature)
        logps = sampled(logp_all, inputs["completion_ids"])
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        hp = trainer.args.credit_hyperparameters()
        return taco_loop(inputs["advantages"], logps, entropy, mask, hp["taco_alpha"], hp["taco_lambda"])

    def _check(self, inputs, expected):
        consumed = inputs["advantages"]
        _, _, mask = _inputs(inputs)
        method = self.trainer.args.credit_method
        if method == "grpo":
            assert consumed.dim() == 1
        elif method == "taco":
            torch.testing.assert_close(consumed, expected, atol=1e-4, rtol=1e-4)
        else:
            assert consumed.shape == mask.shape
            assert (consumed[mask == 0] == 0).all()
            for i in range(consumed.size(0)):
                want = self.expected[_row_key(inputs["prompt_ids"][i], inputs["completion_ids"][i])]
                torch.testing.assert_close(consumed[i], want, atol=1e-4, rtol=1e-4)
        self.checked_batches += 1


def assert_all_params_changed(before, after):
    unchanged = [name for name, param in before.items() if torch.equal(param, after[name].detach())]
    assert not unchanged, f"parameters that did not change: {unchanged}"


class FakeVLLMGeneration:
    """Stands in for TRL's `VLLMGeneration`; only `sync_weights` is reached when a `rollout_func` generates."""

    def __init__(self):
        self.syncs = 0

    def sync_weights(self):
        self.syncs += 1


def make_rollout_func(max_tokens=6, noise=0.3, vary_lengths=False):
    """Completions sampled from the policy, with log-probs perturbed like an inference engine's (bf16 kernels...).

    `vary_lengths`: row i stops after `max_tokens - i % 3` tokens, so TRL right-pads the completions."""
    generator = torch.Generator().manual_seed(0)

    @torch.no_grad()
    def rollout(prompts, trainer):
        tokenizer, model = trainer.processing_class, trainer.accelerator.unwrap_model(trainer.model)
        prompt_ids, completion_ids, logprobs = [], [], []
        for row, prompt in enumerate(prompts):
            ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False)
            completion, token_logps = [], []
            for _ in range(max_tokens - row % 3 if vary_lengths else max_tokens):
                logits = model(input_ids=torch.tensor([ids + completion])).logits[0, -1].float() / trainer.temperature
                logp = torch.log_softmax(logits, dim=-1)
                token = torch.multinomial(logp.exp(), 1, generator=generator).item()
                completion.append(token)
                token_logps.append(logp[token].item() + noise * torch.randn(1, generator=generator).item())
            prompt_ids.append(ids)
            completion_ids.append(completion)
            logprobs.append(token_logps)
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs}

    return rollout
