"""Linear-layer patch: keep a quantized copy of each linear weight for drafts.

`UnquantizedLinearMethod.process_weights_after_loading` prepares a loaded
weight for vLLM's kernels; on CPU it packs the weight for oneDNN and drops the
plain tensor, so nothing after loading can read it. When the engine's
speculative config asks for `draft_weights` (core/draft_weights.py), the
wrapper quantizes the plain weight first and attaches the copy to the layer;
otherwise it is vLLM's own. The config comes from vLLM's current-config
context, which the worker sets while it loads the model.
"""

from __future__ import annotations

from vllm.model_executor.layers.linear import UnquantizedLinearMethod

from vllm_layerskip.patches import Patch, call_original


def _requested_scheme() -> str | None:
    from vllm.config import get_current_vllm_config_or_none

    from vllm_layerskip.core.selection import get_selection

    config = get_current_vllm_config_or_none()
    selection = None if config is None else get_selection(config.speculative_config)
    return None if selection is None else getattr(selection.options, "draft_weights", None)


def process_weights_after_loading(self, layer):
    scheme = _requested_scheme()
    if scheme is not None:
        from vllm_layerskip.core import draft_weights

        draft_weights.attach(layer, scheme)
    return call_original(UnquantizedLinearMethod, "process_weights_after_loading")(self, layer)


def patches() -> list[Patch]:
    return [Patch(UnquantizedLinearMethod, "process_weights_after_loading",
                  process_weights_after_loading)]
