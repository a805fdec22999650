"""``train --compile``: the packed pass with each decoder layer under ``torch.compile`` (inductor)
gives the eager pass's log-probs and parameter gradients within fp32 tolerance, on a batch with
padding everywhere and again after the batch shapes change (P, T, K), with the layers sharing
their compiled graphs instead of compiling one per layer."""

from __future__ import annotations

import copy

import pytest
import torch

from grouppref.train.tensors import packing
from grouppref.train.tensors.batch import collate_groups
from grouppref.train.tensors.logps import group_logps
from tests.support.logps import PAD, _groups, _value_and_grads, make_groups
from tests.support.tolerances import GRAD_ATOL, GRAD_RTOL, MODEL_ATOL, MODEL_RTOL

# compiled vs eager: inductor fuses and reduces in another order; the same tiny-model bounds as
# packed vs naive log-probs (tests/support/tolerances.py)


def _assert_close(got, want) -> None:
    values, grads = got
    torch.testing.assert_close(values, want[0], atol=MODEL_ATOL, rtol=MODEL_RTOL)
    for g, w in zip(grads, want[1], strict=True):
        torch.testing.assert_close(g, w, atol=GRAD_ATOL, rtol=GRAD_RTOL)


# Cold inductor compiles (forward + backward, static then symbolic sizes): 3-5 min on 2 loaded
# cores; ~35 s with inductor's kernel cache warm.
@pytest.mark.slow
def test_compiled_layers_equal_eager_with_grads(tiny_lm_dir, fresh_dynamo):
    from transformers import LlamaForCausalLM

    eager = LlamaForCausalLM.from_pretrained(tiny_lm_dir, dtype=torch.float32).train()
    compiled = copy.deepcopy(eager)
    assert packing.compile_layers(compiled) == eager.config.num_hidden_layers == 2
    batches = [collate_groups(_groups(), PAD),  # B 3, K 4, P 11, T 9; then every size changes
               collate_groups(make_groups([("d", 7, [6, 2, 3]), ("e", 3, [1, 4])], seed=8), PAD),
               collate_groups(make_groups([(f"f{i}", 2 + i, [3 + i, 2]) for i in range(4)], 9), PAD)]
    with torch.no_grad():  # a model's first packed pass is the eager check of its layers
        group_logps(compiled, batches[0])
    for batch in batches:
        want = _value_and_grads(eager, lambda b=batch: group_logps(eager, b))
        _assert_close(_value_and_grads(compiled, lambda b=batch: group_logps(compiled, b)), want)
    assert compiled.config._attn_implementation == packing.NAME
    # Both layers ran one shared forward graph: one for the first shapes, one (sizes symbolic)
    # when they changed, reused by the third batch; no graph break inside a layer.
    assert fresh_dynamo["stats"]["unique_graphs"] == 2
    assert not fresh_dynamo["graph_break"]


def test_compile_setting_compiles_each_decoder_layer_only(tiny_lm_dir):
    from transformers import LlamaForCausalLM

    from grouppref.train.policy.setup import _prepare_policy
    from grouppref.train.settings.policy import TrainConfig

    model = LlamaForCausalLM.from_pretrained(tiny_lm_dir, dtype=torch.float32)
    assert _prepare_policy(model, TrainConfig()) is model
    assert all(m._compiled_call_impl is None for m in model.modules())  # off by default
    model = _prepare_policy(model, TrainConfig(compile=True))
    compiled = [m for m in model.modules() if m._compiled_call_impl is not None]
    assert compiled == list(model.model.layers) and len(compiled) == 2
    assert model.training


def test_compile_setting_without_decoder_layers_is_a_config_error():
    from grouppref.errors import ConfigError
    from grouppref.train.policy.setup import _prepare_policy
    from grouppref.train.settings.policy import TrainConfig

    with pytest.raises(ConfigError, match="no decoder layer"):
        _prepare_policy(torch.nn.Sequential(torch.nn.Linear(4, 4)), TrainConfig(compile=True))
