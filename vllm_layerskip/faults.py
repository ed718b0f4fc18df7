"""Fault injection for tests: make a named point in the plugin raise.

The engine core and workers are separate processes, so tests reach them through
the environment: VLLM_LAYERSKIP_INJECT_FAULT="swift.optimizer@3,swift.score"
makes the 3rd call of `maybe_fail("swift.optimizer")` and every call of
`maybe_fail("swift.score")` raise InjectedFault. Unset, it costs one dict lookup.
"""

from __future__ import annotations

import os
from collections import Counter

ENV_VAR = "VLLM_LAYERSKIP_INJECT_FAULT"

_calls: Counter[str] = Counter()


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
