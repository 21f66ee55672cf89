"""Server mode: `trl vllm-serve` on 127.0.0.1, started once and stopped here; every registered method and documented
stack trains generating through it, the advantages TRL's loss consumed equal the reference rules, each method of the
stack moves credit where it stands, and after training the server generates greedily what the trained model does (its
weights reached the server).

As in test_colocate.py (whose docstring gives the argument), no case can fail by chance: 4 prompts of 4 completions a
step, rewards that differ within every group, and sampling the server seeds per request (`generation_kwargs={"seed":
...}`, vLLM's `SamplingParams.seed`; the `n` completions of a prompt get `seed`, `seed + 1`, ...). Unseeded, the
server's samples differed between identical runs, and a group of 4 completions whose rewards tied left TIDE and STAPO
with nothing to move (issue 51)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import torch
from conftest import make_tiny_tokenizer, tiny_config, tiny_prompt_dataset
from trainer_helpers import path_cases

from real_vllm.cpu_shims import vllm_dist_info
from real_vllm.helpers import RealVLLMRecorder, distinct_in_group_reward, job_settings
from trl_credit import CreditGRPOTrainer

SERVER_START_S = 240
SAMPLING_SEED = 1234


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def vllm_server(vllm_model_dir, tmp_path_factory):
    """`trl vllm-serve` on a copy of the tiny model (the weight transport below rewrites its safetensors)."""
    vllm_dist_info()
    model_dir = tmp_path_factory.mktemp("served") / "model"
    shutil.copytree(vllm_model_dir, model_dir)
    port = free_port()
    trl_command = Path(sys.executable).parent / "trl"
    command = [str(trl_command), "vllm-serve", "--model", str(model_dir), "--host", "127.0.0.1", "--port", str(port)]
    command += ["--gpu_memory_utilization", "0.1", "--dtype", "float32", "--enforce_eager", "true"]
    log = open(model_dir.parent / "server.log", "w")  # noqa: SIM115 - closed after the server stops
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=os.environ)
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"trl vllm-serve exited with {server.returncode}: {log.name}")
            try:
                if requests.get(f"{base_url}/health", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"trl vllm-serve did not answer in {SERVER_START_S} s: {log.name}")
            time.sleep(1)
        yield base_url, port, model_dir
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server and the engine process it started
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


@pytest.fixture
def reload_weights_transport(monkeypatch, vllm_server):
    """Replaces TRL's NCCL weight transport to the server (CUDA only) with the server's own reload from disk: the
    streamed tensors are saved over the served model's safetensors, then `/collective_rpc` `reload_weights` loads them
    (vLLM's dev endpoint, which `trl vllm-serve` enables with `VLLM_SERVER_DEV_MODE=1`)."""
    from safetensors.torch import save_file
    from trl.generation.vllm_client import VLLMClient

    base_url, _, model_dir = vllm_server
    pushes = []

    def update_named_params(self, metadata, named_params):
        tensors = {name: tensor.detach().to("cpu").contiguous().clone() for name, tensor in named_params}
        assert [name for name, _, _ in metadata] == list(tensors)
        save_file(tensors, str(model_dir / "model.safetensors"), metadata={"format": "pt"})
        response = requests.post(
            f"{base_url}/collective_rpc",
            json={"method": "reload_weights", "kwargs": {"weights_path": str(model_dir)}},
            timeout=120,
        )
        response.raise_for_status()
        pushes.append(len(tensors))

    monkeypatch.setattr(VLLMClient, "init_communicator", lambda self, device=0: None)
    monkeypatch.setattr(VLLMClient, "close_communicator", lambda self: None)
    monkeypatch.setattr(VLLMClient, "update_named_params", update_named_params)
    return pushes


@pytest.mark.parametrize("method", path_cases())
def test_training_generates_through_the_server(
    monkeypatch, tmp_path, vllm_model_dir, vllm_server, reload_weights_transport, method
):
    """Each registered method and documented stack, generating through the server: the advantages and loss mask TRL's
    loss consumed equal the reference rules (`RealVLLMRecorder`, in settings where the method moves credit), and the
    weights after step 2 reach the server (its greedy completions are the trained model's)."""
    _, port, _ = vllm_server
    args = tiny_config(
        method,
        tmp_path / "out",
        use_vllm=True,
        vllm_mode="server",
        vllm_server_host="127.0.0.1",
        vllm_server_port=port,
        vllm_server_timeout=60,
        vllm_importance_sampling_mode="token_truncate",
        max_steps=2,
        per_device_train_batch_size=16,  # 4 prompts of 4 completions a step
        generation_kwargs={"seed": SAMPLING_SEED},
        **job_settings(method),
    )
    trainer = CreditGRPOTrainer(
        model=vllm_model_dir,
        reward_funcs=distinct_in_group_reward,
        args=args,
        train_dataset=tiny_prompt_dataset(),
        processing_class=make_tiny_tokenizer(),  # as in test_colocate.py: HICRA's token texts keep their spaces
    )
    generated = []
    original_generate = type(trainer.vllm_generation.vllm_client).generate

    def counting_generate(client, *a, **kw):
        out = original_generate(client, *a, **kw)
        generated.append(len(out["completion_ids"]))
        return out

    trainer.vllm_generation.vllm_client.generate = counting_generate.__get__(trainer.vllm_generation.vllm_client)
    recorder = RealVLLMRecorder(monkeypatch, trainer)
    trainer.train()
    assert generated == [16, 16]  # each step's 16 completions (4 prompts, 4 generations) come from the server
    # One weight push per generation batch, the first before any generation (the server held the previous case's).
    assert len(reload_weights_transport) == 2
    assert recorder.checked_batches == 2
    recorder.assert_each_component_moved()
    log = trainer.state.log_history[0]
    assert "credit/extra_forwards" in log and "sampling/importance_sampling_ratio/mean" in log

    # The weights after step 2 reach the server: its greedy completions are the trained model's.
    trainer.vllm_generation.sync_weights()
    tokenizer, model = trainer.processing_class, trainer.model
    prompts = [
        tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=False)
        for p in tiny_prompt_dataset(4)["prompt"]
    ]
    served = trainer.vllm_generation.vllm_client.generate(prompts, temperature=0.0, max_tokens=6)["completion_ids"]
    with torch.no_grad():
        for prompt, completion in zip(prompts, served, strict=True):
            greedy = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False)[0, len(prompt) :]
            assert completion == greedy.tolist()[: len(completion)]
    print(
        f"\n[real vLLM server] {method}: max |consumed - recomputed| = {recorder.max_difference:.2e}, "
        f"moved share = {recorder.moved_share():.3f}, moved where it stands = {recorder.component_summary()}, "
        f"ill-conditioned tokens = {recorder.ill_conditioned}, completions {recorder.completions.hexdigest()[:12]}"
    )
