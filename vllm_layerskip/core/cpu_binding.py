"""Say so at start-up when vLLM's CPU worker runs on fewer cores than it could.

How vLLM 0.32 binds it (vllm/utils/ompmultiprocessing.py, `OMPProcessManager`,
which the multiprocessing executor runs before it starts each worker; on CPU
vLLM always uses that executor, vllm/platforms/cpu.py): with
`VLLM_CPU_OMP_THREADS_BIND` unset ("auto") each worker gets the cores of one
NUMA node, one logical CPU per physical core on x86, and then
`VLLM_CPU_NUM_OF_RESERVED_CPU` cores (default: one per worker on x86, ARM and
RISC-V) are taken off the last workers' lists for the engine's own process.
The worker inherits the result as OMP_NUM_THREADS and OMP_PLACES (libgomp:
GOMP_CPU_AFFINITY; Intel OpenMP: KMP_AFFINITY). A list the user gives
("0-1"; "0-3|4-7" per rank) is used as it is; "nobind" binds nothing.

On a 2-core machine that halves decoding: Qwen2.5-Coder-1.5B bf16 decoded 4.3
tokens/s at batch 1 with the worker on one core and 8.3 with
`VLLM_CPU_OMP_THREADS_BIND=0-1` (2026-11-28; the engine's process then used 6%
of a core). On a large machine the kept-back core is a small share and vLLM's
choice stands: this warns where the worker lost at least a quarter of the cores
it could have (machines of up to 4 cores a node), and only logs the fact above
that.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import re
from typing import NamedTuple

logger = logging.getLogger("vllm.layerskip")

BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
RESERVED_ENV = "VLLM_CPU_NUM_OF_RESERVED_CPU"
WARN_SHARE = 0.25  # warn when the worker lost at least this share of its cores
_WORKER_PROCESS = "VllmWorker-"  # vLLM's multiprocessing executor names its workers so

_checked = False


class Cpu(NamedTuple):
    id: int
    core: int  # physical core
    node: int  # NUMA node


def worker_cores(environ) -> list[int] | None:
    """The CPUs vLLM's executor bound this worker's OpenMP threads to, from the
    variables it set for the worker; None where it set none."""
    places = environ.get("OMP_PLACES")
    if places:  # "{0,1,2}"
        return _ids(places.strip("{}"))
    affinity = environ.get("KMP_AFFINITY", "")
    found = re.search(r"proclist=\[([0-9,\-\s]*)\]", affinity)
    if found:
        return _ids(found.group(1))
    gomp = environ.get("GOMP_CPU_AFFINITY")
    if gomp:  # "0 1 2"
        return _ids(gomp.replace(" ", ","))
    return None


def _ids(text: str) -> list[int] | None:
    ids = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            low, _, high = part.partition("-")
            ids.update(range(int(low), int(high or low) + 1))
        except ValueError:
            return None
    return sorted(ids) or None


def available_cores(cpus: list[Cpu], used: list[int], one_per_core: bool) -> list[int]:
    """The CPUs this worker could have had: every allowed one on the NUMA nodes
    of the CPUs it got, one per physical core where vLLM binds so (x86, s390x:
    the highest-numbered logical CPU of each core, as vLLM picks it)."""
    nodes = {c.node for c in cpus if c.id in used}
    on_nodes = [c for c in cpus if c.node in nodes]
    if not one_per_core:
        return sorted(c.id for c in on_nodes)
    per_core: dict[tuple[int, int], int] = {}
    for c in on_nodes:
        per_core[(c.node, c.core)] = max(c.id, per_core.get((c.node, c.core), -1))
    return sorted(per_core.values())


def id_ranges(ids: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5", as VLLM_CPU_OMP_THREADS_BIND takes a list."""
    parts, start = [], None
    for i, value in enumerate(ids):
        if start is None:
            start = value
        if i + 1 == len(ids) or ids[i + 1] != value + 1:
            parts.append(str(start) if start == value else f"{start}-{value}")
            start = None
    return ",".join(parts)


def binding_message(bind: str, used: list[int] | None, available: list[int],
                    reserved: str | None = None) -> tuple[int, str] | None:
    """(log level, message) when vLLM's automatic binding gave the worker fewer
    cores than it could have; None when it got them all, when the user chose the
    binding (any value of VLLM_CPU_OMP_THREADS_BIND but "auto") or the cores kept
    back (`reserved`: VLLM_CPU_NUM_OF_RESERVED_CPU, if set), or when the binding
    is not known."""
    if bind.strip() != "auto" or reserved is not None or not used or not available:
        return None
    missing = len(set(available) - set(used))
    if missing == 0:
        return None
    level = logging.WARNING if missing / len(available) >= WARN_SHARE else logging.INFO
    return level, (
        f"vLLM's CPU worker runs on {len(used)} of the {len(available)} cores it could use "
        f"(cores {id_ranges(used)}; with {BIND_ENV} unset vLLM keeps {missing} back for the "
        f"engine's own process). Decoding on a CPU is as fast as the worker's cores: "
        f"Qwen2.5-Coder-1.5B decoded 4.3 tokens/s on 1 of 2 cores against 8.3 on both. "
        f"Set {BIND_ENV}={id_ranges(available)} to give the worker every core "
        f"(with tensor_parallel_size > 1: one list per rank, joined by '|'), or "
        f"{RESERVED_ENV}=0."
    )


def check_worker_binding(environ=os.environ) -> tuple[int, str] | None:
    """In a vLLM CPU worker process: log `binding_message` once. Returns it."""
    global _checked
    if _checked or not multiprocessing.current_process().name.startswith(_WORKER_PROCESS):
        return None
    _checked = True
    try:
        result = _binding_here(environ)
    except Exception as e:  # noqa: BLE001 - a diagnostic must not stop the start-up
        logger.debug("vllm-layerskip: the CPU binding check failed: %r", e)
        return None
    if result is not None:
        logger.log(result[0], "vllm-layerskip: %s", result[1])
    return result


def _binding_here(environ) -> tuple[int, str] | None:
    from vllm.platforms import CpuArchEnum, current_platform

    if not current_platform.is_cpu():
        return None
    arch = current_platform.get_cpu_architecture()
    if arch in (CpuArchEnum.X86, CpuArchEnum.S390X):
        one_per_core = True
    elif arch in (CpuArchEnum.ARM, CpuArchEnum.RISCV):
        one_per_core = False
    else:  # POWER picks 4 threads of each SMT-8 core: not modelled here
        return None
    used = worker_cores(environ)
    if used is None:
        return None
    return binding_message(environ.get(BIND_ENV, "auto"), used,
                           available_cores(_allowed_cpus(), used, one_per_core),
                           environ.get(RESERVED_ENV))


def _allowed_cpus() -> list[Cpu]:
    """The CPUs vLLM chose from: those the engine's process (this worker's
    parent, where vLLM's executor made the lists) may run on. The worker's own
    affinity may already be its OpenMP binding."""
    from vllm.utils import cpu_resource_utils

    try:
        allowed = os.sched_getaffinity(os.getppid())
        every = cpu_resource_utils._get_cpu_list()
    except (AttributeError, OSError):
        return [Cpu(c.id, c.physical_core, c.numa_node)
                for c in cpu_resource_utils.get_allowed_cpu_list()]
    return [Cpu(c.id, c.physical_core, c.numa_node) for c in every if c.id in allowed]
