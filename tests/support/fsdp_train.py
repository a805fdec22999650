"""The training run tests/system/test_fsdp.py compares: the trainer's step (``policy.step.run_steps``) on a
tiny model, in one process or sharded with FSDP2 (``fully_shard``, gloo) under torchrun.

Every step takes a global batch of ``GLOBAL`` groups; under FSDP rank r trains on its
``GLOBAL / world`` slice and FSDP averages the gradients, so both runs minimise the same mean.
Run as a script (torchrun): ``fsdp_train.py MODEL_DIR OUT_DIR``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch

GLOBAL, STEPS, K = 4, 3, 3


def groups():
    """GLOBAL·STEPS groups with prompts and responses of different lengths (padding in play)."""
    from grouppref.train.tensors.batch import TokenizedGroup

    g = torch.Generator().manual_seed(11)
    out = []
    for n in range(GLOBAL * STEPS):
        def ids(length: int) -> list[int]:
            return torch.randint(3, 5000, (length,), generator=g).tolist()

        p = [[0.5 if i == j else float(i < j) for j in range(K)] for i in range(K)]
        w = [[0.0 if i == j else 1.0 for j in range(K)] for i in range(K)]
        out.append(TokenizedGroup(group_id=f"g{n}", prompt_ids=ids(2 + n % 5),
                                  cand_ids=[ids(1 + (n + i) % 6) for i in range(K)], p_ij=p, w_ij=w,
                                  order=list(range(K)), ref_logps=None, behavior_logps=[None] * K,
                                  split="train"))
    return out


def train(model_dir: str, out_dir: str, rank: int = 0, world: int = 1) -> list[float]:
    """Train STEPS steps; save the full model to ``out_dir``; return the global loss per step."""
    import dataclasses

    from transformers import LlamaForCausalLM

    from grouppref.train.policy.step import Objective, run_steps
    from grouppref.train.tensors.batch import collate_groups
    from grouppref.train.tensors.logps import group_logps

    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    data = groups()
    with torch.no_grad():  # reference log-probs from the initial model, the full batch at once
        ref = group_logps(model, collate_groups(data, 0)).tolist()
    data = [dataclasses.replace(grp, ref_logps=r[:K]) for grp, r in zip(data, ref, strict=True)]
    local = GLOBAL // world
    batches = [collate_groups(data[s * GLOBAL + rank * local: s * GLOBAL + (rank + 1) * local], 0)
               for s in range(STEPS)]
    shard(model, world)
    model.train()
    # SGD, not AdamW: Adam's first steps move every weight by ~lr·sign(grad), so float noise in a
    # near-zero gradient would flip a weight by 2·lr; SGD keeps the comparison about gradients.
    optim = torch.optim.SGD(model.parameters(), lr=0.5)
    losses: list[float] = []

    def record(step, out, batch):
        loss = out.loss.detach().mean()
        if world > 1:
            torch.distributed.all_reduce(loss)
            loss /= world
        losses.append(loss.item())

    run_steps(model, optim, batches, Objective(beta=0.5), after_step=record)
    _save(model, model_dir, out_dir, rank, world)
    return losses


def _save(model, model_dir: str, out_dir: str, rank: int, world: int) -> None:
    from transformers import LlamaForCausalLM

    state = full_state(model, world)
    if rank == 0:
        full = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        full.load_state_dict(state)
        full.save_pretrained(out_dir)


def shard(model, world: int) -> None:
    """FSDP2 over ``world`` CPU processes (nothing alone): each decoder layer, then the root
    (embeddings, final norm and the head: the LM head or a reward model's score head)."""
    if world == 1:
        return
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def full_state(model, world: int) -> dict[str, torch.Tensor]:
    """The model's full state dict on every rank (the shards gathered under FSDP)."""
    if world == 1:
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                cpu_offload=True))


def launch(run: Callable[[str, str, int, int], list[float]]) -> None:
    """The torchrun entry point of a harness: ``run(MODEL_DIR, OUT_DIR, rank, world)`` in a gloo
    process group (argv: ``MODEL_DIR OUT_DIR``); rank 0 writes its losses to OUT/losses.json."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model_dir, out_dir = sys.argv[1], sys.argv[2]
    torch.distributed.init_process_group("gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    losses = run(model_dir, out_dir, rank, world)
    if rank == 0:
        Path(out_dir, "losses.json").write_text(json.dumps(losses))
    # every rank's collectives (FSDP's async all-gathers and reduce-scatters included) finish
    # before any rank leaves. Then each rank leaves without tearing gloo down: two CI runs
    # (2026-12-03, 2026-12-05) aborted in rank 1 after the last collective, when rank 0 had
    # saved the model ("terminate called without an active exception", SIGABRT), the second
    # with this barrier in place; the outputs are written by then, and an exit without
    # finalisation runs no destructor of gloo's threads.
    torch.distributed.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    launch(train)
