"""The model a deviation statistic is measured against, and its lifecycle.

`reference_deviation` compares the policy with the frozen initial model: TRL's own reference model when
`beta != 0`, the base model with the adapter disabled under PEFT, else a frozen copy made before TRL wraps the
policy (or loaded again from its name, with TRL's model-init arguments). `previous_policy_deviation` compares it
with the policy of the previous training generation batch: a copy refreshed after each training batch (never
by evaluation), saved in checkpoints.
"""

from __future__ import annotations

import copy
import os
import stat
from contextlib import nullcontext

from accelerate.utils import is_peft_model
from safetensors.torch import load_model, save_model
from transformers.trainer import TRAINING_ARGS_NAME
from transformers.utils import logging
from trl.models import prepare_deepspeed, prepare_fsdp
from trl.trainer.utils import create_model_from_path, disable_dropout_in_model, get_config_model_id, use_adapter

from ..methods import PREVIOUS_POLICY_DEVIATION, REFERENCE_DEVIATION

PREVIOUS_POLICY_FILE = "previous_policy.safetensors"  # checkpoint file of the previous-policy reference

logger = logging.get_logger(__name__)


def copy_initial_model(model, args, peft_config, statistics):
    """A copy of an in-memory policy, taken before TRL patches and wraps it, when a statistic needs its own model.

    No copy is needed when TRL keeps a reference anyway (`beta != 0`) or with PEFT (the adapter is disabled
    instead). A policy given by name is loaded again later, as TRL loads its reference.
    """
    if isinstance(model, str) or is_peft_model(model) or peft_config is not None:
        return None
    if PREVIOUS_POLICY_DEVIATION in statistics or (REFERENCE_DEVIATION in statistics and args.beta == 0.0):
        return copy.deepcopy(model)
    return None


class DeviationReference:
    """The reference model of a deviation statistic, prepared like TRL prepares its own reference model.

    It is given what it reads: TRL's reference model (`None` when `beta == 0`), the accelerator and the training
    arguments when it is built, and the unwrapped policy at each call.
    """

    def __init__(self, statistic: str, policy, initial_copy, ref_model, accelerator, args):
        self.previous_policy = statistic == PREVIOUS_POLICY_DEVIATION
        self.ref_model, self.accelerator = ref_model, accelerator
        # As `Trainer` decides `is_deepspeed_enabled` and `is_fsdp_enabled`:
        deepspeed = getattr(accelerator.state, "deepspeed_plugin", None) is not None
        fsdp = getattr(accelerator.state, "fsdp_plugin", None) is not None
        if self.previous_policy and (is_peft_model(policy) or deepspeed or fsdp):
            raise ValueError(
                f"{statistic} (tide_reference='old') keeps a full copy of the policy that is refreshed every "
                "generation batch; it is supported without PEFT, DeepSpeed and FSDP. Use tide_reference='ref' there."
            )
        self.model = None  # None: TRL's reference model, or the policy with its adapter disabled
        if self.previous_policy or (ref_model is None and not is_peft_model(policy)):
            model = initial_copy if initial_copy is not None else _load_initial_model(policy, args)
            model.requires_grad_(False)
            disable_dropout_in_model(model)
            if deepspeed:
                self.model = prepare_deepspeed(model, accelerator)
            elif fsdp:
                self.model = prepare_fsdp(model, accelerator)
            else:
                self.model = accelerator.prepare_model(model, evaluation_mode=True)

    def model_and_context(self, policy):
        """The (unwrapped) reference model and the context in which calling it computes the reference."""
        if self.model is not None:
            return self.accelerator.unwrap_model(self.model), nullcontext()
        if self.ref_model is not None:
            return self.accelerator.unwrap_model(self.ref_model), nullcontext()
        # PEFT: the initial model is the policy without its adapter
        return policy, use_adapter(policy, adapter_name="ref" if "ref" in policy.peft_config else None)

    def after_batch(self, policy, training: bool) -> None:
        """The next training batch measures deviation from the policy as it is now (evaluation changes nothing)."""
        if self.previous_policy and training:
            self.model.load_state_dict(policy.state_dict())

    def save(self, checkpoint_dir: str) -> None:
        if self.previous_policy:
            save_model(self.accelerator.unwrap_model(self.model), os.path.join(checkpoint_dir, PREVIOUS_POLICY_FILE))

    def load(self, checkpoint_dir: str, policy) -> None:
        if not self.previous_policy:
            return
        path = os.path.join(checkpoint_dir, PREVIOUS_POLICY_FILE)
        if os.path.exists(path):
            load_model(self.accelerator.unwrap_model(self.model), path, device=str(self.accelerator.device))
        else:
            logger.warning(
                f"{checkpoint_dir} has no {PREVIOUS_POLICY_FILE}: the previous-policy reference starts from the resumed "
                "policy instead of the policy of the previous generation batch."
            )
            self.model.load_state_dict(policy.state_dict())


def _load_initial_model(policy, args):
    """The initial weights loaded again from the policy's name, with the arguments TRL loads its reference with."""
    init_kwargs = dict(args.model_init_kwargs or {})
    if args.distributed_state.distributed_type in ["MULTI_GPU", "DEEPSPEED"]:
        init_kwargs["device_map"] = None  # distributed training requires it ("auto" fails)
    init_kwargs.setdefault("trust_remote_code", args.trust_remote_code)
    init_kwargs.setdefault("dtype", policy.dtype)
    init_kwargs.setdefault("attn_implementation", policy.config._attn_implementation)
    return create_model_from_path(get_config_model_id(policy.config), **init_kwargs)


def same_mode_as_training_args(folder: str) -> None:
    """Give the `.safetensors` files in `folder` the mode of the `training_args.bin` saved beside them: safetensors
    writes through a temporary file (mode 0600), every other file is opened under the process's umask."""
    reference = os.path.join(folder, TRAINING_ARGS_NAME)
    if not os.path.isfile(reference):  # a process that saves nothing (not the main one)
        return
    mode = stat.S_IMODE(os.stat(reference).st_mode)
    for name in os.listdir(folder):
        if name.endswith(".safetensors"):
            os.chmod(os.path.join(folder, name), mode)
