"""A user-defined credit method in a few lines: give more credit to the rarest sampled tokens of a response.

python examples/custom_credit_method.py                    # trains a tiny random model with it (CPU, seconds)
trl-credit grpo --method examples/custom_credit_method.py:surprise_boost --surprise_boost_max 2.0
trl-credit grpo --method eapo+examples/custom_credit_method.py:surprise_boost   # stacked after EAPO
"""

from dataclasses import dataclass

from trl_credit import CreditBatch, CreditResult, register_credit_method
from trl_credit.methods import ROLLOUT_LOGPS, check_fields, hyperparameter


@dataclass
class SurpriseBoostArguments:
    surprise_boost_max: float = hyperparameter(1.5, "Largest weight, given to the most surprising token (>= 1).")

    def __post_init__(self):
        check_fields(self, surprise_boost_max=(lambda b: b >= 1.0, ">= 1"))


@register_credit_method(
    "surprise_boost",
    display_name="Surprise boost",
    statistics=(ROLLOUT_LOGPS,),
    arguments=SurpriseBoostArguments,
    paper={"title": "My Surprise Boost", "id": "2601.00001", "citation": "@misc{boost, title = {My Surprise Boost}}"},
)
def surprise_boost(batch: CreditBatch, surprise_boost_max: float) -> CreditResult:
    """Up to `surprise_boost_max` times more credit for the rarest sampled tokens.

    Metrics:
        mean_surprise: mean -log p of the sampled tokens under the rollout policy

    Token statistic:
        surprise: -log p of the sampled token under the rollout policy
    """
    surprise_BT = -batch[ROLLOUT_LOGPS]  # -log p of the sampled token, from the rollout policy
    top_B = surprise_BT.masked_fill(~batch.mask_BT, 0.0).amax(dim=1, keepdim=True).clamp(min=1e-6)
    weights_BT = 1.0 + (surprise_boost_max - 1.0) * surprise_BT / top_B  # in [1, surprise_boost_max]
    return CreditResult(
        batch.advantages_BT * weights_BT, metrics={"mean_surprise": surprise_BT}, statistic_BT=surprise_BT
    )


def main() -> None:  # a tiny random model learns nothing useful: this only shows the method training end to end
    import tempfile

    from datasets import Dataset
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    from trl_credit import CreditGRPOConfig, CreditGRPOTrainer

    words = ["<pad>", "<eos>", "<unk>"] + [str(i) for i in range(20)] + ["+", "=", "?"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=len(words),
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            pad_token_id=0,
            eos_token_id=1,
        )
    )
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"{a} + 1 ="}] for a in range(8)]})
    args = CreditGRPOConfig(
        output_dir=tempfile.mkdtemp(),
        credit_method="surprise_boost",
        credit_kwargs={"surprise_boost_max": 2.0},
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=6,
        max_steps=2,
        logging_steps=1,
        report_to="none",
        activation_checkpointing=False,
    )
    reward = lambda completions, **kwargs: [float(len(c[0]["content"])) for c in completions]  # noqa: E731
    trainer = CreditGRPOTrainer(
        model=model, reward_funcs=reward, args=args, train_dataset=dataset, processing_class=tokenizer
    )
    trainer.train()
    print({k: v for k, v in trainer.state.log_history[-2].items() if k.startswith("surprise_boost/")})


if __name__ == "__main__":
    main()
