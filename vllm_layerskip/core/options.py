"""What every method's options share: the drafting keys, and the checks that turn
a bad value into a message naming the key, the value and what is accepted.

Each method declares its own frozen dataclass of options (methods/<name>/options.py)
on top of `DraftingOptions`; the registry (methods/registry.py) takes the method's
keys out of the user's `--speculative-config` and builds it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_layerskip.core.errors import LayerSkipConfigError
from vllm_layerskip.core.identity import ModelIdentity


@dataclass(frozen=True)
class DraftingOptions:
    """Options every layer-skip method has."""

    draft_confidence_threshold: float = 0.0
    """Stop a request's draft once the draft's top-1 probability is below this."""
    adaptive_draft_length: bool = True
    """Choose each step's draft length (0 = no drafting) from measured costs and
    acceptance, so speculation never makes decoding slower (core/cost_model.py)."""
    probe_interval: int = 16
    """While drafting does not pay: steps between probes (doubling up to 512)."""

    def __post_init__(self):
        check_number("draft_confidence_threshold", self.draft_confidence_threshold, 0.0, 1.0)
        check_bool("adaptive_draft_length", self.adaptive_draft_length)
        check_int("probe_interval", self.probe_interval, minimum=1, unit="steps")

    def validate_for_model(self, model: ModelIdentity) -> None:
        """Raise LayerSkipConfigError if the options cannot apply to this model."""

    def validate_for_parallelism(self, tensor_parallel_size: int) -> None:
        """Raise LayerSkipConfigError if the options cannot apply to this layout."""


def check_number(key: str, value: Any, low: float, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise LayerSkipConfigError(
            f"'{key}' must be a number in [{low:g}, {high:g}], got {value!r}."
        )
    if not low <= value <= high:
        raise LayerSkipConfigError(
            f"'{key}' must be in [{low:g}, {high:g}], got {value}."
            + (" 0 disables it." if low == 0.0 else "")
        )


def check_share(key: str, value: Any) -> None:
    """An optimizer's share of the engine's time: in (0, 1]."""
    check_number(key, value, 0.0, 1.0)
    if value == 0:
        raise LayerSkipConfigError(
            f"'{key}' must be > 0 (the optimizer needs some time); to keep a set fixed "
            "use method 'layer_skip'."
        )


def check_int(key: str, value: Any, minimum: int, unit: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise LayerSkipConfigError(
            f"'{key}' must be {kind}{f' ({unit})' if unit else ''}, got {value!r}."
        )


def check_bool(key: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise LayerSkipConfigError(f"'{key}' must be true or false, got {value!r}.")


def check_layer_list(key: str, values: Any) -> tuple[int, ...]:
    """A list of layer indices, as a sorted tuple without repeats."""
    if not isinstance(values, (list, tuple)) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in values
    ):
        raise LayerSkipConfigError(
            f"'{key}' must be a list of layer indices (integers), got {values!r}."
        )
    return tuple(sorted(set(values)))
