"""The layer-skip methods: one line each. Every list of methods and every message
that names them derives from `METHODS`.

Adding a method: a folder `methods/<name>/` whose `__init__.py` defines
`METHOD = MethodSpec(...)` (options class, proposer, tensor-parallel support),
and its package path below. Packages are imported on first use, as vLLM's own
model registry does, so naming a method costs nothing until it is asked for.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
from dataclasses import dataclass
from typing import Any

from vllm_layerskip.core.errors import LayerSkipConfigError

PACKAGES = {
    "layer_skip": "vllm_layerskip.methods.layer_skip",
    "quantized": "vllm_layerskip.methods.quantized",
    "swift": "vllm_layerskip.methods.swift",
    "clasp": "vllm_layerskip.methods.clasp",
    "self_sd": "vllm_layerskip.methods.self_sd",
    "adadecode": "vllm_layerskip.methods.adadecode",
}

# Keys of vLLM's own SpeculativeConfig that a layer-skip method cannot take:
# the draft is the target model itself.
DRAFT_MODEL_KEYS = frozenset({"model", "draft_model_config", "quantization", "revision"})


@dataclass(frozen=True)
class MethodSpec:
    name: str
    options: type  # a core.options.DraftingOptions subclass
    proposer: str  # dotted path of the proposer class (vLLM's custom_class loads it)


METHOD_NAMES = tuple(PACKAGES)


@functools.cache
def method(name: str) -> MethodSpec:
    if name not in PACKAGES:
        raise unknown_method_error(name)
    spec = importlib.import_module(PACKAGES[name]).METHOD
    assert spec.name == name, f"{PACKAGES[name]} registers {spec.name!r}, listed as {name!r}"
    return spec


def is_layerskip_method(name: Any) -> bool:
    return isinstance(name, str) and name in PACKAGES


def looks_like_layerskip_method(name: Any) -> bool:
    """A misspelling of a layer-skip method name (e.g. "swfit")."""
    return (isinstance(name, str) and name not in PACKAGES
            and bool(difflib.get_close_matches(name, METHOD_NAMES, n=1)))


def unknown_method_error(name: str) -> LayerSkipConfigError:
    close = difflib.get_close_matches(name, METHOD_NAMES, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return LayerSkipConfigError(
        f"Unknown layer-skip method '{name}'{hint}. The methods of vllm-layerskip: "
        f"{', '.join(METHOD_NAMES)}."
    )


def split_speculative_config(
    raw: dict[str, Any], vllm_keys: set[str]
) -> tuple[str, Any, dict[str, Any]]:
    """Split a user's speculative config into (method, our options, vLLM's keys).

    `vllm_keys` are the field names of vLLM's SpeculativeConfig.

    Raises LayerSkipConfigError for an unknown key or a value out of range.
    """
    name = raw["method"]
    options_cls = method(name).options
    option_names = {f.name for f in dataclasses.fields(options_cls)}
    ours = {k: v for k, v in raw.items() if k in option_names}
    vllm_part = {k: v for k, v in raw.items() if k not in option_names}
    given_model_keys = sorted(set(vllm_part) & DRAFT_MODEL_KEYS)
    if given_model_keys:
        raise LayerSkipConfigError(
            f"Method '{name}' drafts with the target model itself; remove "
            f"{', '.join(repr(k) for k in given_model_keys)} from the speculative config."
        )
    unknown = sorted(set(vllm_part) - set(vllm_keys))
    if unknown:
        old = options_cls.DEPRECATED_KEYS
        valid = sorted((option_names - set(old)) | {"method", "num_speculative_tokens"})
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, valid + list(old), n=1)
            close = [old.get(c, c) for c in close if old.get(c, c)]  # the new name
            hints.append(f"'{key}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
        raise LayerSkipConfigError(
            f"Unknown key(s) in the speculative config for method '{name}': "
            f"{', '.join(hints)}. Valid keys: {', '.join(valid)} (and vLLM's own "
            "speculative-config keys)."
        )
    try:
        options = options_cls(**ours)
    except TypeError as e:  # pragma: no cover - keys were filtered above
        raise LayerSkipConfigError(str(e)) from e
    return name, options, vllm_part

