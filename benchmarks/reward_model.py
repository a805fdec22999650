"""Reward-model training: grouppref's ``train-rm`` trainer vs TRL's ``RewardTrainer``, same run.

Workload: ranked groups of K = 4 candidates with a known preference (a candidate with more
"excellent" words in it is better: the 4 candidates carry 0, 1, 2 and 3 of them among random
filler words; consensus = that order, all 6 pairs with p = 1, w = 1). grouppref trains on the
groups (the soft Bradley-Terry loss over the 6 pairs of each group, one score per candidate);
TRL trains ``RewardTrainer`` on the same preferences expanded to the 6 (chosen, rejected) pairs
of each group. Both start from the same model with the same seeded 1-output head, see the same
token ids (grouppref's ``format_for_reward`` formatting, given to TRL pre-tokenised), the same
number of pairs per optimizer step (``--groups-per-step`` groups = 6 x that many pairs), the
same steps, learning rate (constant), AdamW, clipping at 1.0, fp32 (TRL's defaults ``bf16`` and
gradient checkpointing turned off).

Reported side by side: held-out pair accuracy against the consensus (the same scoring function
for both models: one forward per candidate, pairs of the held-out groups) and training pairs/s
(grouppref: pairs over its loop time; TRL: pairs over ``train_runtime``). A group of 4 is 4
sequences for grouppref (each pair's scores come from them) and 12 for TRL (each pair runs its
chosen and its rejected sequence), so pairs/s is where the group form should show.

Usage::

    python benchmarks/reward_model.py                      # tiny Llama from a config, quick
    python benchmarks/reward_model.py --model embedded --train-groups 64 --steps 16
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

K = 4
MARKER = "excellent"
FILLER = ["apple", "river", "stone", "cloud", "green", "table", "music", "light", "paper", "horse",
          "glass", "smile", "winter", "garden", "bread", "ocean", "candle", "forest", "silver"]


def make_groups(n: int, split: str, rng: random.Random, words: int) -> list:
    """``n`` groups; candidate i carries 3 - i markers (candidate 0 best)."""
    from grouppref.schemas import (
        Agreement,
        Annotator,
        Candidate,
        CandidateSource,
        PairPreference,
        Prompt,
        Ranking,
        ValidatedGroup,
        make_candidate_id,
        make_group_id,
    )

    out = []
    for _ in range(n):
        prompt = Prompt(prompt_id=f"p{rng.random():.12f}",
                        text=f"Write about the {rng.choice(FILLER)} and the {rng.choice(FILLER)}.")
        gid = make_group_id(prompt)
        texts = []
        for good in (3, 2, 1, 0):
            tokens = [rng.choice(FILLER) for _ in range(words - good)] + [MARKER] * good
            rng.shuffle(tokens)
            texts.append(" ".join(tokens))
        cands = [Candidate(candidate_id=make_candidate_id(gid, f"{i}:{t}"), text=t,
                           source=CandidateSource(kind="model", model="synthetic"))
                 for i, t in enumerate(texts)]
        ids = [c.candidate_id for c in cands]
        pairs = [PairPreference(winner=ids[i], loser=ids[j], p=1.0, weight=1.0, votes_for=1.0)
                 for i in range(K) for j in range(i + 1, K)]
        out.append(ValidatedGroup(
            group_id=gid, prompt=prompt, candidates=cands, consensus=[[c] for c in ids],
            rankings=[Ranking(annotator=Annotator(id="truth", kind="rule"), group_id=gid,
                              tiers=[[c] for c in ids])],
            strengths={c: float(K - i) for i, c in enumerate(ids)}, pairs=pairs,
            agreement=Agreement(num_annotators=1), split=split))
    return out


def tiny_model(folder: Path, hidden: int) -> str:
    """A 2-layer Llama with SmolLM2's tokenizer and chat template, saved to ``folder`` (the
    tests' tiny model, :func:`tests.support.tiny_models.save_tiny_llama`)."""
    from grouppref.models.loading import embedded_model_dir
    from tests.support.tiny_models import save_tiny_llama

    return str(save_tiny_llama(folder, embedded_model_dir(), hidden=hidden))


def held_out_accuracy(model, tokenizer, groups) -> float:
    """Mean per-group pair accuracy of ``model`` on ``groups`` (same function for both)."""
    import torch

    from grouppref.train.objective.losses import pair_accuracy
    from grouppref.train.reward_model.encode import encode_groups
    from grouppref.train.reward_model.model import reward_scores
    from grouppref.train.tensors.batch import collate_groups

    encoded, _ = encode_groups(groups, tokenizer, 10_000)
    model.eval()
    accs = []
    with torch.no_grad():
        for start in range(0, len(encoded), 8):
            batch = collate_groups(encoded[start:start + 8], model.config.pad_token_id)
            s = reward_scores(model, batch)
            accs += pair_accuracy(s, batch.p_ij, batch.w_ij, batch.valid).tolist()
    return sum(accs) / len(accs)


def run_grouppref(base: str, train, held, args, out: Path) -> dict:
    from grouppref.train.reward_model.model import load_reward_model
    from grouppref.train.reward_model.trainer import train_reward_model
    from grouppref.train.settings.reward_model import RewardModelConfig

    config = RewardModelConfig(model=base, lr=args.lr, lr_scheduler="constant",
                               max_steps=args.steps, batch_size=args.groups_per_step,
                               logging_steps=args.steps, seed=args.seed)
    result = train_reward_model(config, train, out)
    model, tok = load_reward_model(str(out))
    return {"pairs_per_s": result.stats.pairs_per_s, "seconds": result.stats.seconds,
            "accuracy": held_out_accuracy(model, tok, held)}


def trl_pairs(groups, tokenizer) -> list[dict]:
    """Every weighted pair of every group as TRL's pre-tokenised (chosen, rejected) row."""
    from grouppref.train.reward_model.encode import encode_candidate

    rows = []
    for g in groups:
        text = {c.candidate_id: c.text for c in g.candidates}
        for pair in g.pairs:
            rows.append({"chosen_ids": encode_candidate(tokenizer, g, text[pair.winner]),
                         "rejected_ids": encode_candidate(tokenizer, g, text[pair.loser])})
    return rows


def run_trl(base: str, train, held, args, out: Path) -> dict:
    from datasets import Dataset
    from trl import RewardConfig, RewardTrainer

    from grouppref.train.reward_model.model import load_reward_model

    model, tok = load_reward_model(base, args.seed)  # same seeded head as grouppref's
    pairs_per_step = args.groups_per_step * K * (K - 1) // 2
    config = RewardConfig(
        output_dir=str(out), per_device_train_batch_size=pairs_per_step, max_steps=args.steps,
        learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0,
        optim="adamw_torch", bf16=False, gradient_checkpointing=False, use_cpu=True,
        report_to="none", save_strategy="no", logging_steps=args.steps, seed=args.seed,
        disable_dropout=True, dataloader_num_workers=0, max_length=None)
    trainer = RewardTrainer(model=model, args=config, processing_class=tok,
                            train_dataset=Dataset.from_list(trl_pairs(train, tok)))
    runtime = trainer.train().metrics["train_runtime"]
    return {"pairs_per_s": args.steps * pairs_per_step / runtime, "seconds": runtime,
            "accuracy": held_out_accuracy(trainer.model, tok, held)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny", help="'tiny' (2-layer Llama from a config), "
                        "'embedded' (SmolLM2-135M), or a folder / Hub id.")
    parser.add_argument("--hidden", type=int, default=64, help="Width of the tiny model.")
    parser.add_argument("--train-groups", type=int, default=64)
    parser.add_argument("--held-out-groups", type=int, default=32)
    parser.add_argument("--words", type=int, default=12, help="Words per candidate.")
    parser.add_argument("--groups-per-step", type=int, default=4)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)
    train = make_groups(args.train_groups, "train", rng, args.words)
    held = make_groups(args.held_out_groups, "test", rng, args.words)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        base = (tiny_model(root / "base", args.hidden) if args.model == "tiny"
                else None if args.model == "embedded" else args.model)
        results = {}
        for name, run in (("grouppref", run_grouppref), ("trl", run_trl)):
            t0 = time.perf_counter()
            # grouppref trains on the groups (test split held out inside); TRL on train pairs
            data = train + held if name == "grouppref" else train
            results[name] = run(base, data, held, args, root / name)
            results[name]["wall"] = time.perf_counter() - t0
    pairs = args.steps * args.groups_per_step * K * (K - 1) // 2
    print(f"settings: model={args.model} train_groups={args.train_groups} held_out="
          f"{args.held_out_groups} K={K} steps={args.steps} groups/step={args.groups_per_step} "
          f"(= {pairs // args.steps} pairs/step, {pairs} pairs) lr={args.lr} threads={args.threads}")
    print("| engine | held-out pair accuracy | pairs/s | train s | wall s (load+train+eval) |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['accuracy']:.3f} | {r['pairs_per_s']:.1f} | {r['seconds']:.1f} | "
              f"{r['wall']:.1f} |")
    ratio = results["grouppref"]["pairs_per_s"] / results["trl"]["pairs_per_s"]
    print(f"pairs/s grouppref / TRL = {ratio:.2f}x; accuracy grouppref - TRL = "
          f"{results['grouppref']['accuracy'] - results['trl']['accuracy']:+.3f}")


if __name__ == "__main__":
    main()
