"""Fault injection for tests: make a named point in the plugin raise.

The engine core and workers are separate processes, so tests reach them through
the environment: VLLM_LAYERSKIP_INJECT_FAULT="swift.optimizer@3,swift.score"
makes the 3rd call of `maybe_fail("swift.optimizer")` and every call of
`maybe_fail("swift.score")` raise InjectedFault. Unset, it costs one dict lookup.
VLLM_LAYERSKIP_INJECT_DELAY does the same for delays (`maybe_delay`), per
tensor-parallel rank.
"""

from __future__ import annotations

import os
import time
from collections import Counter

ENV_VAR = "VLLM_LAYERSKIP_INJECT_FAULT"

_calls: Counter[str] = Counter()


def reset_counts() -> None:
    """Count calls from zero again. Counts are per process; the test suite,
    which builds several engines in one process, resets them before each test."""
    _calls.clear()


class InjectedFault(RuntimeError):
    """Raised on purpose by a test through VLLM_LAYERSKIP_INJECT_FAULT."""


def maybe_fail(point: str) -> None:
    spec = os.environ.get(ENV_VAR)
    if not spec:
        return
    for item in spec.split(","):
        name, _, nth = item.strip().partition("@")
        if name != point:
            continue
        _calls[point] += 1
        if not nth or _calls[point] == int(nth):
            raise InjectedFault(f"fault injected at '{point}' (call {_calls[point]}, {ENV_VAR})")


DELAY_ENV_VAR = "VLLM_LAYERSKIP_INJECT_DELAY"


def maybe_delay(point: str, rank: int | None = None) -> None:
    """Sleep where VLLM_LAYERSKIP_INJECT_DELAY names this point, e.g.
    "swift.optimizer=0.5@0": every call of maybe_delay("swift.optimizer") on
    tensor-parallel rank 0 sleeps 0.5 s (without "@rank": on every rank).
    Tests use it to make one rank's background thread slow. `rank`: the
    caller's rank, if it knows it (else vLLM's, or 0 outside vLLM)."""
    spec = os.environ.get(DELAY_ENV_VAR)
    if not spec:
        return
    for item in spec.split(","):
        name, _, rest = item.strip().partition("=")
        seconds, _, only_rank = rest.partition("@")
        if name != point:
            continue
        if not only_rank or int(only_rank) == (_tensor_parallel_rank() if rank is None else rank):
            time.sleep(float(seconds))


def _tensor_parallel_rank() -> int:
    try:
        from vllm.distributed import get_tensor_model_parallel_rank

        return get_tensor_model_parallel_rank()
    except Exception:  # noqa: BLE001 - not initialised: a single process
        return 0
