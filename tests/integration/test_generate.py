"""The ``generate`` stage: sampling maths, behaviour log-probs, resume after SIGKILL, mixed
models, rejects, ``--import`` and the CLI (tiny saved models; the embedded SmolLM2 once)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import typer
from typer.testing import CliRunner

from grouppref.commands import generate as generate_cmd
from grouppref.errors import ConfigError, RowError, StageError
from grouppref.models.loading import EMBEDDED_NAME, ModelNotFoundError, load_causal_lm, load_tokenizer
from grouppref.models.sampling import (
    SeededSampler,
    derive_seed,
    gumbel_argmax,
    neutral_generation_config,
    sample_batch,
)
from grouppref.pipeline.generate.config import GenerateConfig, ModelShare
from grouppref.pipeline.generate.shard import Draw, PromptEncoder, _bad_slots
from grouppref.pipeline.generate.stage import run_generate
from grouppref.pipeline.imports.config import ImportConfig
from grouppref.pipeline.imports.stage import run_import_candidates
from grouppref.runs.store import RunStore
from grouppref.schemas import ChatMessage, Prompt
from tests.support.paths import REPO

REPO = REPO
# same derivation as MODEL_ATOL (tests/support/tolerances.py): the KV cache sums attention in another
# order
LOGP_ATOL = 1e-4  # fp32: generate's cached decode vs one full forward pass


def _prompts(n: int = 3) -> list[Prompt]:
    texts = ["Name a colour.", "What is 2 + 2?", "Write a haiku about rain, please.",
             "Say hello.", "List three fruits.", "Why is the sky blue?", "Count to five.",
             "Spell 'cat'."]
    return [Prompt(prompt_id=f"p{i}", text=texts[i]) for i in range(n)]


def _config(model: Path, **extra) -> GenerateConfig:
    values = {"models": [ModelShare(name=str(model))], "k": 3, "max_new_tokens": 6,
              "batch_size": 8, "shard_size": 2, **extra}
    return GenerateConfig(**values)


# -- sampling maths --------------------------------------------------------------------------
def _empirical(choices: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.bincount(choices, minlength=vocab).double() / len(choices)


def test_gumbel_argmax_samples_softmax():
    """x = log([0.5, 0.3, 0.15, 0.05]): the frequencies of 40,000 draws match p within 4 sigma
    (sigma = sqrt(p(1-p)/n) <= 0.0025)."""
    p = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    n = 40_000
    scores = p.log().float().expand(n, 4)  # (B, V)
    uniform = torch.rand(n, 4, generator=torch.Generator().manual_seed(0))
    freq = _empirical(gumbel_argmax(scores, uniform), 4)
    sigma = (p * (1 - p) / n).sqrt()
    assert torch.all((freq - p).abs() <= 4 * sigma), (freq, p)


def test_seeded_sampler_tempered_top_p_distribution_and_raw_logp():
    """Temperature 2, top-p 0.8 over p = [0.6, 0.25, 0.1, 0.05]: the nucleus is {0, 1} (0.6 <
    0.8 <= 0.85 is reached at token 1 under the *tempered* p), and the draws follow the
    renormalised tempered distribution; each recorded log-prob is the untempered log p."""
    p = torch.tensor([0.6, 0.25, 0.1, 0.05], dtype=torch.float64)
    t, top_p, n = 2.0, 0.8, 20_000
    tempered = p.pow(1 / t) / p.pow(1 / t).sum()  # naive reference, float64
    order = torch.argsort(tempered, descending=True)
    keep = torch.zeros(4, dtype=torch.bool)
    mass = 0.0
    for v in order.tolist():  # smallest prefix whose mass reaches top_p
        keep[v] = True
        mass += float(tempered[v])
        if mass >= top_p:
            break
    want = torch.where(keep, tempered, 0.0)
    want = want / want.sum()
    sampler = SeededSampler(list(range(n)), t, top_p, torch.device("cpu"))
    scores = p.log().float().expand(n, 4).clone()
    forced = sampler(torch.zeros(n, 1, dtype=torch.long), scores)
    choice = sampler.tokens[0]
    assert torch.equal(forced.argmax(-1), choice)
    freq = _empirical(choice, 4)
    sigma = (want * (1 - want) / n).sqrt()
    assert torch.all((freq - want).abs() <= 4 * sigma + 1e-12), (freq, want)
    # the sampler's float32 log-probs of 4 scores (~-1.4) vs float64: ~eps32 * 1.4 = 2e-7, 1e-6 = 5x
    torch.testing.assert_close(sampler.logps[0].double(), p.log()[choice], atol=1e-6, rtol=0)


def test_derive_seed_is_a_stable_hash():
    digest = hashlib.sha256(b"7\x1fg-1\x1fm\x1f2\x1f0").digest()
    assert derive_seed(7, "g-1", "m", 2, 0) == int.from_bytes(digest[:8], "big") >> 1
    assert derive_seed(7, "g-1", "m", 2, 1) != derive_seed(7, "g-1", "m", 2, 0)


def test_sample_batch_logp_equals_forward_pass_and_ignores_batchmates(tiny_lm_dir: Path):
    """behavior_logp (from the generation scores) equals sum_t log_softmax(z_t)[y_t] of one
    unpadded teacher-forced forward pass; a row sampled alone gives the same tokens."""
    model, tok = load_causal_lm(str(tiny_lm_dir)), load_tokenizer(str(tiny_lm_dir))
    model.generation_config = neutral_generation_config([tok.eos_token_id], tok.pad_token_id,
                                                        tok.bos_token_id)
    prompts = [tok(t)["input_ids"] for t in ("Hi", "A longer prompt with more words", "Why?")]
    kwargs = {"temperature": 0.7, "top_p": 0.9, "max_new_tokens": 7,
              "eos_ids": [tok.eos_token_id], "pad_id": tok.pad_token_id}
    samples = sample_batch(model, prompts, [11, 12, 13], **kwargs)
    for prompt, sample in zip(prompts, samples, strict=True):
        ids = torch.tensor([prompt + sample.token_ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0].double(), dim=-1)  # (T, V)
        ref = sum(float(logp[len(prompt) - 1 + t, y]) for t, y in enumerate(sample.token_ids))
        assert sample.logp == pytest.approx(ref, abs=LOGP_ATOL)
        assert len(sample.token_ids) == 7 or sample.eos
    alone = sample_batch(model, [prompts[1]], [12], **kwargs)[0]
    assert alone.token_ids == samples[1].token_ids


# -- the stage -------------------------------------------------------------------------------
def test_generate_stage_on_tiny_model(tmp_path: Path, tiny_lm_dir: Path):
    chat = Prompt(prompt_id="chat", messages=[ChatMessage(role="system", content="Be brief."),
                                              ChatMessage(role="user", content="Hello?")])
    too_long = Prompt(prompt_id="long", text="word " * 600)  # > 512 - 6 tokens
    store = RunStore(tmp_path / "run")
    config = _config(tiny_lm_dir, temperature=0.9, top_p=0.95, seed=5)
    stage = run_generate(store, config, prompts=[*_prompts(3), chat, too_long], show_progress=False)
    counts = stage.manifest.counts
    assert (counts.inputs, counts.outputs, counts.rejected) == (5, 4, 1)
    (reject,) = stage.rejects()
    assert "prompt 'long'" in reject.reason and "--truncate-prompts" in reject.reason
    seeds = set()
    for group in stage.records():
        assert group.k == 3
        for c in group.candidates:
            assert c.source.kind == "model" and c.source.model == str(tiny_lm_dir)
            assert c.source.params["temperature"] == 0.9 and c.source.params["top_p"] == 0.95
            assert c.source.params["max_new_tokens"] == 6 and c.source.params["run_seed"] == 5
            assert 1 <= c.num_tokens <= 6 and (c.num_tokens == 6 or c.source.params["eos"])
            assert c.behavior_logp < 0
            seeds.add(c.source.seed)
    assert len(seeds) == 12
    stats = stage.manifest.stats
    assert stats["candidates"] == 12 and stats["generated_tokens"] >= stats["candidate_tokens"]
    again = run_generate(store, config, prompts=[*_prompts(3), chat, too_long], show_progress=False)
    assert again.cached


def test_truncate_prompts_keeps_the_last_tokens(tmp_path: Path, tiny_lm_dir: Path):
    too_long = Prompt(prompt_id="long", text="word " * 600)
    stage = run_generate(RunStore(tmp_path), _config(tiny_lm_dir, truncate_prompts=True, k=2),
                         prompts=[too_long], show_progress=False)
    assert stage.manifest.counts.outputs == 1
    (part,) = stage.rejects()
    assert part.scope == "part" and "truncated from" in part.reason and "last 506" in part.reason


def test_duplicates_are_resampled_then_the_group_rejected(tmp_path: Path, tiny_lm_dir: Path):
    """Temperature 0.001 makes every sample the greedy one (for this tiny model: EOS at once,
    an empty text), so re-sampling cannot help and the group goes to rejects."""
    stage = run_generate(RunStore(tmp_path), _config(tiny_lm_dir, temperature=0.001, k=3,
                                                     max_resample=2), prompts=_prompts(1),
                         show_progress=False)
    assert stage.manifest.counts.rejected == 1 and stage.manifest.counts.outputs == 0
    assert stage.manifest.stats["resampled"] == 3 * 2  # every slot, twice
    (reject,) = stage.rejects()
    assert "only 0 distinct" in reject.reason and "--min-k is 2" in reject.reason


def test_bad_slots_flags_empty_and_repeated_texts():
    def draw(text: str) -> Draw:
        return Draw(text, 1, -1.0, True, 0, 0)

    draws = {0: draw("Red"), 1: draw("  red "), 2: draw(" \n"), 3: draw("blue"), 4: draw("RED")}
    assert _bad_slots(draws) == [1, 2, 4]


def test_mixed_models_in_one_group(tmp_path: Path, tiny_lm_dir: Path):
    other = tmp_path / "other-lm"
    model = load_causal_lm(str(tiny_lm_dir))
    torch.manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.5)
    model.save_pretrained(other)
    load_tokenizer(str(tiny_lm_dir)).save_pretrained(other)
    config = _config(tiny_lm_dir, k=None, models=[ModelShare(name=str(tiny_lm_dir), count=2),
                                                  ModelShare(name=str(other), count=2)])
    stage = run_generate(RunStore(tmp_path / "run"), config, prompts=_prompts(2), show_progress=False)
    for group in stage.records():
        assert [c.source.model for c in group.candidates] == [str(tiny_lm_dir)] * 2 + [str(other)] * 2


def test_resume_after_sigkill_gives_the_uninterrupted_rows(tmp_path: Path, tiny_lm_dir: Path):
    """Kill the run (SIGKILL) right after shard 1 of 4 is on disk, rerun: same rows, no extras."""
    config = _config(tiny_lm_dir, shard_size=1, max_new_tokens=4)
    prompts = _prompts(4)
    driver = tmp_path / "driver.py"
    driver.write_text(textwrap.dedent("""
        import json, os, signal, sys
        from grouppref.pipeline.generate.config import GenerateConfig
        from grouppref.pipeline.generate.stage import run_generate
        from grouppref.runs.store import RunStore, StageRun
        from grouppref.schemas import Prompt

        run, config_json, prompts_json, kill_after = sys.argv[1:5]
        if int(kill_after) >= 0:
            write = StageRun.write_shard
            def write_then_die(self, shard, records, rejects):
                write(self, shard, records, rejects)
                if shard.index == int(kill_after):
                    os.kill(os.getpid(), signal.SIGKILL)
            StageRun.write_shard = write_then_die
        prompts = [Prompt.model_validate(p) for p in json.loads(prompts_json)]
        run_generate(RunStore(run), GenerateConfig.model_validate_json(config_json), prompts=prompts,
                     show_progress=False)
    """))
    args = [config.model_dump_json(), json.dumps([p.model_dump(mode="json") for p in prompts])]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    killed = subprocess.run([sys.executable, str(driver), str(tmp_path / "a"), *args, "1"], env=env)
    assert killed.returncode == -9
    shards = sorted(p.name for p in (tmp_path / "a" / "generate" / "shards").glob("*.arrow"))
    assert shards == ["shard-00000.arrow", "shard-00001.arrow"]
    resumed = subprocess.run([sys.executable, str(driver), str(tmp_path / "a"), *args, "-1"],
                             env=env)
    assert resumed.returncode == 0
    whole = run_generate(RunStore(tmp_path / "b"), config, prompts=prompts, show_progress=False)
    a = RunStore(tmp_path / "a").load_dataset("generate").to_list()
    assert len(a) == 4 and a == whole.dataset().to_list()
    assert RunStore(tmp_path / "a").manifest("generate").counts == whole.manifest.counts


def test_unknown_model_fails_before_any_work(tmp_path: Path):
    with pytest.raises(ModelNotFoundError, match="no-such-model"):
        run_generate(RunStore(tmp_path / "run"), _config(tmp_path / "no-such-model"), prompts=_prompts(1))
    assert not (tmp_path / "run").exists()


def test_reads_the_prompts_stage_when_no_source(tmp_path: Path, tiny_lm_dir: Path):
    with pytest.raises(StageError, match="prompts"):
        run_generate(RunStore(tmp_path), _config(tiny_lm_dir), show_progress=False)


def test_multi_turn_chat_without_template_is_rejected(tiny_lm_dir: Path):
    encoder = PromptEncoder("tiny", load_tokenizer(str(tiny_lm_dir)), 512, 8,
                            chat_template=False, truncate=False)
    chat = Prompt(prompt_id="c", messages=[ChatMessage(role="system", content="Be brief."),
                                           ChatMessage(role="user", content="Hi")])
    with pytest.raises(RowError, match="needs a chat template"):
        encoder.encode(chat)
    ids, cut = encoder.encode(Prompt(prompt_id="t", text="Hi"))
    assert cut is None and ids == load_tokenizer(str(tiny_lm_dir))("Hi")["input_ids"]


# -- settings --------------------------------------------------------------------------------
@pytest.mark.parametrize(("spec", "name", "count"), [
    ("org/model:2", "org/model", 2), ("embedded", "embedded", None), ("./a:b", "./a:b", None),
])
def test_model_share_parse(spec: str, name: str, count: int | None):
    assert ModelShare.parse(spec) == ModelShare(name=name, count=count)


def test_config_splits_k_between_models_and_checks_counts():
    config = GenerateConfig(models=[ModelShare(name="a"), ModelShare(name="b")], k=5)
    assert [m.count for m in config.models] == [3, 2]
    assert GenerateConfig(models=[ModelShare(name="a", count=2),
                                  ModelShare(name="b", count=3)]).k == 5
    for bad in ({"models": [ModelShare(name="a", count=2)], "k": 3},
                {"models": [ModelShare(name="a", count=2), ModelShare(name="b")]},
                {"k": 3, "min_k": 4}, {"models": [ModelShare(name="a"), ModelShare(name="a")]}):
        with pytest.raises(ValueError):
            GenerateConfig(**bad)
    with pytest.raises(ConfigError):
        ModelShare.parse("m:0")


# -- import ----------------------------------------------------------------------------------
def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_import_one_row_per_prompt(tmp_path: Path):
    source = _write_jsonl(tmp_path / "in.jsonl", [
        {"prompt": "Name a colour.", "responses": ["red", {"text": "blue", "model": "m1"}, "Red "]},
        {"prompt": "Say hi.", "responses": ["hi", "hi"]},
        {"prompt": "Count.", "responses": ["1", "1 2", "1 2 3"]},
    ])
    stage = run_import_candidates(RunStore(tmp_path / "run"),
                                  ImportConfig(source=str(source), min_k=3))
    counts = stage.manifest.counts
    assert (counts.inputs, counts.outputs, counts.rejected, counts.partial) == (3, 1, 2, 2)
    (group,) = stage.records()
    assert [c.text for c in group.candidates] == ["1", "1 2", "1 2 3"]
    assert all(c.source.kind == "import" for c in group.candidates)
    reasons = [r.reason for r in stage.rejects() if r.scope == "row"]
    assert any("at least 3 (min_k)" in r for r in reasons) and any("1 distinct" in r for r in reasons)


def test_import_one_row_per_response(tmp_path: Path):
    rows = [{"prompt_id": "a", "prompt": "Name a colour.", "response": t} for t in ("red", "blue")]
    rows += [{"prompt_id": "b", "prompt": "Say hi.", "response": t} for t in ("hi", "hello", "hey")]
    source = _write_jsonl(tmp_path / "in.jsonl", rows)
    stage = run_import_candidates(RunStore(tmp_path / "run"), ImportConfig(source=str(source)))
    assert [g.k for g in stage.records()] == [2, 3]
    assert stage.manifest.counts.inputs == 2 and stage.manifest.stage == "generate"


def test_import_bad_response_row_is_one_reject(tmp_path: Path):
    rows = [{"prompt_id": "a", "prompt": "Name a colour.", "response": 5}]
    rows += [{"prompt_id": "b", "prompt": "Say hi.", "response": t} for t in ("hi", "hello")]
    stage = run_import_candidates(RunStore(tmp_path / "run"),
                                  ImportConfig(source=str(_write_jsonl(tmp_path / "in.jsonl", rows))))
    assert (stage.manifest.counts.outputs, stage.manifest.counts.rejected) == (1, 1)


# -- CLI -------------------------------------------------------------------------------------
def _app() -> typer.Typer:
    app = typer.Typer()
    generate_cmd.register(app)
    app.command()(lambda: None)  # a second command keeps `generate` a subcommand
    return app


def test_cli_generate_and_import(tmp_path: Path, tiny_lm_dir: Path):
    prompts = _write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Hi"}, {"prompt": "Why?"}])
    runner = CliRunner()
    result = runner.invoke(_app(), [
        "generate", "--prompts", str(prompts), "--model", f"{tiny_lm_dir}:2", "--max-new-tokens",
        "4", "--out", str(tmp_path / "run"), "--quiet", "--no-chat-template"])
    assert result.exit_code == 0, result.output
    assert "2 in, 2 out, 0 rejected" in result.output
    manifest = RunStore(tmp_path / "run").manifest("generate")
    assert manifest.config["chat_template"] is False and manifest.config["k"] == 2
    result = runner.invoke(_app(), ["generate", "--import", str(prompts), "--model", "x",
                                    "--out", str(tmp_path / "run2")])
    assert isinstance(result.exception, ConfigError)
    result = runner.invoke(_app(), ["generate", "--prompts", str(prompts), "--k", "3",
                                    "--min-k", "4", "--out", str(tmp_path / "run3")])
    assert isinstance(result.exception, ConfigError) and "min_k=4" in str(result.exception)


# -- the embedded SmolLM2 ---------------------------------------------------------------------
def test_embedded_smollm2_candidates_and_retokenised_logp(tmp_path: Path):
    """Real chat answers from the default model; where re-tokenising the text (+ EOS) gives
    ``num_tokens`` tokens, a forward pass over them reproduces ``behavior_logp``."""
    prompts = [Prompt(prompt_id="a", text="What is 2 + 2?"),
               Prompt(prompt_id="b", text="Name a colour.")]
    config = GenerateConfig(k=3, max_new_tokens=8, temperature=0.8, batch_size=6)
    stage = run_generate(RunStore(tmp_path), config, prompts=prompts, show_progress=False)
    assert stage.manifest.counts.outputs == 2
    model, tok = load_causal_lm(None), load_tokenizer(None)
    checked = 0
    for group in stage.records():
        chat = [m.model_dump() for m in group.prompt.as_messages()]
        prefix = tok(tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False),
                     add_special_tokens=False)["input_ids"]
        for c in group.candidates:
            assert c.source.model == EMBEDDED_NAME and c.text.strip()
            ids = tok(c.text, add_special_tokens=False)["input_ids"]
            ids += [tok.eos_token_id] if c.source.params["eos"] else []
            if len(ids) != c.num_tokens:
                continue
            with torch.no_grad():
                logp = torch.log_softmax(model(torch.tensor([prefix + ids])).logits[0].double(), -1)
            ref = sum(float(logp[len(prefix) - 1 + t, y]) for t, y in enumerate(ids))
            # the embedded 135M model (30 layers, 576 wide, bf16-trained fp32 weights): a sum of up to
            # ~20 token log-probs of generate's cached decode vs one float64-softmaxed full pass; ~20 *
            # 3e-5 typical per token, 1e-3 leaves ~2x
            assert c.behavior_logp == pytest.approx(ref, abs=1e-3)
            checked += 1
    assert checked >= 3
    assert math.isfinite(stage.manifest.stats["tokens_per_s"])
