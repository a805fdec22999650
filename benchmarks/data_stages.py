"""The data stages at real size (issue 32): each stage of ``import -> aggregate -> validate ->
export`` (and ``prompts``) on a Nectar-shaped JSONL file against pyarrow reading the same file
and writing it as Parquet (the peer), in one run.

The file: N groups in Nectar's published schema (``prompt``, an Anthropic-style transcript;
``answers``, K ``{answer, model, rank}`` with ~600-character answers and float ranks 1..K;
``turns``, ``num_responses``, ``source``, ``good_natured``), seeded, written once and reused.

Each side runs as its own command in a child process, the way a user runs it
(``python -m grouppref import FILE --out RUN --layout nectar``, ``aggregate RUN``,
``validate RUN``, ``export RUN --parquet DIR``, ``prompts FILE --out RUN``; the peer is
``pyarrow.json.read_json`` + ``pyarrow.parquet.write_table`` of the file), so its wall time
includes the interpreter and its imports and its peak RSS (``os.wait4``) is its own. The peer
runs before the first stage and after every stage; each stage's ratio is its time over the
mean of the two peer runs beside it (the machine's load changes during a run).

Usage::

    .venv/bin/python benchmarks/data_stages.py --groups 20000
    .venv/bin/python benchmarks/data_stages.py --groups 50000 --work /tmp/grouppref-data-bench
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("gpt-4", "gpt-3.5-turbo", "gpt-3.5-turbo-instruct", "llama-2-7b-chat",
          "mistral-7b-instruct", "vicuna-33b", "wizardlm-13b", "claude-2", "palm-2",
          "koala-13b", "alpaca-13b", "dolly-v2-12b")
SOURCES = ("sharegpt", "lmsys-chat-1m", "anthropic-hh", "ultrachat", "evol_instruct", "flan",
           "truthful_qa")
WORDS = ("the", "a", "model", "answer", "question", "because", "which", "data", "value",
         "should", "first", "then", "example", "result", "people", "python", "function",
         "return", "list", "number", "consider", "important", "however", "step", "simple",
         "water", "energy", "history", "market", "city", "health", "language", "time",
         "system", "design", "problem", "solution", "likely", "different", "common")
PEER = """
import sys, pyarrow.json as pj, pyarrow.parquet as pq
pq.write_table(pj.read_json(sys.argv[1]), sys.argv[2])
"""


def _pool(rng: random.Random, chars: int) -> str:
    """A long random text to cut answers and prompts from."""
    out, n = [], 0
    while n < chars:
        sentence = " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 18)))
        sentence = sentence[0].upper() + sentence[1:] + rng.choice(".!?.")
        out.append(sentence)
        n += len(sentence) + 1
    return " ".join(out)


def write_nectar(path: Path, groups: int, k: int, answer_chars: int, seed: int) -> None:
    """N Nectar-shaped rows (seeded): distinct prompts, K distinct answers each."""
    rng = random.Random(seed)
    pool = _pool(rng, 4_000_000)
    top = len(pool) - 2 * answer_chars

    def cut(n: int) -> str:
        start = rng.randrange(top)
        return pool[start : start + n].strip()

    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for i in range(groups):
            turns = rng.choice((1, 1, 1, 2, 3))
            transcript = ""
            for t in range(turns):
                transcript += f"\n\nHuman: Question {i}.{t}: {cut(rng.randint(40, 300))}"
                if t < turns - 1:
                    transcript += f"\n\nAssistant: {cut(rng.randint(80, 400))}"
            transcript += "\n\nAssistant:"
            ranks = list(range(1, k + 1))
            rng.shuffle(ranks)
            models = rng.sample(MODELS, k)
            answers = [{"answer": f"({j + 1}) " + cut(rng.randint(answer_chars - 150,
                                                                  answer_chars + 150)),
                        "model": models[j], "rank": float(ranks[j])} for j in range(k)]
            row = {"prompt": transcript, "answers": answers, "turns": turns,
                   "num_responses": k, "source": [rng.choice(SOURCES)],
                   "good_natured": rng.random() > 0.05}
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


@dataclass
class Timed:
    name: str
    seconds: float
    peak_rss_mb: float
    stage_seconds: float | None = None  # what the stage's manifest says it took
    cpu_seconds: float = 0.0  # user + system time of the child (all its threads)
    peak_anon_mb: float = 0.0  # largest RssAnon seen (sampled, its processes summed)
    peak_sum_rss_mb: float = 0.0  # largest RSS seen (sampled, its processes summed)
    peak_pss_anon_mb: float = 0.0  # largest Pss_Anon seen (sampled, its processes summed)


def _tree(pid: int) -> list[int]:
    """``pid`` and every process under it (Linux ``/proc``: each thread's children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            try:
                todo.extend(int(c) for c in task.read_text(encoding="ascii").split())
            except OSError:
                pass
    return out


def _memory_mb(pid: int, pss: bool = True) -> tuple[float, float, float]:
    """``(RSS, RssAnon, Pss_Anon)`` of ``pid`` and the processes under it, summed (Linux
    ``/proc``): resident memory; the part of it that no file backs (heap, Python objects,
    Arrow buffers built), as against memory-mapped file pages; and that part with each page
    shared by forked processes (copy-on-write, not yet written) counted once over them,
    where RssAnon counts it in each (0 without ``pss``: reading it walks the page tables)."""
    rss = anon = pss_anon = 0.0
    for p in _tree(pid):
        try:
            with open(f"/proc/{p}/status", encoding="ascii") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        rss += int(line.split()[1]) / 1024
                    elif line.startswith("RssAnon:"):
                        anon += int(line.split()[1]) / 1024
            if pss:
                with open(f"/proc/{p}/smaps_rollup", encoding="ascii") as fh:
                    for line in fh:
                        if line.startswith("Pss_Anon:"):
                            pss_anon += int(line.split()[1]) / 1024
        except OSError:
            pass
    return rss, anon, pss_anon


# how often the memory of a command's processes is summed (in a thread; the command's end is
# waited for, not polled): reading /proc/PID/smaps_rollup walks a process's page tables and
# holds its memory map's lock, which stalls its page faults; every 50 ms it stretched the
# peer's own run by 25-45 % at 50k groups (1.58-1.85 s against 1.27 s), every 250 ms not
SAMPLE_SECONDS = 0.25
# Pss_Anon (smaps_rollup) read at every 4th sample only: at every one it still stretched
# import's run at 50k by 0.2 s (3.92-4.00 s against 3.72-3.77 s)
PSS_EVERY = 4


def run_child(name: str, argv: list[str], cwd: Path, run: Path | None = None,
              stage: str | None = None) -> Timed:
    """Run one command in a child process: its wall time, CPU time and its own peak RSS."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}
    t = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    peaks = [0.0, 0.0, 0.0]
    done = threading.Event()

    def sample() -> None:  # the memory of the child and its processes, until it ends
        n = 0
        while not done.is_set():
            for i, now in enumerate(_memory_mb(proc.pid, pss=n % PSS_EVERY == 0)):
                peaks[i] = max(peaks[i], now)
            n += 1
            done.wait(SAMPLE_SECONDS)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(proc.pid, 0)  # the end, as it comes (no poll's delay)
    seconds = time.perf_counter() - t
    done.set()
    sampler.join()
    rss, anon, pss_anon = peaks
    out = (proc.stdout.read() if proc.stdout else b"") + (proc.stderr.read() if proc.stderr
                                                            else b"")
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"{name} failed ({proc.returncode}):\n{out.decode(errors='replace')[-3000:]}")
    stage_seconds = None
    if run is not None and stage is not None:
        manifest = json.loads((run / stage / "manifest.json").read_text(encoding="utf-8"))
        stage_seconds = manifest.get("seconds")
    return Timed(name, seconds, usage.ru_maxrss / 1024, stage_seconds,
                 usage.ru_utime + usage.ru_stime, anon, rss, pss_anon)


def file_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the Nectar-shaped file and the folder it is kept in."""
    parser.add_argument("--groups", type=int, default=5000)
    parser.add_argument("--k", type=int, default=7)
    parser.add_argument("--answer-chars", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=None,
                        help="folder for the input file (kept, reused) and the runs; default: "
                        "a temporary folder")


def nectar_file(args: argparse.Namespace, prefix: str) -> tuple[Path, Path]:
    """The work folder and the file of :func:`file_arguments`' options, written if missing."""
    work = args.work or Path(tempfile.mkdtemp(prefix=prefix))
    work.mkdir(parents=True, exist_ok=True)
    data = work / f"nectar-{args.groups}-k{args.k}-c{args.answer_chars}-s{args.seed}.jsonl"
    if not data.exists():
        t = time.perf_counter()
        write_nectar(data, args.groups, args.k, args.answer_chars, args.seed)
        print(f"wrote {data} ({data.stat().st_size / 1e6:.0f} MB) in "
              f"{time.perf_counter() - t:.0f} s", flush=True)
    return work, data


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    file_arguments(parser)
    parser.add_argument("--stages", default="prompts,import,aggregate,validate,export",
                        help="comma-separated stages to time (import must run before the "
                        "others)")
    parser.add_argument("--workers", type=int, default=None,
                        help="import's --workers (default: the command's own default)")
    args = parser.parse_args()
    work, data = nectar_file(args, "grouppref-data-bench-")
    run, prompts_run = work / "run", work / "run-prompts"
    for folder in (run, prompts_run, work / "export", work / "peer.parquet"):
        shutil.rmtree(folder, ignore_errors=True) if folder.is_dir() else folder.unlink(
            missing_ok=True)
    py = [sys.executable, "-m", "grouppref"]
    commands: dict[str, tuple[list[str], Path, str | None]] = {
        "prompts": (py + ["prompts", str(data), "--out", str(prompts_run)], prompts_run,
                    "prompts"),
        "import": (py + ["import", str(data), "--out", str(run), "--layout", "nectar",
                         *(["--workers", str(args.workers)] if args.workers is not None else [])],
                   run, "import"),
        "aggregate": (py + ["aggregate", str(run)], run, "aggregate"),
        "validate": (py + ["validate", str(run)], run, "validate"),
        "export": (py + ["export", str(run), "--parquet", str(work / "export")], run, None),
    }
    wanted = [s.strip() for s in args.stages.split(",") if s.strip()]
    loads = [load_average()]
    peer_argv = [sys.executable, "-c", PEER, str(data), str(work / "peer.parquet")]
    peers = [run_child("peer", peer_argv, work)]
    print(f"peer: {peers[-1].seconds:.2f} s (load {loads[-1]})", flush=True)
    results: list[tuple[Timed, float, float]] = []
    for name in wanted:
        argv, where, stage = commands[name]
        timed = run_child(name, argv, work, where, stage)
        if name == "export":  # its manifest is in export/<target>/
            timed.stage_seconds = _manifest_seconds(where, _export_stage(where))
        loads.append(load_average())
        peers.append(run_child("peer", peer_argv, work))
        peer = (peers[-2].seconds + peers[-1].seconds) / 2
        peer_cpu = (peers[-2].cpu_seconds + peers[-1].cpu_seconds) / 2
        results.append((timed, peer, peer_cpu))
        print(f"{name}: {timed.seconds:.2f} s, peer around it {peer:.2f} s (load {loads[-1]})",
              flush=True)
    n = args.groups
    size = data.stat().st_size / 1e6
    print()
    print(f"groups: {n} (K={args.k}, ~{args.answer_chars}-char answers, {size:.0f} MB JSONL), "
          f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    print(f"load average (1/5/15 min) before and after each command: {' | '.join(loads)}")
    print(f"{'command':<10} {'seconds':>8} {'stage s':>8} {'groups/s':>9} {'x peer':>7} "
          f"{'cpu s':>8} {'x peer cpu':>10} {'peak RSS MB':>12} {'sum RSS MB':>11} "
          f"{'anon MB':>8} {'anon PSS MB':>11}")
    for p in peers:
        print(f"{'peer':<10} {p.seconds:8.2f} {'':>8} {n / p.seconds:9.0f} {'':>7} "
              f"{p.cpu_seconds:8.2f} {'':>10} {p.peak_rss_mb:12.0f} {p.peak_sum_rss_mb:11.0f} "
              f"{p.peak_anon_mb:8.0f} {p.peak_pss_anon_mb:11.0f}")
    for timed, peer, peer_cpu in results:
        stage_s = f"{timed.stage_seconds:8.2f}" if timed.stage_seconds is not None else " " * 8
        print(f"{timed.name:<10} {timed.seconds:8.2f} {stage_s} {n / timed.seconds:9.0f} "
              f"{timed.seconds / peer:7.2f} {timed.cpu_seconds:8.2f} "
              f"{timed.cpu_seconds / peer_cpu:10.2f} {timed.peak_rss_mb:12.0f} "
              f"{timed.peak_sum_rss_mb:11.0f} {timed.peak_anon_mb:8.0f} "
              f"{timed.peak_pss_anon_mb:11.0f}")
    wall_med = statistics.median(p.seconds for p in peers)
    cpu_med = statistics.median(p.cpu_seconds for p in peers)
    print(f"\nagainst the median peer run ({wall_med:.2f} s, {cpu_med:.2f} CPU-s; the peer's own "
          f"time moves from run to run, the median less): "
          + ", ".join(f"{t.name} {t.seconds / wall_med:.2f}x wall / {t.cpu_seconds / cpu_med:.2f}x "
                      "CPU" for t, _, _ in results))
    print("(seconds: the command's wall time, interpreter and imports included; stage s: the "
          "stage's own time from its manifest; x peer: seconds / mean of the peer runs before "
          "and after it; cpu s: the command's user + system time, all threads, which a loaded "
          "machine stretches less than wall time; x peer cpu: the same ratio on CPU time; peak RSS: "
          "the largest of the child and the processes it waited for (os.wait4), memory-mapped file "
          "pages included; sum RSS MB: the largest sum of RSS over the child and its processes, "
          "sampled every 250 ms (Pss_Anon every 1 s); anon MB: the same for RssAnon, the "
          "memory no file backs; anon PSS MB: the same for Pss_Anon, which counts a page that "
          "forked processes still share once over them, where RssAnon counts it in each)")


def _export_stage(run: Path) -> str:
    found = sorted(run.glob("export/*/manifest.json"))
    return str(found[-1].parent.relative_to(run)) if found else "export"


def _manifest_seconds(run: Path, stage: str) -> float | None:
    path = run / stage / "manifest.json"
    if not path.exists():
        return None
    return json.loads(path.read_text(encoding="utf-8")).get("seconds")


if __name__ == "__main__":
    main()
