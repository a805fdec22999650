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
delegates to ``sdpa`` unchanged whenever a call carries no packed masks (generation,
evaluation by other code), and its mask function is ``sdpa``'s, so a model routed through it
behaves exactly as with ``sdpa`` outside :func:`grouppref.train.tensors.logps.group_logps`.

On the packed path the call carries only tensors (the masks, keyed by GQA factor and sliding
window), so a decoder layer compiled with ``torch.compile`` traces it in one graph; the check that
every layer ran it (a :class:`Probe` counting calls) rides along only on a model's first packed
pass, which runs eagerly (:mod:`grouppref.train.tensors.logps`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

Tensor = torch.Tensor

NAME = "grouppref_grouped_sdpa"
MASKS_KWARG = "grouppref_masks"
PROBE_KWARG = "grouppref_probe"

MaskKey = tuple[int, "int | None"]  # (G query heads per key/value head, sliding window)


@dataclass
class GroupLayout:
    """The packed rows of one call and the masks derived from them (built once, used by every layer).

    ``prompt_real`` (B, P) and ``resp_real`` (B, K, T) mark real input tokens; ``prompt_pos``
    (B, P) and ``resp_pos`` (B, K, T) are their position ids. ``layout[(g, window)]`` builds
    (once) the masks of the layers with ``g`` query heads per key/value head and that sliding
    window; :meth:`tensors` gives the masks of known keys as a plain dict (tensors only, what a
    ``torch.compile``-d layer can take without a graph break).
    """

    prompt_real: Tensor
    resp_real: Tensor
    prompt_pos: Tensor
    resp_pos: Tensor
    _masks: dict[MaskKey, tuple[Tensor, Tensor]] = field(default_factory=dict)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(B, K, P, T)."""
        b, k, t = self.resp_real.shape
        return b, k, self.prompt_real.shape[1], t

    def __getitem__(self, key: MaskKey) -> tuple[Tensor, Tensor]:
        """Boolean masks (True = attend) with each query row repeated ``g`` times (GQA folding).

        Returns:
            tuple[Tensor, Tensor]: prompts (B, 1, G·P, P) and responses (B·K, 1, G·T, P + T).
        """
        if key not in self._masks:
            self._masks[key] = self._build(*key)
        return self._masks[key]

    def tensors(self, keys: frozenset[MaskKey]) -> dict[MaskKey, tuple[Tensor, Tensor]]:
        """The masks of ``keys`` (as :meth:`__getitem__`), built now, in a plain dict."""
        return {key: self[key] for key in keys}

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


@dataclass
class Probe:
    """What the attention calls of one checked (eager) pass saw: how many ran the grouped
    attention, with which mask keys, and the first feature it does not implement."""

    calls: int = 0
    keys: set[MaskKey] = field(default_factory=set)
    unsupported: str | None = None

    def reset(self) -> None:
        self.calls, self.unsupported = 0, None
        self.keys.clear()


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
    """transformers attention function: grouped attention when the call carries packed masks.

    Tensor-only on the packed path when no :class:`Probe` rides along (so a compiled decoder
    layer traces it without a graph break): the masks come as ``{(g, window): (prompt, resp)}``
    under :data:`MASKS_KWARG` (a :class:`GroupLayout` or a plain dict), and B, K, P, T are read
    from the tensor shapes.

    Args:
        module (Any): the attention module (``is_causal``, optional ``sliding_window``).
        query (Tensor): (B, H, L, D). key, value (Tensor): (B, KV, L, D).
        attention_mask (Tensor | None): ignored with packed masks (those are used instead).
        dropout (float): attention dropout probability.
        scaling (float | None): score scale (default 1/sqrt(D)).

    Returns:
        tuple[Tensor, None]: the output (B, L, H, D), like transformers' ``sdpa``.
    """
    masks = kwargs.pop(MASKS_KWARG, None)
    probe: Probe | None = kwargs.pop(PROBE_KWARG, None)
    if masks is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    b, h, _, d = query.shape
    kv = key.shape[1]
    mask_key = (h // kv, kwargs.get("sliding_window", getattr(module, "sliding_window", None)))
    if probe is not None:
        probe.calls += 1
        probe.keys.add(mask_key)
        probe.unsupported = probe.unsupported or _unsupported(module, kwargs)
    prompt_mask, resp_mask = masks[mask_key]
    p = prompt_mask.shape[-1]
    k, t = resp_mask.shape[0] // b, resp_mask.shape[-1] - p
    q_prompt, q_resp = query.split([p, k * t], dim=2)  # split, not slices: its backward is one
    k_prompt, k_resp = key.split([p, k * t], dim=2)  # cat (slicing's zero-fills a full-size
    v_prompt, v_resp = value.split([p, k * t], dim=2)  # gradient per slice, then adds them)
    # Contiguous keys/values: sdpa saves its inputs for backward, and a compiled layer's backward
    # with symbolic sizes asserted the strides of the first shapes on these split views.
    out = F.scaled_dot_product_attention(_fold(q_prompt, kv), k_prompt.contiguous(),
                                         v_prompt.contiguous(), attn_mask=prompt_mask,
                                         dropout_p=dropout, scale=scaling)
    out = out.reshape(b, h, p, d)
    if t:
        def per_response(x: Tensor) -> Tensor:  # (B, X, K·T, D) -> (B·K, X, T, D)
            return x.reshape(b, x.shape[1], k, t, d).transpose(1, 2).reshape(b * k, -1, t, d)

        def with_prompt(shared: Tensor, own: Tensor) -> Tensor:  # -> (B·K, KV, P + T, D)
            shared = shared[:, None].expand(b, k, kv, p, d).reshape(b * k, kv, p, d)
            return torch.cat([shared, per_response(own)], dim=2)

        resp = F.scaled_dot_product_attention(
            _fold(per_response(q_resp), kv), with_prompt(k_prompt, k_resp),
            with_prompt(v_prompt, v_resp), attn_mask=resp_mask, dropout_p=dropout,
            scale=scaling)
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


def compile_layers(model: Any, **options: Any) -> int:
    """``torch.compile`` each decoder layer of ``model`` in place (``module.compile(**options)``).

    Decoder layers are the modules whose class transformers names in ``_no_split_modules``
    (``LlamaDecoderLayer``, ...). Identical layers share one compiled graph (dynamo inlines
    ``nn.Module`` calls and lifts their parameters to graph inputs), so compiling 30 layers costs
    one compile of a layer's forward and one of its backward. The embedding, the final norm, the
    LM head and the log-prob code stay eager. The packed pass hands each layer tensors only.

    Under peft the layers are found in the wrapped model (the adapters are inside them and are
    compiled with them). A layer that keeps a dropout (LoRA's ``lora_dropout``: the model's own
    dropout is set to 0 by ``disable_dropout``) compiles with inductor's ``fallback_random``, so
    its masks come from torch's generator exactly as in eager mode: the same seed gives the same
    masks compiled or not, and a resumed run draws what an uninterrupted one would.

    Returns:
        int: how many layers were compiled (0: no decoder layer found, nothing changed).
    """
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    for layer in layers:
        layer.compile(**_layer_options(layer, options))
    return len(layers)


def _layer_options(layer: Any, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` plus inductor's ``fallback_random`` when ``layer`` holds a live dropout."""
    if not any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in layer.modules()):
        return options
    inductor = {**options.get("options", {}), "fallback_random": True}
    return {**options, "options": inductor}
