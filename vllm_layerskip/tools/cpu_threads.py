"""Every core to vLLM's CPU worker on a small machine.

Left to itself, vLLM's CPU platform binds the worker's OpenMP threads to all cores
but one, which it keeps for the engine's own process. On a 2-core machine that
halves decoding: Qwen2.5-Coder-1.5B bf16 decoded 4.3 tokens/s at batch 1 with the
worker on one core and 8.3 with `VLLM_CPU_OMP_THREADS_BIND=0-1` (AVX-512 EPYC,
2026-11-28; the engine's process then used 6% of a core, not 87%). The demo and
the benchmarks give the worker every core where there are few of them, unless the
user set the binding; on a larger machine vLLM's own choice (one NUMA node, one
core kept back) stands.
"""

from __future__ import annotations

import os

SMALL_MACHINE_CORES = 4  # at 4 cores the kept-back core is a quarter of the machine


def bind_every_core(environ=os.environ, cores: set[int] | None = None) -> str | None:
    """For engines of one worker (tensor_parallel_size 1; with more, vLLM wants one
    list per rank): set VLLM_CPU_OMP_THREADS_BIND to every core this process may
    run on ("0,1") where they are at most SMALL_MACHINE_CORES and the variable is
    unset. Returns the binding in force (None: vLLM's automatic one)."""
    if "VLLM_CPU_OMP_THREADS_BIND" in environ:
        return environ["VLLM_CPU_OMP_THREADS_BIND"]
    cores = cores if cores is not None else os.sched_getaffinity(0)
    if not cores or len(cores) > SMALL_MACHINE_CORES:
        return None
    environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(c) for c in sorted(cores))
    return environ["VLLM_CPU_OMP_THREADS_BIND"]
