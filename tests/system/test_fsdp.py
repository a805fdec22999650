"""FSDP2 on CPU: two processes (torchrun, gloo) shard the tiny model with ``fully_shard`` and run
the trainer's step; the losses and the saved model equal one process on the same global batch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.support import fsdp_train
from tests.support.tolerances import MODEL_ATOL, MODEL_RTOL, tol_after_sgd_steps
from tests.support.torchrun import torchrun

# STEPS SGD steps at lr 0.5 (tests/support/fsdp_train.py) on gradients summed over <= 96 tokens a
# step (4 groups of <= 6 prompt + 3 x 6 response tokens) in two orders; rtol: weights ~1 (norms)
FSDP_ATOL = tol_after_sgd_steps(fsdp_train.STEPS, 0.5, terms=96)


@pytest.mark.slow
def test_fsdp_two_processes_equal_one(tiny_lm_dir: Path, tmp_path: Path) -> None:
    from transformers import LlamaForCausalLM

    single = fsdp_train.train(str(tiny_lm_dir), str(tmp_path / "single"))
    torchrun(Path(fsdp_train.__file__), [str(tiny_lm_dir), str(tmp_path / "fsdp")], nproc=2)
    sharded = json.loads((tmp_path / "fsdp" / "losses.json").read_text())
    assert len(sharded) == fsdp_train.STEPS
    # a loss (~1) of the same weights summed over 2 shards vs 1: MODEL_RTOL's reduction-order
    # error, after up to STEPS-1 SGD steps of FSDP_ATOL drift (tests/support/tolerances.py)
    torch.testing.assert_close(torch.tensor(sharded), torch.tensor(single), atol=MODEL_ATOL,
                               rtol=MODEL_RTOL)
    assert single[-1] < single[0]  # it trained

    def load(path: Path) -> dict[str, torch.Tensor]:
        return LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()

    a, b, initial = load(tmp_path / "fsdp"), load(tmp_path / "single"), load(tiny_lm_dir)
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=FSDP_ATOL, rtol=MODEL_RTOL, msg=name)
    assert any(not torch.equal(b[n], initial[n]) for n in b)  # the weights moved
