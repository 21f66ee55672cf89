"""`trl_credit.trainer.trl_compat`: the TRL seams checked against the installed TRL (a moved one fails naming the
supported range), what TRL does with them (run on both supported releases), and the torch fused-head fallback that
TRL 1.15 lacks off CUDA/XPU."""

import dataclasses
import inspect
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch
import trl
from conftest import (
    TINY_FAMILIES,
    make_tiny_model,
    make_tiny_tokenizer,
    tiny_config,
    tiny_prompt_dataset,
    tiny_trainer,
)
from trl import GRPOTrainer
from trl.trainer import utils as trl_utils

from trl_credit import CreditGRPOTrainer
from trl_credit.trainer import trl_compat
from trl_credit.trainer.lm_head_statistics import LogitTransform
from trl_credit.trainer.model_parts import backbone, logit_transform
from trl_credit.trainer.trl_compat import (
    cache_keyword,
    chunked_logprob_torch,
    needs_torch_fused_head,
    output_cache,
    torch_fused_head,
)


@pytest.fixture(autouse=True)
def fresh_check():
    trl_compat.check_trl_surfaces.cache_clear()
    yield
    # After the test's monkeypatches are undone: cache the real TRL's verdict again for the trainers of later tests.
    trl_compat.check_trl_surfaces.cache_clear()
    trl_compat.check_trl_surfaces()


def test_the_installed_trl_has_every_surface():
    trl_compat.check_trl_surfaces()


def test_the_supported_range_is_the_one_pyproject_declares():
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    (requirement,) = [r for r in project["dependencies"] if r.replace(" ", "").startswith("trl>")]
    assert requirement.replace(" ", "") == f"trl{trl_compat.SUPPORTED_TRL}"


def _fails_naming_the_range(match):
    with pytest.raises(trl_compat.UnsupportedTRLError, match=match) as error:
        trl_compat.check_trl_surfaces()
    assert f"trl{trl_compat.SUPPORTED_TRL}" in str(error.value) and trl.__version__ in str(error.value)


def test_a_new_multimodal_keyword_of_the_scoring_forward_is_caught(monkeypatch):
    original = GRPOTrainer._get_per_token_logps_and_entropies

    def scoring(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        pixel_values=None,
        video_grid_thw=None,
    ):
        return original(self, model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy)

    monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies", scoring)
    _fails_naming_the_range("scores tokens with _get_per_token_logps_and_entropies")


def test_a_compute_loss_with_another_signature_is_caught(monkeypatch):
    monkeypatch.setattr(GRPOTrainer, "_compute_loss", lambda self, model, inputs, num_items_in_batch: None)
    _fails_naming_the_range(r"trl \S+ has a GRPOTrainer\._compute_loss that does not take \(model, inputs\)\. Install")


def test_trl_is_checked_without_reading_its_source(monkeypatch):
    """A TRL release that only reformats its code passes: no check reads TRL's source text."""

    def no_source(obj):
        raise AssertionError(f"read the source of {obj}")

    monkeypatch.setattr(trl_compat.inspect, "getsource", no_source)
    trl_compat.check_trl_surfaces()


@pytest.mark.parametrize("name", ["_compute_loss", "_calculate_rewards"])
def test_a_trl_without_a_method_the_trainer_overrides_is_caught_naming_it(monkeypatch, name):
    monkeypatch.setattr(GRPOTrainer, name, None)
    _fails_naming_the_range(rf"has no GRPOTrainer\.{name}\.")


def test_a_scoring_forward_without_a_keyword_the_trainer_passes_is_caught(monkeypatch):
    """TRL's scoring forward with every multimodal input but without `compute_entropy`."""
    original = GRPOTrainer._get_per_token_logps_and_entropies
    signature = inspect.signature(original)

    def scoring(*args, **kwargs):
        return original(*args, **kwargs)

    kept = [parameter for parameter in signature.parameters.values() if parameter.name != "compute_entropy"]
    scoring.__signature__ = signature.replace(parameters=kept)
    monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies", scoring)
    _fails_naming_the_range(r"scores tokens with _get_per_token_logps_and_entropies.*expected the keywords")


@pytest.mark.parametrize("version", ["1.14.9", "1.17.0", "1.17.0.dev0"])
def test_a_version_outside_the_range_is_refused(monkeypatch, version):
    monkeypatch.setattr(trl, "__version__", version)
    _fails_naming_the_range(rf"the installed trl {re.escape(version)} is outside that range\. Install a supported")


@pytest.mark.parametrize("version", ["1.15.0", "1.16.0.dev0", "1.16.9"])
def test_a_version_inside_the_range_is_taken_its_lower_bound_included(monkeypatch, version):
    monkeypatch.setattr(trl, "__version__", version)
    trl_compat.check_trl_surfaces()


def test_the_fused_output_fields_are_checked(monkeypatch):
    monkeypatch.setattr(trl_compat, "FUSED_OUTPUT_FIELDS", ("log_probs", "entropy", "max_logit"))
    _fails_naming_the_range(r"fused LM head output without \['max_logit'\]")
    assert trl_utils.FusedCausalLMOutput is trl_compat.FusedCausalLMOutput


def test_a_trainer_without_the_attributes_that_say_how_trl_generates_is_refused_naming_them():
    from types import SimpleNamespace

    built = SimpleNamespace(use_vllm=False, rollout_func=None, tools=None)
    with pytest.raises(trl_compat.UnsupportedTRLError) as error:
        trl_compat.check_trainer_attributes(built)
    assert "builds a GRPOTrainer without the attributes ['use_transformers_continuous_batching', '_is_vlm']" in str(
        error.value
    )


def test_a_method_the_trainer_overrides_missing_from_trl_is_named(monkeypatch):
    monkeypatch.setattr(trl_compat, "_OVERRIDDEN", (*trl_compat._OVERRIDDEN, "_a_method_trl_does_not_have"))
    _fails_naming_the_range(r"has no GRPOTrainer\._a_method_trl_does_not_have")


def test_an_output_with_exactly_the_fields_read_is_taken(monkeypatch):
    every_field = tuple(f.name for f in dataclasses.fields(trl_compat.FusedCausalLMOutput))
    monkeypatch.setattr(trl_compat, "FUSED_OUTPUT_FIELDS", every_field)
    trl_compat.check_trl_surfaces()


ALL_OUTPUTS = ("log_probs", *trl_compat.OPTIONAL_OUTPUTS)


def _inputs(seed: int, n: int = 37, hidden: int = 12, vocab: int = 50):
    generator = torch.Generator().manual_seed(seed)
    hidden_NH = torch.randn(n, hidden, generator=generator, requires_grad=True)
    weight_VH = torch.randn(vocab, hidden, generator=generator, requires_grad=True)
    bias_V = torch.randn(vocab, generator=generator, requires_grad=True)
    targets_N = torch.randint(0, vocab, (n,), generator=generator)
    return hidden_NH, weight_VH, bias_V, targets_N


def test_only_trl_1_15_needs_the_fallback_and_only_inside_the_block():
    assert needs_torch_fused_head("1.15.0") and needs_torch_fused_head("1.15.2")
    assert not needs_torch_fused_head("1.16.0") and not needs_torch_fused_head("1.14.2")
    kernel = trl_utils._ChunkedLogProbFunction
    with torch_fused_head():
        with torch_fused_head():  # re-entrant
            inside = trl_utils._ChunkedLogProbFunction
        assert trl_utils._ChunkedLogProbFunction is inside
    assert trl_utils._ChunkedLogProbFunction is kernel
    assert (inside is trl_compat._FusedHeadFunction) == needs_torch_fused_head(trl.__version__)
    assert inside is kernel or needs_torch_fused_head(trl.__version__)


@pytest.mark.parametrize("softcap", [None, 3.0])
def test_fallback_matches_the_softmax_of_the_transformed_logits(monkeypatch, softcap):
    monkeypatch.setattr(trl_compat, "_TOKEN_CHUNK", 8)  # several token chunks, the last one partial
    hidden_NH, weight_VH, bias_V, targets_N = _inputs(0)
    temperature, scale = 0.7, 0.5
    got = chunked_logprob_torch(hidden_NH, weight_VH, bias_V, targets_N, temperature, 16, softcap, scale, ALL_OUTPUTS)

    z_NV = (hidden_NH @ weight_VH.T + bias_V) * scale
    if softcap is not None:
        z_NV = softcap * torch.tanh(z_NV / softcap)
    z_NV = z_NV / temperature
    p_NV = torch.softmax(z_NV.double(), -1)
    expected = (
        p_NV.gather(-1, targets_N[:, None]).squeeze(-1).log(),
        -(p_NV * p_NV.log()).sum(-1),
        (p_NV**2).sum(-1).log(),
        z_NV.double().mean(-1),
    )
    for value, reference in zip(got[:4], expected):
        torch.testing.assert_close(value.double(), reference.detach(), rtol=1e-5, atol=1e-5)
    assert torch.equal(got[4], z_NV.argmax(-1) == targets_N)
    only_logps = chunked_logprob_torch(hidden_NH, weight_VH, bias_V, targets_N, temperature, 16, softcap, scale, ())
    assert all(value is None for value in only_logps[1:])

    # Gradients of a loss on log-probs and entropy reach hidden states, LM head and bias exactly.
    (got[0].sum() + 0.3 * got[1].sum()).backward()
    mine = [t.grad.clone() for t in (hidden_NH, weight_VH, bias_V)]
    for t in (hidden_NH, weight_VH, bias_V):
        t.grad = None
    logp_NV = torch.log_softmax(z_NV, -1)
    (logp_NV.gather(-1, targets_N[:, None]).sum() - 0.3 * (logp_NV.exp() * logp_NV).sum()).backward()
    for value, reference in zip(mine, (hidden_NH.grad, weight_VH.grad, bias_V.grad)):
        torch.testing.assert_close(value, reference, rtol=1e-4, atol=1e-5)


def test_fallback_under_autocast_forms_the_logits_in_autocasts_dtype():
    """`--bf16` on a CPU trains under autocast: the LM head's product is taken in bfloat16, as TRL's kernel takes it,
    and the softmax in float32."""
    hidden_NH, weight_VH, bias_V, targets_N = _inputs(3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = chunked_logprob_torch(hidden_NH, weight_VH, bias_V, targets_N, 0.7, 16, None, 1.0, ("entropy",))
    z_NV = (hidden_NH.bfloat16() @ weight_VH.bfloat16().T).float() + bias_V.float()
    logp_NV = torch.log_softmax(z_NV / 0.7, -1)
    torch.testing.assert_close(got[0], logp_NV.gather(-1, targets_N[:, None]).squeeze(-1), rtol=0, atol=1e-6)
    torch.testing.assert_close(got[1], -(logp_NV.exp() * logp_NV).sum(-1), rtol=0, atol=1e-6)


@pytest.mark.skipif(needs_torch_fused_head(trl.__version__), reason="TRL 1.15's own kernel needs Triton on CUDA/XPU")
def test_fallback_agrees_with_trl_kernel_on_cpu():
    """TRL 1.16's `ChunkedLogProbFunction` runs on CPU: the fallback must give what it gives, values and gradients."""
    from trl.kernels import ChunkedLogProbFunction

    results = []
    for function in (chunked_logprob_torch, ChunkedLogProbFunction.apply):
        hidden_NH, weight_VH, bias_V, targets_N = _inputs(1)
        values = function(hidden_NH, weight_VH, bias_V, targets_N, 0.9, 16, 2.0, 0.8, trl_compat.OPTIONAL_OUTPUTS)
        (values[0].sum() + 0.5 * values[1].sum()).backward()
        results.append((values, (hidden_NH.grad, weight_VH.grad, bias_V.grad)))
    (mine, my_grads), (trls, trl_grads) = results
    for value, reference in zip(mine[:4], trls[:4]):
        torch.testing.assert_close(value, reference, rtol=1e-5, atol=1e-5)
    assert torch.equal(mine[4], trls[4])
    for value, reference in zip(my_grads, trl_grads):
        torch.testing.assert_close(value, reference, rtol=1e-4, atol=1e-5)


def test_fallback_without_valid_tokens_stays_in_the_graph():
    """An all-masked micro-batch (every completion truncated and masked) must still backpropagate a zero loss."""
    hidden_NH, weight_VH, bias_V, _ = _inputs(2)
    values = chunked_logprob_torch(
        hidden_NH[:0], weight_VH, bias_V, torch.zeros(0, dtype=torch.long), 1.0, 16, None, 1.0, ALL_OUTPUTS[1:]
    )
    assert [tuple(value.shape) for value in values] == [(0,)] * 5
    (values[0].sum() + values[1].sum()).backward()
    assert weight_VH.grad is not None and not weight_VH.grad.any()


# ------------------------------------------------------------------------ TRL's behaviour the trainer relies on


def _tiny_trainer(tmp_path, trainer_class=GRPOTrainer, method="grpo", **overrides):
    tokenizer = make_tiny_tokenizer()
    return tiny_trainer(tiny_config(method, tmp_path, **overrides), trainer_class, tokenizer=tokenizer)


class _AfterTheForward(GRPOTrainer):
    """Writes the micro-batch's token advantages and multiplies its completion mask only once TRL's scoring forward
    has returned, as `CreditGRPOTrainer` does."""

    calls, micro_batch, advantages_BT, weights_BT = 0, None, None, None

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        result = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        self.calls += 1
        self.micro_batch["advantages"] = self.advantages_BT
        self.micro_batch["completion_mask"].mul_(self.weights_BT)
        return result


def _micro_batch(vocab: int, with_tool_mask: bool):
    generator = torch.Generator().manual_seed(0)
    completion_mask = torch.ones(4, 5)
    completion_mask[0, 3:] = 0
    batch = {
        "prompt_ids": torch.randint(7, vocab, (4, 3), generator=generator),
        "prompt_mask": torch.ones(4, 3, dtype=torch.long),
        "completion_ids": torch.randint(7, vocab, (4, 5), generator=generator),
        "completion_mask": completion_mask,
        "advantages": torch.zeros(4),
    }
    if with_tool_mask:
        batch["tool_mask"] = torch.ones(4, 5)
    return batch


@pytest.mark.parametrize("with_tool_mask", [False, True], ids=["completion_mask", "tool_mask"])
def test_trl_loss_reads_the_advantages_and_its_mask_after_its_forward(tmp_path, with_tool_mask):
    """TRL's `_compute_loss` scores the micro-batch with one call of `_get_per_token_logps_and_entropies`, then reads
    `inputs["advantages"]`; without a tool mask its loss mask is `inputs["completion_mask"]` itself, read after that
    call; with one, the mask was multiplied before it. With `bnpo`, no old log-probs and `beta = 0`, the loss is
    `-sum(A w) / sum(w)` over the mask `w` it read (the ratio is exactly 1)."""
    trainer = _tiny_trainer(tmp_path, _AfterTheForward, loss_type="bnpo")
    trainer.model.eval()  # no gradient-accumulation scaling
    batch = _micro_batch(len(trainer.processing_class), with_tool_mask)
    buffered_mask_BT = batch["completion_mask"].clone()
    generator = torch.Generator().manual_seed(1)
    trainer.micro_batch, trainer.advantages_BT = batch, torch.randn(4, 5, generator=generator)
    trainer.weights_BT = torch.rand(4, 5, generator=generator)
    with torch_fused_head():
        loss = trainer._compute_loss(trainer.model, batch)
    mask_BT = buffered_mask_BT if with_tool_mask else buffered_mask_BT * trainer.weights_BT
    expected = -(trainer.advantages_BT * mask_BT).sum() / mask_BT.sum()
    assert trainer.calls == 1
    torch.testing.assert_close(loss, expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(
    "options",
    [{}, {"steps_per_generation": 2}, {"num_iterations": 2}, {"gradient_accumulation_steps": 2}],
    ids=["on_policy", "steps_per_generation", "num_iterations", "grad_accum"],
)
def test_trl_runs_its_old_log_prob_forward_exactly_when_runs_scoring_forward_says(tmp_path, options):
    trainer = _tiny_trainer(tmp_path, **options)
    trainer.model.train()
    prompts = [row for row in tiny_prompt_dataset() for _ in range(trainer.num_generations)]
    with torch_fused_head():
        batch = trainer._generate_and_score_completions(prompts[: 4 * trainer.args.steps_per_generation])
    runs = trl_compat.runs_scoring_forward(
        trainer.args, trainer.num_iterations, trainer.use_vllm, trainer.vllm_importance_sampling_correction
    )
    assert ("old_per_token_logps" in batch) == runs


@pytest.mark.parametrize(
    "key,value",
    [
        ("final_logit_softcapping", 2.0),
        ("logit_scale", 0.5),
        ("output_multiplier", 0.25),
        ("lm_head_multiplier", 3.0),
        ("logits_scaling", 4.0),
    ],
)
def test_trl_fused_head_transforms_the_logits_as_logit_transform_reads_the_config(key, value):
    """Each key of `LOGIT_TRANSFORM_KEYS` changes TRL's fused head exactly as `model_parts.logit_transform` says."""
    assert key in trl_compat.LOGIT_TRANSFORM_KEYS
    tokenizer = make_tiny_tokenizer()
    model = make_tiny_model(tokenizer)
    setattr(model.config, key, value)
    assert logit_transform(model) != LogitTransform()
    trl_utils.add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", "entropy"))
    ids_BL = torch.randint(7, len(tokenizer), (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), torch_fused_head():
        fused = model(input_ids=ids_BL, labels=ids_BL, fused_lm_head=True)
        hidden_BLH = model.model(input_ids=ids_BL).last_hidden_state[:, :-1]
    logits_BLV = logit_transform(model)(hidden_BLH @ model.lm_head.weight.T, 0.7)
    logp_BLV = torch.log_softmax(logits_BLV.double(), dim=-1)
    expected_BL = logp_BLV.gather(-1, ids_BL[:, 1:, None]).squeeze(-1)
    torch.testing.assert_close(fused.log_probs.double(), expected_BL, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fused.entropy.double(), -(logp_BLV.exp() * logp_BLV).sum(-1), atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------ no global state in TRL


def test_importing_trl_credit_leaves_trl_untouched():
    script = (
        "import trl.trainer.utils as u\n"
        "kernel = u._ChunkedLogProbFunction\n"
        "import trl_credit, trl_credit.trainer, trl_credit.cli\n"
        "from trl_credit import CreditGRPOTrainer\n"
        "assert u._ChunkedLogProbFunction is kernel, u._ChunkedLogProbFunction\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, env=dict(os.environ), timeout=300)


def test_trainers_change_trl_only_inside_their_own_scoring_calls(monkeypatch, tmp_path):
    """Building a `CreditGRPOTrainer` and a plain `GRPOTrainer` leaves TRL's kernel as it was; the trainer's scoring
    calls (its loss forward included) run with TRL 1.15's torch fallback, and TRL's kernel is back after each."""
    kernel = trl_utils._ChunkedLogProbFunction
    credit = _tiny_trainer(tmp_path / "credit", CreditGRPOTrainer, "taco", max_steps=1)
    _tiny_trainer(tmp_path / "plain")
    assert trl_utils._ChunkedLogProbFunction is kernel
    seen = []
    original = GRPOTrainer._get_per_token_logps_and_entropies

    loss_forward_hooks = []

    def scoring(self, model, *args, **kwargs):
        seen.append(trl_utils._ChunkedLogProbFunction)
        if torch.is_grad_enabled():  # TRL's loss forward: the hand-off registers no hook on the policy
            loss_forward_hooks.append(len(model._forward_hooks) + len(model._forward_pre_hooks))
        return original(self, model, *args, **kwargs)

    monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies", scoring)
    credit.train()
    assert seen
    fallback = trl_compat._FusedHeadFunction if needs_torch_fused_head(trl.__version__) else kernel
    assert all(function is fallback for function in seen)
    assert trl_utils._ChunkedLogProbFunction is kernel
    assert loss_forward_hooks == [0]


def _private_names_the_package_touches() -> dict[str, set[str]]:
    """Private attribute names of `trl_credit/` (read with `ast`) that may belong to another package, with the modules
    using them: every one read or set on an object, and every method or class attribute the package's classes define
    (an override of TRL's when TRL's classes have it). Names the package only sets on `self` or `cls` are its own."""
    import ast

    import trl_credit

    package = Path(trl_credit.__file__).resolve().parent
    found: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        module = path.relative_to(package).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Attribute):
                on_self = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
                if not (isinstance(node.ctx, ast.Store) and on_self):
                    names.append(node.attr)
            elif isinstance(node, ast.ClassDef):
                for statement in node.body:
                    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        names.append(statement.name)
                    elif isinstance(statement, (ast.Assign, ast.AnnAssign)):
                        targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
                        names.extend(t.id for t in targets if isinstance(t, ast.Name))
            for name in names:
                if name.startswith("_") and not name.startswith("__"):
                    found.setdefault(name, set()).add(module)
    return found


def test_every_private_trl_or_transformers_surface_the_package_touches_is_listed(tmp_path):
    """A private attribute of TRL's or transformers' objects (by the installed objects: a built `GRPOTrainer`, its
    model, config and arguments, TRL's and transformers' trainer classes and TRL's trainer utilities) used anywhere in
    `trl_credit/` must be in `trl_compat.PRIVATE_SURFACES`, and every listed one must exist."""
    import transformers

    args = trl.GRPOConfig(
        output_dir=str(tmp_path), use_cpu=True, report_to="none", per_device_train_batch_size=4, num_generations=4
    )
    trainer = tiny_trainer(args, GRPOTrainer)
    owners = (
        GRPOTrainer,
        trl.GRPOConfig,
        transformers.Trainer,
        trl_utils,
        trainer,
        trainer.model,
        trainer.model.config,
    )
    touched = _private_names_the_package_touches()
    theirs = {name: modules for name, modules in touched.items() if any(hasattr(o, name) for o in owners)}
    unlisted = {name: sorted(modules) for name, modules in theirs.items() if name not in trl_compat.PRIVATE_SURFACES}
    assert unlisted == {}, "add these to trl_compat.PRIVATE_SURFACES, saying what each is used for"
    missing = [name for name in trl_compat.PRIVATE_SURFACES if not any(hasattr(o, name) for o in owners)]
    assert missing == []


def test_the_private_surface_reader_sees_reads_overrides_and_foreign_writes(tmp_path, monkeypatch):
    # The reader on a package written for it: a read, an override, a write to another object; not a write to self.
    import trl_credit

    (tmp_path / "mod.py").write_text(
        "class T:\n"
        "    _tag_names = []\n"
        "    def _compute_loss(self):\n"
        "        self._own = 1\n"
        "        self._metrics['train']\n"
        "        other._kernel = None\n"
    )
    monkeypatch.setattr(trl_credit, "__file__", str(tmp_path / "__init__.py"))
    assert set(_private_names_the_package_touches()) == {"_tag_names", "_compute_loss", "_metrics", "_kernel"}


def test_trl_choices_are_the_values_trl_documents():
    """Each enumerated field's values are the ones TRL's help quotes, its default among them, and the help quotes no
    other word that could be a value (the rest are field names, booleans and other fields' values)."""
    import dataclasses
    import re

    from trl import GRPOConfig

    fields = {f.name: f for f in dataclasses.fields(GRPOConfig)}
    every_value = {value for values in trl_compat.TRL_CHOICES.values() for value in values}
    for name, values in trl_compat.TRL_CHOICES.items():
        quoted = set(re.findall(r"[`'\"](\w+)['`\"]", fields[name].metadata["help"]))
        assert set(values) <= quoted, f"{name}: {sorted(set(values) - quoted)} not in TRL's help"
        unexplained = quoted - set(values) - set(fields) - {"True", "False"} - every_value
        assert not unexplained, f"{name}: TRL's help names {sorted(unexplained)}, which TRL_CHOICES lacks"
        assert fields[name].default in values


@pytest.mark.parametrize("family", sorted(TINY_FAMILIES))
def test_a_forward_on_a_prompt_cache_frees_each_layers_new_keys_once_it_has_used_them(family):
    """`attending_without_growing`, as `model_parts.completion_hidden` runs the completions on their prompts' cache:
    the same hidden states as on transformers' own growing cache, no earlier layer holding the completion's keys
    while the last layer runs, and afterwards the prompt's cache and no hook left on the backbone."""
    torch.manual_seed(0)
    decoder = backbone(make_tiny_model(make_tiny_tokenizer(), family=family))
    prompt_ids, completion_ids = torch.randint(3, 60, (2, 3)), torch.randint(3, 60, (2, 5))
    mask = torch.ones(2, 8, dtype=torch.long)  # prompt + completion

    def completions_on(cache):
        on_cache = {cache_keyword(decoder.forward): cache}
        return decoder(input_ids=completion_ids, attention_mask=mask, use_cache=True, **on_cache).last_hidden_state

    grown = output_cache(decoder(input_ids=prompt_ids, use_cache=True))
    want = completions_on(grown)
    assert grown.get_seq_length() == 8  # transformers' own cache keeps the completions' keys: what this changes

    cache = output_cache(decoder(input_ids=prompt_ids, use_cache=True))
    indexed = [m for m in decoder.modules() if isinstance(getattr(m, "layer_idx", None), int)]
    last_attention = [m for m in indexed if m.layer_idx == len(cache.layers) - 1][-1]
    lengths = []
    watch = last_attention.register_forward_hook(
        lambda *_: lengths.append([cache.get_seq_length(i) for i in range(len(cache.layers))])
    )
    with trl_compat.attending_without_growing(decoder, cache):
        got = completions_on(cache)
    watch.remove()

    assert torch.equal(got, want)
    assert lengths == [[3] * (len(cache.layers) - 1) + [8]]
    assert [cache.get_seq_length(i) for i in range(len(cache.layers))] == [3] * len(cache.layers)
    assert not any(module._forward_hooks for module in decoder.modules())
