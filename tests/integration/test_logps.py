"""Prefix-shared log-probs equal the unshared computation and a naive per-candidate loop
(no padding at all), values and parameter gradients, within 1e-4 in fp32."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from grouppref.errors import ConfigError
from grouppref.train.tensors import logps as logps_mod
from grouppref.train.tensors import packing
from grouppref.train.tensors import token_logps as taken
from grouppref.train.tensors.batch import GroupBatch, TokenizedGroup, collate_groups
from grouppref.train.tensors.logps import group_logps, taken_logps
from tests.support.logps import PAD, _groups, _value_and_grads
from tests.support.tolerances import MODEL_ATOL, MODEL_RTOL

# packed / shared-prefix vs naive per-candidate passes: the same fp32 math summed in another
# order (tests/support/tolerances.py: MODEL_* for log-probs, GRAD_* for their gradients)
ATOL, RTOL = MODEL_ATOL, MODEL_RTOL


@pytest.fixture(scope="module")
def model(tiny_lm_dir):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(tiny_lm_dir, dtype=torch.float32).train()


def _naive(model, groups: list[TokenizedGroup]) -> torch.Tensor:
    """One unpadded forward pass per candidate over prompt + response, (B, K)."""
    k = max(len(g.cand_ids) for g in groups)
    out = torch.zeros(len(groups), k)
    for b, grp in enumerate(groups):
        for i, cand in enumerate(grp.cand_ids):
            ids = torch.tensor([grp.prompt_ids + cand])
            logp = model(input_ids=ids).logits[0, :-1].float().log_softmax(-1)  # (L-1, V)
            picked = logp.gather(1, ids[0, 1:, None])[:, 0]
            out = out.index_put((torch.tensor(b), torch.tensor(i)), picked[len(grp.prompt_ids) - 1:].sum())
    return out


def _repad(batch: GroupBatch, prompt_left: bool, resp_right: bool) -> GroupBatch:
    """The same batch with prompts right-padded and/or responses left-padded (flip alignment)."""
    def flip(ids, mask, to_left):
        key = mask if to_left else 1 - mask
        idx = key.argsort(dim=-1, stable=True)
        return ids.gather(-1, idx), mask.gather(-1, idx)

    p_ids, p_mask = flip(batch.prompt_ids, batch.prompt_mask, prompt_left)
    c_ids, c_mask = flip(batch.cand_ids, batch.cand_mask, not resp_right)
    return dataclasses.replace(batch, prompt_ids=p_ids, prompt_mask=p_mask, cand_ids=c_ids,
                               cand_mask=c_mask)


def _assert_same(got, want) -> None:
    (v1, g1), (v2, g2) = got, want
    torch.testing.assert_close(v1, v2, atol=ATOL, rtol=RTOL)
    for a, b in zip(g1, g2, strict=True):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=RTOL)


@pytest.fixture(scope="module")
def reference(model):
    return _value_and_grads(model, lambda: _naive(model, _groups()))


@pytest.mark.parametrize("share_prefix", [True, False])
@pytest.mark.parametrize(("prompt_left", "resp_right"), [(True, True), (False, True), (False, False)])
def test_group_logps_equal_naive_with_grads(model, reference, share_prefix, prompt_left, resp_right):
    batch = _repad(collate_groups(_groups(), PAD), prompt_left, resp_right)
    got = _value_and_grads(model, lambda: group_logps(model, batch, share_prefix=share_prefix))
    _assert_same(got, reference)
    assert (got[0][1, 2:] == 0).all() and got[0][0, 3] == 0  # invalid slots are 0


def test_collate_pads_prompts_left_and_responses_right():
    batch = collate_groups(_groups(), PAD)
    assert batch.prompt_ids.shape == (3, 11) and batch.cand_ids.shape == (3, 4, 9)
    assert batch.prompt_mask[0].tolist() == [0] * 6 + [1] * 5
    assert batch.cand_mask[0, 0].tolist() == [1] * 3 + [0] * 6
    assert batch.valid.tolist() == [[True] * 3 + [False], [True] * 2 + [False] * 2, [True] * 4]


def _tiny(tiny_lm_dir, attn: str, checkpointing: bool = False):
    from transformers import LlamaForCausalLM

    m = LlamaForCausalLM.from_pretrained(tiny_lm_dir, dtype=torch.float32, attn_implementation=attn)
    if checkpointing:
        m.activation_checkpointing_enable()
    return m.train()


def test_packed_pass_runs_under_gradient_checkpointing(tiny_lm_dir, reference):
    """The packed pass needs no KV cache, so prefix sharing works with checkpointing on."""
    gc_model = _tiny(tiny_lm_dir, "sdpa", checkpointing=True)
    batch = collate_groups(_groups(), PAD)
    _assert_same(_value_and_grads(gc_model, lambda: group_logps(gc_model, batch)), reference)
    assert gc_model.config._attn_implementation == packing.NAME


def test_cached_fallback_equals_naive(tiny_lm_dir, reference):
    """A model not on sdpa (here eager) keeps its attention and takes the KV-cache path."""
    eager = _tiny(tiny_lm_dir, "eager")
    batch = _repad(collate_groups(_groups(), PAD), False, False)
    _assert_same(_value_and_grads(eager, lambda: group_logps(eager, batch)), reference)
    assert eager.config._attn_implementation == "eager"


def test_cached_fallback_needs_a_cache(tiny_lm_dir):
    gc_model = _tiny(tiny_lm_dir, "eager", checkpointing=True)
    batch = collate_groups(_groups(), PAD)
    with pytest.raises(ConfigError, match="KV cache"):
        group_logps(gc_model, batch, share_prefix=True)
    assert group_logps(gc_model, batch, share_prefix=False).shape == (3, 4)


def test_taken_logps_equals_log_softmax_with_grads():
    """Chunked log-sum-exp + gather equals log_softmax[rows, targets], a row used twice included."""
    g = torch.Generator().manual_seed(3)
    logits = (torch.randn(7, 50, generator=g) * 4).requires_grad_()
    rows, targets = torch.tensor([0, 0, 2, 6, 3]), torch.tensor([4, 9, 49, 0, 4])
    weights = torch.arange(1.0, 6.0)
    got = taken_logps(logits, rows, targets)
    (grad,) = torch.autograd.grad((got * weights).sum(), logits)
    want = logits.log_softmax(-1)[rows, targets]
    (want_grad,) = torch.autograd.grad((want * weights).sum(), logits)
    # assert_close's float32 defaults (rtol 1.3e-6 = 11 eps, atol 1e-5): a log-softmax over 50
    # logits of ~4·N(0,1) in another order differs by a few eps · max|logit| ~ 2e-6
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(grad, want_grad)


def test_head_taken_logps_equals_head_then_log_softmax_with_grads(monkeypatch):
    """The LM head fused in vocabulary chunks (5 chunks here, the last one short) equals
    ``log_softmax(hidden @ W.T)[rows, targets]``, values and both gradients."""
    monkeypatch.setattr(taken, "HEAD_CHUNK", 12)
    g = torch.Generator().manual_seed(5)
    hidden = torch.randn(7, 16, generator=g).requires_grad_()
    weight = torch.randn(50, 16, generator=g).requires_grad_()
    rows, targets = torch.tensor([0, 0, 2, 6, 3, 5]), torch.tensor([4, 49, 12, 0, 4, 36])
    weights = torch.arange(1.0, 7.0)
    got = logps_mod.head_taken_logps(hidden, weight, rows, targets)
    got_grads = torch.autograd.grad((got * weights).sum(), (hidden, weight))
    want = (hidden @ weight.T).log_softmax(-1)[rows, targets]
    want_grads = torch.autograd.grad((want * weights).sum(), (hidden, weight))
    # float32 defaults (see above): the chunks sum the same 50 exps in 5 parts, the 16-wide
    # matmul is the same; a few eps · max|logit| apart
    torch.testing.assert_close(got, want)
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b)


def test_packed_pass_fuses_the_head_and_restores_it(model, reference):
    """The tiny Llama (tied head, CPU) takes the fused head, equals the naive loop (the tied
    weight's gradient sums the head's and the input embedding's parts), and gets its head's
    own ``forward`` back."""
    assert logps_mod._fusable_head(model) is model.lm_head
    batch = collate_groups(_groups(), PAD)
    _assert_same(_value_and_grads(model, lambda: group_logps(model, batch)), reference)
    assert "forward" not in vars(model.lm_head)
    with torch.no_grad():  # outside training the model's head runs as usual
        assert logps_mod._fusable_head(model) is None


def test_model_transforming_its_logits_gets_the_real_head():
    """Granite divides its logits by ``logits_scaling`` after the head: the packed pass sees the
    head's output was transformed, reruns with the real head (once per model) and equals the
    unshared pass."""
    from transformers import GraniteConfig, GraniteForCausalLM

    torch.manual_seed(0)
    cfg = GraniteConfig(vocab_size=5000, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, logits_scaling=4.0,
                        tie_word_embeddings=True, attn_implementation="sdpa")
    granite = GraniteForCausalLM(cfg).train()
    batch = collate_groups(_groups(), PAD)
    got = _value_and_grads(granite, lambda: group_logps(granite, batch))
    assert granite in logps_mod._NO_FUSED_HEAD and logps_mod._fusable_head(granite) is None
    assert granite.config._attn_implementation == packing.NAME  # still the packed pass
    want = _value_and_grads(granite, lambda: _naive(granite, _groups()))
    _assert_same(got, want)
