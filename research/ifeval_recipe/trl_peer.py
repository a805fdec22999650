"""TRL's ``DPOTrainer`` as a TRL user runs it on grouppref's data: the study's peer.

The groups are exported the way the docs tell a TRL user to (``grouppref export RUN --format
trl-pairs --pairs best_worst|consensus --chat always``: chat turns, so TRL applies the same
chat template the package's trainer does), then ``DPOTrainer`` trains the same start model
with the same optimizer settings as the package's runs: AdamW at a constant rate, no warm-up,
gradient clipping at 1.0, dropout off, β, the sigmoid loss, reference log-probs precomputed
(or, with ``precompute_ref=False``, computed per batch by TRL's reference copy: the same values
for only the pairs the steps see, which is what makes the all-pairs run affordable),
in the precision the package's runs use (fp32, or bf16 autocast). Weights are saved at
the curve steps (``save_only_model``), so the curve folders load like any model.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any


def export_pairs(run_dir: Path, pairs: str, work: Path) -> Path:
    """``grouppref export RUN --format trl-pairs --pairs PAIRS --chat always --to DIR``."""
    from grouppref.api import ExportConfig, RunStore, run_export

    target = work / f"pairs-{pairs}"
    if not (target / "dataset_dict.json").exists():
        run_export(RunStore(run_dir), ExportConfig(format="trl-pairs", pairs=pairs,
                                                   chat="always", to_dir=str(target)))
    return target


def train_trl(run_dir: Path, base: str, folder: Path, *, pairs: str, lr: float, seed: int,
              steps: int, batch: int, beta: float, curve: tuple[int, ...], max_new_tokens: int,
              work: Path, device: str = "cpu", bf16: bool = False,
              precompute_ref: bool = True) -> dict[str, Any]:
    """Train with ``DPOTrainer``; the final model in ``folder``, ``folder/step-N`` for the curve.

    ``bf16``: bf16 autocast (on the GPU or the CPU), as the package's trainer runs with
    ``mixed_precision: bf16``; otherwise fp32.

    Returns:
        dict: steps, pairs in the data, tokens trained (prompt twice + both responses per pair,
        as TRL forwards them, times the pairs seen) and the logged training metrics.
    """
    import datasets
    from trl import DPOConfig, DPOTrainer

    from grouppref.api import load_causal_lm, load_tokenizer

    data = datasets.load_from_disk(str(export_pairs(run_dir, pairs, work)))["train"]
    data = data.select_columns(["prompt", "chosen", "rejected"])
    tokenizer = load_tokenizer(base)
    model = load_causal_lm(base).train()
    out = folder / "trl-out"
    gpu = device.startswith("cuda")
    config = DPOConfig(
        output_dir=str(out), use_cpu=not gpu, bf16=bf16, fp16=False, seed=seed, data_seed=seed,
        learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0,
        weight_decay=0.0, beta=beta, loss_type=["sigmoid"], precompute_ref_log_probs=precompute_ref,
        precompute_ref_batch_size=32, per_device_train_batch_size=batch,
        gradient_accumulation_steps=1, max_steps=steps, max_length=256 + max_new_tokens + 1,
        disable_dropout=True, logging_steps=1, save_strategy="steps", save_steps=min(curve),
        save_only_model=True, report_to=[], disable_tqdm=True, dataloader_num_workers=0)
    trainer = DPOTrainer(model=model, args=config, train_dataset=data, processing_class=tokenizer)
    tokenised = trainer.train_dataset
    per_pair = sum(2 * len(r["prompt_ids"]) + len(r["chosen_ids"]) + len(r["rejected_ids"])
                   for r in tokenised) / len(tokenised)
    trainer.train()
    trainer.save_model(str(folder))
    tokenizer.save_pretrained(str(folder))
    for step in curve:
        ckpt = out / f"checkpoint-{step}"
        if ckpt.exists() and step < steps:
            shutil.move(str(ckpt), str(folder / f"step-{step}"))
    history = [x for x in trainer.state.log_history if "loss" in x]
    shutil.rmtree(out, ignore_errors=True)
    return {"steps": trainer.state.global_step, "pairs_in_data": len(data),
            "tokens_per_pair": round(per_pair, 1),
            "tokens_trained": round(per_pair * batch * trainer.state.global_step),
            "tokens_at": {str(s): round(per_pair * batch * s) for s in (*curve, steps)},
            "train_metrics": {k: v for k, v in (history[-1] if history else {}).items()
                              if isinstance(v, int | float)}}
