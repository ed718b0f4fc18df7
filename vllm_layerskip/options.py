"""Options of every layer-skip method, parsed from `--speculative-config`.

vLLM's `SpeculativeConfig` forbids unknown keys, so the plugin takes its own keys
out of the user's dict before vLLM sees it (see `patches/config.py`), validates
them here into a frozen dataclass, and attaches that dataclass to the config.
Every error names the bad key or value and says what would be accepted.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import Any

# Methods whose proposer works end to end. A method is listed here only once it
# really works: asking for a planned one gives a clear error, never a fallback.
AVAILABLE_METHODS = ("layer_skip",)
PLANNED_METHODS = ("swift", "clasp", "self_sd", "adadecode")

# Keys of vLLM's own SpeculativeConfig that a layer-skip method cannot take:
# the draft is the target model itself.
DRAFT_MODEL_KEYS = frozenset({"model", "draft_model_config", "quantization", "revision"})


class LayerSkipConfigError(ValueError):
    """A bad `--speculative-config` for a layer-skip method."""


@dataclass(frozen=True)
class LayerSkipOptions:
    """Options of method `layer_skip`: a fixed set of skipped sub-layers."""

    skip_layers: tuple[int, ...] = ()
    """Whole decoder layers to skip (attention and MLP)."""
    skip_attn: tuple[int, ...] = ()
    """Layers whose attention sub-layer is skipped."""
    skip_mlp: tuple[int, ...] = ()
    """Layers whose MLP sub-layer is skipped."""
    skip_ratio: float | None = None
    """Fraction of the 2*L sub-layers to skip, spread evenly over the middle
    layers (first and last layer kept). Used when no explicit set is given."""
    draft_confidence_threshold: float = 0.0
    """Stop a request's draft once the draft's top-1 probability is below this."""
    adaptive_draft_length: bool = True
    """Choose each step's draft length (0 = no drafting) from measured costs and
    acceptance, so speculation never makes decoding slower (cost_model.py)."""
    probe_interval: int = 16
    """While drafting does not pay: steps between probes (doubling up to 512)."""

    def __post_init__(self):
        for key in ("skip_layers", "skip_attn", "skip_mlp"):
            values = getattr(self, key)
            if not isinstance(values, (list, tuple)) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in values
            ):
                raise LayerSkipConfigError(
                    f"'{key}' must be a list of layer indices (integers), got "
                    f"{values!r}."
                )
            object.__setattr__(self, key, tuple(sorted(set(values))))
        if self.skip_ratio is not None:
            ratio = self.skip_ratio
            if isinstance(ratio, bool) or not isinstance(ratio, (int, float)):
                raise LayerSkipConfigError(
                    f"'skip_ratio' must be a number in [0, 1), got {ratio!r}."
                )
            if not 0.0 <= ratio < 1.0:
                raise LayerSkipConfigError(
                    f"'skip_ratio' must be in [0, 1), got {ratio}. "
                    "Use e.g. 0.3 to skip 30% of the attention and MLP sub-layers."
                )
            if self.skip_layers or self.skip_attn or self.skip_mlp:
                raise LayerSkipConfigError(
                    "'skip_ratio' cannot be combined with 'skip_layers', "
                    "'skip_attn' or 'skip_mlp': give either a ratio or an "
                    "explicit set."
                )
        _check_probability("draft_confidence_threshold", self.draft_confidence_threshold)
        if not isinstance(self.adaptive_draft_length, bool):
            raise LayerSkipConfigError(
                f"'adaptive_draft_length' must be true or false, got {self.adaptive_draft_length!r}."
            )
        p = self.probe_interval
        if isinstance(p, bool) or not isinstance(p, int) or p < 1:
            raise LayerSkipConfigError(
                f"'probe_interval' must be a positive integer (steps), got {p!r}."
            )


def _check_probability(key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise LayerSkipConfigError(f"'{key}' must be a number in [0, 1], got {value!r}.")
    if not 0.0 <= value <= 1.0:
        raise LayerSkipConfigError(
            f"'{key}' must be in [0, 1], got {value}. 0 disables it."
        )


OPTIONS_BY_METHOD: dict[str, type] = {"layer_skip": LayerSkipOptions}


def is_layerskip_method(method: Any) -> bool:
    return method in AVAILABLE_METHODS or method in PLANNED_METHODS


def split_speculative_config(
    raw: dict[str, Any], vllm_keys: set[str]
) -> tuple[str, Any, dict[str, Any]]:
    """Split a user's speculative config into (method, our options, vLLM's keys).

    `vllm_keys` are the field names of vLLM's SpeculativeConfig.

    Raises LayerSkipConfigError for a planned-but-unavailable method, an unknown
    key, or a value out of range.
    """
    method = raw["method"]
    if method not in AVAILABLE_METHODS:
        raise LayerSkipConfigError(
            f"Speculative method '{method}' of vllm-layerskip is not available yet "
            f"in this version. Available layer-skip methods: "
            f"{', '.join(AVAILABLE_METHODS)}."
        )
    options_cls = OPTIONS_BY_METHOD[method]
    option_names = {f.name for f in dataclasses.fields(options_cls)}
    ours = {k: v for k, v in raw.items() if k in option_names}
    vllm_part = {k: v for k, v in raw.items() if k not in option_names}
    given_model_keys = sorted(set(vllm_part) & DRAFT_MODEL_KEYS)
    if given_model_keys:
        raise LayerSkipConfigError(
            f"Method '{method}' drafts with the target model itself; remove "
            f"{', '.join(repr(k) for k in given_model_keys)} from the speculative config."
        )
    unknown = sorted(set(vllm_part) - set(vllm_keys))
    if unknown:
        valid = sorted(option_names | {"method", "num_speculative_tokens"})
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, valid, n=1)
            hints.append(f"'{key}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
        raise LayerSkipConfigError(
            f"Unknown key(s) in the speculative config for method '{method}': "
            f"{', '.join(hints)}. Valid keys: {', '.join(valid)} (and vLLM's own "
            "speculative-config keys)."
        )
    try:
        options = options_cls(**ours)
    except TypeError as e:  # pragma: no cover - keys were filtered above
        raise LayerSkipConfigError(str(e)) from e
    return method, options, vllm_part


@dataclass(frozen=True)
class SkipMask:
    """Which sub-layers the draft pass runs. Index i is decoder layer i."""

    run_attn: tuple[bool, ...]
    run_mlp: tuple[bool, ...]

    @property
    def num_layers(self) -> int:
        return len(self.run_attn)

    @property
    def num_skipped(self) -> int:
        return self.run_attn.count(False) + self.run_mlp.count(False)

    def describe(self) -> str:
        attn = [i for i, r in enumerate(self.run_attn) if not r]
        mlp = [i for i, r in enumerate(self.run_mlp) if not r]
        return f"skip attn {attn} mlp {mlp} ({self.num_skipped}/{2 * self.num_layers})"

    @classmethod
    def from_sets(
        cls, num_layers: int, skip_attn: set[int] | tuple, skip_mlp: set[int] | tuple
    ) -> "SkipMask":
        return cls(
            run_attn=tuple(i not in set(skip_attn) for i in range(num_layers)),
            run_mlp=tuple(i not in set(skip_mlp) for i in range(num_layers)),
        )


def uniform_skip_sets(num_layers: int, ratio: float) -> tuple[set[int], set[int]]:
    """An evenly spread set of round(ratio * 2L) sub-layers, never in the first or
    last layer. Attention and MLP sub-layers alternate in the spread, so a ratio of
    0.5 on layers 1..L-2 skips every other sub-layer."""
    # Sub-layer s: layer s // 2, attention if s is even else MLP.
    candidates = list(range(2, 2 * (num_layers - 1)))
    count = min(round(ratio * 2 * num_layers), len(candidates))
    if count <= 0:
        return set(), set()
    step = len(candidates) / count
    chosen = [candidates[int(step * k + step / 2)] for k in range(count)]
    skip_attn = {s // 2 for s in chosen if s % 2 == 0}
    skip_mlp = {s // 2 for s in chosen if s % 2 == 1}
    return skip_attn, skip_mlp


def build_mask(options: LayerSkipOptions, num_layers: int) -> SkipMask:
    """The draft mask for a model with `num_layers` decoder layers, checked against it."""
    for key in ("skip_layers", "skip_attn", "skip_mlp"):
        bad = [i for i in getattr(options, key) if not 0 <= i < num_layers]
        if bad:
            raise LayerSkipConfigError(
                f"'{key}' has layer indices {bad} outside the model, which has "
                f"{num_layers} decoder layers (valid indices 0..{num_layers - 1})."
            )
    if options.skip_ratio is not None:
        skip_attn, skip_mlp = uniform_skip_sets(num_layers, options.skip_ratio)
    else:
        skip_attn = set(options.skip_layers) | set(options.skip_attn)
        skip_mlp = set(options.skip_layers) | set(options.skip_mlp)
    mask = SkipMask.from_sets(num_layers, skip_attn, skip_mlp)
    if mask.num_skipped == 2 * num_layers:
        raise LayerSkipConfigError(
            "The skip set skips every attention and MLP sub-layer, so the draft would "
            "not run the model at all. Keep at least one sub-layer."
        )
    return mask
