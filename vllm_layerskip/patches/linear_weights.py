"""Linear-layer patch: keep a quantized copy of each linear weight for drafts.

`UnquantizedLinearMethod.process_weights_after_loading` prepares a loaded
weight for vLLM's kernels; on CPU it packs the weight for oneDNN and drops the
plain tensor, so nothing after loading can read it. When the engine's
speculative config asks for `draft_weights` (core/draft_weights.py), the
wrapper quantizes the plain weight first and attaches the copy to the layer;
otherwise it is vLLM's own. The config comes from vLLM's current-config
context, which the worker sets while it loads the model; `draft_weights_grid`
travels with it (how "int4" picks its steps). A copy made once is read back
from disk at later starts (core/draft_weights_cache.py).
"""

from __future__ import annotations

from vllm.model_executor.layers.linear import UnquantizedLinearMethod

from vllm_layerskip.patches import Patch, call_original


def _requested() -> tuple[str, str] | None:
    """(scheme, int4 grid) of the engine's `draft_weights`, None without it."""
    from vllm.config import get_current_vllm_config_or_none

    from vllm_layerskip.core.selection import get_selection

    config = get_current_vllm_config_or_none()
    selection = None if config is None else get_selection(config.speculative_config)
    options = None if selection is None else selection.options
    scheme = getattr(options, "draft_weights", None)
    return None if scheme is None else (scheme, options.int4_grid)


def process_weights_after_loading(self, layer):
    requested = _requested()
    if requested is not None:
        from vllm_layerskip.core import draft_weights

        scheme, grid = requested
        draft_weights.attach(layer, scheme, grid)
    return call_original(UnquantizedLinearMethod, "process_weights_after_loading")(self, layer)


def patches() -> list[Patch]:
    return [Patch(UnquantizedLinearMethod, "process_weights_after_loading",
                  process_weights_after_loading)]
