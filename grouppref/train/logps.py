"""Per-candidate response log-probs with the prompt computed once per group (prefix sharing).

Shapes: B groups, K candidate slots, P prompt columns, T response columns, N = number of
valid candidates in the batch, V vocabulary. Any padding is accepted: prompts are first
left-aligned and responses right-aligned (a stable sort of each row on its mask), so the code
below only deals with left-padded prompts and right-padded responses.

Shared path (``share_prefix=True``), two forward passes:

1. the B prompts, with ``use_cache=True`` and only the last position's logits kept: that logit
   predicts every candidate's first response token (prompts are left-padded, so it is column
   P − 1 for all groups);
2. the KV cache is gathered to the N valid candidates (``DynamicCache.batch_select_indices``,
   an indexing op, so gradients flow back into the prompt pass and sum over the K candidates),
   and the N responses run on top of it with ``position_ids`` continuing each prompt's real
   length and an attention mask covering prompt + response.

The unshared path concatenates prompt and response per candidate and runs N full rows; it is
the reference the shared path must equal (1e-4 in fp32, tests/test_logps.py).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn.functional as F

from grouppref.errors import ConfigError
from grouppref.train.data import GroupBatch

Tensor = torch.Tensor


def token_logps(logits: Tensor, targets: Tensor) -> Tensor:
    """``log softmax(logits)[target]`` in float32.

    Args:
        logits (Tensor): shape (..., V).
        targets (Tensor): long, shape (...).

    Returns:
        Tensor: shape (...).
    """
    flat = logits.reshape(-1, logits.shape[-1]).float()  # fused log-softmax + pick: lean backward
    return -F.cross_entropy(flat, targets.reshape(-1), reduction="none").view(targets.shape)


def _positions(mask: Tensor) -> Tensor:
    """Position ids that skip padding: 0 at each row's first real token. (R, L) -> (R, L)."""
    return (mask.cumsum(dim=-1) - 1).clamp(min=0)


def _cache_kwarg(model: Any) -> str:
    """``cache`` (transformers >= 5.24) or the older ``past_key_values``.

    Wrappers (DDP's ``module``, peft's ``get_base_model()``) forward extra keywords to the
    model they wrap, so the innermost model's signature decides.
    """
    base = getattr(model, "module", model)
    base = base.get_base_model() if hasattr(base, "get_base_model") else base
    params = inspect.signature(base.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _align(ids: Tensor, mask: Tensor, left: bool) -> tuple[Tensor, Tensor]:
    """Move each row's real tokens to the right end (``left`` padding) or the left end.

    A stable sort on the mask keeps the tokens in order, so any padding (left, right, both)
    is accepted. (R, L) -> (R, L), (R, L).
    """
    key = mask if left else 1 - mask
    idx = key.argsort(dim=1, stable=True)
    return ids.gather(1, idx), mask.gather(1, idx)


def _scatter(values: Tensor, rows: Tensor, cols: Tensor, shape: tuple[int, int]) -> Tensor:
    out = values.new_zeros(shape)
    return out.index_put((rows, cols), values)


def _shared(model: Any, prompt: tuple[Tensor, Tensor], cand: tuple[Tensor, Tensor],
            rows: Tensor) -> Tensor:
    prompt_ids, prompt_mask = prompt  # (B, P) left-padded
    resp, resp_mask = cand  # (N, T) right-padded
    out = model(input_ids=prompt_ids, attention_mask=prompt_mask,
                position_ids=_positions(prompt_mask), use_cache=True, logits_to_keep=1)
    cache = getattr(out, "cache", None)
    if cache is None:  # transformers < 5.24
        cache = getattr(out, "past_key_values", None)
    if cache is None:
        raise ConfigError("the model returned no KV cache (gradient checkpointing turns "
                          "use_cache off); disable it or use share_prefix=False")
    first = token_logps(out.logits[:, -1][rows], resp[:, 0])  # (N,)
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
    t = resp.shape[1]
    logits = model(input_ids=ids, attention_mask=mask, position_ids=_positions(mask),
                   use_cache=False, logits_to_keep=t).logits  # (N, T, V)
    return (token_logps(logits, resp) * resp_mask).sum(dim=1)


def group_logps(model: Any, batch: GroupBatch, share_prefix: bool = True) -> Tensor:
    """Summed log-probs of each candidate's response given its group's prompt.

    ``logp[b, k] = Σ_t log πθ(y_{b,k,t} | x_b, y_{b,k,<t})`` over the real response tokens.

    Args:
        model (Any): a transformers causal LM (supports ``logits_to_keep``, ``position_ids``
            and a ``DynamicCache``).
        batch (GroupBatch): the groups, on the model's device.
        share_prefix (bool): run each prompt once and share its KV cache across the
            group's candidates (fewer tokens); False runs prompt + response per candidate.

    Returns:
        Tensor: float32, shape (B, K); 0 for invalid candidate slots. Differentiable.

    Raises:
        ConfigError: ``share_prefix`` but the model returns no KV cache.
    """
    rows, cols = batch.valid.nonzero(as_tuple=True)  # (N,), (N,)
    prompt = _align(batch.prompt_ids, batch.prompt_mask, left=True)  # (B, P)
    cand = _align(batch.cand_ids[rows, cols], batch.cand_mask[rows, cols], left=False)  # (N, T)
    if share_prefix:
        sums = _shared(model, prompt, cand, rows)  # (N,)
    else:
        sums = _unshared(model, prompt, cand, rows)
    return _scatter(sums, rows, cols, tuple(batch.valid.shape))
