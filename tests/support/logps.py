"""Random token groups and a value-and-gradients probe, for the log-prob and compile tests."""

from __future__ import annotations

import torch

from grouppref.train.tensors.batch import TokenizedGroup

PAD = 0


def _groups() -> list[TokenizedGroup]:
    """Three groups: prompts of 5, 11 and 1 tokens; K = 3, 2, 4; responses of 1 to 9 tokens."""
    return make_groups([("a", 5, [3, 9, 1]), ("b", 11, [4, 2]), ("c", 1, [2, 5, 7, 6])], seed=7)


def make_groups(spec: list[tuple[str, int, list[int]]], seed: int) -> list[TokenizedGroup]:
    """Groups of random token ids: (group id, prompt length, response lengths) each."""
    g = torch.Generator().manual_seed(seed)

    def ids(n: int) -> list[int]:
        return torch.randint(3, 5000, (n,), generator=g).tolist()

    def group(gid: str, p: int, lens: list[int]) -> TokenizedGroup:
        k = len(lens)
        return TokenizedGroup(group_id=gid, prompt_ids=ids(p), cand_ids=[ids(n) for n in lens],
                              p_ij=[[0.5] * k for _ in range(k)], w_ij=[[0.0] * k for _ in range(k)],
                              order=list(range(k)), ref_logps=None, behavior_logps=[None] * k,
                              split=None)

    return [group(*row) for row in spec]


def _value_and_grads(model, fn) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad()
    logps = fn()
    # A weighted sum so every candidate's gradient matters with a different weight.
    weights = torch.arange(1, logps.numel() + 1, dtype=logps.dtype).reshape(logps.shape) / logps.numel()
    (logps * weights).sum().backward()
    grads = [p.grad.detach().clone() for p in model.parameters()]
    return logps.detach(), grads
