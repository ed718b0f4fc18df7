"""Config patches: accept the layer-skip method names and reserve KV slots for drafts.

1. `EngineArgs.create_speculative_config`: when `method` is a layer-skip method,
   take our option keys out of the dict (vLLM's SpeculativeConfig forbids extra
   keys), validate them against the target model, and hand vLLM a `custom_class`
   config whose `model` is our proposer's class path. `custom_class` gives us, for
   free, no draft-model config and no async scheduling. The parsed options are
   attached to the SpeculativeConfig as `layerskip`; it is pickled to the engine
   core and the workers with the config. This is the one path behind `vllm serve`,
   `LLM(...)` and `vllm bench`.
2. `VllmConfig.num_lookahead_tokens`: the draft pass writes KV for draft positions
   into the target's paged cache, so the scheduler must allocate K slots ahead of
   each running request, as it does for EAGLE. The verify pass overwrites them.
"""

from __future__ import annotations

import typing
from typing import Any

from vllm.config import SpeculativeConfig, VllmConfig
from vllm.engine.arg_utils import EngineArgs

from vllm_layerskip.core.errors import LayerSkipConfigError
from vllm_layerskip.core.identity import model_identity
from vllm_layerskip.core.model_adapter import check_model_supported
from vllm_layerskip.core.selection import LayerSkipSelection, attach_selection, get_selection
from vllm_layerskip.methods import registry
from vllm_layerskip.patches import Patch, call_original


def _merge_cli_flags(args: EngineArgs) -> dict[str, Any] | None:
    """The user's speculative config with --spec-method/--spec-tokens folded in."""
    raw = dict(args.speculative_config or {})
    for flag, key in (("spec_method", "method"), ("spec_tokens", "num_speculative_tokens")):
        value = getattr(args, flag, None)
        if value is not None and key not in raw:
            raw[key] = value
    return {k.replace("-", "_"): v for k, v in raw.items()} or None


def _is_misspelled_method(name) -> bool:
    """Not a method vLLM knows, but close to one of ours: say so, instead of
    vLLM's list of its own methods."""
    vllm_methods = typing.get_args(SpeculativeConfig.__dataclass_fields__["method"].type)
    flat = {m for arg in vllm_methods for m in (typing.get_args(arg) or (arg,))}
    return name not in flat and registry.looks_like_layerskip_method(name)


def _validate_for_target(method: str, options: Any, raw: dict, target_model_config, target_parallel_config) -> None:
    k = raw.get("num_speculative_tokens")
    if k is None:
        raise LayerSkipConfigError(
            f"Method '{method}' needs 'num_speculative_tokens' (the maximum draft "
            'length per step), e.g. {"method": "' + method + '", "num_speculative_tokens": 4}.'
        )
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise LayerSkipConfigError(
            f"'num_speculative_tokens' must be a positive integer, got {k!r}."
        )
    if target_parallel_config.pipeline_parallel_size > 1:
        raise LayerSkipConfigError(
            f"Method '{method}' does not support pipeline parallelism "
            f"(pipeline_parallel_size={target_parallel_config.pipeline_parallel_size}): "
            "vLLM runs the drafter on the last pipeline stage only, which does not "
            "hold the early layers the draft pass needs. Use tensor parallelism."
        )
    # Every method keeps its tensor-parallel ranks in step (core/rank_agreement.py).
    tp = target_parallel_config.tensor_parallel_size
    # Options that depend on the parallel layout (a method's validate_for_parallelism).
    options.validate_for_parallelism(tp)
    check_model_supported(target_model_config)
    options.validate_for_model(model_identity(target_model_config))


def create_speculative_config(
    self: EngineArgs, target_model_config, target_parallel_config
) -> SpeculativeConfig | None:
    raw = _merge_cli_flags(self)
    if raw is not None and _is_misspelled_method(raw.get("method")):
        raise registry.unknown_method_error(raw["method"])
    if raw is None or not registry.is_layerskip_method(raw.get("method")):
        config = call_original(EngineArgs, "create_speculative_config")(
            self, target_model_config, target_parallel_config
        )
        # A second call (vLLM re-creating the engine config) sees the rewritten
        # dict: re-attach what the first call parsed.
        selection = getattr(self, "_layerskip_selection", None)
        if config is not None and selection is not None:
            attach_selection(config, selection)
        return config

    vllm_keys = set(SpeculativeConfig.__dataclass_fields__)
    method, options, vllm_part = registry.split_speculative_config(raw, vllm_keys)
    _validate_for_target(method, options, raw, target_model_config, target_parallel_config)

    # Like vLLM's own method, this rewrites the EngineArgs' dict in place.
    proposer = registry.method(method).proposer
    self.speculative_config = {**vllm_part, "method": "custom_class", "model": proposer}
    self.spec_method = self.spec_tokens = None
    config = call_original(EngineArgs, "create_speculative_config")(
        self, target_model_config, target_parallel_config
    )
    selection = LayerSkipSelection(method=method, options=options)
    self._layerskip_selection = selection
    attach_selection(config, selection)
    return config


def _num_lookahead_tokens(self: VllmConfig) -> int:
    if get_selection(self.speculative_config) is not None:
        return self.speculative_config.num_speculative_tokens
    return call_original(VllmConfig, "num_lookahead_tokens").fget(self)


def patches() -> list[Patch]:
    return [
        Patch(EngineArgs, "create_speculative_config", create_speculative_config),
        Patch(VllmConfig, "num_lookahead_tokens", property(_num_lookahead_tokens)),
    ]
