"""Options of method `quantized`: every layer drafts, reading a quantized copy
of its linear weights (core/draft_weights.py); nothing is skipped."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_layerskip.core.errors import LayerSkipConfigError
from vllm_layerskip.core.options import DraftingOptions


@dataclass(frozen=True)
class QuantizedOptions(DraftingOptions):
    """The keys every method takes; `draft_weights` defaults to "int4" and
    cannot be left out (without it the draft would be the model itself)."""

    draft_weights: str | None = "int4"

    def __post_init__(self):
        if self.draft_weights is None:
            raise LayerSkipConfigError(
                "Method 'quantized' drafts through a quantized copy of the model's "
                "weights: 'draft_weights' must be \"int4\" or \"w8a8\" "
                "(default \"int4\"); for the model's own weights with sub-layers "
                "skipped use 'layer_skip', 'swift', 'clasp' or 'self_sd'.")
        super().__post_init__()
