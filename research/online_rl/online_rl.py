"""Experiment 4: cost of grouppref's offline pipeline against online RL (TRL's GRPOTrainer).

Same model (SmolLM2-135M-Instruct), same training prompts, same verifiable reward (the rule
ranker's score, no annotator noise on either side), same number of policy updates, same
completions per update:

* ``offline_gspo``: generate K candidates per prompt once, rank with the rule ranker,
  aggregate (one rule "annotator"), then ``updates`` steps of the gspo loss;
* ``grpo``: TRL ``GRPOTrainer`` (token-level importance sampling), fresh samples from the
  current policy, ``steps_per_generation`` updates per generation round;
* ``grpo_sequence_is``: the same with ``importance_sampling_level="sequence"`` and the
  settings TRL's paper index gives for Qwen's Group Sequence Policy Optimization
  (``loss_type="grpo"``, ``epsilon=3e-4``, ``epsilon_high=4e-4``).

Reported: wall time, tokens generated, tokens trained, and the held-out reward reached (the
mean rule score of greedy answers on held-out prompts, and the shares correct / in format).

    .venv/bin/python -m research.online_rl.online_rl
    .venv/bin/python -m research.online_rl.online_rl --quick
"""

from __future__ import annotations

import copy
import tempfile
import time
import traceback
from typing import Any

import torch

from grouppref.api import resolve_model
from research import common as c
from research.real_model import real_model as rm
from research.real_model import smol


def settings(quick: bool) -> dict[str, Any]:
    if quick:
        return {"seed": 0, "train_prompts": 4, "test_prompts": 4, "k": 4, "max_new_tokens": 8,
                "updates": 2, "prompts_per_update": 2, "steps_per_generation": 2, "lr": 3e-5,
                "beta": 0.1}
    return {"seed": 0, "train_prompts": 32, "test_prompts": 48, "k": 4, "max_new_tokens": 12,
            "updates": 24, "prompts_per_update": 2, "steps_per_generation": 2, "lr": 3e-5,
            "beta": 0.1}


def held_out(model: Any, tok: Any, items: list[smol.Item], ranker: Any, cfg: dict[str, Any]
             ) -> dict[str, float]:
    g = smol.greedy_scores(model, tok, items, ranker, cfg["max_new_tokens"])
    return {**g, "greedy_reward": g["greedy_correct"] + 0.5 * g["greedy_format"]}


def offline(model: Any, tok: Any, items: list[smol.Item], test: list[smol.Item], ranker: Any,
            cfg: dict[str, Any]) -> dict[str, Any]:
    """Generate once, rank, aggregate, train ``updates`` steps of gspo."""
    t0 = time.perf_counter()
    ids, texts, gen_tokens = smol.generate(model, tok, items, cfg["k"], cfg["max_new_tokens"], cfg["seed"])
    t_gen = time.perf_counter() - t0
    scores = [smol.score_texts(ranker, it, t) for it, t in zip(items, texts, strict=True)]
    groups, stats = rm.build_groups(items, ids, scores, "noise=0.0", cfg["seed"])
    rm.ref_logps(model, groups["gspo_soft"], tok.pad_token_id)
    t_ref = time.perf_counter() - t0 - t_gen
    train_cfg = {**cfg, "steps": cfg["updates"], "batch_groups": cfg["prompts_per_update"]}
    trained, info = rm.train(model, groups["gspo_soft"], "gspo_soft", train_cfg, tok.pad_token_id)
    return {"wall_s": time.perf_counter() - t0, "generate_wall_s": t_gen, "reference_wall_s": t_ref,
            "tokens_generated": gen_tokens, "tokens_trained": info["tokens_trained"],
            "updates": cfg["updates"], "groups_with_signal": stats["groups_kept"],
            "held_out": held_out(trained, tok, test, ranker, cfg)}


def grpo(tok: Any, items: list[smol.Item], test: list[smol.Item], ranker: Any, cfg: dict[str, Any],
         level: str) -> dict[str, Any]:
    """TRL GRPOTrainer for ``updates`` optimizer steps; tokens counted in the reward function."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    count = {"generated": 0, "trained": 0, "completions": 0}
    by_text = {it.text: it for it in items}

    def reward(prompts: list[Any], completions: list[Any], **kw: Any) -> list[float]:
        out = []
        for p, comp, cids in zip(prompts, completions, kw["completion_ids"], strict=True):
            it = by_text[p[-1]["content"]]
            out.append(smol.score_texts(ranker, it, [comp[0]["content"]])[0])
            count["generated"] += len(cids)
            count["trained"] += len(cids) + len(it.ids)
            count["completions"] += 1
        return out

    per_update = cfg["prompts_per_update"] * cfg["k"]
    with tempfile.TemporaryDirectory() as out_dir:
        args = GRPOConfig(
            output_dir=out_dir, use_cpu=True, bf16=False, report_to="none", seed=cfg["seed"],
            learning_rate=cfg["lr"], max_steps=cfg["updates"], per_device_train_batch_size=per_update,
            gradient_accumulation_steps=1, num_generations=cfg["k"],
            steps_per_generation=cfg["steps_per_generation"], max_completion_length=cfg["max_new_tokens"],
            temperature=0.7, importance_sampling_level=level, logging_steps=1, save_strategy="no",
            lr_scheduler_type="constant", warmup_steps=0, disable_tqdm=True,
            **({"loss_type": "grpo", "epsilon": 3e-4, "epsilon_high": 4e-4} if level == "sequence" else {}))
        data = Dataset.from_list([{"prompt": [{"role": "user", "content": it.text}]} for it in items])
        trainer = GRPOTrainer(model=resolve_model(None), reward_funcs=[reward], args=args,
                              train_dataset=data, processing_class=copy.deepcopy(tok))
        t0 = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - t0
        model = trainer.model.eval()
    history = [h for h in trainer.state.log_history if "reward" in h]
    return {"wall_s": wall, "train_reward_per_round": [h["reward"] for h in history],
            "tokens_generated": count["generated"], "tokens_trained": count["trained"],
            "completions": count["completions"], "updates": cfg["updates"],
            "importance_sampling_level": level, "held_out": held_out(model, tok, test, ranker, cfg)}


def markdown(result: dict[str, Any]) -> str:
    """The results as a markdown table (one row per method)."""
    b = result["before"]
    lines = ["| method | updates | wall s | tokens generated | tokens trained | held-out greedy "
             "reward | greedy correct | greedy format |", "|---|---|---|---|---|---|---|---|",
             f"| reference (before) | 0 | — | — | — | {b['greedy_reward']:.3f} | "
             f"{b['greedy_correct']:.3f} | {b['greedy_format']:.3f} |"]
    for name, r in result["methods"].items():
        if "error" in r:
            lines.append(f"| {name} | failed: {r['error'][:120]} |  |  |  |  |  |  |")
            continue
        h = r["held_out"]
        lines.append(f"| {name} | {r['updates']} | {r['wall_s']:.0f} | {r['tokens_generated']} | "
                     f"{r['tokens_trained']} | {h['greedy_reward']:.3f} | {h['greedy_correct']:.3f} | "
                     f"{h['greedy_format']:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = c.evidence_parser(__doc__, c.results_of(__file__), "the JSON", threads=2).parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = settings(args.quick)
    model, tok = smol.load_smol()
    ranker = smol.rule_ranker()
    items = smol.make_items(tok, cfg["train_prompts"] + cfg["test_prompts"], cfg["seed"] + 7)
    train_items, test_items = items[:cfg["train_prompts"]], items[cfg["train_prompts"]:]
    result: dict[str, Any] = {"experiment": "online_rl", "quick": args.quick, "settings": cfg,
                              "environment": c.environment(),
                              "before": held_out(model, tok, test_items, ranker, cfg), "methods": {}}
    result["methods"]["offline_gspo"] = offline(model, tok, train_items, test_items, ranker, cfg)
    c.log(f"offline: {result['methods']['offline_gspo']}")
    for name, level in (("grpo", "token"), ("grpo_sequence_is", "sequence")):
        try:
            result["methods"][name] = grpo(tok, train_items, test_items, ranker, cfg, level)
        except Exception as e:  # reported in the results: the point is to say what failed
            result["methods"][name] = {"error": f"{type(e).__name__}: {e}",
                                       "traceback": traceback.format_exc()[-3000:]}
        c.log(f"{name}: {result['methods'][name]}")
    name = "online_rl_quick" if args.quick else "online_rl"
    c.write_json(args.out / f"{name}.json", result)
    (args.out / f"{name}_table.md").write_text(markdown(result) + "\n", encoding="utf-8")
    return result


if __name__ == "__main__":
    main()
