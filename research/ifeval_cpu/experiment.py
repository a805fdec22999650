"""The IFEval-style experiment end to end, in one process (research/ifeval_cpu/README.md).

1. Prompts: :mod:`research.ifeval_cpu.build` (train and held-out topics/constraint pairs).
2. Data with the package's own stages (``research/ifeval_cpu/pipeline.yaml`` through
   :func:`grouppref.runner.run_pipeline`): generate K candidates with the model itself -> rank
   with the rule check ``constraints`` -> aggregate -> validate.
3. Train every method (:data:`METHODS`) for every seed with :func:`grouppref.train.policy.trainer.train`
   at equal optimizer steps and batch size (tokens trained per method are reported), constant
   learning rate; then seed 0 again at fewer steps for the learning curve (with a constant rate
   and the same seed, a shorter run is the prefix of the longer one).
4. Evaluate the untrained model and every trained one on the held-out prompts
   (:mod:`research.ifeval_cpu.evaluate`: greedy + S samples, constraint checks, KL to the start).

Work is done in priority order (untrained, then each seed's methods, then the curve) under a
time budget: a task that would not fit is recorded as skipped. ``DIR/results.json`` is
rewritten after every task, so a run cut short still leaves its data; progress goes to stderr
with timestamps; the end prints the markdown tables of :mod:`research.ifeval_cpu.report`.

    python -m research.ifeval_cpu.experiment --model SmolLM2-135M-Instruct.Q4_1.gguf \\
        --device cuda --out runs/ifeval-exp --scale full
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from research.ifeval_cpu.build import build, write_jsonl

PIPELINE = Path(__file__).with_name("pipeline.yaml")
# in the order they run within a seed: the default loss and the two baselines first, so a
# budget that cuts a seed short keeps the main comparison
METHODS: dict[str, dict[str, Any]] = {
    "gspo_soft": {"loss": "gspo"},
    "dpo": {"loss": "dpo"},
    "sft": {"loss": "sft"},
    "gspo_hard": {"loss": "gspo", "pair_targets": "hard"},
    "plackett_luce": {"loss": "plackett_luce"},
}


@dataclass(frozen=True)
class Scale:
    """Sizes of one experiment."""

    train: int
    test: int
    k: int
    seeds: int
    steps: int
    batch: int
    samples: int
    max_new_tokens: int
    curve: tuple[int, ...]
    gen_batch: int
    shard: int
    chunk: int
    lr: float = 2e-5
    beta: float = 0.1
    temperature: float = 0.7


SCALES = {
    "full": Scale(train=1000, test=300, k=8, seeds=3, steps=100, batch=8, samples=4,
                  max_new_tokens=48, curve=(25, 50), gen_batch=512, shard=128, chunk=100),
    # cpu: what fits ~75 min of a 2-core machine shared with other jobs (one torch thread,
    # measured 2026-12-01: ~0.35 CPU-s per decoded row per model, ~15 CPU-s per GSPO step of 4
    # groups at K=8, ~4 for DPO); greedy only (samples=0: KL along the greedy answer)
    "cpu": Scale(train=96, test=150, k=8, seeds=3, steps=12, batch=4, samples=0,
                 max_new_tokens=48, curve=(4,), gen_batch=64, shard=16, chunk=50, lr=5e-5),
    # smoke: the plumbing on a CPU in minutes; its rate moves a tiny model in 2 steps, so a
    # KL > 0 shows the trained model (not the start) is what gets evaluated
    "smoke": Scale(train=24, test=4, k=3, seeds=1, steps=2, batch=2, samples=2,
                   max_new_tokens=16, curve=(1,), gen_batch=24, shard=8, chunk=4, lr=5e-3),
}


class Log:
    """Timestamped progress lines on stderr."""

    def __init__(self) -> None:
        self.t0 = time.time()

    def elapsed(self) -> float:
        return time.time() - self.t0

    def __call__(self, message: str) -> None:
        stamp = time.strftime("%H:%M:%S", time.gmtime())
        print(f"[{stamp} +{self.elapsed():6.1f}s] {message}", file=sys.stderr, flush=True)


class Results:
    """The one results file, rewritten atomically after every task.

    Resuming: when ``path`` already holds a run of the same experiment (same scale settings,
    methods, model and held-out prompts), its finished runs are kept and :meth:`done` names
    them, so a restarted experiment skips them; anything else is started afresh (the old file
    is kept as ``results.json.old``). Skipped tasks are forgotten: a restart tries them again.
    """

    KEYS = ("scale_settings", "methods", "model", "prompts")

    def __init__(self, path: Path, header: dict[str, Any]) -> None:
        self.path, self.data = path, {**header, "runs": [], "skipped": []}
        self.resumed = 0
        if path.exists():
            old = json.loads(path.read_text())
            same = all(old.get(k) == json.loads(json.dumps(header[k])) for k in self.KEYS)
            if same:
                self.data["runs"], self.resumed = old["runs"], len(old["runs"])
            else:
                shutil.copyfile(path, path.with_name(path.name + ".old"))

    def done(self, name: str) -> bool:
        """Whether the run called ``name`` (see :func:`run_name`) is already recorded."""
        return any(run_name(r["method"], r["seed"], r["steps"]) == name
                   for r in self.data["runs"])

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data) + "\n")
        tmp.replace(self.path)


def run_name(method: str, seed: int | None, steps: int) -> str:
    """A run's name in the log, ``skipped`` and ``evals/``: ``base`` for the untrained model."""
    return "base" if method == "base" else f"{method}-seed{seed}-steps{steps}"


def base_model(model: str | None, out: Path) -> str:
    """A model folder: a ``.gguf`` file is dequantised once into ``out/base``."""
    from grouppref.api import convert_gguf, resolve_model

    if model and model.endswith(".gguf"):
        target = out / "base"
        if not (target / "config.json").exists():
            convert_gguf(Path(model).resolve(), target)
        return str(target)
    return resolve_model(model)


class DataScale(Protocol):
    """The sizes the data stages read from a scale (this module's and the study's)."""

    k: int
    gen_batch: int
    shard: int
    max_new_tokens: int
    temperature: float


DATA_STAGES = ("generate", "rank", "aggregate", "validate")


def run_data_stages(base: str, run_dir: Path, prompts: Path, scale: DataScale,
                    device: str) -> dict[str, Any]:
    """generate -> rank -> aggregate -> validate of ``prompts`` into ``run_dir`` with the
    package's stages (``pipeline.yaml``, sized by ``scale``); returns each stage's counts."""
    import yaml

    from grouppref.api import RunConfig, run_pipeline

    data = yaml.safe_load(PIPELINE.read_text(encoding="utf-8"))
    data["run_dir"] = str(run_dir)
    data["prompts"]["source"] = str(prompts)
    data["generate"].update(k=scale.k, batch_size=scale.gen_batch, shard_size=scale.shard,
                            max_new_tokens=scale.max_new_tokens, device=device,
                            temperature=scale.temperature, models=[{"name": base}])
    data["report"] = None
    run_pipeline(RunConfig.model_validate(data), until="validate")
    return stage_counts(run_dir)


def stage_counts(run_dir: Path) -> dict[str, Any]:
    """Each data stage's counts (inputs, outputs, rejected, partial) in ``run_dir``."""
    from grouppref.api import RunStore

    store = RunStore(run_dir)
    return {stage: store.require(stage).counts.model_dump() for stage in DATA_STAGES}


def make_data(base: str, out: Path, scale: Scale, device: str) -> tuple[list[Any], dict[str, Any]]:
    """Prompts, then the data stages (:func:`run_data_stages`)."""
    from grouppref.api import load_groups

    train, test = build(scale.train, scale.test, seed=0, held_out_topics=40)
    write_jsonl(out / "prompts" / "train.jsonl", train)
    write_jsonl(out / "prompts" / "test.jsonl", test)
    info = run_data_stages(base, out / "run", out / "prompts" / "train.jsonl", scale, device)
    source = load_groups(out / "run")
    return source.groups, {"stage_counts": info, "groups": len(source.groups),
                           "train_prompts": len(train), "test_prompts": len(test)}


def train_config(method: str, seed: int, steps: int, base: str, scale: Scale, device: str) -> Any:
    from grouppref.api import DataConfig, TrainConfig

    return TrainConfig(model=base, **METHODS[method], lr=scale.lr, beta=scale.beta,
                       max_steps=steps, batch_size=scale.batch, seed=seed,
                       lr_scheduler="constant", logging_steps=steps, eval_batch_size=32,
                       mixed_precision="bf16" if device.startswith("cuda") else "no",
                       data=DataConfig(max_prompt_length=256,
                                       max_response_length=scale.max_new_tokens + 1))


def tokens_per_group(config: Any, groups: list[Any], tokenizer: Any) -> float:
    """Mean tokens one training group contributes under ``config.loss`` (prompt once + the
    candidates the loss reads), as the trainer counts them."""
    from grouppref.api import split_groups

    train_set, _, _ = split_groups(groups, tokenizer, config)
    total = sum(len(g.prompt_ids) + sum(len(c) for c in g.cand_ids) for g in train_set)
    return total / len(train_set)


def compact(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per prompt: the greedy answer's checks, each sample's checks, KL and greedy length."""
    return [{"g": [int(m) for m in r["greedy"]["met"]],
             "s": [[int(m) for m in a["met"]] for a in r["samples"]],
             "kl": [a["kl"] or 0.0 for a in r["samples"]], "kl_g": r["greedy"]["kl"] or 0.0,
             "len_g": r["greedy"]["tokens"]} for r in results]


class Experiment:
    """Runs the tasks in priority order under the time budget (see the module docstring)."""

    def __init__(self, args: argparse.Namespace, scale: Scale, log: Log) -> None:
        self.args, self.scale, self.log = args, scale, log
        self.out: Path = args.out
        self.longest = 0.0  # the longest train+eval task so far: the estimate of the next

    def setup(self) -> None:
        from grouppref.api import load_causal_lm, load_tokenizer

        a = self.args
        self.log(f"model {a.model or 'embedded'} -> folder")
        self.base = base_model(a.model, self.out)
        self.log(f"data: {self.scale.train} train / {self.scale.test} held-out prompts, "
                 f"K={self.scale.k}, generate on {a.device}")
        t = time.time()
        self.groups, data_info = make_data(self.base, self.out, self.scale, a.device)
        data_info["seconds"] = round(time.time() - t, 1)
        self.log(f"data done: {data_info}")
        self.test = [json.loads(line) for line in
                     (self.out / "prompts" / "test.jsonl").read_text().splitlines()]
        self.tokenizer = load_tokenizer(self.base, padding_side="left")
        self.reference = load_causal_lm(self.base, device=a.device)
        self.results = Results(self.out / "results.json", {
            "experiment": "ifeval", "scale": a.scale, "scale_settings": asdict(self.scale),
            "methods": METHODS, "model": a.model or "embedded", "device": a.device,
            "machine": _machine(a.device), "data": data_info,
            "prompts": [{"prompt_id": p["prompt_id"], "kinds": p["metadata"]["kinds"].split("+")}
                        for p in self.test]})
        if self.results.resumed:
            self.log(f"resuming: {self.results.resumed} finished runs kept from results.json")
            self.longest = max((r["train_seconds"] + r["eval_seconds"]
                                for r in self.results.data["runs"] if r["method"] != "base"),
                               default=0.0)
        self.results.save()

    def evaluate(self, model: Any, name: str) -> list[dict[str, Any]]:
        from research.ifeval_cpu.evaluate import evaluate

        models = [self.reference] if model is self.reference else [model, self.reference]
        got = evaluate(models, self.tokenizer, self.test, samples=self.scale.samples,
                       temperature=self.scale.temperature,
                       max_new_tokens=self.scale.max_new_tokens, seed=0,
                       chunk=self.scale.chunk, device=self.args.device)
        evals = self.out / "evals"
        evals.mkdir(exist_ok=True)
        (evals / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in got))
        return compact(got)

    def run_base(self) -> None:
        if self.results.done("base"):
            self.log("base: already in results.json (resumed)")
            return
        t = time.time()
        per_prompt = self.evaluate(self.reference, "base")
        self._record({"method": "base", "seed": None, "steps": 0, "tokens_trained": 0,
                      "train_seconds": 0.0, "eval_seconds": round(time.time() - t, 1),
                      "per_prompt": per_prompt})

    def run_trained(self, method: str, seed: int, steps: int) -> None:
        from grouppref.api import load_causal_lm, train

        name = run_name(method, seed, steps)
        if self.results.done(name):
            self.log(f"{name}: already in results.json (resumed)")
            return
        # the next task's time: the longest so far, its training part scaled by the steps
        estimate = self.longest * (0.4 + 0.6 * steps / self.scale.steps)
        if self.longest and self.log.elapsed() + estimate > self.args.budget_s:
            self.log(f"skip {name}: ~{estimate:.0f}s would pass the {self.args.budget_s}s budget")
            self.results.data["skipped"].append(name)
            self.results.save()
            return
        t0 = time.time()
        config = train_config(method, seed, steps, self.base, self.scale, self.args.device)
        per_group = tokens_per_group(config, self.groups, self.tokenizer)
        folder = self.out / "models" / name
        stats = train(config, self.groups, folder, reference_cache=self.out / "reference").stats
        _free_memory()  # the trainer's model, optimizer and autocast wrapper
        t1 = time.time()
        # the saved model, loaded like the reference (float32, no training-time autocast)
        per_prompt = self.evaluate(load_causal_lm(str(folder), device=self.args.device), name)
        t2 = time.time()
        if not self.args.keep_models:
            shutil.rmtree(folder, ignore_errors=True)
        _free_memory()
        self.longest = max(self.longest, t2 - t0)
        self._record({"method": method, "seed": seed, "steps": stats.steps,
                      "tokens_trained": round(per_group * self.scale.batch * stats.steps),
                      "tokens_per_group": round(per_group, 1),
                      "train_seconds": round(t1 - t0, 1), "eval_seconds": round(t2 - t1, 1),
                      "train_metrics": stats.train,
                      "groups": stats.groups.model_dump(), "per_prompt": per_prompt})

    def _record(self, run: dict[str, Any]) -> None:
        from research.ifeval_cpu.report import run_summary

        self.results.data["runs"].append(run)
        self.results.data["elapsed_s"] = round(self.log.elapsed(), 1)
        self.results.save()
        s = run_summary(run)
        self.log(f"{run['method']} seed={run['seed']} steps={run['steps']}: greedy "
                 f"{s['greedy']:.3f} sampled {s['sampled']:.3f} all-met {s['greedy_all']:.3f} "
                 f"KL {s['kl']:.3f} (train {run['train_seconds']}s, eval {run['eval_seconds']}s)")

    def run(self) -> None:
        self.setup()
        self.run_base()
        for seed in range(self.scale.seeds):
            for method in METHODS:
                self.run_trained(method, seed, self.scale.steps)
        for steps in [s for s in self.scale.curve if s < self.scale.steps]:
            for method in METHODS:
                self.run_trained(method, 0, steps)
        self.results.data["finished"] = True
        self.results.data["elapsed_s"] = round(self.log.elapsed(), 1)
        self.results.save()


def _free_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _machine(device: str) -> dict[str, Any]:
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__,
            "cpus": os.cpu_count(), "load": os.getloadavg()[0]}
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def _prepare_torch(device: str, threads: int | None) -> None:
    import torch

    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            sys.exit("--device cuda: torch sees no CUDA GPU here (use --device cpu)")
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if threads:
        torch.set_num_threads(threads)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None,
                    help="A .gguf file, a model folder or Hub id (default: the embedded SmolLM2).")
    ap.add_argument("--device", default="cpu", help="cpu or cuda.")
    ap.add_argument("--out", type=Path, required=True, help="Folder for results.json and all.")
    ap.add_argument("--scale", choices=sorted(SCALES), default="full")
    ap.add_argument("--budget-s", type=float, default=360.0,
                    help="Start no task that would end past this many seconds of the run.")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads.")
    ap.add_argument("--lr", type=float, default=None, help="Learning rate (default: the scale's).")
    ap.add_argument("--steps", type=int, default=None, help="Optimizer steps per run "
                    "(default: the scale's).")
    ap.add_argument("--keep-models", action="store_true", help="Keep every trained model.")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the trainer (accelerate) must stay on the CPU
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    _prepare_torch(args.device, args.threads)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    args.out.mkdir(parents=True, exist_ok=True)
    log = Log()
    log(f"ifeval experiment, scale {args.scale}, device {args.device}, out {args.out}")
    scale = SCALES[args.scale]
    scale = replace(scale, lr=args.lr or scale.lr, steps=args.steps or scale.steps)
    Experiment(args, scale, log).run()
    log(f"done in {log.elapsed():.0f}s: {args.out / 'results.json'}")
    from research.ifeval_cpu.report import markdown, plot

    results = json.loads((args.out / "results.json").read_text())
    plot(results, args.out / "curve.png")
    print(markdown(results))


if __name__ == "__main__":
    main()
