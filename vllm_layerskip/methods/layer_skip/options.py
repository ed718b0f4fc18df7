"""Options of method `layer_skip`, and the skip mask they describe."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_layerskip.core.errors import LayerSkipConfigError
from vllm_layerskip.core.identity import ModelIdentity
from vllm_layerskip.core.options import DraftingOptions, check_layer_list, take_renamed_key
from vllm_layerskip.core.skip_mask import SkipMask, uniform_skip_sets


@dataclass(frozen=True)
class LayerSkipOptions(DraftingOptions):
    """Options of method `layer_skip`: a fixed set of skipped sub-layers."""

    DEPRECATED_KEYS = {"skip_ratio": "sublayer_skip_ratio"}

    skip_layers: tuple[int, ...] = ()
    """Whole decoder layers to skip (attention and MLP)."""
    skip_attn: tuple[int, ...] = ()
    """Layers whose attention sub-layer is skipped."""
    skip_mlp: tuple[int, ...] = ()
    """Layers whose MLP sub-layer is skipped."""
    sublayer_skip_ratio: float | None = None
    """Fraction of all 2*L attention and MLP sub-layers to skip, spread evenly
    over layers 1..L-2 (the first and last layer are kept). Used when no
    explicit set is given. (`swift`'s `skip_ratio` counts only the 2(L-2)
    sub-layers of layers 1..L-2; `clasp`'s `layer_skip_ratio` whole layers.)"""
    skip_ratio: float | None = None
    """The old spelling of `sublayer_skip_ratio`: accepted, with a warning that
    names the new key, for one release."""

    def __post_init__(self):
        super().__post_init__()
        for key in ("skip_layers", "skip_attn", "skip_mlp"):
            object.__setattr__(self, key, check_layer_list(key, getattr(self, key)))
        take_renamed_key(self, "layer_skip", "skip_ratio", "sublayer_skip_ratio",
                         "a share of all 2L attention and MLP sub-layers")
        if self.sublayer_skip_ratio is not None:
            ratio = self.sublayer_skip_ratio
            if isinstance(ratio, bool) or not isinstance(ratio, (int, float)):
                raise LayerSkipConfigError(
                    f"'sublayer_skip_ratio' must be a number in [0, 1), got {ratio!r}."
                )
            if not 0.0 <= ratio < 1.0:
                raise LayerSkipConfigError(
                    f"'sublayer_skip_ratio' must be in [0, 1), got {ratio}. "
                    "Use e.g. 0.3 to skip 30% of the attention and MLP sub-layers."
                )
            if self.skip_layers or self.skip_attn or self.skip_mlp:
                raise LayerSkipConfigError(
                    "'sublayer_skip_ratio' cannot be combined with 'skip_layers', "
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
    if options.sublayer_skip_ratio is not None:
        skip_attn, skip_mlp = uniform_skip_sets(num_layers, options.sublayer_skip_ratio)
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
