"""The human-to-automatic curriculum (``train --mix``): schedule parsing, the sampler's realised
shares (linear and by-steps, start / middle / end), seeds, DDP sharding through accelerate's
own ``BatchSamplerShard``, the consensus kinds the aggregate stage records, the trainer's
logged mix on a tiny model, and the one-line errors of the CLI."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from grouppref.commands import train as train_commands
from grouppref.errors import ConfigError
from grouppref.pipeline.aggregate.config import AggregateConfig
from grouppref.pipeline.aggregate.stage import run_aggregate
from grouppref.runs.stage import StageContext
from grouppref.runs.store import RunStore
from grouppref.schemas import AnnotatedGroup, Annotator, Ranking
from grouppref.train.data.tokenize import consensus_kinds
from grouppref.train.policy.mix_sampler import MixSampler, check_sources
from grouppref.train.policy.trainer import train
from grouppref.train.settings.mix import MixConfig
from grouppref.train.settings.policy import TrainConfig
from tests.support.factories import make_group, make_ranking
from tests.support.simulate import write_stage
from tests.support.training import PLAIN, _write_validate, mixed_groups, synthetic_group

LINEAR = "human=0.8,auto=0.2 -> human=0,auto=1"
STEPS = "human=1,auto=0 @0; human=0.5,auto=0.5 @10; human=0,auto=1 @20"


def _sampler(schedule: str, n_human: int = 30, n_auto: int = 90, **kw: int) -> MixSampler:
    sources = ["human"] * n_human + ["auto"] * n_auto
    random.Random(1).shuffle(sources)
    args = {"batch_size": 8, "total_steps": 40, "processes": 1, "grad_accum": 1, "seed": 0} | kw
    return MixSampler(MixConfig(schedule=schedule), sources, **args)


def _human_share(sampler: MixSampler, batches: range) -> float:
    picked = [i for g in batches for i in sampler.batch(g)]
    return sum(sampler.sources[i] == "human" for i in picked) / len(picked)


def test_parse_both_forms_and_interpolate() -> None:
    linear = MixConfig.model_validate(LINEAR)  # a bare string is the schedule
    assert [p.shares for p in linear.schedule] == [{"human": 0.8, "auto": 0.2},
                                                   {"human": 0.0, "auto": 1.0}]
    # linear interpolation of given shares: float64, a few operations: approx's default rel 1e-6 is ~1e9
    # eps64
    assert linear.shares_at(0, 41)["human"] == pytest.approx(0.8)
    assert linear.shares_at(20, 41)["human"] == pytest.approx(0.4)
    assert linear.shares_at(40, 41)["human"] == pytest.approx(0.0)
    steps = MixConfig(schedule=STEPS)
    assert [p.step for p in steps.schedule] == [0, 10, 20]
    # float64, a few operations: approx's default rel 1e-6 is ~1e9 eps64
    assert steps.shares_at(5, 1000) == pytest.approx({"human": 0.75, "auto": 0.25})
    assert steps.shares_at(500, 1000) == {"human": 0.0, "auto": 1.0}  # held after the last point
    assert MixConfig(schedule="auto=1").shares_at(7, 9) == {"human": 0.0, "auto": 1.0}
    assert steps.describe() == "human=1,auto=0 @0; human=0.5,auto=0.5 @10; human=0,auto=1 @20"


@pytest.mark.parametrize("schedule, error", [
    ("human=0.8,auto=0.3 -> auto=1", "sum to 1.1, not 1"),
    ("human=0.5,robot=0.5", "unknown source 'robot'"),
    ("human=1 @0; auto=1 -> human=1", "mixes the linear form"),
    ("human=1 @3; auto=1 @9", "start at @0"),
    ("human=1 @0; auto=1 @0", "must increase"),
    ("human=lots", "is not a number"),
    ("human=1 @0; auto=1", "gives every point its step"),
])
def test_bad_schedules_name_the_fix(schedule: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        MixConfig(schedule=schedule)


@pytest.mark.parametrize("schedule", [LINEAR, STEPS])
def test_realised_shares_follow_the_schedule(schedule: str) -> None:
    sampler = _sampler(schedule)
    for step in (0, 15, 39):  # start, middle, end: a window of 1 update = 1 micro-batch here
        target = sampler.target(step)["human"]
        assert abs(_human_share(sampler, range(step, step + 1)) - target) <= 1 / 8 + 1e-9
    for lo, hi in ((0, 5), (15, 25), (30, 40)):  # over windows: within one group of the target
        target = sum(sampler.target(s)["human"] for s in range(lo, hi)) / (hi - lo)
        assert abs(_human_share(sampler, range(lo, hi)) - target) <= 1 / (8 * (hi - lo)) + 1e-9
    assert sampler.human_before(40) == round(8 * sum(sampler.target(s)["human"]
                                                     for s in range(40)))


def test_each_source_is_read_in_passes_without_repeats() -> None:
    sampler = _sampler("human=0.5,auto=0.5", n_human=12, n_auto=12)
    humans = [i for g in range(3) for i in sampler.batch(g) if sampler.sources[i] == "human"]
    assert len(humans) == 12 and sorted(humans) == sorted(sampler.members["human"])
    assert all(len(b) == 8 for b in (sampler.batch(g) for g in range(40)))


def test_seeded_and_pure() -> None:
    a, b, c = _sampler(LINEAR), _sampler(LINEAR), _sampler(LINEAR, seed=1)
    first = [a.batch(g) for g in range(40)]
    assert first == [b.batch(g) for g in range(40)]  # same seed, same batches
    assert first != [c.batch(g) for g in range(40)]  # another seed, other groups
    fresh = _sampler(LINEAR)  # a resumed run asks for late batches first: same answer
    assert [fresh.batch(g) for g in range(39, -1, -1)] == first[::-1]
    epochs = _sampler(LINEAR)
    assert len(epochs) == 15  # ceil(120 / 8) updates hold the 120 groups once
    epochs.set_epoch(1)
    assert list(epochs) == [a.batch(g) for g in range(15, 30)]


def test_ddp_shards_split_each_update_between_processes() -> None:
    from accelerate.data_loader import BatchSamplerShard

    sampler = _sampler(LINEAR, processes=2, grad_accum=2, total_steps=10)
    assert len(sampler) % 4 == 0  # whole updates of 2 processes x 2 micro-batches
    shards = [list(BatchSamplerShard(sampler, num_processes=2, process_index=p)) for p in (0, 1)]
    assert len(shards[0]) == len(shards[1]) == len(sampler) // 2
    assert [x for pair in zip(*shards, strict=True) for x in pair] == list(sampler)
    for step in range(len(sampler) // 4):  # both ranks of one update see its scheduled mix
        picked = [i for p in (0, 1) for i in shards[p][2 * step] + shards[p][2 * step + 1]]
        share = sum(sampler.sources[i] == "human" for i in picked) / len(picked)
        assert abs(share - sampler.target(step)["human"]) <= 1 / 32 + 1e-9


def test_no_group_of_a_drawn_source_is_one_error() -> None:
    with pytest.raises(ConfigError, match="none of the 3 training groups is human-labelled"):
        check_sources(MixConfig(schedule=LINEAR), ["auto"] * 3)
    check_sources(MixConfig(schedule="auto=1"), ["auto"] * 3)  # no human share: fine
    with pytest.raises(ConfigError, match="auto share to 0"):
        check_sources(MixConfig(schedule="human=1 -> human=0.5,auto=0.5"), ["human"])


def test_aggregate_records_the_kinds_its_consensus_used(tmp_path: Path) -> None:
    g = make_group(k=3)
    judge = Ranking(annotator=Annotator(id="judge", kind="llm_judge"), group_id=g.group_id,
                    tiers=[[c] for c in g.candidate_ids()])
    rows = [AnnotatedGroup(**g.model_dump(), rankings=[make_ranking(g, [0, 1, 2], "a"), judge])]
    store = RunStore(tmp_path / "run")
    write_stage(store, "label", rows)
    (row,) = run_aggregate(store, AggregateConfig()).records()
    assert row.consensus_kinds == ["human", "llm_judge"]
    (row,) = run_aggregate(store, AggregateConfig(kind_weights={"human": 0.0}),
                           StageContext(force=True)).records()
    assert row.consensus_kinds == ["llm_judge"]  # the human ranking was left out of the fit
    assert MixConfig(schedule="auto=1").source_of(consensus_kinds(row)) == "auto"
    old = row.model_copy(update={"consensus_kinds": None})  # aggregated before the field
    assert consensus_kinds(old) == ("human", "llm_judge")


def test_trainer_logs_the_realised_mix(tiny_lm_dir: Path, tmp_path: Path) -> None:
    config = TrainConfig(model=str(tiny_lm_dir), beta=0.5, lr=5e-3, batch_size=4, max_steps=6,
                         logging_steps=2, grad_accum=2, data=PLAIN,
                         mix={"schedule": "human=1,auto=0 -> human=0,auto=1"})
    result = train(config, mixed_groups(8, 24, 4), tmp_path / "out")
    lines = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    train_lines = [x for x in lines if x["split"] == "train"]
    assert [x["step"] for x in train_lines] == [2, 4, 6]
    # updates 0..5 have human shares 1, .8, .6, .4, .2, 0: windows of two updates
    expected = [0.9, 0.5, 0.1]
    for line, share in zip(train_lines, expected, strict=True):
        # the schedule's float64 share: float64, a few operations: approx's default rel 1e-6 is ~1e9
        # eps64
        assert line["mix_target_human"] == pytest.approx(share)
        assert line["mix_human"] == pytest.approx(share, abs=1 / 16 + 1e-9)  # 16 groups/window
        # two counts over one total: float64, a few operations: approx's default rel 1e-6 is ~1e9 eps64
        assert line["mix_human"] + line["mix_auto"] == pytest.approx(1.0)
    assert result.stats.train["mix_human"] == train_lines[-1]["mix_human"]


def test_cli_mix_errors_are_one_line(tiny_lm_dir: Path, tmp_path: Path) -> None:
    rng = random.Random(0)
    store = _write_validate(tmp_path / "run", [synthetic_group(i, "train", rng) for i in range(4)])
    app = typer.Typer()
    train_commands.register(app)
    base = ["train", str(store.root), "--model", str(tiny_lm_dir), "--no-chat-template"]
    for mix, message in ((LINEAR, "none of the 4 training groups is human-labelled"),
                         ("human=0.7,auto=0.2", "sum to 0.9, not 1"),
                         ("human=0.5,bots=0.5", "unknown source 'bots'")):
        result = CliRunner().invoke(app, [*base, "--mix", mix])
        assert isinstance(result.exception, ConfigError), result.output
        assert message in str(result.exception) and "\n" not in str(result.exception)
    # rule rankings count as human once the kind is named human
    ok = CliRunner().invoke(app, [*base, "--mix", "human=1", "--mix-human-kinds", "rule",
                                  "--max-steps", "1", "--batch-size", "2"])
    assert ok.exit_code == 0, ok.output
    line = json.loads((store.stage_dir("train") / "model" / "metrics.jsonl").read_text()
                      .splitlines()[-1])
    assert line["mix_human"] == 1.0
    assert store.manifest("train").config["train"]["mix"]["human_kinds"] == ["rule"]


@pytest.mark.slow
def test_resume_draws_the_same_batches(tiny_lm_dir: Path, tmp_path: Path) -> None:
    """5 updates straight == 2, checkpoint, resume to 5 (crossing an epoch), with a by-steps
    schedule (it does not depend on the run's length, which the two runs set differently)."""
    import torch

    from tests.support.training import _final_params

    groups = mixed_groups(8, 16, 0)  # 24 groups, batch 4 x accumulation 2: 3 updates / epoch
    base = dict(model=str(tiny_lm_dir), lr=1e-3, lr_scheduler="constant", batch_size=4,
                grad_accum=2, logging_steps=1, data=PLAIN,
                mix={"schedule": "human=1 @0; human=0.25,auto=0.75 @3"})
    straight = train(TrainConfig(**base, max_steps=5), groups, tmp_path / "a")
    train(TrainConfig(**base, max_steps=2, save_steps=2), groups, tmp_path / "b")
    resumed = train(TrainConfig(**base, max_steps=5), groups, tmp_path / "b", resume=True)
    # exact: the resume restores weights, Adam's moments, the mix sampler and the RNG bit for bit
    # and replays the same kernels on the same batches (one thread, one machine)
    assert torch.equal(_final_params(straight.model), _final_params(resumed.model))

    def shares(out: Path) -> list[float]:
        lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        return [x["mix_human"] for x in lines if x["split"] == "train"]

    assert shares(tmp_path / "a") == shares(tmp_path / "b") == [1.0, 0.75, 0.5, 0.25, 0.25]


DDP_SCRIPT = """
import os, sys, torch
from grouppref.train.settings.shared import DataConfig
from grouppref.train.settings.policy import TrainConfig
from grouppref.train.policy.trainer import train
from tests.support.training import mixed_groups

model, out = sys.argv[1], sys.argv[2]
config = TrainConfig(model=model, beta=0.5, lr=5e-3, lr_scheduler="constant", batch_size=2,
                     max_steps=4, logging_steps=1, data=DataConfig(chat_template=False),
                     mix={"schedule": "human=1 @0; auto=1 @2"})
result = train(config, mixed_groups(6, 10, 0), out)
params = torch.cat([p.detach().flatten() for p in result.model.parameters()])
torch.save(params, os.path.join(out, f"replica-{os.environ['RANK']}.pt"))
"""


@pytest.mark.slow
def test_ddp_two_processes_follow_the_schedule(tiny_lm_dir: Path, tmp_path: Path) -> None:
    """torchrun, 2 CPU processes: each update's 2 x 2 groups follow the schedule (update 0 all
    human, 1 half, from 2 on all automatic), logged over both ranks; the replicas agree."""
    import torch

    from tests.support.ddp import torchrun_cpu

    out = torchrun_cpu(tmp_path, DDP_SCRIPT, tiny_lm_dir)
    assert torch.equal(torch.load(out / "replica-0.pt"), torch.load(out / "replica-1.pt"))
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    train_lines = [x for x in lines if x["split"] == "train"]
    assert [x["mix_human"] for x in train_lines] == [1.0, 0.5, 0.0, 0.0]
    assert [x["mix_target_human"] for x in train_lines] == [1.0, 0.5, 0.0, 0.0]
