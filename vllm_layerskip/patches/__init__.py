"""Patches of vLLM, one module per vLLM area, applied in a fixed order.

A patch replaces one attribute of a vLLM class, keeps the original as
`_layerskip_orig_<name>` for the wrapper to call, and refuses to patch the same
attribute twice. Its hook point in the hook table (hook_table.py) says what it
was written against, declared once: `check_signatures()` compares the table's
parameters with the installed vLLM at start-up so that a changed vLLM fails
loudly instead of misbehaving.
"""

from __future__ import annotations

import inspect
import logging
import types
from dataclasses import dataclass
from typing import Any, Callable

logger = logging.getLogger("vllm.layerskip")


@dataclass
class Patch:
    target: Any  # a vLLM class, or a module for a module-level function
    name: str
    replacement: Any

    @property
    def qualname(self) -> str:
        owner = getattr(self.target, "__qualname__", None) or self.target.__name__
        return f"{owner}.{self.name}"

    @property
    def hook(self):
        """This patch's entry in the hook table."""
        from vllm_layerskip.patches.hook_table import patched_hook

        is_module = isinstance(self.target, types.ModuleType)
        module = self.target.__name__ if is_module else self.target.__module__
        name = self.name if is_module else f"{self.target.__name__}.{self.name}"
        return patched_hook(module.replace(".", "/") + ".py", name)

    @property
    def expected_params(self) -> tuple[str, ...] | None:
        """Parameter names of the original, as the wrapper expects them (None:
        not a function, e.g. a property)."""
        hook = self.hook
        return hook.params if hook.kind in ("method", "function") else None

    @property
    def orig_attr(self) -> str:
        return f"_layerskip_orig_{self.name}"

    def signature_problem(self) -> str | None:
        # Once applied, the target holds our wrapper: check the original it keeps.
        original = self.target.__dict__.get(self.orig_attr, self.target.__dict__.get(self.name))
        if original is None:
            return f"{self.qualname} does not exist"
        if self.expected_params is None:
            return None
        params = tuple(inspect.signature(original).parameters)
        if params != self.expected_params:
            return (
                f"{self.qualname} has parameters {params}, "
                f"expected {self.expected_params}"
            )
        return None

    def apply(self) -> None:
        if self.orig_attr in self.target.__dict__:
            raise RuntimeError(
                f"vllm_layerskip: {self.qualname} is already "
                "patched; patches must be applied once per process."
            )
        setattr(self.target, self.orig_attr, self.target.__dict__[self.name])
        setattr(self.target, self.name, self.replacement)
        logger.debug("vllm_layerskip patched %s", self.qualname)


def all_patches() -> list[Patch]:
    # Imported here: the patch modules import vLLM, and the version gate must
    # run before any of that.
    from vllm_layerskip.patches import (config, cpu_sampler, engine_core, linear_weights,
                                        model_runner)

    # Order: config first (the front end builds the SpeculativeConfig, the
    # engine core reads num_lookahead_tokens), then the engine core, then the
    # worker side.
    return [*config.patches(), *engine_core.patches(), *model_runner.patches(),
            *cpu_sampler.patches(), *linear_weights.patches()]


_applied = False


def check_signatures() -> list[str]:
    return [p for p in (patch.signature_problem() for patch in all_patches()) if p]


def apply_all() -> None:
    global _applied
    if _applied:
        return
    problems = check_signatures()
    if problems:
        raise RuntimeError(
            "vllm_layerskip cannot patch this vLLM: " + "; ".join(problems) + ". "
            "Install a supported vLLM version (see vllm_layerskip.SUPPORTED_VLLM_VERSIONS)."
        )
    for patch in all_patches():
        patch.apply()
    _applied = True


def call_original(target: type, name: str) -> Callable:
    return getattr(target, f"_layerskip_orig_{name}")
