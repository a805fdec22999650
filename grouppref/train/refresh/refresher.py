"""Refresh rounds during training: the hook the trainer's loop calls (docs/train.md, "Refresh").

Schedule. Round ``r`` runs when ``r * every`` optimizer steps are done (r = 0, 1, ...; none at
or after the last step), before the next step's first micro-batch: it samples ``k`` candidates
for ``prompts`` prompts from the current policy, ranks and aggregates them
(:mod:`grouppref.train.refresh.fresh_groups`), computes their reference log-probs (the trainer's
reference cache), adds the groups whose aggregate decides some pair to the buffer
(:mod:`grouppref.train.refresh.buffer`), and scores the held-out split. From then on every
micro-batch takes ``round(fresh_share * batch_size)`` groups from the buffer; the data loader
supplies the rest.

Store. ``REFRESH_DIR/round-NNN`` (``RUN/train/refresh`` in a run, else ``OUT/refresh``) is a
stage of a run store rooted at ``REFRESH_DIR``: ``data/`` holds every group of the round as
``AnnotatedGroup`` rows, ``rejects.jsonl`` the prompts without a group, and the manifest's
``stats`` the round's metrics (:class:`~grouppref.schemas.reports.RefreshRound`), so
``grouppref inspect REFRESH_DIR`` lists the rounds and ``grouppref aggregate REFRESH_DIR
--input-stage round-003`` re-uses one. Each round's metrics are also a ``split: refresh`` line
of ``metrics.jsonl`` and an entry of ``metrics.json``'s ``refresh``.

Resume. A run started afresh deletes old rounds. A resumed run reads back every round before
the checkpoint's step (it must be complete: those rounds were trained on) and rebuilds the
buffer from them; a later round already complete on disk (the run was killed after it) is read
back instead of sampled again. Buffer and draws depend only on the rounds and the seeds, so
the resumed run trains on what the uninterrupted one would have.

Distributed (DDP). Each process samples and ranks its strided share of the round's prompts;
the groups are gathered to every process in prompt order, and aggregation, tokenisation and
the buffer are computed identically everywhere (the reference pass is split between the
processes by the reference cache). The main process writes the round.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grouppref.errors import StageError
from grouppref.models.loading import load_causal_lm
from grouppref.pipeline.aggregate.core import aggregate_groups
from grouppref.runs.store import RunStore, Shard
from grouppref.schemas import AnnotatedGroup, Reject, ValidatedGroup, make_group_id
from grouppref.schemas.reports import RefreshRound
from grouppref.train.data.reference import ensure_reference, score_groups
from grouppref.train.data.tokenize import tokenize_groups
from grouppref.train.engine.checkpoint import TrainState
from grouppref.train.engine.metric_sums import reduce_sums
from grouppref.train.engine.prepare import LoopRun
from grouppref.train.eval.metrics import evaluate
from grouppref.train.refresh.buffer import KINDS, FreshBuffer, RhoStats, mix_batch
from grouppref.train.refresh.fresh_groups import (
    AGGREGATE,
    STAGE,
    RefreshPlan,
    has_signal,
    mean_scores,
    rank_groups,
    round_prompts,
    sample_groups,
)
from grouppref.train.tensors.batch import GroupBatch, TokenizedGroup

ROUND = "round-{:03d}"


@dataclass
class SampledRound:
    """A round sampled and ranked by this run (not read back): the groups of every process in
    prompt order, their rejects, and what sampling and ranking took."""

    prompts: int
    groups: list[AnnotatedGroup]
    rejects: list[Reject]
    tokens: int  # generated, over every process
    generate_s: float
    rank_s: float


class Refresher:
    """The refresh rounds of one training run; see the module docstring.

    Args:
        plan (RefreshPlan): the checked settings, prompt pool and rankers.
        run (LoopRun): the trainer's run (accelerator, model, state, held-out groups, log, ...).
        tokenizer (Any): the policy's tokenizer.
        refresh_dir (Path): where the rounds are written.
        reference_dir (Path): the reference log-prob cache.
    """

    def __init__(self, plan: RefreshPlan, run: LoopRun, tokenizer: Any, refresh_dir: Path,
                 reference_dir: Path) -> None:
        self.plan, self.run, self.tokenizer = plan, run, tokenizer
        self.config = plan.config
        refresh = plan.config.refresh
        assert refresh is not None  # a plan is made only when refresh is set
        self.refresh = refresh
        self.store = RunStore(refresh_dir)
        self.reference_dir = reference_dir
        self.buffer = FreshBuffer(self.refresh.buffer_size())
        clip = self.config.importance_clip
        self.rho = RhoStats(clip) if clip is not None else None
        self.fresh_n = self.refresh.fresh_per_batch(self.config.batch_size)
        self.rounds: list[RefreshRound] = []
        self.done: set[int] = set()
        self.trained = dict.fromkeys(KINDS, 0.0)  # groups trained on since the last round
        self._logged: set[int] = set()  # steps whose refresh line is in metrics.jsonl
        self._kinds: list[str] = []
        self._reference: Any = None
        self._mark = time.perf_counter()

    # -- the hooks ----------------------------------------------------------------------------
    def start(self, fresh: bool) -> None:
        """Before the loop: clear old rounds (``fresh``), or read back the rounds before the
        resumed step and rebuild the buffer from them."""
        acc = self.run.accelerator
        if acc.is_main_process:
            for note in self.plan.notes:
                from rich.console import Console

                Console(stderr=True).print(note)
        if fresh:
            if acc.is_main_process:
                for old in self.store.root.glob("round-*"):
                    shutil.rmtree(old, ignore_errors=True)
            acc.wait_for_everyone()
            return
        self._logged = {r["step"] for r in self.run.log.records() if r["split"] == "refresh"}
        for step in range(0, self.run.state.step, self.refresh.every):
            self._round(step, replay=True)
        self._mark = time.perf_counter()

    def mix(self, batch: GroupBatch, state: TrainState) -> GroupBatch:
        """The micro-batch to train on: runs the round that is due, then adds this batch's
        share of fresh groups (drawn per epoch, micro-batch and process)."""
        step = state.step
        if step % self.refresh.every == 0 and step < self.run.total_steps and step not in self.done:
            self._round(step)
        acc = self.run.accelerator
        drawn = self.buffer.draw(self.fresh_n, self.config.seed, state.epoch,
                                 state.batch_in_epoch, acc.process_index)
        only = self.refresh.fresh_share == 1 and bool(drawn)
        newest = self.buffer.newest_round()
        self._kinds = ([] if only else ["offline"] * len(batch.group_ids)) + [
            "fresh_newest" if d.round == newest else "fresh_older" for d in drawn]
        return mix_batch(batch, [d.group for d in drawn], self.run.pad_token_id, only)

    def observe(self, batch: GroupBatch, policy_logps: torch.Tensor) -> None:
        """Count this micro-batch's groups by kind and the importance weights the loss
        applied to them."""
        if len(self._kinds) != len(batch.group_ids):
            return
        for kind in self._kinds:
            self.trained[kind] += 1
        if self.rho is not None:
            self.rho.add(policy_logps, batch, self._kinds)

    def close(self) -> None:
        """Free the reference model (kept between rounds)."""
        self._reference = None
        gc.collect()

    # -- one round ----------------------------------------------------------------------------
    def _round_config(self, round_: int, step: int) -> dict[str, Any]:
        return {"refresh": self.refresh.model_dump(mode="json"), "round": round_, "step": step,
                "model": self.config.model, "seed": self.config.seed,
                "data": self.config.data.model_dump(mode="json")}

    def _round(self, step: int, replay: bool = False) -> None:
        """Run (or read back) the round at ``step`` and add its groups to the buffer."""
        self.done.add(step)
        round_ = step // self.refresh.every
        name = ROUND.format(round_)
        hit = self.store.cached(name, self._round_config(round_, step))
        if hit is None and replay:
            raise StageError(f"--resume: refresh round {name} (step {step}) is missing or "
                             f"unfinished in {self.store.root}, but the checkpoint trained after "
                             "it; resume needs the rounds it trained on (or train afresh)")
        t0 = time.perf_counter()
        made: SampledRound | None = None
        if hit is not None:
            groups = self.store.load_records(name, AnnotatedGroup)
        else:
            made = self._sample(round_, step)
            groups = made.groups
        t1 = time.perf_counter()
        # the aggregate stage's fit (reliability, BT, noise rules); a group no ranker could
        # rank is left out
        validated = aggregate_groups(groups, AGGREGATE, source=str(self.store.root / name),
                                     stage=STAGE).groups if groups else []
        tokenized, _ = tokenize_groups(validated, self.tokenizer, self.config.data, stage=STAGE)
        t2 = time.perf_counter()
        if made is not None:  # the sampling policy's log-probs of the candidates as trained
            logps = self._behaviour(tokenized)
            tokenized = [dataclasses.replace(g, behavior_logps=list(logps[g.group_id]))
                         for g in tokenized]
            kept = {g.group_id: g.candidate_ids for g in tokenized}
            made.groups = [with_behaviour(g, logps, kept) for g in groups]
        filled = self._with_reference(tokenized)
        signal = {g.group_id for g in validated if has_signal(g)}
        added = [g for g in filled if g.group_id in signal]
        self.buffer.add(added, round_)
        t3 = time.perf_counter()
        if made is None:
            assert hit is not None
            stats = RefreshRound.model_validate({**hit.stats, "loaded": True})
            if not replay:  # the stored round already reports the training before it
                self._take_trained()
                if self.rho is not None:
                    self.rho.take()
        else:
            seconds = {"generate": made.generate_s, "rank": made.rank_s,
                       "aggregate": t2 - t1, "score": t3 - t2}
            stats = self._stats(round_, step, made, validated, filled, len(added), seconds, t0)
            self._write(name, round_, step, made, stats)
        self.rounds.append(stats)
        if not replay and step not in self._logged:
            self._logged.add(step)
            self.run.log.write(step, self.run.state.epoch_progress(self.run.steps_per_epoch),
                               "refresh", flat_metrics(stats))
        self._mark = time.perf_counter()

    def _sample(self, round_: int, step: int) -> SampledRound:
        """This process's share of the round's prompts sampled and ranked, gathered from every
        process in prompt order."""
        from accelerate.utils import gather_object

        acc = self.run.accelerator
        pool = self.plan.prompts
        prompts = [pool[i] for i in round_prompts(len(pool), self.refresh.prompts, round_,
                                                  self.config.seed)]
        own = prompts[acc.process_index::acc.num_processes]
        t0 = time.perf_counter()
        groups, rejects, tokens = sample_groups(self.plan, acc.unwrap_model(self.run.model),
                                                self.tokenizer, own, round_, step)
        t1 = time.perf_counter()
        annotated, rank_rejects = rank_groups(self.plan, groups)
        part = (annotated, rejects + rank_rejects, tokens, t1 - t0, time.perf_counter() - t1)
        parts = gather_object([part]) if acc.num_processes > 1 else [part]
        where = {make_group_id(p): i for i, p in enumerate(prompts)}
        every = sorted((g for p in parts for g in p[0]), key=lambda g: where[make_group_id(g.prompt)])
        return SampledRound(prompts=len(prompts), groups=every,
                            rejects=[r for p in parts for r in p[1]],
                            tokens=sum(p[2] for p in parts), generate_s=max(p[3] for p in parts),
                            rank_s=max(p[4] for p in parts))

    def _behaviour(self, groups: list[TokenizedGroup]) -> dict[str, list[float]]:
        """Log-probs of every candidate, as the trainer tokenises it (text + EOS), under the
        policy that sampled it (now): its importance ratio starts at exactly 1. Each process
        scores a strided share; every process gets all."""
        from accelerate.utils import gather_object

        acc, config = self.run.accelerator, self.config
        own = groups[acc.process_index::acc.num_processes]
        model = acc.unwrap_model(self.run.model)
        was_training = model.training
        model.eval()
        scores = score_groups(model, own, batch_size=config.eval_batch_size,
                              pad_token_id=self.run.pad_token_id, share_prefix=config.share_prefix,
                              autocast_dtype=_autocast(config.mixed_precision))
        model.train(was_training)
        part = {g.group_id: s for g, s in zip(own, scores, strict=True)}
        parts = gather_object([part]) if acc.num_processes > 1 else [part]
        return {gid: s for p in parts for gid, s in p.items()}

    def _reference_model(self) -> Any:
        if self._reference is None:
            self._reference = load_causal_lm(self.config.reference_name(),
                                             dtype=self.config.ref_dtype,
                                             device=str(self.run.accelerator.device))
            for p in self._reference.parameters():
                p.requires_grad_(False)
        return self._reference

    def _with_reference(self, groups: list[TokenizedGroup]) -> list[TokenizedGroup]:
        if not groups:
            return []
        filled, _ = ensure_reference(
            groups, model_name=self.config.reference_name(), cache_dir=self.reference_dir,
            data_config=self.config.data, batch_size=self.config.eval_batch_size,
            pad_token_id=self.run.pad_token_id, share_prefix=self.config.share_prefix,
            dtype=self.config.ref_dtype, model=self._reference_model())
        return filled

    def _stats(self, round_: int, step: int, made: SampledRound, validated: list[ValidatedGroup],
               filled: list[TokenizedGroup], added: int, seconds: dict[str, float],
               t0: float) -> RefreshRound:
        """The round's metrics (collectives inside: every process calls it)."""
        t = time.perf_counter()
        held_out = self._held_out()
        seconds = {**seconds, "eval": time.perf_counter() - t, "train": t0 - self._mark}
        kl = on_policy_kl(filled)
        return RefreshRound(
            round=round_, step=step, prompts=made.prompts, groups=len(made.groups),
            rejected=sum(r.scope == "row" for r in made.rejects),
            without_signal=len(made.groups) - sum(has_signal(g) for g in validated),
            added=added, buffer=len(self.buffer), tokens_generated=made.tokens,
            scores=mean_scores(made.groups), held_out=held_out, kl_ref=kl[0],
            kl_ref_per_token=kl[1], rho=self.rho.take() if self.rho is not None else {},
            groups_trained=self._take_trained(),
            seconds={k: round(v, 3) for k, v in seconds.items()})

    def _take_trained(self) -> dict[str, int]:
        """Groups trained on per kind since the last round, over every process (a collective)."""
        counts = reduce_sums([self.trained[k] for k in KINDS])
        self.trained = dict.fromkeys(KINDS, 0.0)
        return {k: int(v) for k, v in zip(KINDS, counts, strict=True)}

    def _held_out(self) -> dict[str, float]:
        run, config = self.run, self.config
        metrics = evaluate(run.model, run.held_out, beta=config.beta,
                           length_normalise=config.length_normalise,
                           batch_size=config.eval_batch_size, pad_token_id=run.pad_token_id,
                           share_prefix=config.share_prefix,
                           autocast_dtype=_autocast(config.mixed_precision))
        return {k: v for k, v in metrics.items() if not math.isnan(v)}

    def _write(self, name: str, round_: int, step: int, made: SampledRound,
               stats: RefreshRound) -> None:
        """The round as a stage of the refresh store (main process), then a barrier."""
        acc = self.run.accelerator
        if acc.is_main_process:
            stage = self.store.open_stage(name, self._round_config(round_, step),
                                          record_type=AnnotatedGroup, force=True)
            stage.write_shard(Shard(index=0, start=0, items=made.groups), made.groups,
                              made.rejects)
            stage.finish(inputs=made.prompts, stats=stats.model_dump(mode="json"))
        acc.wait_for_everyone()


def _autocast(mixed_precision: str) -> torch.dtype | None:
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mixed_precision)


def with_behaviour(group: AnnotatedGroup, logps: dict[str, list[float]],
                   kept: dict[str, list[str]]) -> AnnotatedGroup:
    """``group`` with each candidate's ``behavior_logp`` replaced by its re-scored log-prob
    (``logps``: group id -> values for the candidate ids ``kept[group id]``, those the trainer
    tokenised), the sampler's own value kept as ``source.params["sampled_logp"]``. Groups the
    trainer could not tokenise (never trained on) keep the sampler's value."""
    if group.group_id not in kept:
        return group
    new = dict(zip(kept[group.group_id], logps[group.group_id], strict=True))
    candidates = [c if c.candidate_id not in new else c.model_copy(update={
        "behavior_logp": min(new[c.candidate_id], 0.0),
        "source": c.source.model_copy(update={"params": {
            **c.source.params, **({} if c.behavior_logp is None
                                  else {"sampled_logp": c.behavior_logp})}})})
        for c in group.candidates]
    return group.model_copy(update={"candidates": candidates})


def on_policy_kl(groups: list[TokenizedGroup]) -> tuple[float | None, float | None]:
    """``KL(pi || pi_ref)`` estimated on candidates sampled from ``pi`` with Schulman's k3
    estimator: the mean over them of ``e^d - 1 - d``, ``d = log pi_ref(y) - log pi(y)`` (their
    reference and behaviour log-probs), per response and per token (each response's term over
    its length). Unbiased like the plain mean of ``-d`` but never negative, so a few samples
    cannot report a negative KL. Exact at temperature 1 and top_p 1 (else it measures the
    sampler's shift as well)."""
    terms = [(k3, k3 / max(len(ids), 1))
             for g in groups for b, r, ids in zip(g.behavior_logps, g.ref_logps or [], g.cand_ids,
                                                  strict=False)
             if b is not None
             for k3 in (math.expm1(min(r - b, 50.0)) - (r - b),)]
    if not terms:
        return None, None
    return (sum(t for t, _ in terms) / len(terms), sum(t for _, t in terms) / len(terms))


def flat_metrics(stats: RefreshRound) -> dict[str, float]:
    """A round's metrics as flat floats for ``metrics.jsonl`` and the trackers."""
    out: dict[str, float] = {k: float(getattr(stats, k)) for k in (
        "round", "prompts", "groups", "rejected", "without_signal", "added", "buffer",
        "tokens_generated")}
    out["kl_ref"] = math.nan if stats.kl_ref is None else stats.kl_ref
    out["kl_ref_per_token"] = math.nan if stats.kl_ref_per_token is None else stats.kl_ref_per_token
    out |= {f"score/{k}": v for k, v in stats.scores.items()}
    out |= {f"held_out/{k}": v for k, v in stats.held_out.items()}
    out |= {f"trained/{k}": float(v) for k, v in stats.groups_trained.items()}
    out |= {f"rho/{kind}/{k}": v for kind, d in stats.rho.items() for k, v in d.items()}
    out |= {f"seconds/{k}": v for k, v in stats.seconds.items()}
    return out
