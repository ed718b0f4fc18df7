"""Options of method `layer_skip`, and the skip mask they describe."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_layerskip.core.errors import LayerSkipConfigError
from vllm_layerskip.core.identity import ModelIdentity
from vllm_layerskip.core.options import DraftingOptions, check_layer_list
from vllm_layerskip.core.skip_mask import SkipMask, uniform_skip_sets


@dataclass(frozen=True)
class LayerSkipOptions(DraftingOptions):
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

    def __post_init__(self):
        super().__post_init__()
        for key in ("skip_layers", "skip_attn", "skip_mlp"):
            object.__setattr__(self, key, check_layer_list(key, getattr(self, key)))
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

    def validate_for_model(self, model: ModelIdentity) -> None:
        super().validate_for_model(model)
        build_mask(self, model.num_layers)  # raises on indices outside the model


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
