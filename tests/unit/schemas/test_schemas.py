"""Record validators and the lossless Arrow round trip (property-based with hypothesis)."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from grouppref.schemas import (
    RECORD_TYPES,
    Agreement,
    AnnotatedGroup,
    Annotator,
    Candidate,
    CandidateGroup,
    CandidateSource,
    ChatMessage,
    PairPreference,
    Prompt,
    Ranking,
    ValidatedGroup,
    features_for,
    from_dataset,
    from_row,
    make_candidate_id,
    make_group_id,
    normalise_text,
    to_dataset,
    to_row,
)
from tests.support.factories import make_annotated, make_group, make_ranking
from tests.support.paths import REPO

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

words = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")),
                min_size=1, max_size=30).filter(lambda s: s.strip())
scalars = st.one_of(st.integers(-10**6, 10**6), st.floats(allow_nan=False, allow_infinity=False),
                    st.booleans(), st.text(max_size=10))


@st.composite
def prompts(draw: st.DrawFn) -> Prompt:
    metadata = draw(st.dictionaries(st.text(min_size=1, max_size=8), scalars, max_size=3))
    reference = draw(st.one_of(st.none(), words))
    if draw(st.booleans()):
        return Prompt(prompt_id="p1", text=draw(words), reference=reference, metadata=metadata)
    roles = st.sampled_from(["system", "user", "assistant"])
    turns = draw(st.lists(st.tuples(roles, words), min_size=1, max_size=3))
    return Prompt(prompt_id="p1", messages=[ChatMessage(role=r, content=c) for r, c in turns],
                  reference=reference, metadata=metadata)


@st.composite
def validated_groups(draw: st.DrawFn) -> ValidatedGroup:
    prompt = draw(prompts())
    gid = make_group_id(prompt)
    texts = draw(st.lists(words, min_size=2, max_size=6, unique_by=normalise_text))
    candidates = [
        Candidate(candidate_id=make_candidate_id(gid, t), text=t,
                  source=CandidateSource(kind="model", model="m", params={"temperature": 0.7},
                                         seed=draw(st.one_of(st.none(), st.integers(0, 99)))),
                  num_tokens=draw(st.one_of(st.none(), st.integers(0, 500))),
                  behavior_logp=draw(st.one_of(st.none(), st.floats(-1e4, 0.0))))
        for t in texts
    ]
    ids = [c.candidate_id for c in candidates]
    order = draw(st.permutations(ids))
    cut = draw(st.integers(1, len(order)))
    tiers = [list(order[:cut])] + ([list(order[cut:])] if cut < len(order) else [])
    ranking = Ranking(annotator=Annotator(id="a", kind="human"), group_id=gid, tiers=tiers,
                      scores={i: draw(st.floats(-5, 5)) for i in ids},
                      created_at=datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=timezone.utc))
    pairs = [PairPreference(winner=order[0], loser=order[-1], p=draw(st.floats(0.5, 1.0)),
                            weight=draw(st.floats(0.0, 1.0)), votes_for=2, votes_against=1)]
    return ValidatedGroup(
        group_id=gid, prompt=prompt, candidates=candidates, rankings=[ranking],
        consensus=[[i] for i in order], strengths={i: draw(st.floats(-3, 3)) for i in ids},
        pairs=pairs, agreement=Agreement(num_annotators=1, kendall_w=1.0, noise=0.0),
        flags=draw(st.lists(st.sampled_from(["cycle", "low_agreement"]), unique=True)),
        split=draw(st.sampled_from([None, "train", "test"])),
    )


@SETTINGS
@given(validated_groups())
def test_arrow_round_trip_is_lossless(group: ValidatedGroup) -> None:
    row = to_row(group)
    assert from_row(ValidatedGroup, row) == group
    back = from_dataset(to_dataset([group], ValidatedGroup), ValidatedGroup)
    assert back == [group]
    # JSON keeps int and float apart: metadata 1 stays int, 1.0 stays float.
    assert back[0].prompt.metadata == group.prompt.metadata
    assert {k: type(v) for k, v in back[0].prompt.metadata.items()} == {
        k: type(v) for k, v in group.prompt.metadata.items()}


def test_every_record_has_arrow_features_and_json_schema() -> None:
    for name, cls in RECORD_TYPES.items():
        assert features_for(cls), name
        schema = cls.model_json_schema()
        assert schema["additionalProperties"] is False, name


def test_schema_made_without_datasets_is_the_one_datasets_makes_of_the_features() -> None:
    import datasets

    from grouppref.schemas.arrow import arrow_schema_for, feature_dict_for

    for name, cls in RECORD_TYPES.items():
        theirs = datasets.Features.from_dict(feature_dict_for(cls))
        assert theirs.to_dict() == feature_dict_for(cls), name  # datasets' serialized form
        assert theirs.arrow_schema.equals(arrow_schema_for(cls), check_metadata=True), name


def test_empty_dataset_keeps_schema() -> None:
    ds = to_dataset([], CandidateGroup)
    assert len(ds) == 0 and ds.features == features_for(CandidateGroup)


def test_arrow_table_and_its_rows_of_a_whole_table_and_of_a_selection() -> None:
    from grouppref.schemas.arrow import arrow_table, table_rows

    groups = [make_group(prompt_text=f"Name colour {i}.") for i in range(3)]
    ds = to_dataset(groups, CandidateGroup)
    assert arrow_table(ds).to_pylist() == list(ds)
    picked = ds.select([2, 0])  # an indices mapping over the same table
    assert arrow_table(picked).to_pylist() == list(picked)
    assert [r["group_id"] for r in table_rows(arrow_table(picked))] == [groups[2].group_id,
                                                                          groups[0].group_id]
    assert [r["group_id"] for r in table_rows(arrow_table(ds), batch_size=2)] == [
        g.group_id for g in groups]
    # the records of a selection, through from_dataset (from_table of its rows)
    assert from_dataset(picked, CandidateGroup) == [groups[2], groups[0]]


@SETTINGS
@given(st.lists(st.integers(0, 59), max_size=25))
def test_take_rows_of_a_table_of_many_chunks_equals_take(indices: list[int]) -> None:
    import pyarrow as pa

    from grouppref.schemas.arrow import take_rows

    chunks = [pa.table({"n": list(range(i, i + 6)), "s": [str(j) for j in range(i, i + 6)]})
              for i in range(0, 60, 6)]
    table = pa.concat_tables(chunks)  # 10 chunks, as a stage's table of 10 shards
    assert take_rows(table, indices).equals(table.take(pa.array(indices, pa.int64())))
    assert take_rows(table, list(range(7, 19))).to_pydict()["n"] == list(range(7, 19))


@SETTINGS
@given(st.integers(0, 30))
def test_group_size_bounds(k: int) -> None:
    texts = [f"t{i}" for i in range(k)]
    if 2 <= k <= 16:
        assert make_group(texts=texts).k == k
    else:
        with pytest.raises(ValidationError, match="candidates"):
            make_group(texts=texts)


@SETTINGS
@given(words, st.sampled_from(["upper", "spaces", "same"]))
def test_duplicate_normalised_texts_rejected(text: str, variant: str) -> None:
    other = {"upper": text.upper(), "spaces": "  " + text.replace(" ", "\n ") + " ",
             "same": text}[variant]
    if normalise_text(other) != normalise_text(text):  # casefold of some scripts differs
        return
    with pytest.raises(ValidationError, match="same normalised text|duplicate"):
        make_group(texts=[text, other])


def test_duplicate_candidate_ids_rejected() -> None:
    g = make_group(k=2)
    data = g.model_dump()
    data["candidates"][1]["candidate_id"] = data["candidates"][0]["candidate_id"]
    with pytest.raises(ValidationError, match="duplicate candidate id"):
        CandidateGroup.model_validate(data)


@pytest.mark.parametrize("text", ["", "   ", "\n\t"])
def test_empty_text_rejected(text: str) -> None:
    with pytest.raises(ValidationError, match="empty"):
        make_group(texts=["a", text])
    with pytest.raises(ValidationError):
        Prompt(prompt_id="p", text=text)


def test_prompt_needs_exactly_one_form() -> None:
    with pytest.raises(ValidationError, match="exactly one"):
        Prompt(prompt_id="p")
    with pytest.raises(ValidationError, match="exactly one"):
        Prompt(prompt_id="p", text="x", messages=[ChatMessage(role="user", content="x")])
    with pytest.raises(ValidationError):
        Prompt(prompt_id="p", text="x", extra_field=1)


@SETTINGS
@given(st.data())
def test_tiers_must_name_candidates_at_most_once_and_two_at_least(data: st.DataObject) -> None:
    """A ranking may leave candidates out (a partial ranking), but must compare two."""
    g = make_group(k=4)
    ids = g.candidate_ids()
    mutation = data.draw(st.sampled_from(["drop", "duplicate", "unknown", "empty_tier"]))
    tiers = [[i] for i in data.draw(st.permutations(ids))]
    partial = AnnotatedGroup(**g.model_dump(), rankings=[Ranking(
        annotator=Annotator(id="a", kind="human"), group_id=g.group_id, tiers=tiers[:2])])
    assert len(partial.rankings[0].tiers) == 2
    if mutation == "drop":
        tiers = tiers[:1]
    elif mutation == "duplicate":
        tiers.append([tiers[0][0]])
    elif mutation == "unknown":
        tiers[0] = ["c-unknown"]
    else:
        tiers.append([])
    with pytest.raises(ValidationError, match="at least 2|twice|unknown|empty tier"):
        Ranking(annotator=Annotator(id="a", kind="human"), group_id=g.group_id, tiers=tiers)
        AnnotatedGroup(**g.model_dump(), rankings=[
            Ranking(annotator=Annotator(id="a", kind="human"), group_id=g.group_id, tiers=tiers)])


def test_annotated_group_rejects_duplicate_annotator_and_foreign_group() -> None:
    g = make_group(k=3)
    with pytest.raises(ValidationError, match="ranks this group twice"):
        AnnotatedGroup(**g.model_dump(), rankings=[make_ranking(g, [0, 1, 2]),
                                                    make_ranking(g, [2, 1, 0])])
    other = make_group(k=3, prompt_text="Another prompt")
    r = make_ranking(g, [0, 1, 2]).model_copy(update={"group_id": other.group_id})
    with pytest.raises(ValidationError, match="is for group"):
        AnnotatedGroup(**g.model_dump(), rankings=[r])


@SETTINGS
@given(p=st.floats(allow_nan=True, allow_infinity=True), w=st.floats(allow_nan=True))
def test_pair_ranges_and_nan(p: float, w: float) -> None:
    ok = math.isfinite(p) and 0.5 <= p <= 1.0 and math.isfinite(w) and 0.0 <= w <= 1.0
    if ok:
        PairPreference(winner="a", loser="b", p=p, weight=w)
    else:
        with pytest.raises(ValidationError):
            PairPreference(winner="a", loser="b", p=p, weight=w)


def test_nan_rejected_everywhere() -> None:
    g = make_group(k=2)
    ids = g.candidate_ids()
    with pytest.raises(ValidationError):
        Ranking(annotator=Annotator(id="a", kind="rule"), group_id=g.group_id,
                tiers=[[ids[0]], [ids[1]]], scores={ids[0]: float("nan")})
    with pytest.raises(ValidationError):
        Prompt(prompt_id="p", text="x", metadata={"v": float("inf")})
    with pytest.raises(ValidationError):
        Candidate(candidate_id="c", text="x", source=CandidateSource(kind="import"),
                  behavior_logp=float("nan"))


def test_unknown_candidates_in_pairs_rejected() -> None:
    g = make_annotated(make_group(k=3), [[0, 1, 2]])
    ids = g.candidate_ids()
    base = dict(consensus=[[i] for i in ids], strengths={i: 0.0 for i in ids},
                agreement=Agreement(num_annotators=1))
    with pytest.raises(ValidationError, match="unknown candidates"):
        ValidatedGroup(**g.model_dump(), **base,
                       pairs=[PairPreference(winner=ids[0], loser="c-nope", p=0.7, weight=1)])
    with pytest.raises(ValidationError, match="appears twice"):
        pair = PairPreference(winner=ids[0], loser=ids[1], p=0.7, weight=1)
        flipped = PairPreference(winner=ids[1], loser=ids[0], p=0.7, weight=1)
        ValidatedGroup(**g.model_dump(), **base, pairs=[pair, flipped])


def test_ids_are_stable_hashes() -> None:
    p1 = Prompt(prompt_id="a", text="Same prompt")
    p2 = Prompt(prompt_id="b", text="Same prompt")
    assert make_group_id(p1) == make_group_id(p2)
    assert make_candidate_id("g-1", "x") == make_candidate_id("g-1", "x") != make_candidate_id(
        "g-2", "x")


def test_schema_json_is_valid_json() -> None:
    text = json.dumps(ValidatedGroup.model_json_schema())
    assert "consensus" in json.loads(text)["properties"]


def test_data_format_reference_is_current() -> None:

    from grouppref.schemas.docs import render

    path = REPO / "docs" / "data-format.md"
    assert path.read_text() == render(), "run: python -m grouppref.schemas.docs > docs/data-format.md"
