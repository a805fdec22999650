"""One forward pass per group: the prompt and its K responses packed in one row, with an
attention that lets each response see its own prompt and itself, never its siblings.

Shapes: B groups (rows), K candidate slots, P prompt columns (left-padded), T response input
columns per slot (right-padded), L = P + K·T, H query heads, G = H / KV query heads per key/value
head (GQA), D head size.

Row layout::

    [ prompt (P) | response 1 (T) | response 2 (T) | ... | response K (T) ]

Response k's input at column t is its token t (its last token is only ever a target), with
position id ``prompt_len + t``, so every response continues its prompt exactly as if it ran
alone. Each linear layer then runs ONE matrix product over all B·L tokens per step: a prompt
pass plus a response pass (the KV-cache approach) run two, so every weight gradient is computed
twice and summed, and the tied embedding's (V, d) gradient is zero-filled twice.

Attention, per layer, is two ``scaled_dot_product_attention`` calls:

* prompts: causal over the (B, P) prompts;
* responses: the B·K responses as a batch, each over ``[its prompt's P keys, its own T keys]``
  (prompt keys broadcast to the K responses of the group; causal within the response).

No attention is spent between sibling responses (a dense mask over the packed row would spend
~2.8x the attention FLOPs of the 64 + 4 x 64 benchmark group on masked entries), and GQA heads
are folded into the query rows (``(B, KV, G·P, D)``) so keys and values are never repeated.
Padding queries attend to themselves only (no all-masked rows, so no NaN); padding keys are
masked for every real query.

The function is registered with transformers' ``AttentionInterface`` under :data:`NAME`; it
delegates to ``sdpa`` unchanged whenever a call carries no :class:`GroupLayout` (generation,
evaluation by other code), and its mask function is ``sdpa``'s, so a model routed through it
behaves exactly as with ``sdpa`` outside :func:`grouppref.train.logps.group_logps`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

Tensor = torch.Tensor

NAME = "grouppref_grouped_sdpa"
LAYOUT_KWARG = "grouppref_layout"


@dataclass
class GroupLayout:
    """The packed rows of one call and the masks derived from them (built once, used by every layer).

    ``prompt_real`` (B, P) and ``resp_real`` (B, K, T) mark real input tokens; ``prompt_pos``
    (B, P) and ``resp_pos`` (B, K, T) are their position ids.
    """

    prompt_real: Tensor
    resp_real: Tensor
    prompt_pos: Tensor
    resp_pos: Tensor
    calls: int = 0
    unsupported: str | None = None
    _masks: dict[tuple[int, int | None], tuple[Tensor, Tensor]] = field(default_factory=dict)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(B, K, P, T)."""
        b, k, t = self.resp_real.shape
        return b, k, self.prompt_real.shape[1], t

    def masks(self, g: int, window: int | None) -> tuple[Tensor, Tensor]:
        """Boolean masks (True = attend) with each query row repeated ``g`` times (GQA folding).

        Returns:
            tuple[Tensor, Tensor]: prompts (B, 1, G·P, P) and responses (B·K, 1, G·T, P + T).
        """
        if (g, window) not in self._masks:
            self._masks[(g, window)] = self._build(g, window)
        return self._masks[(g, window)]

    def _build(self, g: int, window: int | None) -> tuple[Tensor, Tensor]:
        b, k, p, t = self.shape
        dev = self.prompt_real.device
        eye_p = torch.eye(p, dtype=torch.bool, device=dev)
        causal_p = torch.ones(p, p, dtype=torch.bool, device=dev).tril()
        prompt = causal_p & self.prompt_real[:, None, :]  # (B, P, P)
        own = torch.ones(t, t, dtype=torch.bool, device=dev).tril() & self.resp_real[:, :, None, :]
        to_prompt = self.prompt_real[:, None, None, :].expand(b, k, t, p)  # (B, K, T, P)
        if window is not None:  # sliding-window layers: keys closer than `window` positions
            prompt = prompt & (self.prompt_pos[:, :, None] - self.prompt_pos[:, None, :] < window)
            to_prompt = to_prompt & (self.resp_pos[..., None] - self.prompt_pos[:, None, None, :] < window)
            own = own & (self.resp_pos[..., None] - self.resp_pos[..., None, :] < window)
        prompt = prompt | eye_p  # padding queries see themselves only
        own = own | torch.eye(t, dtype=torch.bool, device=dev)
        resp = torch.cat([to_prompt, own], dim=-1).reshape(b * k, 1, t, p + t)
        return prompt[:, None].repeat(1, 1, g, 1), resp.repeat(1, 1, g, 1)


def _fold(x: Tensor, kv: int) -> Tensor:
    """(R, H, L, D) -> (R, KV, G·L, D): query head h = j·G + r reads key/value head j."""
    r, h, n, d = x.shape
    return x.reshape(r, kv, (h // kv) * n, d)


def _unsupported(module: Any, kwargs: dict[str, Any]) -> str | None:
    if kwargs.get("softcap") is not None:
        return "attention logit soft-capping"
    if kwargs.get("s_aux") is not None or getattr(module, "sinks", None) is not None:
        return "attention sinks"
    if kwargs.get("position_bias") is not None:
        return "an attention position bias"
    return None


def grouped_attention(module: Any, query: Tensor, key: Tensor, value: Tensor,
                      attention_mask: Tensor | None, dropout: float = 0.0,
                      scaling: float | None = None, **kwargs: Any) -> tuple[Tensor, None]:
    """transformers attention function: grouped attention when the call carries a layout.

    Args:
        module (Any): the attention module (``is_causal``, optional ``sliding_window``).
        query (Tensor): (B, H, L, D). key, value (Tensor): (B, KV, L, D).
        attention_mask (Tensor | None): ignored with a layout (the layout's masks are used).
        dropout (float): attention dropout probability.
        scaling (float | None): score scale (default 1/sqrt(D)).

    Returns:
        tuple[Tensor, None]: the output (B, L, H, D), like transformers' ``sdpa``.
    """
    layout: GroupLayout | None = kwargs.pop(LAYOUT_KWARG, None)
    if layout is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    layout.calls += 1
    layout.unsupported = layout.unsupported or _unsupported(module, kwargs)
    window = kwargs.get("sliding_window", getattr(module, "sliding_window", None))
    b, h, _, d = query.shape
    kv = key.shape[1]
    _, k, p, t = layout.shape
    prompt_mask, resp_mask = layout.masks(h // kv, window)
    sdpa = dict(dropout_p=dropout, scale=scaling)
    out = F.scaled_dot_product_attention(_fold(query[:, :, :p], kv), key[:, :, :p],
                                         value[:, :, :p], attn_mask=prompt_mask, **sdpa)
    out = out.reshape(b, h, p, d)
    if t:
        def per_response(x: Tensor) -> Tensor:  # (B, X, K·T, D) -> (B·K, X, T, D)
            return x[:, :, p:].reshape(b, x.shape[1], k, t, d).transpose(1, 2).reshape(b * k, -1, t, d)

        def with_prompt(x: Tensor) -> Tensor:  # (B, KV, L, D) -> (B·K, KV, P + T, D)
            shared = x[:, None, :, :p].expand(b, k, kv, p, d).reshape(b * k, kv, p, d)
            return torch.cat([shared, per_response(x)], dim=2)

        resp = F.scaled_dot_product_attention(_fold(per_response(query), kv), with_prompt(key),
                                              with_prompt(value), attn_mask=resp_mask, **sdpa)
        resp = resp.reshape(b, k, h, t, d).transpose(1, 2).reshape(b, h, k * t, d)
        out = torch.cat([out, resp], dim=2)
    return out.transpose(1, 2).contiguous(), None


def install(model: Any) -> bool:
    """Route ``model``'s attention through :func:`grouped_attention` (idempotent).

    Only models on ``sdpa`` are switched (the function delegates to ``sdpa`` for every call
    without a layout); other implementations (eager, flash-attention, flex) are left as they
    are.

    Returns:
        bool: whether the model now uses :data:`NAME`.
    """
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    config = getattr(model, "config", None)
    current = getattr(config, "_attn_implementation", None)
    if current == NAME:
        return True
    if current != "sdpa" or not hasattr(model, "set_attn_implementation"):
        return False
    AttentionInterface.register(NAME, grouped_attention)
    AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    model.set_attn_implementation(NAME)
    return model.config._attn_implementation == NAME
