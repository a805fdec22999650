"""The machine's matmul limit, two ways, for ``train_peak.py`` and ``train_throughput.py``.

* **peak** (:func:`matmul_peak`): the best rate of any short burst of back-to-back products
  (bursts of 1-64 products, the fastest kept). An upper bound: it catches the machine's best
  moment, e.g. a burst that ran while a virtual machine's other tenants were quiet.
* **sustained** (:func:`matmul_sustained`): the median rate over windows of back-to-back
  products (``seconds / windows`` each, whole products only). The rate a seconds-long workload
  such as a training step can expect from the same kernel at that time; a step's median time
  compares with this like for like, where the peak compares a median with a maximum.

Both per (M, K, N) shape, wall clock and per CPU-second (``time.process_time``), in the model
dtype. On the shared 2-core CPU machine the two differ by 10-35 %
(benchmarks/results/train_peak.md).
"""

from __future__ import annotations

import statistics
import time

import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _operands(device: torch.device, dtype: torch.dtype, m: int, k: int,
              n: int) -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(k, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    _sync(device)
    return a, b


def matmul_peak(device: torch.device, dtype: torch.dtype, shapes: list[tuple[int, int, int]],
                seconds: float) -> dict[str, float]:
    """Best FLOP/s of ``torch.matmul`` per (M, K, N) shape, each timed for about ``seconds``."""
    out = {}
    for m, k, n in shapes:
        a, b = _operands(device, dtype, m, k, n)
        best, best_cpu, spent = float("inf"), float("inf"), 0.0
        reps = 1
        while spent < seconds:
            start, start_cpu = time.perf_counter(), time.process_time()
            for _ in range(reps):
                a @ b
            _sync(device)
            took = time.perf_counter() - start
            spent += took
            best = min(best, took / reps)
            best_cpu = min(best_cpu, (time.process_time() - start_cpu) / reps)
            reps = min(reps * 2, 64) if took < seconds / 8 else reps
        out[f"{m}x{k}x{n}"] = 2 * m * k * n / best
        out[f"{m}x{k}x{n} per CPU-s"] = 2 * m * k * n / max(best_cpu, 1e-9)
        del a, b
    return out


def matmul_sustained(device: torch.device, dtype: torch.dtype,
                     shapes: list[tuple[int, int, int]], seconds: float,
                     windows: int = 4) -> dict[str, float]:
    """Median FLOP/s over ``windows`` windows of back-to-back products, per (M, K, N) shape,
    each shape timed for about ``seconds``; keys as :func:`matmul_peak`'s."""
    out = {}
    for m, k, n in shapes:
        a, b = _operands(device, dtype, m, k, n)
        rates, cpu_rates = [], []
        for _ in range(windows):
            start, start_cpu, count = time.perf_counter(), time.process_time(), 0
            while time.perf_counter() - start < seconds / windows:
                a @ b
                count += 1
            _sync(device)
            flop = 2 * m * k * n * count
            rates.append(flop / (time.perf_counter() - start))
            cpu_rates.append(flop / max(time.process_time() - start_cpu, 1e-9))
        out[f"{m}x{k}x{n}"] = statistics.median(rates)
        out[f"{m}x{k}x{n} per CPU-s"] = statistics.median(cpu_rates)
        del a, b
    return out


def model_shapes(shape: dict, tokens: int, device: torch.device) -> list[tuple[int, int, int]]:
    """A square product and a model's (tokens x d x ffn), (tokens x ffn x d), (tokens x d x V)."""
    d, f, v = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
    square = 2048 if device.type == "cpu" else 8192
    return [(square, square, square), (tokens, d, f), (tokens, f, d), (tokens, d, v)]


def best_rates(by_shape: dict[str, float]) -> tuple[float, float]:
    """The best wall-clock FLOP/s and the best FLOP per CPU-second over the shapes."""
    return (max(v for name, v in by_shape.items() if not name.endswith("CPU-s")),
            max(v for name, v in by_shape.items() if name.endswith("CPU-s")))


def model_peak(shape: dict, tokens: int, device: torch.device, dtype: torch.dtype,
               seconds: float) -> tuple[dict[str, float], float, float]:
    """The matmul peak for a model shape (:func:`model_shapes`).

    Returns:
        tuple: FLOP/s by shape, the best wall-clock FLOP/s, the best FLOP per CPU-second.
    """
    peaks = matmul_peak(device, dtype, model_shapes(shape, tokens, device), seconds)
    return (peaks, *best_rates(peaks))


def model_sustained(shape: dict, tokens: int, device: torch.device, dtype: torch.dtype,
                    seconds: float) -> tuple[dict[str, float], float, float]:
    """The sustained matmul rate for a model shape; returns as :func:`model_peak`."""
    rates = matmul_sustained(device, dtype, model_shapes(shape, tokens, device), seconds)
    return (rates, *best_rates(rates))
