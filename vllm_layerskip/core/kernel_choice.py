"""The override variables that force one of a draft-weights scheme's kernels
(core/int4_kernels.py, core/w8a8_kernels.py), read one way for both."""

from __future__ import annotations

import os

from vllm_layerskip.core.errors import LayerSkipConfigError


def forced(env: str, kernels: tuple[str, ...], picked_by: str) -> str:
    """The kernel `env` names, "" where it is unset; an error naming the choices
    for any other value. `picked_by`: what chooses while it is unset."""
    value = os.environ.get(env, "")
    if value and value not in kernels:
        raise LayerSkipConfigError(f"{env}={value!r}: must be one of {', '.join(kernels)} "
                                   f"(or unset, to pick by {picked_by}).")
    return value
