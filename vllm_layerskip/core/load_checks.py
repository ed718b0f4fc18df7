"""What a proposer checks and says once the model is loaded: that the draft
weights asked for are there (and their size), and, on a CPU, whether a bf16
model can gain from drafting at all (core/cpu_dtype.py)."""

from __future__ import annotations

import logging

from vllm_layerskip.core.cpu_dtype import bf16_without_arithmetic_warning, cpu_flags
from vllm_layerskip.core.errors import LayerSkipConfigError

logger = logging.getLogger("vllm.layerskip")


def draft_weights_status(scheme: str | None, engine) -> dict | None:
    """The quantized copies draft passes read, None without (draft_weights)."""
    from vllm_layerskip.core.draft_weights import total_bytes

    stack = engine.stack
    if stack is None or stack.draft is None:
        return None
    # The kernels the copies run, as "scheme kernel" where a scheme has several
    # (core/int4_kernels.py, core/w8a8_kernels.py).
    kernels = sorted({f"{m.scheme} {m.kernel}" if m.kernel else m.scheme
                      for d in stack.draft for m in d.linears.values()})
    return {"scheme": scheme,
            "bytes": total_bytes(stack.draft) + engine.head.quantized_bytes,
            "max_tokens_per_pass": stack.draft[0].max_tokens,
            "kernels": kernels}


def check_draft_weights(method: str, asked: str | None, engine) -> None:
    loaded = draft_weights_status(asked, engine)
    if asked is not None and loaded is None:
        raise LayerSkipConfigError(
            f"'draft_weights': {asked!r} was asked for but the model's linear layers "
            "were loaded without a draft copy (was the plugin loaded in the worker "
            "before the model? vllm.general_plugins entry point)."
        )
    if loaded is not None:
        head = " and of the pruned draft head" if engine.head.quantized_bytes else ""
        logger.info("vllm-layerskip %s: drafts read %s copies of the linear weights%s "
                    "(%.2f GB beside the model's; kernels: %s)", method, asked, head,
                    loaded["bytes"] / 1e9, ", ".join(loaded["kernels"]))


def warn_if_bf16_cannot_pay(method: str, vllm_config) -> None:
    from vllm.distributed import get_tensor_model_parallel_rank
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or get_tensor_model_parallel_rank() != 0:
        return  # one warning per engine, not one per tensor-parallel rank
    dtype = str(vllm_config.model_config.dtype).replace("torch.", "")
    warning = bf16_without_arithmetic_warning(dtype, cpu_flags())
    if warning:
        logger.warning("vllm-layerskip %s: %s", method, warning)
