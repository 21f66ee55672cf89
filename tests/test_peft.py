"""Every method trains a LoRA adapter; TIDE's reference is the base model with the adapter disabled; adapters reload."""

import pytest
import torch
from conftest import (
    make_tiny_model,
    make_tiny_tokenizer,
    naive_logprobs,
    tiny_config,
    tiny_trainer,
)

from trl_credit import CreditGRPOTrainer
from trl_credit.trainer.batch_layout import valid_mask

peft = pytest.importorskip(
    "peft", reason="needs peft: pip install -e '.[peft]'"
)  # a declared test dependency (the `test` extra); only absent in a broken install

METHODS = ["grpo", "taco", "eapo", "tide"]


def _lora_config():
    return peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0, task_type="CAUSAL_LM"
    )


class DeviationRecorder(CreditGRPOTrainer):
    """Checks TIDE's streamed deviation against full logits of the policy and of the adapter-disabled base."""

    checked = 0

    def _generate_and_score_completions(self, inputs):
        batch = super()._generate_and_score_completions(inputs)
        self._check_deviation(batch, batch["credit_reference_deviation"], valid_mask(batch))
        return batch

    def _check_deviation(self, batch, deviation_BT, mask_BT):
        policy = self.accelerator.unwrap_model(self.model)
        logp_policy = naive_logprobs(policy, batch, self.temperature)
        with policy.disable_adapter():
            logp_base = naive_logprobs(policy, batch, self.temperature)
        want_BT = (1 - torch.exp(0.5 * (logp_policy + logp_base)).sum(-1)).clamp(0, 1) * mask_BT
        torch.testing.assert_close(deviation_BT, want_BT, atol=1e-5, rtol=1e-4)
        type(self).checked += 1


@pytest.mark.parametrize("method", METHODS)
def test_every_method_trains_lora_and_the_adapter_reloads(tmp_path, method):
    tokenizer = make_tiny_tokenizer()
    args = tiny_config(method, tmp_path / "out")
    trainer_cls = DeviationRecorder if method == "tide" else CreditGRPOTrainer
    DeviationRecorder.checked = 0
    trainer = tiny_trainer(args, trainer_cls, tokenizer=tokenizer, peft_config=_lora_config())
    policy = trainer.accelerator.unwrap_model(trainer.model)
    assert isinstance(policy, peft.PeftModel)
    trainable = {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert {tuple(n.split(".")[-4:-2]) for n in trainable} == {
        (m, ab) for m in ("q_proj", "v_proj") for ab in ("lora_A", "lora_B")
    }
    frozen = {n: p.detach().clone() for n, p in policy.named_parameters() if not p.requires_grad}

    trainer.train()

    unchanged = [n for n, p in policy.named_parameters() if n in trainable and torch.equal(p, trainable[n])]
    assert not unchanged, f"LoRA parameters that did not change: {unchanged}"
    assert all(torch.equal(p, frozen[n]) for n, p in policy.named_parameters() if n in frozen)

    if method == "tide":
        # No copy of the model: the reference is the policy with its adapter disabled.
        assert trainer.deviation_reference.model is None and trainer.ref_model is None
        assert DeviationRecorder.checked == 3
        deviations = [e["tide/mean_deviation"] for e in trainer.state.log_history if "tide/mean_deviation" in e]
        assert deviations[0] == pytest.approx(0.0, abs=1e-7)  # LoRA B starts at 0: policy == base before an update
        assert all(d > 1e-6 for d in deviations[1:])
    elif method != "grpo":
        weights = [e[f"{method}/mean_weight"] for e in trainer.state.log_history if "loss" in e]
        assert len(weights) == 3 and any(w is not None for w in weights)  # None: a batch whose advantages are all 0

    trainer.save_model(str(tmp_path / "adapter"))
    reloaded = peft.PeftModel.from_pretrained(make_tiny_model(tokenizer), str(tmp_path / "adapter")).eval()
    input_ids = torch.tensor([[7, 3, 20, 10, 11, 12, 13, 14]])
    policy.eval()
    with torch.no_grad():
        want = policy(input_ids=input_ids).logits
        got = reloaded(input_ids=input_ids).logits
        base = make_tiny_model(tokenizer).eval()(input_ids=input_ids).logits
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    assert (got - base).abs().max() > 1e-4  # the adapter does something: the comparison is not trivial
