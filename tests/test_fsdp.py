"""FSDP2 on CPU: two processes (torchrun, gloo) shard the tiny model with ``fully_shard`` and run
the trainer's step; the losses and the saved model equal one process on the same global batch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.support import fsdp_train
from tests.support.torchrun import torchrun


@pytest.mark.slow
def test_fsdp_two_processes_equal_one(tiny_lm_dir: Path, tmp_path: Path) -> None:
    from transformers import LlamaForCausalLM

    single = fsdp_train.train(str(tiny_lm_dir), str(tmp_path / "single"))
    torchrun(Path(fsdp_train.__file__), [str(tiny_lm_dir), str(tmp_path / "fsdp")], nproc=2)
    sharded = json.loads((tmp_path / "fsdp" / "losses.json").read_text())
    assert len(sharded) == fsdp_train.STEPS
    torch.testing.assert_close(torch.tensor(sharded), torch.tensor(single), atol=1e-5, rtol=1e-5)
    assert single[-1] < single[0]  # it trained

    def load(path: Path) -> dict[str, torch.Tensor]:
        return LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()

    a, b, initial = load(tmp_path / "fsdp"), load(tmp_path / "single"), load(tiny_lm_dir)
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-5, rtol=1e-4, msg=name)
    assert any(not torch.equal(b[n], initial[n]) for n in b)  # the weights moved
