"""Refresh: training that samples fresh groups from the current policy, ranks them
automatically and mixes them into the batches (docs/train.md, "Refresh").

End to end on a tiny Llama built from a config (tests/conftest.py): the real sampler, the
real rule rankers, the real aggregation and reference cache, rounds written to disk and read
back on resume, and a 2-process DDP launch on gloo.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from grouppref.config import validate
from grouppref.errors import ConfigError, StageError
from grouppref.pipeline.aggregate.config import AggregateConfig
from grouppref.pipeline.aggregate.stage import run_aggregate
from grouppref.runs.store import RunStore
from grouppref.schemas import AnnotatedGroup, ValidatedGroup
from grouppref.schemas.arrow import to_dataset
from grouppref.train.policy.trainer import train
from grouppref.train.refresh.buffer import FreshBuffer, RhoStats, concat_batches
from grouppref.train.refresh.fresh_groups import round_prompts
from grouppref.train.refresh.refresher import on_policy_kl
from grouppref.train.settings.policy import TrainConfig
from grouppref.train.settings.refresh import RefreshConfig
from grouppref.train.settings.shared import DataConfig
from grouppref.train.tensors.batch import TokenizedGroup, collate_groups
from tests.support.ddp import torchrun_cpu
from tests.support.paths import REPO
from tests.support.training import synthetic_groups

REPO = REPO
PLAIN = DataConfig(chat_template=False, max_response_length=32)
LENGTH = {"kind": "rule", "checks": [{"check": "length", "target": 20}]}


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def refresh_config(tiny: Path, **over) -> TrainConfig:
    refresh = {"every": 2, "prompts": 4, "k": 3, "max_new_tokens": 8, "rankers": [LENGTH],
               **over.pop("refresh", {})}
    base = dict(model=str(tiny), beta=0.5, lr=5e-3, lr_scheduler="constant", batch_size=4,
                max_steps=5, logging_steps=1, data=PLAIN, importance_clip=(0.5, 2.0),
                refresh=refresh)
    return TrainConfig(**{**base, **over})


# -- pure pieces ------------------------------------------------------------------------------
def tokenized(gid: str, prompt: list[int], cands: list[list[int]], ref: bool = True,
              seed: int = 0) -> TokenizedGroup:
    rng = random.Random(seed)
    k = len(cands)
    p = [[0.5 if i == j else rng.random() for j in range(k)] for i in range(k)]
    return TokenizedGroup(
        group_id=gid, prompt_ids=prompt, cand_ids=cands, p_ij=p,
        w_ij=[[0.0 if i == j else 1.0 for j in range(k)] for i in range(k)],
        order=list(reversed(range(k))), ref_logps=[-rng.random() for _ in range(k)] if ref else None,
        behavior_logps=[-1.0, None, *([-2.0] * (k - 2))], split=None, candidate_ids=[
            f"{gid}-{i}" for i in range(k)])


def test_concat_batches_equals_collate_of_the_union() -> None:
    a = [tokenized("a", [5, 6, 7], [[1, 2], [3, 4, 5, 6]], seed=1),
         tokenized("b", [8], [[9], [10, 11], [12]], seed=2)]
    b = [tokenized("c", [1, 2, 3, 4, 5], [[7, 7, 7, 7, 7, 7], [8], [9, 9], [4]], seed=3)]
    got = concat_batches(collate_groups(a, 0), collate_groups(b, 0), pad_token_id=0)
    want = collate_groups(a + b, 0)
    for name, value in vars(want).items():
        if isinstance(value, torch.Tensor):
            # exact: concatenating copies values, no arithmetic (NaN marks a missing log-prob)
            torch.testing.assert_close(getattr(got, name), value, rtol=0, atol=0, equal_nan=True,
                                       msg=name)
        else:
            assert getattr(got, name) == value, name
    with pytest.raises(ConfigError, match="one batch has reference log-probs"):
        concat_batches(collate_groups(a, 0), collate_groups(
            [tokenized("d", [1], [[2], [3]], ref=False)], 0), pad_token_id=0)


def test_buffer_keeps_the_newest_and_draws_reproducibly() -> None:
    buffer = FreshBuffer(capacity=5)
    for r in range(3):
        buffer.add([tokenized(f"r{r}-{i}", [1], [[2], [3]]) for i in range(3)], r)
    assert [f.group.group_id for f in buffer.items] == ["r1-1", "r1-2", "r2-0", "r2-1", "r2-2"]
    assert buffer.newest_round() == 2
    one = [f.group.group_id for f in buffer.draw(3, 0, 1, 7, 0)]
    assert one == [f.group.group_id for f in buffer.draw(3, 0, 1, 7, 0)]  # same seed, same draw
    assert len(set(one)) == 3
    draws = {tuple(f.group.group_id for f in buffer.draw(3, 0, 1, 7, rank)) for rank in range(8)}
    assert len(draws) > 1  # each process draws its own
    assert len(buffer.draw(9, 0, 0)) == 5  # never more than it holds


def test_rho_stats_count_clipped_weights_per_kind() -> None:
    batch = collate_groups([tokenized("a", [1], [[2, 3], [4, 5], [6, 7]]),
                            tokenized("b", [1], [[2, 3], [4, 5], [6, 7]])], 0)
    policy = torch.tensor([[-1.0, -3.0, -2.0], [-1.0 + 2 * 0.1, -3.0, 0.0]])  # (B, K)
    stats = RhoStats(clip=(0.5, 2.0))
    stats.add(policy, batch, ["offline", "fresh_newest"])
    out = stats.take()
    # a: ratios 1, (unknown), 1; b: exp(0.1), (unknown), exp(1) clipped to 2
    assert out["offline"] == {"candidates": 2.0, "mean": 1.0, "clipped": 0.0}
    assert out["fresh_newest"]["candidates"] == 2.0
    # float32 exp of the same input on both sides, one mean: ~eps32, inside approx's rel 1e-6
    assert out["fresh_newest"]["mean"] == pytest.approx((torch.tensor(0.1).exp().item() + 2) / 2)
    assert out["fresh_newest"]["clipped"] == 0.5
    assert stats.take() == {}


def test_round_prompts_are_distinct_and_cover_the_pool() -> None:
    rounds = [round_prompts(10, 4, r, seed=3) for r in range(5)]
    assert all(len(set(r)) == 4 for r in rounds)
    assert set(rounds[0] + rounds[1] + rounds[2][:2]) == set(range(10))  # one pass = the pool
    assert rounds == [round_prompts(10, 4, r, seed=3) for r in range(5)]


def test_on_policy_kl_is_k3_unbiased_and_never_negative() -> None:
    # a policy and a reference over 3 one-token responses; candidates sampled from the policy
    pi, ref = torch.tensor([0.6, 0.3, 0.1]), torch.tensor([0.2, 0.3, 0.5])
    exact = float((pi * (pi / ref).log()).sum())
    draws = torch.multinomial(pi, 30_000, replacement=True, generator=torch.Generator().manual_seed(0))
    cands = [[int(t)] for t in draws]
    group = TokenizedGroup(
        group_id="g", prompt_ids=[1], cand_ids=cands, p_ij=[], w_ij=[], order=[],
        ref_logps=[float(ref[t].log()) for t in draws], split=None,
        behavior_logps=[float(pi[t].log()) for t in draws])
    per_response, per_token = on_policy_kl([group])
    # a Monte-Carlo estimate from the drawn responses: its sampling error, not rounding (measured ~1%)
    assert per_response == pytest.approx(exact, rel=0.05) and per_token == per_response
    # a few samples where the plain mean of log pi - log pi_ref is negative: k3 stays >= 0
    few = TokenizedGroup(group_id="f", prompt_ids=[1], cand_ids=[[2], [2, 3]], p_ij=[], w_ij=[],
                         order=[], ref_logps=[-1.0, -3.0], behavior_logps=[-1.5, -2.9], split=None)
    assert -1.5 - -1.0 + -2.9 - -3.0 < 0  # log pi - log pi_ref summed over the two
    k3 = [torch.expm1(torch.tensor(0.5)) - 0.5, torch.expm1(torch.tensor(-0.1)) + 0.1]
    # float32 expm1 of the same inputs, a few sums: ~eps32 relative
    assert on_policy_kl([few]) == pytest.approx((float(sum(k3)) / 2, float(k3[0] + k3[1] / 2) / 2))
    assert on_policy_kl([]) == (None, None)


@pytest.mark.parametrize(("over", "match"), [
    ({"fresh_share": 1.5}, "refresh.fresh_share: Input should be less than or equal to 1"),
    ({"fresh_share": -0.1}, "refresh.fresh_share: Input should be greater than or equal to 0"),
    ({"fresh_share": 0.1}, "gives 0 fresh and 4 offline groups per batch"),
    ({"max_new_tokens": 40}, "must be below data.max_response_length 32"),
    ({"ensemble": {"weights": {"judge": 1}}}, "ensemble names unknown rankers"),
])
def test_refresh_settings_are_checked(over: dict, match: str) -> None:
    data = {"batch_size": 4, "data": {"max_response_length": 32},
            "refresh": {"every": 2, "prompts": 4, "rankers": [LENGTH], **over}}
    with pytest.raises(ConfigError, match=match):
        validate(TrainConfig, data, "train")


def test_fresh_share_splits_each_batch() -> None:
    refresh = RefreshConfig(every=1, prompts=1, rankers=[LENGTH], fresh_share=0.25)
    assert (refresh.fresh_per_batch(8), refresh.offline_per_batch(8)) == (2, 6)
    only = refresh.model_copy(update={"fresh_share": 1.0})
    assert (only.fresh_per_batch(8), only.offline_per_batch(8)) == (8, 8)  # offline paces epochs
    assert refresh.buffer_size() == 2


# -- end to end -------------------------------------------------------------------------------
def test_refresh_rounds_end_to_end(tiny_lm_dir: Path, tmp_path: Path) -> None:
    config = refresh_config(tiny_lm_dir)
    result = train(config, synthetic_groups(12, 4, seed=7), tmp_path / "out")
    rounds = result.stats.refresh
    assert [(r.round, r.step) for r in rounds] == [(0, 0), (1, 2), (2, 4)]
    store = RunStore(tmp_path / "out" / "refresh")
    for r in rounds:
        name = f"round-{r.round:03d}"
        manifest = store.require(name)
        assert manifest.counts.inputs == 4 == manifest.counts.outputs + manifest.counts.rejected
        groups = store.load_records(name, AnnotatedGroup)
        assert len(groups) == r.groups == 4 and r.prompts == 4
        for g in groups:
            assert g.group_id.endswith(f"-r{r.round:03d}")
            assert len(g.rankings) == 1 and g.rankings[0].annotator.id == "rule:length=20"
            for c in g.candidates:
                assert c.source.model == f"{tiny_lm_dir}@step-{r.step}"
                assert c.source.params["policy_step"] == r.step
                assert c.behavior_logp is not None and "sampled_logp" in c.source.params
        assert manifest.stats["step"] == r.step
    # at step 0 the policy is the reference: the on-policy KL estimate is exactly 0
    assert rounds[0].kl_ref == 0.0 and rounds[1].kl_ref > 0
    # every round scored the held-out split and the candidates with the ranker
    assert all(r.held_out["groups"] == 4 and "rule:length=20" in r.scores for r in rounds)
    # batches of 4 at fresh_share 0.5: 2 offline + 2 fresh groups in each of the 2 steps
    assert rounds[1].groups_trained == {"offline": 4, "fresh_newest": 4, "fresh_older": 0}
    trained = rounds[2].groups_trained
    assert trained["offline"] == 4 and trained["fresh_newest"] + trained["fresh_older"] == 4
    # importance weights: the synthetic offline groups claim behaviour log-prob -5 per
    # candidate, far above what the model gives them: every weight clipped to 0.5
    assert rounds[1].rho["offline"] == {"candidates": 16.0, "mean": 0.5, "clipped": 1.0}
    fresh = rounds[1].rho["fresh_newest"]
    assert 8 <= fresh["candidates"] <= 12 and 0.5 < fresh["mean"] < 2.0  # 2 groups of 2-3, x2
    lines = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    refresh_lines = [x for x in lines if x["split"] == "refresh"]
    assert [x["step"] for x in refresh_lines] == [0, 2, 4]
    assert refresh_lines[1]["trained/fresh_newest"] == 4
    assert [x["rho"] for x in lines if x["split"] == "train"][0] < 1  # weights were applied
    saved = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert len(saved["refresh"]) == 3
    # a round is a stage of its own store: aggregate re-uses it
    agg = run_aggregate(store, AggregateConfig(input_stage="round-002", min_rankings=1))
    assert len(agg.records()) == 4


def test_resume_reads_rounds_back_and_continues_exactly(tiny_lm_dir: Path, tmp_path: Path) -> None:
    """6 steps straight == 3 steps with a checkpoint at step 2 (the round at step 2, written
    after that checkpoint, is read back, not sampled again) + resume to 6."""
    groups = synthetic_groups(16, 0, seed=3)
    straight = train(refresh_config(tiny_lm_dir, max_steps=6), groups, tmp_path / "a")
    train(refresh_config(tiny_lm_dir, max_steps=3, save_steps=2), groups, tmp_path / "b")
    resumed = train(refresh_config(tiny_lm_dir, max_steps=6, save_steps=2), groups, tmp_path / "b",
                    resume=tmp_path / "b" / "checkpoints" / "step-00000002")
    assert [(r.step, r.loaded) for r in resumed.stats.refresh] == [
        (0, True), (2, True), (4, False)]
    for name in ("round-000", "round-001", "round-002"):
        a = RunStore(tmp_path / "a" / "refresh").load_records(name, AnnotatedGroup)
        b = RunStore(tmp_path / "b" / "refresh").load_records(name, AnnotatedGroup)
        assert [g.model_dump(exclude={"rankings"}) for g in a] == [
            g.model_dump(exclude={"rankings"}) for g in b]
    params = [torch.cat([p.detach().flatten() for p in r.model.parameters()])
              for r in (straight, resumed)]
    # exact: the resume restores weights, Adam's moments, the rounds and the RNG bit for bit and
    # replays the same kernels on the same batches (one thread, one machine)
    assert torch.equal(params[0], params[1])
    lines = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if x["split"] == "refresh"] == [0, 2, 4]  # none twice
    shutil.rmtree(tmp_path / "b" / "refresh" / "round-000")  # a round trained on is gone
    with pytest.raises(StageError, match="round-000 .step 0. is missing"):
        train(refresh_config(tiny_lm_dir, max_steps=6, save_steps=2), groups, tmp_path / "b",
              resume=True)


def test_a_round_from_a_prompt_file_without_signal_trains_offline(tiny_lm_dir: Path,
                                                                  tmp_path: Path) -> None:
    """Prompts from refresh.source with reference answers (the offline groups have none); the
    tiny random model never writes 4817, so verify ties every candidate: no signal."""
    source = tmp_path / "prompts.jsonl"
    source.write_text("".join(json.dumps({"prompt_id": f"q{i}", "reference": "4817",
                                          "prompt": f"What is 4800 + 17? (case {i})"}) + "\n"
                              for i in range(6)))
    config = refresh_config(tiny_lm_dir, max_steps=2, refresh={
        "source": str(source), "rankers": [{"kind": "rule", "checks": [{"check": "verify"}]}]})
    result = train(config, synthetic_groups(8, 0), tmp_path / "out")
    (first,) = result.stats.refresh
    assert first.groups == 4 and first.without_signal == 4 and first.added == 0
    assert first.scores == {"rule:verify": 0.0}
    written = RunStore(tmp_path / "out" / "refresh").load_records("round-000", AnnotatedGroup)
    assert {g.prompt.reference for g in written} == {"4817"}
    assert {g.prompt.prompt_id for g in written} <= {f"q{i}" for i in range(6)}
    assert result.stats.steps == 2  # trained on the offline groups alone


def test_bad_refresh_input_fails_before_any_model_loads(tiny_lm_dir: Path, tmp_path: Path) -> None:
    groups = synthetic_groups(8, 0)  # no reference answers
    verify = {"rankers": [{"kind": "rule", "checks": [{"check": "verify"}]}]}
    with pytest.raises(ConfigError, match="need a reference answer, and none of the 8 prompts"):
        train(refresh_config(tiny_lm_dir, refresh=verify), groups, tmp_path / "a")
    with pytest.raises(ConfigError, match="refresh.prompts 9 is more than the 8 usable prompts"):
        train(refresh_config(tiny_lm_dir, refresh={"prompts": 9}), groups, tmp_path / "b")
    long = refresh_config(tiny_lm_dir, data=DataConfig(chat_template=False,
                                                       max_response_length=1000),
                          refresh={"max_new_tokens": 600})
    with pytest.raises(ConfigError, match="leaves no room for a prompt in the 512-token context"):
        train(long, groups, tmp_path / "c")
    for out in ("a", "b", "c"):
        assert not (tmp_path / out / "model.safetensors").exists()
        assert not (tmp_path / out / "metrics.jsonl").exists()


def _saved_dataset(path: Path, groups: list[ValidatedGroup]) -> Path:
    to_dataset(groups, ValidatedGroup).save_to_disk(str(path))
    return path


def grouppref(*args: str) -> int:
    """``grouppref ARGS`` in this process (the CLI's own entry point); its exit code."""
    from grouppref.cli import main

    argv = sys.argv
    sys.argv = ["grouppref", *args]
    try:
        main()
    except SystemExit as e:
        return int(e.code or 0)
    finally:
        sys.argv = argv
    return 0


@pytest.mark.parametrize(("args", "message"), [
    (["--refresh-ranker", "verify"], "need a reference answer"),
    (["--refresh-ranker", "rule:length=20", "--fresh-share", "1.5"],
     "--fresh-share: Input should be less than or equal to 1"),
    (["--refresh-ranker", "rule:length=20", "--refresh-max-new-tokens", "600",
      "--max-response-length", "1000"], "leaves no room for a prompt"),
])
def test_cli_bad_refresh_input_is_one_line_exit_2(tiny_lm_dir: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str],
                                                   args: list[str], message: str) -> None:
    data = _saved_dataset(tmp_path / "data", synthetic_groups(8, 0))
    capsys.readouterr()  # the fixture's own output
    code = grouppref("train", str(data), "--out", str(tmp_path / "out"), "--model",
                     str(tiny_lm_dir), "--no-chat-template", "--refresh-every", "2",
                     "--refresh-prompts", "2", *args)
    stderr = capsys.readouterr().err
    assert code == 2, stderr[-2000:]
    lines = [x for x in stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and message in lines[0], stderr
    assert not (tmp_path / "out" / "metrics.jsonl").exists()  # stopped before training


def test_cli_refresh_trains_and_reports(tiny_lm_dir: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    data = _saved_dataset(tmp_path / "data", synthetic_groups(8, 4))
    code = grouppref("train", str(data), "--out", str(tmp_path / "out"), "--model",
                     str(tiny_lm_dir), "--no-chat-template", "--max-steps", "2",
                     "--max-response-length", "32", "--refresh-every", "1", "--refresh-prompts",
                     "2", "--refresh-k", "3", "--refresh-max-new-tokens", "6", "--refresh-ranker",
                     "rule:length=20;keywords=sunny", "--fresh-share", "0.5", "--buffer", "3",
                     "--importance-clip", "0.5,2")
    assert code == 0, capsys.readouterr().err[-3000:]
    stats = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert [r["buffer"] for r in stats["refresh"]] == [2, 3]  # capped at --buffer
    assert stats["refresh"][1]["groups_trained"]["offline"] == 2
    assert "refresh" in capsys.readouterr().out  # the summary table names the rounds


# -- distributed ------------------------------------------------------------------------------
SCRIPT = textwrap.dedent("""
    import json, os, sys, torch
    from grouppref.train.settings.shared import DataConfig
    from grouppref.train.settings.policy import TrainConfig
    from grouppref.train.policy import trainer
    from tests.support.training import synthetic_groups

    model, out = sys.argv[1], sys.argv[2]
    seen = {}
    original = trainer._loop

    def loop(run):  # record the buffer of this process when training ends
        original(run)
        seen["buffer"] = [[f.round, f.group.group_id, f.group.cand_ids, f.group.ref_logps,
                           f.group.behavior_logps, f.group.p_ij] for f in run.refresh.buffer.items]

    trainer._loop = loop
    config = TrainConfig(model=model, beta=0.5, lr=5e-3, lr_scheduler="constant", batch_size=2,
                         max_steps=4, logging_steps=1, importance_clip=(0.5, 2.0),
                         data=DataConfig(chat_template=False, max_response_length=32),
                         refresh={"every": 2, "prompts": 3, "k": 3, "max_new_tokens": 6,
                                  "buffer": 5, "rankers": [{"kind": "rule", "checks": [
                                      {"check": "length", "target": 20}]}]})
    result = trainer.train(config, synthetic_groups(12, 4, seed=7), out)
    params = torch.cat([p.detach().flatten() for p in result.model.parameters()])
    torch.save(params, os.path.join(out, f"replica-{os.environ['RANK']}.pt"))
    with open(os.path.join(out, f"buffer-{os.environ['RANK']}.json"), "w") as fh:
        json.dump(seen["buffer"], fh)
""")


@pytest.mark.slow
def test_ddp_processes_share_one_buffer(tiny_lm_dir: Path, tmp_path: Path) -> None:
    out = torchrun_cpu(tmp_path, SCRIPT, tiny_lm_dir)
    b0, b1 = (json.loads((out / f"buffer-{r}.json").read_text()) for r in (0, 1))
    assert b0 == b1 and len(b0) == 5  # the same buffer on both processes, capped at 5
    assert {row[0] for row in b0} == {0, 1}
    assert torch.equal(torch.load(out / "replica-0.pt"), torch.load(out / "replica-1.pt"))
    metrics = json.loads((out / "metrics.json").read_text())
    rounds = metrics["refresh"]
    # 3 prompts per round shared out between the 2 processes (2 + 1), gathered into one round
    assert [(r["step"], r["prompts"], r["groups"]) for r in rounds] == [(0, 3, 3), (2, 3, 3)]
    # each process trains batches of 1 offline + 1 fresh group: 2 steps x 2 processes
    assert rounds[1]["groups_trained"] == {"offline": 4, "fresh_newest": 4, "fresh_older": 0}
    written = RunStore(out / "refresh").load_records("round-001", AnnotatedGroup)
    assert len(written) == 3 and len({g.group_id for g in written}) == 3
