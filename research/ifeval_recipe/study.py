"""The recipe study (issue 28): which loss, at its own tuned learning rate, trains the real
embedded model best from ranked groups, with TRL's ``DPOTrainer`` itself as the peer.

Phases, each resumable (``OUT/results.json`` is rewritten after every task; a restart with
the same command skips every finished task):

1. **data** (``DATA``, meant to be committed): prompts from :mod:`research.ifeval_cpu.build` in
   three splits with disjoint topics (train; ``val`` for choosing learning rates; ``test``, half
   of it asking for constraint pairs never seen in training), then generate K candidates per
   training prompt with the model itself -> rank with the exact ``constraints`` rule ->
   aggregate -> validate, with the package's stages (``research/ifeval_cpu/pipeline.yaml``).
2. **screen**: every method (:data:`METHODS`) at every learning rate of the grid, seed 0, at
   equal optimizer steps and batch; each trained model and its checkpoints at the curve steps
   are evaluated greedily on ``val``. The learning rate with the best final ``val`` rate is the
   method's (ties: the smaller rate).
3. **seeds**: each method at its chosen rate for every seed, evaluated on ``test`` (greedy +
   the scale's S samples, constraint checks, KL to the start, answer length); seed 0 reuses the
   screen's model and also evaluates its curve checkpoints on ``test`` (greedy). ``--seeds N``
   adds seeds to a finished study and ``--samples S`` evaluates S sampled answers per prompt
   (and the KL along them) as a task of its own, ``eval:test:sampled:NAME``, for every seed
   whose model is on disk (a seed trained in this run; an earlier run's deleted models are not
   re-trained for it, and the tables say how many seeds each sampled rate rests on).

Methods train through :func:`grouppref.train.policy.trainer.train` (``engine: grouppref``) or through
TRL's ``DPOTrainer`` on what ``grouppref export --format trl-pairs`` writes
(``engine: trl``; :mod:`research.ifeval_recipe.trl_peer`). Progress goes to stderr with timestamps.

    python -m research.ifeval_recipe.study --data research/ifeval_recipe/results --out /work/study \\
        --scale cpu --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from research.ifeval_cpu.build import build, write_jsonl
from research.ifeval_cpu.experiment import (
    Log,
    _free_memory,
    base_model,
    compact,
    run_data_stages,
    stage_counts,
    tokens_per_group,
)

# in the order they run: the default and the peer first, so a session cut short keeps the
# main comparison; "train" holds TrainConfig fields, "pairs" the trl-pairs export's --pairs
METHODS: dict[str, dict[str, Any]] = {
    "gspo_soft": {"engine": "grouppref", "train": {"loss": "gspo"}},
    "trl_dpo": {"engine": "trl", "pairs": "best_worst"},
    "gspo_hard": {"engine": "grouppref", "train": {"loss": "gspo", "pair_targets": "hard"}},
    "lipo": {"engine": "grouppref", "train": {"loss": "lipo"}},
    "nca": {"engine": "grouppref", "train": {"loss": "nca"}},
    "sft": {"engine": "grouppref", "train": {"loss": "sft"}},
    "plackett_luce": {"engine": "grouppref", "train": {"loss": "plackett_luce"}},
    "infonca": {"engine": "grouppref", "train": {"loss": "infonca"}},
    # every consensus pair at the peer's safe rate, reference log-probs per batch: precomputing
    # them for all 2,158 pairs costs more than the 32 steps see
    "trl_dpo_all": {"engine": "trl", "pairs": "consensus", "seeds": 1, "lrs": [1e-5],
                    "ref": "per_batch"},
    # the peer at the grid's smallest rate: TRL's chosen 1e-4 (best on val at seed 0) collapsed
    # to empty answers on some test seeds, so the group losses are also compared with a TRL run
    # that does not
    "trl_dpo_1e5": {"engine": "trl", "pairs": "best_worst", "lrs": [1e-5]},
    "dpo": {"engine": "grouppref", "train": {"loss": "dpo"}},  # ours, beside TRL's
}


@dataclass(frozen=True)
class Scale:
    """Sizes of one study."""

    train: int
    val: int
    test: int
    k: int
    seeds: int
    steps: int
    batch: int
    pair_batch_all: int  # pairs per step of trl_dpo_all (4 groups' worth of candidate reads)
    samples: int
    max_new_tokens: int
    curve: tuple[int, ...]
    lrs: tuple[float, ...]
    gen_batch: int = 64
    shard: int = 16
    chunk: int = 50
    beta: float = 0.1
    temperature: float = 0.7
    held_out_topics: int = 40
    val_topics: int = 20
    screen_curve: bool = True  # the screen also evaluates its curve checkpoints on val


SCALES = {
    # sized for the 2-core CPU machine: 256 training prompts (2,048 candidates), 128 val and
    # 300 test prompts; 32 steps of 4 groups; curve points at 8 steps (equal candidate tokens:
    # a K=8 group loss at 8 steps reads as many candidates as a pair loss at 32) and 16
    "cpu": Scale(train=256, val=128, test=300, k=8, seeds=3, steps=32, batch=4,
                 pair_batch_all=16, samples=4, max_new_tokens=48, curve=(8, 16),
                 lrs=(1e-5, 3e-5, 1e-4)),
    # one CPU session (~2 h of the 2 cores with bf16 training for the first three methods):
    # the same data, steps and rates as "cpu"; test answers greedy only (the KL along them),
    # and the curve is evaluated on test (seed 0) only
    "cpu-short": Scale(train=256, val=128, test=300, k=8, seeds=3, steps=32, batch=4,
                       pair_batch_all=16, samples=0, max_new_tokens=48, curve=(8, 16),
                       lrs=(1e-5, 3e-5, 1e-4), screen_curve=False),
    # smoke: the plumbing in minutes (tests); the large rate moves a tiny model in 2 steps
    "smoke": Scale(train=12, val=3, test=3, k=3, seeds=2, steps=2, batch=2, pair_batch_all=2,
                   samples=1, max_new_tokens=12, curve=(1,), lrs=(1e-3, 5e-3), gen_batch=12,
                   shard=6, chunk=3, held_out_topics=4, val_topics=4),
}


def make_data(base: str, data: Path, scale: Scale, device: str) -> dict[str, Any]:
    """Prompts (three splits) in ``data/prompts``; the training groups in ``data/run``."""
    from grouppref.api import RunStore

    train, test, val = build(scale.train, scale.test, seed=0,
                             held_out_topics=scale.held_out_topics, n_val=scale.val,
                             val_topics=scale.val_topics)
    changed = False
    for name, rows in (("train", train), ("val", val), ("test", test)):
        path = data / "prompts" / f"{name}.jsonl"
        if not path.exists() or path.read_text() != "".join(json.dumps(r, ensure_ascii=False)
                                                            + "\n" for r in rows):
            write_jsonl(path, rows)
            changed = True
    prompts = {"train": len(train), "val": len(val), "test": len(test)}
    done = RunStore(data / "run").manifest("validate")
    if not changed and done is not None and done.status == "complete":
        # committed data with unchanged prompts is the study's input as it stands: the model's
        # input fingerprint (a hash of the files the GGUF is converted into) need not match on
        # another machine, and re-generating would change the data later sessions continue on
        return {"stage_counts": stage_counts(data / "run"), "prompts": prompts}
    counts = run_data_stages(base, data / "run", data / "prompts" / "train.jsonl", scale, device)
    return {"stage_counts": counts, "prompts": prompts}


def read_split(data: Path, name: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (data / "prompts" / f"{name}.jsonl").read_text().splitlines()]


# settings that decide how many tasks run, not what a task computes (each sampled evaluation's
# spec holds its S): a study re-run with more seeds or samples keeps its finished tasks
RUN_ONLY = ("seeds", "samples")


def _task_settings(settings: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in json.loads(json.dumps(settings)).items() if k not in RUN_ONLY}


class Results:
    """``results.json``: finished tasks by name, rewritten atomically after each one.

    A task's record keeps the settings it ran with (``spec``), so a method whose settings
    changed since is run again and the others are kept when :data:`METHODS` grows. Tasks of a
    file whose scale settings differ (but for :data:`RUN_ONLY`) are dropped.
    """

    def __init__(self, path: Path, header: dict[str, Any]) -> None:
        self.path = path
        self.data: dict[str, Any] = {**header, "tasks": {}}
        if path.exists():
            old = json.loads(path.read_text())
            if _task_settings(old.get("scale_settings", {})) == _task_settings(
                    header["scale_settings"]):
                self.data["tasks"] = old.get("tasks", {})
                self.data["chosen_lr"] = old.get("chosen_lr", {})

    def get(self, name: str, spec: dict[str, Any]) -> dict[str, Any] | None:
        task = self.data["tasks"].get(name)
        return task if task is not None and task.get("spec") == spec else None

    def put(self, name: str, record: dict[str, Any]) -> None:
        self.data["tasks"][name] = record
        self.save()

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data) + "\n")
        tmp.replace(self.path)


def lr_tag(lr: float) -> str:
    return f"{lr:.0e}".replace("e-0", "e-")


class Study:
    """The phases in order (module docstring)."""

    def __init__(self, args: argparse.Namespace, scale: Scale, log: Log) -> None:
        self.args, self.scale, self.log = args, scale, log
        self.out: Path = args.out
        self.data_dir: Path = args.data
        self.n_seeds: int = args.seeds or scale.seeds
        self.n_samples: int = args.samples or 0  # the scale's own S are in the full evaluation

    # -- set-up ---------------------------------------------------------------------------
    def setup(self) -> None:
        from grouppref.api import load_causal_lm, load_groups, load_tokenizer

        a = self.args
        self.base = base_model(a.model, self.out)
        t = time.time()
        info = make_data(self.base, self.data_dir, self.scale, a.device)
        info["seconds"] = round(time.time() - t, 1)
        self.log(f"data: {info}")
        self.groups = load_groups(self.data_dir / "run").groups
        self.splits = {s: read_split(self.data_dir, s) for s in ("val", "test")}
        self.tokenizer = load_tokenizer(self.base, padding_side="left")
        self.reference = load_causal_lm(self.base, device=a.device)
        self.results = Results(self.out / "results.json", {
            "study": "recipe", "scale": a.scale, "scale_settings": asdict(self.scale),
            "seeds_run": self.n_seeds, "samples_run": self.n_samples,
            "methods": METHODS, "model": a.model or "embedded", "device": a.device,
            "data": info, "prompts": {s: [{"prompt_id": p["prompt_id"],
                                           "kinds": p["metadata"]["kinds"].split("+")}
                                          for p in rows] for s, rows in self.splits.items()}})

    # -- evaluation -----------------------------------------------------------------------
    def evaluate(self, model: Any, split: str, name: str, *, full: bool,
                 samples: int | None = None, reference: bool = True) -> list[dict[str, Any]]:
        """Greedy on ``split``; ``full``: also ``samples`` (default: the scale's S) sampled
        answers and (``reference``) the KL to the start."""
        from research.ifeval_cpu.evaluate import evaluate

        samples = self.scale.samples if samples is None else samples
        models = ([model] if model is self.reference or not full or not reference
                  else [model, self.reference])
        got = evaluate(models, self.tokenizer, self.splits[split],
                       samples=samples if full else 0,
                       temperature=self.scale.temperature,
                       max_new_tokens=self.scale.max_new_tokens, seed=0,
                       chunk=self.scale.chunk, device=self.args.device)
        folder = self.out / "evals" / split
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in got))
        return compact(got)

    def eval_task(self, name: str, spec: dict[str, Any], model_dir: Path | None, split: str,
                  full: bool) -> dict[str, Any]:
        """Evaluate a saved model (None: the start) once; cached in results.json."""
        from grouppref.api import load_causal_lm
        from research.ifeval_cpu.report import run_summary

        key = f"eval:{split}:{'full' if full else 'greedy'}:{name}"
        spec = {**spec, "split": split, "full": full}
        if (done := self.results.get(key, spec)) is not None:
            return done
        t = time.time()
        model = self.reference if model_dir is None else load_causal_lm(
            str(model_dir), device=self.args.device)
        record = {"spec": spec, "per_prompt": self.evaluate(model, split, name, full=full),
                  "seconds": round(time.time() - t, 1)}
        del model
        _free_memory()
        self.results.put(key, record)
        s = run_summary(record)
        self.log(f"{key}: greedy {s['greedy']:.3f} all-met {s['greedy_all']:.3f} "
                 f"sampled {s['sampled']:.3f} KL {s['kl']:.2f} ({record['seconds']}s)")
        return record

    def sampled_task(self, name: str, spec: dict[str, Any], model_dir: Path | None) -> None:
        """``--samples S`` answers per test prompt at the scale's temperature
        (``eval:test:sampled:NAME``; the greedy answer is decoded again beside them). No KL
        along them: the reference's lockstep pass would double the cost, and the KL along the
        greedy answer is in the full evaluation. Cached in results.json; skipped when the
        model is not on disk."""
        from grouppref.api import load_causal_lm
        from research.ifeval_cpu.report import run_summary

        key = f"eval:test:sampled:{name}"
        spec = {**spec, "split": "test", "samples": self.n_samples,
                "temperature": self.scale.temperature}
        if self.results.get(key, spec) is not None or (
                model_dir is not None and not (model_dir / "config.json").exists()):
            return
        t = time.time()
        model = self.reference if model_dir is None else load_causal_lm(
            str(model_dir), device=self.args.device)
        answers = self.evaluate(model, "test", f"{name}.sampled", full=True,
                                samples=self.n_samples, reference=False)
        record = {"spec": spec, "per_prompt": answers, "seconds": round(time.time() - t, 1)}
        del model
        _free_memory()
        self.results.put(key, record)
        s = run_summary(record)
        self.log(f"{key}: sampled {s['sampled']:.3f} all-met {s['sampled_all']:.3f} "
                 f"({record['seconds']}s)")

    # -- training -------------------------------------------------------------------------
    def spec(self, method: str, lr: float, seed: int) -> dict[str, Any]:
        spec = {"method": METHODS[method], "lr": lr, "seed": seed, "steps": self.scale.steps}
        if self.args.mixed_precision != "no":  # fp32 runs keep the key set they had
            spec["mixed_precision"] = self.args.mixed_precision
        return spec

    def train_task(self, method: str, lr: float, seed: int) -> tuple[str, Path]:
        """Train once (cached): the final model in ``models/NAME``, curve models beside it."""
        from research.ifeval_recipe.trl_peer import train_trl

        name = f"{method}-lr{lr_tag(lr)}-seed{seed}"
        folder = self.out / "models" / name
        spec = self.spec(method, lr, seed)
        if self.results.get(f"train:{name}", spec) is not None and (folder / "config.json").exists():
            return name, folder
        shutil.rmtree(folder, ignore_errors=True)
        t = time.time()
        m = METHODS[method]
        if m["engine"] == "trl":
            batch = self.scale.pair_batch_all if m["pairs"] == "consensus" else self.scale.batch
            info = train_trl(self.data_dir / "run", self.base, folder, pairs=m["pairs"], lr=lr,
                             seed=seed, steps=self.scale.steps, batch=batch,
                             beta=self.scale.beta, curve=self.scale.curve,
                             max_new_tokens=self.scale.max_new_tokens, work=self.out / "trl",
                             device=self.args.device, bf16=self.args.mixed_precision == "bf16",
                             precompute_ref=m.get("ref") != "per_batch")
        else:
            info = self._train_grouppref(m["train"], lr, seed, folder)
        _free_memory()
        self.results.put(f"train:{name}", {"spec": spec, **info,
                                           "seconds": round(time.time() - t, 1)})
        self.log(f"train:{name} done in {time.time() - t:.0f}s ({info.get('tokens_trained')} tokens)")
        return name, folder

    def _train_grouppref(self, fields: dict[str, Any], lr: float, seed: int, folder: Path
                         ) -> dict[str, Any]:
        from grouppref.api import DataConfig, TrainConfig, train
        from research.ifeval_recipe.curve import save_curve_models

        s = self.scale
        config = TrainConfig(model=self.base, **fields, lr=lr, beta=s.beta, max_steps=s.steps,
                             batch_size=s.batch, seed=seed, lr_scheduler="constant",
                             logging_steps=1, eval_batch_size=32,
                             save_steps=min(s.curve), save_total_limit=len(s.curve) + 2,
                             mixed_precision=self.args.mixed_precision,
                             data=DataConfig(max_prompt_length=256,
                                             max_response_length=s.max_new_tokens + 1))
        per_group = tokens_per_group(config, self.groups, self.tokenizer)
        stats = train(config, self.groups, folder, reference_cache=self.out / "reference").stats
        save_curve_models(folder, self.base, s.curve)
        return {"steps": stats.steps, "train_metrics": stats.train,
                "tokens_per_group": round(per_group, 1),
                "tokens_trained": round(per_group * s.batch * stats.steps),
                "tokens_at": {str(n): round(per_group * s.batch * n) for n in (*s.curve, s.steps)}}

    # -- the phases -----------------------------------------------------------------------
    def chosen_lr(self, method: str) -> float | None:
        """The screen's best final val rate (ties: the smaller rate); None until all ran."""
        from research.ifeval_cpu.report import run_summary

        scores = []
        for lr in self.lrs(method):
            name = f"{method}-lr{lr_tag(lr)}-seed0"
            got = self.results.data["tasks"].get(f"eval:val:greedy:{name}")
            if got is None:
                return None
            scores.append((-run_summary(got)["greedy"], lr))
        return min(scores)[1]

    def evaluated(self, name: str, spec: dict[str, Any], split: str, full: bool,
                  curve: bool) -> bool:
        """Whether the run ``name`` has its evaluation on ``split`` (and its curve points)."""
        keys = [(f"eval:{split}:{'full' if full else 'greedy'}:{name}", full, {})]
        if curve:
            keys += [(f"eval:{split}:greedy:{name}@{n}", False, {"at": n}) for n in self.scale.curve]
        return all(self.results.get(key, {**spec, **extra, "split": split, "full": f})
                   is not None for key, f, extra in keys)

    def lrs(self, method: str) -> tuple[float, ...]:
        """The method's learning-rate grid: its own ``lrs`` or the scale's."""
        return tuple(METHODS[method].get("lrs", self.scale.lrs))

    def screen(self, method: str) -> None:
        for lr in self.lrs(method):
            name, spec = f"{method}-lr{lr_tag(lr)}-seed0", self.spec(method, lr, 0)
            if self.evaluated(name, spec, "val", full=False, curve=self.scale.screen_curve):
                continue  # a restart: its model may be gone, its results are kept
            name, folder = self.train_task(method, lr, 0)
            self.eval_task(name, spec, folder, "val", full=False)
            for step in self.scale.curve if self.scale.screen_curve else ():
                curve = folder / f"step-{step}"
                if curve.exists():
                    self.eval_task(f"{name}@{step}", {**spec, "at": step}, curve, "val", False)

    def seeds(self, method: str) -> None:
        lr = self.chosen_lr(method)
        if lr is None:
            return
        self.results.data["chosen_lr"] = {**self.results.data.get("chosen_lr", {}), method: lr}
        self.results.save()
        for other in self.lrs(method):  # the screen's other models are no longer needed
            if other != lr and not self.args.keep_models:
                shutil.rmtree(self.out / "models" / f"{method}-lr{lr_tag(other)}-seed0",
                              ignore_errors=True)
        for seed in range(METHODS[method].get("seeds", self.n_seeds)):
            name, spec = f"{method}-lr{lr_tag(lr)}-seed{seed}", self.spec(method, lr, seed)
            folder = self.out / "models" / name
            if self.evaluated(name, spec, "test", full=True, curve=seed == 0):
                if self.n_samples:  # a model kept from before (seed 0, --keep-models)
                    self.sampled_task(name, spec, folder)
                continue
            name, folder = self.train_task(method, lr, seed)
            self.eval_task(name, spec, folder, "test", full=True)
            if self.n_samples:
                self.sampled_task(name, spec, folder)
            if seed == 0:
                for step in self.scale.curve:
                    if (folder / f"step-{step}").exists():
                        self.eval_task(f"{name}@{step}", {**spec, "at": step},
                                       folder / f"step-{step}", "test", False)
            if not self.args.keep_models and seed > 0:
                shutil.rmtree(folder, ignore_errors=True)

    def run(self, phases: list[str], methods: list[str]) -> None:
        self.setup()
        if "data" in phases and len(phases) == 1:
            return
        self.eval_task("base", {"method": "base"}, None, "val", full=False)
        if "seeds" in phases:
            self.eval_task("base", {"method": "base"}, None, "test", full=True)
            if self.n_samples:
                self.sampled_task("base", {"method": "base"}, None)
        for method in methods:  # one method whole before the next: a cut-short run keeps
            if "screen" in phases:  # complete comparisons
                self.screen(method)
            if "seeds" in phases:
                self.seeds(method)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="A .gguf, model folder or Hub id "
                    "(default: the embedded SmolLM2).")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--data", type=Path, required=True, help="Prompts and the generated, ranked "
                    "groups (committed, so a later session continues on the same data).")
    ap.add_argument("--out", type=Path, required=True, help="Models, evaluations, results.json.")
    ap.add_argument("--scale", choices=sorted(SCALES), default="cpu")
    ap.add_argument("--phases", default="data,screen,seeds")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--seeds", type=int, default=None, help="Training seeds per method on test "
                    "(default: the scale's); more seeds extend a finished study.")
    ap.add_argument("--samples", type=int, default=None, help="Sampled test answers per prompt, "
                    "a task of its own per seed whose model is on disk, for a scale whose test "
                    "evaluation is greedy only (cpu-short).")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--mixed-precision", choices=("no", "bf16"), default=None,
                    help="Training precision of both engines (default: bf16 on a GPU, fp32 on "
                    "the CPU). bf16 autocast on a CPU with AMX trains ~2.3x faster; evaluation "
                    "stays fp32.")
    ap.add_argument("--keep-models", action="store_true")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    if args.mixed_precision is None:
        args.mixed_precision = "bf16" if args.device.startswith("cuda") else "no"
    for key, value in (("TRANSFORMERS_VERBOSITY", "error"), ("HF_HUB_OFFLINE", "1"),
                       ("HF_HUB_DISABLE_PROGRESS_BARS", "1")):
        os.environ.setdefault(key, value)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    methods = [m for m in args.methods.split(",") if m]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        sys.exit(f"unknown method(s) {unknown}; known: {', '.join(METHODS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    log = Log()
    log(f"recipe study, scale {args.scale}, phases {args.phases}, methods {methods}")
    Study(args, SCALES[args.scale], log).run(args.phases.split(","), methods)
    log(f"done in {log.elapsed():.0f}s")


if __name__ == "__main__":
    main()
