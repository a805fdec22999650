"""The groups of one refresh round, made by the pipeline's own stages' code: candidates sampled
from the policy being trained by the generate stage's seeded sampler (with ``behavior_logp``),
ranked by the rank stage's rankers, aggregated by the aggregate stage's Bradley-Terry fit.

:func:`plan_refresh` checks everything that can be checked before a model loads (the prompts
and their reference answers, the rankers, whether the sampler can run the policy here) and
fails with one line (a :class:`~grouppref.errors.ConfigError`) on unusable input.

A fresh group gets the id ``<group id of its prompt>-rNNN`` (round NNN) and candidate ids
hashed from it, so rounds of the same prompt, and the offline group of that prompt, never
share an id; its candidates' source is ``<model>@step-S``, the policy after S optimizer steps.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from grouppref.errors import ConfigError
from grouppref.models.loading import model_label, resolve_model
from grouppref.models.sampling import derive_seed, neutral_generation_config
from grouppref.pipeline.aggregate.config import AggregateConfig
from grouppref.pipeline.generate.config import GenerateConfig, ModelShare
from grouppref.pipeline.generate.core import context_length, prompt_encoder
from grouppref.pipeline.generate.core import sample_groups as sample_core
from grouppref.pipeline.rank.config import RankConfig
from grouppref.pipeline.rank.core import rank_groups as rank_core
from grouppref.pipeline.rank.rankers import Ranker, build_ranker
from grouppref.pipeline.rank.settings import (
    RankerSettings,
    RuleRankerSettings,
    SimilarityRankerSettings,
    annotator_for,
)
from grouppref.pipeline.rank.shard_scoring import ShardScorer
from grouppref.schemas import (
    AnnotatedGroup,
    Annotator,
    Candidate,
    CandidateGroup,
    Prompt,
    Reject,
    ValidatedGroup,
    make_candidate_id,
    make_group_id,
)
from grouppref.train.settings.policy import TrainConfig

STAGE = "refresh"
# One ranking per group is the rule here (often a single automatic ranker): not a flag. The
# fits stay in the training process (workers=1): it may hold a GPU and run next to other ranks,
# where forking helpers is no gain and a risk.
AGGREGATE = AggregateConfig(min_rankings=1, workers=1)
_SAMPLERS_NEED_WHOLE_WEIGHTS = ("FSDP", "DEEPSPEED", "MEGATRON_LM")


def needs_reference(settings: RankerSettings) -> bool:
    """Whether a ranker scores only prompts with a reference answer (verify, similarity)."""
    if isinstance(settings, SimilarityRankerSettings):
        return True
    return isinstance(settings, RuleRankerSettings) and any(
        c.check == "verify" for c in settings.checks)


@dataclass
class RefreshPlan:
    """What the refresh rounds use, checked before any model loads.

    ``scorer`` scores a round's groups with every ranker as the rank stage does (served
    judges' requests together, in-process rankers meanwhile); it loads the in-process rankers'
    models at the first round and keeps them; its connection pool is open only while a round
    is ranked.

    Raises:
        ConfigError: served judges on one server with different ``api_key_env``.
    """

    config: TrainConfig
    prompts: list[Prompt]  # the pool the rounds draw from
    context: int | None  # the policy's context length in tokens
    rank_config: RankConfig
    rankers: list[Ranker]
    annotators: list[Annotator]
    notes: list[str] = field(default_factory=list)
    scorer: ShardScorer = field(init=False)

    def __post_init__(self) -> None:
        self.scorer = ShardScorer(self.rankers)


def _pool(config: TrainConfig, groups: Sequence[ValidatedGroup]) -> tuple[list[Prompt], str]:
    refresh = config.refresh
    assert refresh is not None
    if refresh.source is None:
        prompts = [g.prompt for g in groups if g.split != "test"]
        where = "the training groups"
    else:
        from grouppref.readers.prompts import read_prompts

        prompts, where = read_prompts(refresh.source, stage=STAGE).items, refresh.source
    unique = {make_group_id(p): p for p in prompts}  # one entry per prompt content
    return list(unique.values()), where


def _check_prompts(config: TrainConfig, prompts: list[Prompt], where: str,
                   notes: list[str]) -> list[Prompt]:
    """The prompts the rankers can score; fail when fewer than a round needs are left."""
    refresh = config.refresh
    assert refresh is not None
    if all(needs_reference(r) for r in refresh.rankers):
        with_ref = [p for p in prompts if p.reference and p.reference.strip()]
        if not with_ref:
            raise ConfigError(
                f"refresh: the rankers {[annotator_for(r).id for r in refresh.rankers]} need a "
                f"reference answer, and none of the {len(prompts)} prompts of {where} has one; "
                "give refresh.source a prompt file with a 'reference' column, or add a ranker "
                "that needs none (reward, judge, a rule without verify)")
        if len(with_ref) < len(prompts):
            notes.append(f"refresh: {len(prompts) - len(with_ref)} of {len(prompts)} prompts of "
                         f"{where} have no reference answer, which the rankers need; rounds draw "
                         f"from the other {len(with_ref)}")
        prompts = with_ref
    if refresh.prompts > len(prompts):
        raise ConfigError(f"refresh.prompts {refresh.prompts} is more than the {len(prompts)} "
                          f"usable prompts of {where}; lower --refresh-prompts or give "
                          "refresh.source more prompts")
    return prompts


def _check_sampler(config: TrainConfig, tokenizer: Any, distributed_type: str) -> int | None:
    """Fail unless the seeded sampler can run the policy here; the policy's context length."""
    from transformers import AutoConfig

    if distributed_type.upper() in _SAMPLERS_NEED_WHOLE_WEIGHTS:
        raise ConfigError(f"refresh samples from the policy with generate, which needs its whole "
                          f"weights on every process; {distributed_type} shards them: train with "
                          "DDP or one process, or drop refresh")
    path = resolve_model(config.model)
    arch = AutoConfig.from_pretrained(path).architectures or []
    if arch and not any(a.endswith(("ForCausalLM", "LMHeadModel", "ForConditionalGeneration"))
                        for a in arch):
        raise ConfigError(f"refresh: model {config.model!r} is a {arch[0]}, which the sampler "
                          "cannot generate with; train a causal LM or drop refresh")
    context = context_length(path, tokenizer)
    # room for the answers? (ConfigError if not)
    prompt_encoder(_generate_config(config, model_label(config.model)), tokenizer, context)
    return context


def _generate_config(config: TrainConfig, label: str) -> GenerateConfig:
    """The generate stage's settings of a round: the policy (named ``label``) fills all K
    slots."""
    refresh = config.refresh
    assert refresh is not None
    return GenerateConfig(
        models=[ModelShare(name=label, count=refresh.k)], k=refresh.k,
        temperature=refresh.temperature, top_p=refresh.top_p,
        max_new_tokens=refresh.max_new_tokens, max_resample=refresh.max_resample,
        seed=derive_seed(config.seed, "refresh") % 2**31, batch_size=refresh.batch_size,
        chat_template=config.data.chat_template)


def plan_refresh(config: TrainConfig, groups: Sequence[ValidatedGroup], tokenizer: Any,
                 distributed_type: str = "NO") -> RefreshPlan:
    """Check the refresh settings against the data, the rankers and the policy, loading no
    model weights.

    Raises:
        ConfigError: a ranker that cannot score the prompts (e.g. ``verify`` and no reference
            answer), more prompts per round than there are, a policy the sampler cannot run
            (not a causal LM, a context too short for ``max_new_tokens``, weights sharded by
            FSDP / DeepSpeed), served judges on one server with different ``api_key_env``.
        ModelNotFoundError: a ranker's model that does not exist.
    """
    refresh = config.refresh
    if refresh is None:
        raise ConfigError("plan_refresh needs a refresh section")
    notes: list[str] = []
    context = _check_sampler(config, tokenizer, distributed_type)
    pool, where = _pool(config, groups)
    prompts = _check_prompts(config, pool, where, notes)
    rank_config = refresh.rank_config()
    rankers = [build_ranker(s, rank_config.device, rank_config.dtype) for s in rank_config.rankers]
    for ranker in rankers:
        ranker.check()
    return RefreshPlan(config=config, prompts=prompts, context=context, rank_config=rank_config,
                       rankers=rankers, annotators=[annotator_for(s) for s in rank_config.rankers],
                       notes=notes)


def round_prompts(pool_size: int, m: int, round_: int, seed: int) -> list[int]:
    """Indices of round ``round_``'s ``m`` distinct prompts: consecutive places in a sequence of
    seeded permutations of the pool, so every prompt is drawn about equally often."""
    import torch

    out: list[int] = []
    pos = round_ * m
    perms: dict[int, list[int]] = {}
    while len(out) < m:
        sweep, i = divmod(pos, pool_size)
        if sweep not in perms:
            gen = torch.Generator().manual_seed(derive_seed(seed, "refresh-prompts", sweep))
            perms[sweep] = torch.randperm(pool_size, generator=gen).tolist()
        if perms[sweep][i] not in out:
            out.append(perms[sweep][i])
        pos += 1
    return out


# -- sampling ---------------------------------------------------------------------------------
def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    eos = model.generation_config.eos_token_id
    ids = {*(eos if isinstance(eos, list) else [eos] if eos is not None else [])}
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return sorted(ids)


@contextlib.contextmanager
def sampling_mode(model: Any, tokenizer: Any) -> Iterator[list[int]]:
    """The policy ready for the seeded sampler (eval mode, a neutral generation config on it
    and, under peft, on its base model, decoder layers compiled by ``train --compile`` run
    eagerly: generation's KV cache and changing lengths would recompile them at every round);
    everything restored afterwards. Yields the EOS ids."""
    import torch

    targets = [model] + ([model.get_base_model()] if hasattr(model, "get_base_model") else [])
    saved = [t.generation_config for t in targets]
    eos_ids = _eos_ids(targets[-1], tokenizer)
    was_training = model.training
    for t in targets:
        t.generation_config = neutral_generation_config(eos_ids, tokenizer.pad_token_id,
                                                        tokenizer.bos_token_id)
    model.eval()
    try:
        with torch.compiler.set_stance("force_eager"):
            yield eos_ids
    finally:
        for t, config in zip(targets, saved, strict=True):
            t.generation_config = config
        model.train(was_training)


def policy_label(config: TrainConfig, step: int) -> str:
    """The source model of a round's candidates: the policy after ``step`` optimizer steps."""
    return f"{model_label(config.model)}@step-{step}"


def sample_groups(plan: RefreshPlan, model: Any, tokenizer: Any, prompts: Sequence[Prompt],
                  round_: int, step: int) -> tuple[list[CandidateGroup], list[Reject], int]:
    """K candidates per prompt from ``model`` (the policy, unwrapped) by the generate stage's
    seeded sampler (:func:`~grouppref.pipeline.generate.core.sample_groups`), renamed for the
    round.

    Returns:
        tuple: the groups, the rejects (prompts without a group, slots left out), and the
        number of tokens generated.
    """
    gen_config = _generate_config(plan.config, policy_label(plan.config, step))
    with sampling_mode(model, tokenizer) as eos_ids:
        sampled = sample_core(prompts, model, tokenizer, gen_config, context=plan.context,
                              eos_ids=eos_ids)
    suffix = f"-r{round_:03d}"
    rejects = [r.model_copy(update={"stage": STAGE, "group_id": r.group_id and r.group_id + suffix})
               for r in sampled.rejects]
    return ([_for_round(g, suffix, round_, step) for g in sampled.groups], rejects,
            sampled.tokens)


def _for_round(group: CandidateGroup, suffix: str, round_: int, step: int) -> CandidateGroup:
    gid = group.group_id + suffix
    candidates = [Candidate(
        candidate_id=make_candidate_id(gid, c.text), text=c.text, num_tokens=c.num_tokens,
        behavior_logp=c.behavior_logp,
        source=c.source.model_copy(update={"params": {**c.source.params, "refresh_round": round_,
                                                      "policy_step": step}}))
        for c in group.candidates]
    return CandidateGroup(group_id=gid, prompt=group.prompt, candidates=candidates)


# -- ranking and aggregation ------------------------------------------------------------------
def rank_groups(plan: RefreshPlan, groups: Sequence[CandidateGroup]
                ) -> tuple[list[AnnotatedGroup], list[Reject]]:
    """Every ranker's ranking of every group (the rank stage's core,
    :func:`~grouppref.pipeline.rank.core.rank_groups`); part-rejects for the groups a ranker
    skipped. The served judges' connection pool is closed when the round is ranked (training
    holds no idle connections)."""
    if not groups:
        return [], []
    annotated = [AnnotatedGroup(**dict(g)) for g in groups]
    try:
        ranked = rank_core(annotated, plan.scorer, plan.rank_config)
    finally:
        plan.scorer.close()
    return ranked.groups, [r.model_copy(update={"stage": STAGE}) for r in ranked.rejects]


def has_signal(group: ValidatedGroup) -> bool:
    """Whether the aggregate separates any candidates (more than one consensus tier)."""
    return len(group.consensus) > 1


def mean_scores(groups: Sequence[AnnotatedGroup]) -> dict[str, float]:
    """Mean score of every candidate per ranker (annotator id) over ``groups``."""
    sums: dict[str, list[float]] = {}
    for g in groups:
        for r in g.rankings:
            if r.scores:
                acc = sums.setdefault(r.annotator.id, [0.0, 0.0])
                acc[0] += sum(r.scores.values())
                acc[1] += len(r.scores)
    return {k: s / n for k, (s, n) in sums.items() if n}
