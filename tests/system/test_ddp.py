"""DDP on CPU: ``torchrun --nproc_per_node 2`` (gloo) runs the real trainer for a few steps and
the two replicas must end with identical weights (docs/train.md, "Scaling out": ``accelerate launch --cpu
--num_processes 2`` started only one process here, so the test uses torchrun)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch

from tests.support.ddp import torchrun_cpu

SCRIPT = textwrap.dedent("""
    import os, sys, torch
    from grouppref.train.settings.policy import TrainConfig
    from grouppref.train.settings.shared import DataConfig
    from grouppref.train.policy.trainer import train
    from tests.support.training import synthetic_groups

    model, out = sys.argv[1], sys.argv[2]
    config = TrainConfig(model=model, beta=0.5, lr=5e-3, lr_scheduler="constant", batch_size=2,
                         max_steps=3, logging_steps=1, data=DataConfig(chat_template=False))
    result = train(config, synthetic_groups(12, 4, seed=7), out)
    params = torch.cat([p.detach().flatten() for p in result.model.parameters()])
    torch.save(params, os.path.join(out, f"replica-{os.environ['RANK']}.pt"))
""")


@pytest.mark.slow
def test_two_cpu_processes_keep_replicas_equal(tiny_lm_dir: Path, tmp_path: Path) -> None:
    out = torchrun_cpu(tmp_path, SCRIPT, tiny_lm_dir)
    r0, r1 = torch.load(out / "replica-0.pt"), torch.load(out / "replica-1.pt")
    initial = torch.cat([p.flatten() for p in _load(tiny_lm_dir).parameters()])
    assert torch.equal(r0, r1)  # gradients were all-reduced: the replicas agree bit for bit
    # 3 Adam steps move weights by ~lr = 1e-3 >> allclose's 1e-8 + 1e-5 |x|
    assert not torch.allclose(r0, initial)  # and they trained
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 3
    assert metrics["groups"]["train"] == 12 and metrics["groups"]["held_out"] == 4
    assert metrics["eval"]["groups"] == 4  # the held-out split was scored across both ranks
    # Both ranks scored half of the reference pass; the main process merged the parts.
    (entry,) = (out / "reference").iterdir()
    assert len((entry / "ref_logps.jsonl").read_text().splitlines()) == 16
    assert not list(entry.glob("part-*"))
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if x["split"] == "train"] == [1, 2, 3]


def _load(path: Path):
    from grouppref.models.loading import load_causal_lm

    return load_causal_lm(str(path))
