"""``generate`` through an inference server: the in-process backend vs llama.cpp's
OpenAI-compatible server at several concurrencies, and grouppref's overhead against a bare
async client loop sending the same requests to the same server.

For the same prompts and K:

- **in process**: ``run_generate`` with the embedded SmolLM2 (transformers, batched);
- **server, c = 1, 2, 4**: ``run_generate`` with ``--backend openai`` against
  ``python -m llama_cpp.server`` serving the same model (its GGUF, Q4_1);
- **bare loop, same c**: ``httpx.AsyncClient`` + a semaphore of c sending exactly the requests
  grouppref sends for the candidates (same bodies, same per-candidate seeds, so the server does
  the same work), and nothing else.

grouppref's time is the whole ``run_generate`` call (``/models`` check, the first draw that
the check sends, shards, the final dataset and manifest; model loading excluded for the
in-process side). Re-sampling is
off (``max_resample 0``) so both server sides send the same requests (the same bodies, in the
same order). Before timing, one untimed request warms the server and one untimed one-prompt
``run_generate`` warms grouppref's lazy imports (datasets, pyarrow: once per process, not per
run). Bare and grouppref runs alternate, and which goes first alternates from repeat to repeat
(so a load that drifts during the run does not favour one side); the best of ``--repeats`` is
compared, and the median of the paired runs' ratios. When the script starts the server it also
prints the server's CPU seconds per side: the same requests should cost the server the same,
and on a loaded machine they do not (llama.cpp's threads spin while waiting for each other).
Prints candidates/s and tokens/s side by side and the ratio grouppref / bare loop per concurrency
(target: >= 0.9), with ``uptime`` before and after (the ratio is the claim; absolute numbers
depend on the machine and its load). Per run it also prints the client side, which holds under
load: the client process's CPU per sampling request (in total, and while a request was in
flight: at concurrency 1, CPU taken from a server on the same cores), its threads, the gaps
between an answer and the next request, and the time before the first sampling request (with
the setup requests in it) and after the last.

Example (starts its own server on a free loopback port):
    .venv/bin/python benchmarks/generate_server.py --n-prompts 32 --k 4 --max-new-tokens 64 \\
        --concurrency 1 2 4 --repeats 3 --threads 2
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from grouppref.models.loading import embedded_gguf
from grouppref.models.seeds import derive_seed
from grouppref.models.served.protocol import CHAT, endpoint, parse_sample, sample_body
from grouppref.pipeline.generate.config import GenerateConfig, ModelShare
from grouppref.pipeline.generate.served import SEED_MASK
from grouppref.pipeline.generate.stage import run_generate
from grouppref.readers.prompts import read_prompts
from grouppref.runs.store import RunStore
from grouppref.schemas import Prompt, make_group_id

DEMO = Path(__file__).resolve().parents[1] / "data" / "demo_prompts.jsonl"
ALIAS = "smollm2"
NEUTRAL = {"repeat_penalty": 1.0, "top_k": 0, "min_p": 0.0}  # temperature and top_p only


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def start_server(threads: int | None) -> tuple[subprocess.Popen, str]:
    """llama.cpp's server on a free loopback port; returns it and its base URL once serving."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(embedded_gguf()),
           "--model_alias", ALIAS, "--host", "127.0.0.1", "--port", str(port)]
    if threads:
        cmd += ["--n_threads", str(threads)]
    process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v1"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    process.kill()
    raise SystemExit("llama.cpp server did not start")


def config(args: argparse.Namespace, url: str | None, concurrency: int = 1) -> GenerateConfig:
    common = {"k": args.k, "max_new_tokens": args.max_new_tokens, "max_resample": 0,
              "shard_size": args.shard_size, "temperature": 1.0, "top_p": 1.0}
    if url is None:
        return GenerateConfig(models=[ModelShare(name="embedded")], batch_size=args.batch_size,
                              **common)
    return GenerateConfig(backend="openai", models=[ModelShare(name=ALIAS)], server={
        "base_url": url, "concurrency": concurrency, "server_params": NEUTRAL}, **common)


def server_cpu(process: subprocess.Popen | None) -> float:
    """CPU seconds the server process has used so far (0 for a server it did not start)."""
    if process is None:
        return 0.0
    with open(f"/proc/{process.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Sent:
    """One HTTP request as the client saw it: path, wall start / end (``perf_counter``) and the
    client process's CPU seconds (``process_time``, all threads) at start / end."""

    path: str
    start: float
    end: float
    cpu_start: float
    cpu_end: float


@dataclass
class ClientTrace:
    """What the client process did during one run: its wall and CPU seconds, its threads and
    every request it sent (recorded at ``httpx.AsyncClient.send``, the same for both sides)."""

    start: float = 0.0
    end: float = 0.0
    cpu: float = 0.0
    threads: int = 0
    max_threads: int = 0
    sent: list[Sent] = field(default_factory=list)

    def summary(self, sampling: int) -> dict[str, float]:
        """Load-robust numbers of a run whose last ``sampling`` requests are the candidates':
        client CPU per sampling request (total, and while a request was in flight: at
        concurrency 1 that is CPU taken from the server), the gaps between one answer and the
        next request, the time before the first and after the last sampling request."""
        ordered = sorted(self.sent, key=lambda r: r.start)
        samples, setup = ordered[-sampling:], ordered[:-sampling]
        gaps = [b.start - a.end for a, b in itertools.pairwise(samples)]
        in_flight = sum(r.cpu_end - r.cpu_start for r in samples)
        return {"cpu_ms_per_request": 1000 * self.cpu / len(samples),
                "in_flight_cpu_ms_per_request": 1000 * in_flight / len(samples),
                "gap_ms_median": 1000 * statistics.median(gaps) if gaps else 0.0,
                "gap_ms_max": 1000 * max(gaps) if gaps else 0.0,
                "lead_s": samples[0].start - self.start, "tail_s": self.end - samples[-1].end,
                "setup_requests_s": sum(r.end - r.start for r in setup),
                "requests": len(self.sent), "threads": self.max_threads}


TRACE = ClientTrace()


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def trace_requests() -> None:
    """Record every ``httpx.AsyncClient.send`` (both sides send through it) into ``TRACE``."""
    original = httpx.AsyncClient.send

    async def send(client: httpx.AsyncClient, request: httpx.Request, *args, **kwargs):
        t0, c0 = time.perf_counter(), time.process_time()
        TRACE.max_threads = max(TRACE.max_threads, _threads())
        try:
            return await original(client, request, *args, **kwargs)
        finally:
            TRACE.sent.append(Sent(request.url.path, t0, time.perf_counter(), c0,
                                   time.process_time()))

    httpx.AsyncClient.send = send  # type: ignore[method-assign]


@contextmanager
def traced() -> Iterator[ClientTrace]:
    """A fresh ``TRACE`` around one run."""
    global TRACE
    TRACE = ClientTrace(threads=_threads(), max_threads=_threads())
    TRACE.start, cpu = time.perf_counter(), time.process_time()
    yield TRACE
    TRACE.end, TRACE.cpu = time.perf_counter(), time.process_time() - cpu


def grouppref_run(prompts: list[Prompt], cfg: GenerateConfig) -> tuple[float, int, int]:
    """Seconds (model loading excluded), candidates sampled, tokens generated."""
    with tempfile.TemporaryDirectory() as run:
        t0 = time.perf_counter()
        stage = run_generate(RunStore(run), cfg, prompts=prompts, show_progress=False)
        seconds = time.perf_counter() - t0
    stats = stage.manifest.stats
    return seconds - stats["model_load_seconds"], stats["sampled"], stats["generated_tokens"]


def bare_bodies(prompts: list[Prompt], cfg: GenerateConfig) -> list[tuple[str, dict]]:
    """Exactly the sampling requests grouppref sends (same seeds)."""
    out = []
    for prompt in prompts:
        path = endpoint(prompt, cfg.chat_template)
        for slot in range(cfg.k or 0):
            seed = derive_seed(cfg.seed, make_group_id(prompt), ALIAS, slot, 0) & SEED_MASK
            out.append((path, sample_body(
                ALIAS, prompt, path, temperature=cfg.temperature, top_p=cfg.top_p,
                max_tokens=cfg.max_new_tokens, seed=seed, stop=[], logprobs=True,
                server_params=cfg.server.server_params)))
    return out


async def bare_loop(url: str, bodies: list[tuple[str, dict]], concurrency: int) -> tuple[float, int]:
    """Seconds and generated tokens of a plain async loop over ``bodies``."""
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url + "/", timeout=600, limits=limits) as client:
        async def one(path: str, body: dict) -> int:
            async with gate:
                answer = (await client.post(path.lstrip("/"), json=body)).json()
            return parse_sample(answer, path, want_logprobs=True).num_tokens or 0

        t0 = time.perf_counter()
        tokens = await asyncio.gather(*(one(p, b) for p, b in bodies))
        return time.perf_counter() - t0, sum(tokens)


def compare(args: argparse.Namespace, prompts: list[Prompt], url: str,
            process: subprocess.Popen | None, rows: list, traces: list) -> tuple[list, list]:
    """grouppref against the bare loop at each concurrency (rows appended to ``rows``, each
    run's client trace summary to ``traces``): the ratios per concurrency, and each repeat's
    seconds and server CPU seconds."""
    bodies = bare_bodies(prompts, config(args, url))
    asyncio.run(bare_loop(url, bodies[:1], 1))  # warm the server
    grouppref_run(prompts[:1], config(args, url))  # warm grouppref's lazy imports
    ratios, cpu = [], []
    for c in args.concurrency:
        ours, bare, cpu_ours, cpu_bare = [], [], [], []
        for repeat in range(args.repeats):
            for side in ("bare", "ours") if repeat % 2 == 0 else ("ours", "bare"):
                before = server_cpu(process)
                with traced() as trace:
                    if side == "bare":
                        bare.append(asyncio.run(bare_loop(url, bodies, c)))
                    else:
                        ours.append(grouppref_run(prompts, config(args, url, c)))
                (cpu_bare if side == "bare" else cpu_ours).append(server_cpu(process) - before)
                traces.append((c, side, trace.summary(len(bodies))))
        best_ours, best_bare = min(ours, key=lambda r: r[0]), min(bare, key=lambda r: r[0])
        rows.append((f"server, grouppref, c={c}", *best_ours))
        rows.append((f"server, bare loop, c={c}", best_bare[0], len(bodies), best_bare[1]))
        paired = sorted(b[0] / o[0] for b, o in zip(bare, ours, strict=True))
        ratios.append((c, best_bare[0] / best_ours[0], statistics.median(paired)))
        cpu.append((c, cpu_ours, cpu_bare, [o[0] for o in ours], [b[0] for b in bare]))
    return ratios, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", default=str(DEMO))
    parser.add_argument("--n-prompts", type=int, default=8)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--shard-size", type=int, default=32)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads in process and llama.cpp threads in the server")
    parser.add_argument("--url", default=None, help="use this server (serving model "
                        f"{ALIAS!r}) instead of starting one")
    parser.add_argument("--skip-in-process", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(f"start: {uptime()}")
    prompts = read_prompts(args.prompts).items[:args.n_prompts]
    rows: list[tuple[str, float, int, int]] = []
    traces: list[tuple[int, str, dict[str, float]]] = []
    trace_requests()
    if not args.skip_in_process:
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        best = min((grouppref_run(prompts, config(args, None)) for _ in range(args.repeats)),
                   key=lambda r: r[0])
        rows.append(("in process (transformers)", *best))
    process, url = (None, args.url) if args.url else start_server(args.threads)
    try:
        ratios, cpu = compare(args, prompts, url, process, rows, traces)
    finally:
        if process is not None:
            process.terminate()
            process.wait(timeout=30)
    print(f"settings: prompts={len(prompts)} k={args.k} max_new_tokens={args.max_new_tokens} "
          f"repeats={args.repeats} threads={args.threads or 'default'} endpoint={CHAT}")
    print(f"{'side':32s} {'seconds':>8s} {'candidates/s':>13s} {'tokens/s':>9s}")
    for name, seconds, candidates, tokens in rows:
        print(f"{name:32s} {seconds:8.1f} {candidates / seconds:13.2f} {tokens / seconds:9.1f}")
    for c, best, median in ratios:
        print(f"concurrency {c}: grouppref / bare loop = {best:.3f} best vs best, {median:.3f} "
              "median of paired runs (target >= 0.9)")
    for c, cpu_ours, cpu_bare, wall_ours, wall_bare in cpu:
        show = " ".join
        print(f"concurrency {c}, each repeat: grouppref {show(f'{w:.1f}' for w in wall_ours)} s "
              f"(server CPU {show(f'{x:.1f}' for x in cpu_ours)} s), bare loop "
              f"{show(f'{w:.1f}' for w in wall_bare)} s (server CPU "
              f"{show(f'{x:.1f}' for x in cpu_bare)} s)")
    print_traces(traces)
    print(f"end: {uptime()}")


def print_traces(traces: list[tuple[int, str, dict[str, float]]]) -> None:
    """The client side of each run (load-robust: CPU seconds, gaps, requests), per repeat."""
    print("client process, each run (CPU: process_time of the client, all its threads; gap: "
          "from one answer to the next sampling request; lead/tail: before the first / after "
          "the last sampling request)")
    print(f"{'c':>2s} {'side':9s} {'requests':>8s} {'CPU ms/req':>10s} {'in flight':>9s} "
          f"{'gap med ms':>10s} {'gap max':>8s} {'lead s':>7s} {'(setup requests)':>16s} "
          f"{'tail s':>7s} {'threads':>7s}")
    for c, side, t in traces:
        name = "grouppref" if side == "ours" else "bare loop"
        # in flight and gaps mean something only one request at a time
        in_flight, gap, gap_max = ((f"{t['in_flight_cpu_ms_per_request']:9.1f}",
                                    f"{t['gap_ms_median']:10.2f}", f"{t['gap_ms_max']:8.2f}")
                                   if c == 1 else (f"{'-':>9s}", f"{'-':>10s}", f"{'-':>8s}"))
        print(f"{c:2d} {name:9s} {t['requests']:8d} {t['cpu_ms_per_request']:10.1f} "
              f"{in_flight} {gap} {gap_max} {t['lead_s']:7.3f} {t['setup_requests_s']:16.3f} "
              f"{t['tail_s']:7.3f} {t['threads']:7d}")


if __name__ == "__main__":
    main()
