"""CUDA timing for the benchmarks and the controls: CUDA-event times of a call, and a call captured
into a CUDA graph (warmed up on a side stream first, as capture needs). torch is imported on use,
so the command modules that import this stay torch-free until they run."""

from __future__ import annotations

import statistics
from typing import Any, Callable


def events_ms(fn: Callable[[], Any], iters: int, warmup: int, reps: int = 1) -> list[float]:
    """ms per call of ``fn`` in each of ``iters`` samples, after ``warmup`` calls: a sample is ``reps``
    calls issued back to back between two CUDA events (1: each call timed alone; more: the host's
    work for one call overlaps the GPU's for the one before, as in a training loop)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / reps)
    return times


def host_us(fn: Callable[[], Any], iters: int, reps: int = 20) -> float:
    """Microseconds of host time per call of ``fn`` (median over ``iters`` samples of ``reps`` calls
    issued back to back after a synchronize, timed with perf_counter): what a launch costs the host
    while the GPU queue absorbs the work. Beside the event timings it splits an alone-vs-back-to-back
    gap into the host's part and the device's (launch latency, the kernel's prologue)."""
    import time

    import torch

    times = []
    for _ in range(iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        times.append((time.perf_counter() - t0) / reps * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def median_ms(fn: Callable[[], Any], iters: int, warmup: int = 3) -> float:
    return statistics.median(events_ms(fn, iters, warmup))


def capture_graph(fn: Callable[[], Any], warmup: int = 3, device: Any = None):
    """A ``torch.cuda.CUDAGraph`` of one call of ``fn``, after ``warmup`` calls on a side stream (they
    allocate what the call needs, compile what torch.compile compiles); replay it with ``.replay()``."""
    import torch

    s = torch.cuda.Stream(device)
    s.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(s):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream(device).wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph
