"""Per-candidate response log-probs with the prompt computed once per group (prefix sharing).

Shapes: B groups, K candidate slots, P prompt columns, T response columns, N = number of
valid candidates in the batch, V vocabulary. Any padding is accepted: prompts are first
left-aligned and responses right-aligned (a stable sort of each row on its mask), so the code
below only deals with left-padded prompts and right-padded responses.

Shared path (``share_prefix=True``): ONE forward pass over B packed rows
``[prompt | response 1 | ... | response K]`` (:mod:`grouppref.train.packing`), where each
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
the reference the shared path must equal (1e-4 in fp32, tests/test_logps.py).

Log-probs of the taken tokens come from :func:`taken_logps`: a log-sum-exp per logit row in
chunks and one gather, with no (rows, V) log-softmax kept for backward.
"""

from __future__ import annotations

import inspect
import weakref
from typing import Any

import torch

from grouppref.errors import ConfigError
from grouppref.train import packing
from grouppref.train.batch import GroupBatch

Tensor = torch.Tensor

# Logit bytes per log-sum-exp chunk: ~2 MB on CPU (the chunk stays in cache); 256 MB on an
# accelerator, where a chunk of a few rows would cost a kernel launch per few rows.
CHUNK_BYTES = {"cpu": 1 << 21}
CHUNK_BYTES_ACCELERATOR = 1 << 28
_FALLBACK: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


class _TakenLogps(torch.autograd.Function):
    """``logits[r, y] - logsumexp(logits[r])`` for M (row, target) pairs; see :func:`taken_logps`."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, rows: Tensor, targets: Tensor) -> Tensor:
        chunk = CHUNK_BYTES.get(logits.device.type, CHUNK_BYTES_ACCELERATOR)
        step = max(1, chunk // (logits.shape[1] * logits.element_size()))
        lse = torch.cat([torch.logsumexp(logits[i:i + step].float(), dim=-1)
                         for i in range(0, logits.shape[0], step)])  # (R,)
        ctx.save_for_backward(logits, lse, rows, targets)
        ctx.step = step
        return logits[rows, targets].float() - lse[rows]

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        # d/dlogits of Σ_m g_m (logits[r_m, y_m] - lse[r_m]) = onehot·g - softmax · Σ_{m: r_m = r} g_m
        logits, lse, rows, targets = ctx.saved_tensors
        per_row = torch.zeros_like(lse).index_add_(0, rows, grad.float())  # (R,)
        out = torch.empty_like(logits)
        for i in range(0, logits.shape[0], ctx.step):
            part = (logits[i:i + ctx.step].float() - lse[i:i + ctx.step, None]).exp_()
            torch.mul(part, per_row[i:i + ctx.step, None].neg(), out=out[i:i + ctx.step])
        out.index_put_((rows, targets), grad.to(out.dtype), accumulate=True)
        return out, None, None


def taken_logps(logits: Tensor, rows: Tensor, targets: Tensor) -> Tensor:
    """``log softmax(logits[rows[m]])[targets[m]]`` in float32, for M pairs.

    Equals ``logits.log_softmax(-1)[rows, targets]``, but the backward pass rebuilds the
    softmax from the saved logits and a (R,) log-sum-exp chunk by chunk instead of keeping a
    (R, V) log-softmax and zero-filling a (R, V) gradient for the gather. A row may serve
    several pairs (a prompt's last logit predicts the first token of all K responses).

    Args:
        logits (Tensor): (R, V), any float dtype.
        rows (Tensor): long (M,), row of each pair.
        targets (Tensor): long (M,), token id of each pair.

    Returns:
        Tensor: float32 (M,). Differentiable in ``logits``.
    """
    return _TakenLogps.apply(logits, rows, targets)


def token_logps(logits: Tensor, targets: Tensor) -> Tensor:
    """``log softmax(logits)[target]`` in float32 for every position.

    Args:
        logits (Tensor): shape (..., V).
        targets (Tensor): long, shape (...).

    Returns:
        Tensor: shape (...).
    """
    flat = logits.reshape(-1, logits.shape[-1])
    rows = torch.arange(flat.shape[0], device=flat.device)
    return taken_logps(flat, rows, targets.reshape(-1)).view(targets.shape)


def _positions(mask: Tensor) -> Tensor:
    """Position ids that skip padding: 0 at each row's first real token. (R, L) -> (R, L)."""
    return (mask.cumsum(dim=-1) - 1).clamp(min=0)


def _inner(model: Any) -> Any:
    """The model under DDP's ``module`` and peft's ``get_base_model()``."""
    base = getattr(model, "module", model)
    return base.get_base_model() if hasattr(base, "get_base_model") else base


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


def _sum_taken(logits: Tensor, rows: Tensor, targets: Tensor, mask: Tensor) -> Tensor:
    """Σ_t of the taken-token log-probs per candidate: (R, V) logits, (N, T) rows/targets/mask -> (N,)."""
    n, t = mask.shape
    keep = mask.reshape(-1).bool()
    owner = torch.arange(n, device=mask.device).repeat_interleave(t)[keep]  # (M,)
    taken = taken_logps(logits, rows.reshape(-1)[keep], targets.reshape(-1)[keep])
    return torch.zeros(n, dtype=taken.dtype, device=taken.device).index_add(0, owner, taken)


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
    out = model(input_ids=ids, attention_mask=placeholder, position_ids=pos, use_cache=False,
                logits_to_keep=1 + k * t, **{packing.LAYOUT_KWARG: layout})
    layers = getattr(_inner(model).config, "num_hidden_layers", None)
    ok = layout.unsupported is None and layout.calls == layers
    logits = out.logits.reshape(b * (1 + k * t), -1)  # row b·(1+K·T) + c: column P-1+c of row b
    first = torch.arange(b, device=ids.device).repeat_interleave(k) * (1 + k * t)  # (B·K,)
    rows = torch.cat([first[:, None], first[:, None] + 1 + (torch.arange(b * k, device=ids.device)
                      % k)[:, None] * t + torch.arange(t, device=ids.device)], dim=1)  # (B·K, T)
    return _sum_taken(logits, rows, resp, resp_mask), ok


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
    logits = model(input_ids=ids, attention_mask=mask, position_ids=_positions(mask),
                   use_cache=False, logits_to_keep=t).logits  # (N, T, V)
    logit_rows = torch.arange(n * t, device=resp.device).view(n, t)
    return _sum_taken(logits.reshape(n * t, -1), logit_rows, resp, resp_mask)


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


def _scatter(values: Tensor, rows: Tensor, cols: Tensor, shape: tuple[int, int]) -> Tensor:
    out = values.new_zeros(shape)
    return out.index_put((rows, cols), values)


def group_logps(model: Any, batch: GroupBatch, share_prefix: bool = True) -> Tensor:
    """Summed log-probs of each candidate's response given its group's prompt.

    ``logp[b, k] = Σ_t log πθ(y_{b,k,t} | x_b, y_{b,k,<t})`` over the real response tokens.

    With ``share_prefix``, a model on ``sdpa`` attention is switched to grouppref's grouped
    attention (:mod:`grouppref.train.packing`), which behaves exactly as ``sdpa`` for any other
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
