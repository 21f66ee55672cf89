"""The TRL seams are checked against the installed TRL, and a moved one fails with the supported range named."""

import tomllib
from pathlib import Path

import pytest
import trl
from trl import GRPOTrainer
from trl.trainer import utils as trl_utils

from trl_credit.trainer import trl_compat


@pytest.fixture(autouse=True)
def fresh_check():
    trl_compat.check_trl_surfaces.cache_clear()
    yield
    trl_compat.check_trl_surfaces.cache_clear()


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

    def scoring(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False,
                compute_aux_loss=False, pixel_values=None, video_grid_thw=None):
        return original(self, model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy)

    monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies", scoring)
    _fails_naming_the_range("scores tokens with _get_per_token_logps_and_entropies")


def test_a_new_logit_transform_of_the_fused_head_is_caught(monkeypatch):
    def add_fused_lm_head(model, temperature=1.0, cast_lm_head_to_fp32=False, outputs=("log_probs",)):
        text_config = model.config.get_text_config()
        for key in trl_compat.LOGIT_TRANSFORM_KEYS + ("logit_bias_scale",):
            getattr(text_config, key, None)

    monkeypatch.setattr(trl_compat, "add_fused_lm_head", add_fused_lm_head)
    _fails_naming_the_range("transforms the fused LM head's logits")


def test_a_version_outside_the_range_is_refused(monkeypatch):
    monkeypatch.setattr(trl, "__version__", "1.17.0")
    _fails_naming_the_range("is outside that range")


def test_the_fused_output_fields_are_checked(monkeypatch):
    monkeypatch.setattr(trl_compat, "FUSED_OUTPUT_FIELDS", ("log_probs", "entropy", "max_logit"))
    _fails_naming_the_range(r"fused LM head output without \['max_logit'\]")
    assert trl_utils.FusedCausalLMOutput is trl_compat.FusedCausalLMOutput
