"""``train --compile`` with the other training settings: LoRA (adapters and their dropout inside
the compiled layers) with gradient checkpointing (the compiled layer recomputed in backward), on
the packed shared-prefix pass and on the unshared one, equals the same eager model in log-probs
and adapter gradients (fp32); the settings compile cannot run with stop with one line before
training; generation in a refresh round runs the layers eagerly (no compile)."""

from __future__ import annotations

import copy

import pytest
import torch

from grouppref.train.engine.prepare import add_lora, enable_checkpointing
from grouppref.train.settings.policy import TrainConfig
from grouppref.train.settings.shared import LoraSettings
from grouppref.train.tensors import packing
from grouppref.train.tensors.batch import collate_groups
from grouppref.train.tensors.logps import group_logps
from tests.support.logps import PAD, _groups
from tests.support.tolerances import GRAD_ATOL, GRAD_RTOL, MODEL_ATOL, MODEL_RTOL

# compiled vs eager (LoRA layers): other fusion and reduction order (tests/support/tolerances.py)
pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _lora_policy(tiny_lm_dir, dropout: float):
    """The tiny Llama with gradient checkpointing and LoRA adapters (B randomised, so every
    adapter weight gets a gradient), as trainer_setup puts them on."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(tiny_lm_dir, dtype=torch.float32)
    enable_checkpointing(model)
    lora = LoraSettings(r=4, alpha=8, dropout=dropout, target_modules=["q_proj", "v_proj", "up_proj"])
    model = add_lora(model, lora, "CAUSAL_LM", gradient_checkpointing=True)
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.1)
    return model.train()


def _logps_and_grads(model, batch, share_prefix: bool):
    """Seeded (LoRA dropout draws the same masks), a weighted sum of log-probs backpropagated:
    the log-probs and the gradient of every trainable parameter."""
    model.zero_grad()
    torch.manual_seed(5)
    logps = group_logps(model, batch, share_prefix=share_prefix)
    weights = torch.arange(1, logps.numel() + 1, dtype=logps.dtype).reshape(logps.shape)
    (logps * weights / logps.numel()).sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return logps.detach(), grads


# Cold inductor compiles of the LoRA layer (forward, backward, recomputed forward), packed then
# unshared: minutes on 2 loaded cores.
@pytest.mark.slow
def test_compiled_lora_layers_with_checkpointing_equal_eager(tiny_lm_dir, fresh_dynamo):
    eager = _lora_policy(tiny_lm_dir, dropout=0.1)
    compiled = copy.deepcopy(eager)
    assert packing.compile_layers(compiled) == 2  # found inside peft's wrapping
    layers = [m for m in compiled.modules() if m._compiled_call_impl is not None]
    assert layers == list(compiled.get_base_model().model.layers)
    assert any("lora_dropout" in n for n, _ in layers[0].named_modules())
    batch = collate_groups(_groups(), PAD)
    with torch.no_grad():  # a model's first packed pass is the eager check of its layers
        group_logps(compiled, batch)
    assert not fresh_dynamo["stats"]
    for share_prefix in (True, False):
        want = _logps_and_grads(eager, batch, share_prefix)
        graphs = fresh_dynamo["stats"]["unique_graphs"]
        got = _logps_and_grads(compiled, batch, share_prefix)
        assert fresh_dynamo["stats"]["unique_graphs"] > graphs  # this pass ran compiled
        torch.testing.assert_close(got[0], want[0], atol=MODEL_ATOL, rtol=MODEL_RTOL)
        assert set(got[1]) == set(want[1]) and len(want[1]) == 2 * 3 * 2  # A, B x 3 x 2 layers
        for name, grad in want[1].items():
            assert grad.abs().sum() > 0, name
            torch.testing.assert_close(got[1][name], grad, atol=GRAD_ATOL, rtol=GRAD_RTOL, msg=name)
    # The dropout is live (another seed, other log-probs), the layers really ran compiled, and
    # the packed attention was used on the shared pass.
    torch.manual_seed(6)
    with torch.no_grad():
        # another dropout mask moves log-probs by ~0.1, far beyond allclose's 1e-5 relative
        assert not torch.allclose(group_logps(compiled, batch), got[0])
    assert compiled.get_base_model().config._attn_implementation == packing.NAME


def test_compile_refuses_the_kv_cache_fallback(tiny_lm_dir):
    """A model not on sdpa takes the KV-cache fallback on the shared pass: compile stops there
    with one line naming the fix; the unshared pass and sdpa models are accepted."""
    from transformers import LlamaForCausalLM

    from grouppref.errors import ConfigError
    from grouppref.train.policy.setup import check_compile

    config = TrainConfig(model=str(tiny_lm_dir), compile=True)
    eager = LlamaForCausalLM.from_pretrained(tiny_lm_dir, attn_implementation="eager")
    sdpa = LlamaForCausalLM.from_pretrained(tiny_lm_dir, attn_implementation="sdpa")
    with pytest.raises(ConfigError, match="'eager'.* takes the KV-cache fallback; set "
                                          "--no-share-prefix or train without --compile"):
        check_compile(eager, config)
    check_compile(eager, config.model_copy(update={"share_prefix": False}))
    check_compile(eager, config.model_copy(update={"compile": False}))
    check_compile(sdpa, config)
    with torch.no_grad():  # its first packed pass switches it to the packed attention
        group_logps(sdpa, collate_groups(_groups(), PAD))
    check_compile(sdpa, config)


def test_compile_refuses_fsdp():
    from grouppref.errors import ConfigError
    from grouppref.train.policy.setup import check_compile_distributed

    check_compile_distributed(TrainConfig(compile=True), "MULTI_CPU")  # DDP: tested
    check_compile_distributed(TrainConfig(), "FSDP")
    with pytest.raises(ConfigError, match="not supported with FSDP.*without --compile, or with DDP"):
        check_compile_distributed(TrainConfig(compile=True), "FSDP")


def test_refresh_generation_runs_compiled_layers_eagerly(tiny_lm_dir, fresh_dynamo):
    """The sampler of a refresh round generates with the policy's compiled layers switched to
    eager: nothing is traced or compiled, and the layers are compiled again afterwards."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    from grouppref.train.refresh.fresh_groups import sampling_mode

    tokenizer = AutoTokenizer.from_pretrained(tiny_lm_dir)
    model = LlamaForCausalLM.from_pretrained(tiny_lm_dir, dtype=torch.float32).train()
    packing.compile_layers(model)
    ids = torch.tensor([[5, 6, 7, 8]])
    with sampling_mode(model, tokenizer):
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4,
                             min_new_tokens=4, do_sample=True)
        assert torch._dynamo.eval_frame._stance.stance == "force_eager"
    assert out.shape == (1, 8)
    assert not fresh_dynamo["stats"]  # dynamo captured no frame
    assert torch._dynamo.eval_frame._stance.stance == "default"
    assert model.training and all(m._compiled_call_impl is not None for m in model.model.layers)


def test_cli_compile_on_an_eager_attention_model_stops_before_the_reference_pass(
        tiny_lm_dir, tmp_path):
    """Through ``train`` on a run: a model whose config asks for eager attention, ``--compile``
    (share_prefix on) stops with the one-line error naming the fix before any reference
    log-prob is computed."""
    import json
    import shutil

    import typer
    from typer.testing import CliRunner

    from grouppref.commands import train as train_commands
    from grouppref.errors import ConfigError
    from tests.support.training import _write_validate, synthetic_groups

    model = shutil.copytree(tiny_lm_dir, tmp_path / "eager-model")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "attn_implementation": "eager"}))
    store = _write_validate(tmp_path / "run", synthetic_groups(4, 0))
    app = typer.Typer()
    train_commands.register(app)
    args = ["train", str(store.root), "--model", str(model), "--compile", "--max-steps", "1",
            "--batch-size", "4", "--no-chat-template"]
    result = CliRunner().invoke(app, args)
    assert isinstance(result.exception, ConfigError)
    assert "('eager') takes the KV-cache fallback; set --no-share-prefix" in str(result.exception)
    assert not list(tmp_path.rglob("ref_logps*"))
