"""Per-candidate response log-probs with the prompt computed once per group (prefix sharing).

Shapes: B groups, K candidate slots, P prompt columns, T response columns, N = number of
valid candidates in the batch, V vocabulary. Any padding is accepted: prompts are first
left-aligned and responses right-aligned (a stable sort of each row on its mask), so the code
below only deals with left-padded prompts and right-padded responses.

Shared path (``share_prefix=True``): ONE forward pass over B packed rows
``[prompt | response 1 | ... | response K]`` (:mod:`grouppref.train.tensors.packing`), where each
response attends to its own prompt and itself. Every linear layer runs one matrix product for
all tokens of the batch, the prompt's keys and values are broadcast to the K responses, and
only the response positions (plus each prompt's last one, which predicts every first response
token) reach the LM head.

Fallback (models not on ``sdpa``, or with attention features the packed attention does not
implement: soft-capping, sinks, a position bias, non-attention layers): two passes, the prompts
with ``use_cache=True``, then the N responses on the KV cache gathered to them
(``DynamicCache.batch_select_indices``). It needs the KV cache, so not with gradient
checkpointing.

The unshared path concatenates prompt and response per candidate and runs N full rows; it is
the reference the shared path must equal (1e-4 in fp32, tests/integration/test_logps.py).

Log-probs of the taken tokens come from :func:`taken_logps`: a log-sum-exp per logit row in
chunks and one gather, with no (rows, V) log-softmax kept for backward. On CPU, when the model's
LM head is a plain bias-free ``nn.Linear`` whose output the model returns untouched, the packed
pass goes further (:func:`head_taken_logps`): the model returns the hidden states, and the head
runs here in vocabulary chunks, each chunk's softmax gradient formed in place and consumed by
the two weight/input products while it is still in cache (no (R, V) gradient tensor).
"""

from __future__ import annotations

import contextlib
import inspect
import weakref
from collections.abc import Iterator
from typing import Any

import torch

from grouppref.errors import ConfigError
from grouppref.train.tensors import packing
from grouppref.train.tensors.batch import GroupBatch
from grouppref.train.tensors.token_logps import head_taken_logps, taken_logps, token_logps

__all__ = ["group_logps", "head_taken_logps", "taken_logps", "token_logps"]

Tensor = torch.Tensor

_FALLBACK: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
_NO_FUSED_HEAD: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
# Models whose first packed pass ran the grouped attention in every layer: the mask keys used.
_CHECKED: weakref.WeakKeyDictionary[Any, frozenset[Any]] = weakref.WeakKeyDictionary()


def _positions(mask: Tensor) -> Tensor:
    """Position ids that skip padding: 0 at each row's first real token. (R, L) -> (R, L)."""
    return (mask.cumsum(dim=-1) - 1).clamp(min=0)


def _inner(model: Any) -> Any:
    """The model under DDP's ``module`` and peft's ``get_base_model()``."""
    base = getattr(model, "module", model)
    return base.get_base_model() if hasattr(base, "get_base_model") else base


def takes_fallback(model: Any) -> bool:
    """Whether the shared pass of ``model`` runs the KV-cache fallback: it is on neither
    ``sdpa`` nor the packed attention, or its first packed pass found the packed attention not
    applicable."""
    inner = _inner(model)
    attention = getattr(getattr(inner, "config", None), "_attn_implementation", None)
    return inner in _FALLBACK or attention not in ("sdpa", packing.NAME)


def _cache_kwarg(model: Any) -> str:
    """``cache`` (transformers >= 5.24) or the older ``past_key_values``.

    Wrappers (DDP's ``module``, peft's ``get_base_model()``) forward extra keywords to the
    model they wrap, so the innermost model's signature decides.
    """
    params = inspect.signature(_inner(model).forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _align(ids: Tensor, mask: Tensor, left: bool) -> tuple[Tensor, Tensor]:
    """Move each row's real tokens to the right end (``left`` padding) or the left end.

    A stable sort on the mask keeps the tokens in order, so any padding (left, right, both)
    is accepted. (R, L) -> (R, L), (R, L).
    """
    key = mask if left else 1 - mask
    idx = key.argsort(dim=1, stable=True)
    return ids.gather(1, idx), mask.gather(1, idx)


def _sum_taken(logits: Tensor, rows: Tensor, targets: Tensor, mask: Tensor,
               head: torch.nn.Linear | None = None) -> Tensor:
    """Σ_t of the taken-token log-probs per candidate: (R, V) logits, (N, T) rows/targets/mask -> (N,).

    With ``head``, ``logits`` are the (R, d) hidden states entering it (:func:`head_taken_logps`).
    """
    n, t = mask.shape
    keep = mask.reshape(-1).bool()
    owner = torch.arange(n, device=mask.device).repeat_interleave(t)[keep]  # (M,)
    rows, targets = rows.reshape(-1)[keep], targets.reshape(-1)[keep]
    taken = (taken_logps(logits, rows, targets) if head is None
             else head_taken_logps(logits, head.weight, rows, targets))
    return torch.zeros(n, dtype=taken.dtype, device=taken.device).index_add(0, owner, taken)


def _fusable_head(model: Any) -> torch.nn.Linear | None:
    """The LM head when :func:`head_taken_logps` can replace it, else None.

    CPU (where it was measured), a plain bias-free ``nn.Linear`` with a plain parameter (not a
    sharded DTensor, no hook or offloading wrapper on its ``forward``), gradients on, and a
    model not yet seen to transform the head's output.
    """
    inner = _inner(model)
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    if (inner in _NO_FUSED_HEAD or type(head) is not torch.nn.Linear or head.bias is not None
            or type(head.weight) is not torch.nn.Parameter or head.weight.device.type != "cpu"
            or "forward" in vars(head) or getattr(head, "_hf_hook", None) is not None
            or not torch.is_grad_enabled()):
        return None
    return head


@contextlib.contextmanager
def _head_bypassed(head: torch.nn.Linear | None) -> Iterator[list[Tensor]]:
    """While active, ``head`` returns its input (recorded in the yielded list)."""
    seen: list[Tensor] = []
    if head is None:
        yield seen
        return

    def passthrough(x: Tensor) -> Tensor:
        seen.append(x)
        return x

    head.forward = passthrough  # type: ignore[method-assign, assignment]  # torch types forward as a method
    try:
        yield seen
    finally:
        del head.forward


def _head_rows(model: Any, packed: dict[str, Any], **kwargs: Any,
               ) -> tuple[Tensor, torch.nn.Linear | None]:
    """A training call's output: the hidden states entering a fusable head (and the head), else
    the logits. ``packed`` holds the packed pass's extra keywords (masks, probe). A model that
    turns out to transform its head's output is rerun, once per model.
    """
    kwargs.update(packed)
    head = _fusable_head(model)
    if head is not None:
        try:
            with _head_bypassed(head) as seen:
                out = model(**kwargs).logits
            if len(seen) == 1 and out is seen[0]:
                return out, head
        except Exception:  # noqa: BLE001 - its code after the head needed real logits
            pass
        _NO_FUSED_HEAD[_inner(model)] = "the model transforms the LM head's output"
        if (probe := packed.get(packing.PROBE_KWARG)) is not None:
            probe.reset()
    return model(**kwargs).logits, None


def _packed_call(model: Any, layout: packing.GroupLayout, **kwargs: Any,
                 ) -> tuple[Tensor, torch.nn.Linear | None, bool]:
    """The packed forward: ``_head_rows``'s output and whether every layer ran the grouped
    attention. A model's first packed call runs eagerly with a :class:`packing.Probe` that counts
    the attention calls and records the mask keys; later calls get those masks, built up front,
    as tensors only (a compiled decoder layer takes them without a graph break)."""
    inner = _inner(model)
    keys = _CHECKED.get(inner)
    if keys is not None:
        out, head = _head_rows(model, {packing.MASKS_KWARG: layout.tensors(keys)}, **kwargs)
        return out, head, True
    probe = packing.Probe()
    stance = getattr(torch.compiler, "set_stance", None)  # torch >= 2.6
    with stance("force_eager") if stance is not None else contextlib.nullcontext():
        out, head = _head_rows(model, {packing.MASKS_KWARG: layout, packing.PROBE_KWARG: probe},
                               **kwargs)
    ok = probe.unsupported is None and probe.calls == getattr(inner.config, "num_hidden_layers", None)
    if ok:
        _CHECKED[inner] = frozenset(probe.keys)
    return out, head, ok


def _packed(model: Any, prompt: tuple[Tensor, Tensor], cand: tuple[Tensor, Tensor],
            slots: tuple[int, int]) -> tuple[Tensor, bool]:
    """One pass over B rows ``[prompt | K responses minus their last token]``.

    ``cand`` is (B·K, T) with every slot (invalid ones all padding). Returns (B·K,) sums and
    whether the model ran the grouped attention in every layer (else the values are wrong).
    """
    prompt_ids, prompt_mask = prompt  # (B, P)
    resp, resp_mask = cand  # (B·K, T)
    b, k = slots
    t = resp.shape[1] - 1
    resp_in = resp[:, :-1].reshape(b, k, t)  # input columns: tokens 0..T-2
    layout = packing.GroupLayout(
        prompt_real=prompt_mask.bool(), resp_real=resp_mask[:, 1:].reshape(b, k, t).bool(),
        prompt_pos=_positions(prompt_mask),
        resp_pos=(prompt_mask.sum(1)[:, None] + torch.arange(t, device=resp.device))[:, None]
        .expand(b, k, t))
    ids = torch.cat([prompt_ids, resp_in.reshape(b, k * t)], dim=1)  # (B, L)
    pos = torch.cat([layout.prompt_pos, layout.resp_pos.reshape(b, k * t)], dim=1)
    placeholder = torch.ones(b, 1, 1, 1, dtype=torch.bool, device=ids.device)  # 4D: used as is
    out, head, ok = _packed_call(model, layout, input_ids=ids, attention_mask=placeholder,
                                 position_ids=pos, use_cache=False, logits_to_keep=1 + k * t)
    logits = out.reshape(b * (1 + k * t), -1)  # row b·(1+K·T) + c: column P-1+c of row b
    first = torch.arange(b, device=ids.device).repeat_interleave(k) * (1 + k * t)  # (B·K,)
    rows = torch.cat([first[:, None], first[:, None] + 1 + (torch.arange(b * k, device=ids.device)
                      % k)[:, None] * t + torch.arange(t, device=ids.device)], dim=1)  # (B·K, T)
    return _sum_taken(logits, rows, resp, resp_mask, head), ok


def _cached(model: Any, prompt: tuple[Tensor, Tensor], cand: tuple[Tensor, Tensor],
            rows: Tensor) -> Tensor:
    """Fallback: prompts with ``use_cache=True``, then the N responses on the gathered cache."""
    prompt_ids, prompt_mask = prompt  # (B, P) left-padded
    resp, resp_mask = cand  # (N, T) right-padded
    out = model(input_ids=prompt_ids, attention_mask=prompt_mask,
                position_ids=_positions(prompt_mask), use_cache=True, logits_to_keep=1)
    cache = getattr(out, "cache", None)
    if cache is None:  # transformers < 5.24
        cache = getattr(out, "past_key_values", None)
    if cache is None:
        raise ConfigError("the model returned no KV cache (gradient checkpointing turns "
                          "use_cache off) and its attention cannot run the packed pass; disable "
                          "gradient checkpointing or use share_prefix=False")
    first = taken_logps(out.logits[:, -1], rows, resp[:, 0])  # (N,)
    if resp.shape[1] == 1:
        return first
    cache.batch_select_indices(rows)  # (B, ...) -> (N, ...), differentiable
    prompt_len = prompt_mask.sum(dim=1)[rows]  # (N,)
    steps = torch.arange(resp.shape[1] - 1, device=resp.device)
    position_ids = prompt_len[:, None] + steps  # (N, T-1)
    attention_mask = torch.cat([prompt_mask[rows], resp_mask[:, :-1]], dim=1)  # (N, P+T-1)
    logits = model(input_ids=resp[:, :-1], attention_mask=attention_mask,
                   position_ids=position_ids, use_cache=True, **{_cache_kwarg(model): cache}).logits
    rest = token_logps(logits, resp[:, 1:])  # (N, T-1)
    return first + (rest * resp_mask[:, 1:]).sum(dim=1)


def _unshared(model: Any, prompt: tuple[Tensor, Tensor], cand: tuple[Tensor, Tensor],
              rows: Tensor) -> Tensor:
    prompt_ids, prompt_mask = prompt  # (B, P) left-padded
    resp, resp_mask = cand  # (N, T) right-padded
    ids = torch.cat([prompt_ids[rows], resp], dim=1)[:, :-1]  # (N, P+T-1)
    mask = torch.cat([prompt_mask[rows], resp_mask], dim=1)[:, :-1]
    n, t = resp.shape
    logits, head = _head_rows(model, {}, input_ids=ids, attention_mask=mask,
                              position_ids=_positions(mask), use_cache=False,
                              logits_to_keep=t)  # (N, T, V), or (N, T, d) with a head
    logit_rows = torch.arange(n * t, device=resp.device).view(n, t)
    return _sum_taken(logits.reshape(n * t, -1), logit_rows, resp, resp_mask, head)


def _shared(model: Any, batch: GroupBatch, prompt: tuple[Tensor, Tensor]) -> Tensor:
    """(B, K) sums by the packed pass, or the cached fallback where it does not apply."""
    rows, cols = batch.valid.nonzero(as_tuple=True)
    inner = _inner(model)
    if inner not in _FALLBACK and packing.install(inner):
        b, k = batch.valid.shape
        cand = _align(batch.cand_ids.reshape(b * k, -1), batch.cand_mask.reshape(b * k, -1),
                      left=False)
        sums, ok = _packed(model, prompt, cand, (b, k))
        if ok:
            return sums.view(b, k) * batch.valid
        _FALLBACK[inner] = "packed attention not applicable"
    cand = _align(batch.cand_ids[rows, cols], batch.cand_mask[rows, cols], left=False)
    return _scatter(_cached(model, prompt, cand, rows), rows, cols, tuple(batch.valid.shape))


def _scatter(values: Tensor, rows: Tensor, cols: Tensor, shape: tuple[int, ...]) -> Tensor:
    out = values.new_zeros(shape)
    return out.index_put((rows, cols), values)


def group_logps(model: Any, batch: GroupBatch, share_prefix: bool = True) -> Tensor:
    """Summed log-probs of each candidate's response given its group's prompt.

    ``logp[b, k] = Σ_t log πθ(y_{b,k,t} | x_b, y_{b,k,<t})`` over the real response tokens.

    With ``share_prefix``, a model on ``sdpa`` attention is switched to grouppref's grouped
    attention (:mod:`grouppref.train.tensors.packing`), which behaves exactly as ``sdpa`` for any other
    call.

    Args:
        model (Any): a transformers causal LM (supports ``logits_to_keep`` and
            ``position_ids``; the fallback also a ``DynamicCache``).
        batch (GroupBatch): the groups, on the model's device.
        share_prefix (bool): compute each prompt once for its group's candidates (fewer
            tokens); False runs prompt + response per candidate.

    Returns:
        Tensor: float32, shape (B, K); 0 for invalid candidate slots. Differentiable.

    Raises:
        ConfigError: ``share_prefix``, the packed pass does not apply to this model, and the
            model returns no KV cache (gradient checkpointing).
    """
    prompt = _align(batch.prompt_ids, batch.prompt_mask, left=True)  # (B, P)
    if share_prefix:
        return _shared(model, batch, prompt)
    rows, cols = batch.valid.nonzero(as_tuple=True)  # (N,), (N,)
    cand = _align(batch.cand_ids[rows, cols], batch.cand_mask[rows, cols], left=False)  # (N, T)
    return _scatter(_unshared(model, prompt, cand, rows), rows, cols, tuple(batch.valid.shape))
