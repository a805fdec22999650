"""Log-probs of taken tokens from logits, or from the hidden states entering the LM head, without
a (rows, V) log-softmax or a (rows, V) gradient kept around.

Shapes: R logit rows, V vocabulary, d hidden size, M (row, target) pairs (a row may serve
several pairs: a prompt's last logit predicts the first token of all K responses).
"""

from __future__ import annotations

from typing import Any

import torch

Tensor = torch.Tensor

# Logit bytes per log-sum-exp chunk: ~2 MB on CPU (the chunk stays in cache); 256 MB on an
# accelerator, where a chunk of a few rows would cost a kernel launch per few rows.
CHUNK_BYTES = {"cpu": 1 << 21}
CHUNK_BYTES_ACCELERATOR = 1 << 28
# Vocabulary columns per chunk of the fused LM head: (R x 576 x 4096) products run near the
# square-matmul rate on CPU where one (R x 576 x 49152) product runs at ~70 % of it
# (benchmarks/results/train_peak.md, "where the rest went").
HEAD_CHUNK = 4096


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


class _HeadTakenLogps(torch.autograd.Function):
    """``taken_logps(hidden @ weight.T, rows, targets)`` with the product in vocabulary chunks."""

    @staticmethod
    def forward(ctx: Any, hidden: Tensor, weight: Tensor, rows: Tensor, targets: Tensor) -> Tensor:
        chunks, lse = [], None
        taken = hidden.new_empty(targets.shape, dtype=torch.float32)
        for start in range(0, weight.shape[0], HEAD_CHUNK):
            part = hidden @ weight[start:start + HEAD_CHUNK].T  # (R, C)
            part_lse = torch.logsumexp(part.float(), dim=-1)
            lse = part_lse if lse is None else torch.logaddexp(lse, part_lse)
            inside = (targets >= start) & (targets < start + part.shape[1])
            taken[inside] = part[rows[inside], targets[inside] - start].float()
            chunks.append(part)
        assert lse is not None  # the head has at least one row
        ctx.save_for_backward(hidden, weight, lse, rows, targets)
        ctx.chunks = chunks
        return taken - lse[rows]

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None, None]:
        # Per chunk: dlogits = onehot·g - softmax · Σ_{m: r_m = r} g_m (as _TakenLogps), then
        # d hidden += dlogits @ W_chunk and d W_chunk = dlogits.T @ hidden.
        hidden, weight, lse, rows, targets = ctx.saved_tensors
        if ctx.chunks is None:
            raise RuntimeError("head_taken_logps: backward through the same graph twice")
        per_row = torch.zeros_like(lse).index_add_(0, rows, grad.float())[:, None]  # (R, 1)
        grad_h = torch.zeros_like(hidden) if ctx.needs_input_grad[0] else None
        grad_w = torch.empty_like(weight) if ctx.needs_input_grad[1] else None
        for n, part in enumerate(ctx.chunks):
            start = n * HEAD_CHUNK
            part.sub_(lse[:, None]).exp_().mul_(-per_row)  # in place: the chunk is ours
            inside = (targets >= start) & (targets < start + part.shape[1])
            part.index_put_((rows[inside], targets[inside] - start), grad[inside].to(part.dtype),
                            accumulate=True)
            if grad_w is not None:
                torch.mm(part.T, hidden, out=grad_w[start:start + part.shape[1]])
            if grad_h is not None:
                grad_h.addmm_(part, weight[start:start + part.shape[1]])
        ctx.chunks = None
        return grad_h, grad_w, None, None


def head_taken_logps(hidden: Tensor, weight: Tensor, rows: Tensor, targets: Tensor) -> Tensor:
    """``taken_logps(hidden @ weight.T, rows, targets)``, the LM head fused in vocabulary chunks.

    Same values and gradients (up to float rounding) as the LM head followed by
    :func:`taken_logps`, with the (R, V) logits kept once (as chunks) and no (R, V) gradient:
    each chunk's softmax gradient is formed in place and consumed by the two products.

    Args:
        hidden (Tensor): (R, d) hidden states entering the head.
        weight (Tensor): (V, d) the head's weight (no bias).
        rows (Tensor): long (M,), row of each pair. targets (Tensor): long (M,), token ids.

    Returns:
        Tensor: float32 (M,). Differentiable in ``hidden`` and ``weight``. The graph can be
        backpropagated once (the saved chunks are overwritten by their gradient).
    """
    return _HeadTakenLogps.apply(hidden, weight, rows, targets)


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
