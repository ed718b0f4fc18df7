"""What the user asked for, carried from the front end to the workers.

The config patch (patches/config.py) parses the user's speculative config and
attaches the result to vLLM's SpeculativeConfig as `layerskip`; the config is
pickled to the engine core and the workers, where the proposer reads it back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LayerSkipSelection:
    method: str
    options: Any  # the method's options (a core.options.DraftingOptions subclass)


def get_selection(speculative_config) -> LayerSkipSelection | None:
    return getattr(speculative_config, "layerskip", None)


def attach_selection(speculative_config, selection: LayerSkipSelection) -> None:
    speculative_config.layerskip = selection
