"""Options of method `clasp`."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from vllm_layerskip.core.errors import LayerSkipConfigError
from vllm_layerskip.core.identity import ModelIdentity
from vllm_layerskip.core.options import (
    DraftingOptions,
    check_bool,
    check_int,
    check_share,
    take_renamed_key,
)

logger = logging.getLogger("vllm.layerskip")

# Keys of removed features, accepted (with a warning) for one release.
REMOVED_KEYS = ("background_dp", "max_dp_context")


@dataclass(frozen=True)
class ClaspOptions(DraftingOptions):
    """Options of method `clasp` (CLaSp, Chen et al., ACL 2025; defaults from
    its Section 5.3)."""

    DEFAULT_SKIP_RATIO = 0.5  # class constant, not an option
    DEPRECATED_KEYS = {"skip_ratio": "layer_skip_ratio", **dict.fromkeys(REMOVED_KEYS)}

    num_skip_layers: int | None = None
    """M: whole decoder layers the draft skips. Give this or `layer_skip_ratio`."""
    layer_skip_ratio: float | None = None
    """M as a fraction of the L decoder layers: M = round(r * L). When neither
    is given, r = 0.5 (the paper finds 40-60% best, Sec. 5.3.1). A share of
    whole layers (`swift`'s `skip_ratio` and `layer_skip`'s `sublayer_skip_ratio`
    are shares of sub-layers)."""
    skip_ratio: float | None = None
    """The old spelling of `layer_skip_ratio`: accepted, with a warning that
    names the new key, for one release."""
    layer_optimization_interval: int = 16
    """Verify steps between DP runs. In the paper the speedup first rises with
    the interval, then falls once it passes 128 (Sec. 3.7, 5.3.2, Fig. 4b); the
    text names no single value, so 16 is our choice within that range."""
    draft_confidence_threshold: float = 0.7
    """The paper's draft-exiting threshold (Sec. 5.3.3, best near 0.7): stop a
    request's draft once the draft's top-1 probability is below it."""
    protect_first_layers: int = 0
    """The DP never skips the first this many layers (the paper protects none)."""
    protect_last_layers: int = 0
    """The DP never skips the last this many layers."""
    max_dp_requests: int = 8
    """Most running requests whose last tokens enter one DP run; with more
    running, they take turns. The DP's cost grows linearly with this."""
    max_optimizer_share: float = 0.01
    """Most of the engine's busy time the DP may take (token bucket, as SWIFT's
    `max_optimizer_share`): a due run that would exceed it waits. The DP's cost
    grows with the requests it covers; uncapped it took 10% of the time at 8
    concurrent requests here. 1 = every due run goes ahead (the paper)."""
    background_dp: bool | None = None
    """Removed (the DP runs in the engine step, always): accepted, with a
    warning, for one release, and ignored."""
    max_dp_context: int | None = None
    """Removed with `background_dp`, whose K/V copies it bounded: accepted,
    with a warning, for one release, and ignored."""

    def __post_init__(self):
        super().__post_init__()
        if self.num_skip_layers is not None:
            check_int("num_skip_layers", self.num_skip_layers, minimum=1, unit="layers")
        take_renamed_key(self, "clasp", "skip_ratio", "layer_skip_ratio",
                         "a share of whole decoder layers")
        r = self.layer_skip_ratio
        if r is not None and (
            isinstance(r, bool) or not isinstance(r, (int, float)) or not 0.0 < r < 1.0
        ):
            raise LayerSkipConfigError(
                f"'layer_skip_ratio' must be a number in (0, 1), got {r!r}. CLaSp skips "
                "this fraction of the decoder layers; the paper uses 0.4-0.6."
            )
        if r is not None and self.num_skip_layers is not None:
            raise LayerSkipConfigError(
                "Give either 'num_skip_layers' or 'layer_skip_ratio' for method 'clasp', "
                "not both."
            )
        check_int(
            "layer_optimization_interval", self.layer_optimization_interval, minimum=1,
            unit="verify steps between DP runs",
        )
        check_int("protect_first_layers", self.protect_first_layers, minimum=0, unit="layers")
        check_int("protect_last_layers", self.protect_last_layers, minimum=0, unit="layers")
        check_int("max_dp_requests", self.max_dp_requests, minimum=1, unit="requests")
        check_share("max_optimizer_share", self.max_optimizer_share)
        self._warn_about_removed_keys()

    def _warn_about_removed_keys(self) -> None:
        """Old configs that name `background_dp` (the DP on a background thread,
        removed) or its `max_dp_context` start, with one warning."""
        if self.background_dp is not None:
            check_bool("background_dp", self.background_dp)
        if self.max_dp_context is not None:
            check_int("max_dp_context", self.max_dp_context, minimum=1, unit="positions")
        given = [key for key in REMOVED_KEYS if getattr(self, key) is not None]
        if given:
            logger.warning(removed_keys_warning(given))

    def num_skipped(self, num_layers: int) -> int:
        """M for a model with `num_layers` decoder layers."""
        if self.num_skip_layers is not None:
            return self.num_skip_layers
        return round((self.layer_skip_ratio or self.DEFAULT_SKIP_RATIO) * num_layers)

    def validate_for_model(self, model: ModelIdentity) -> None:
        super().validate_for_model(model)
        n = model.num_layers
        m = self.num_skipped(n)
        key = "num_skip_layers" if self.num_skip_layers is not None else "layer_skip_ratio"
        protected = self.protect_first_layers + self.protect_last_layers
        if protected >= n:
            raise LayerSkipConfigError(
                f"'protect_first_layers' + 'protect_last_layers' = {protected} protects "
                f"every one of the model's {n} decoder layers; nothing is left to skip."
            )
        if m < 1:
            raise LayerSkipConfigError(
                f"'layer_skip_ratio' {self.layer_skip_ratio} skips no layer of this model "
                f"({n} decoder layers); raise it."
            )
        most = min(n - 1, n - protected)
        if m > most:
            raise LayerSkipConfigError(
                f"'{key}' asks to skip {m} layers, but this model has {n} decoder layers, "
                f"{protected} of them protected, and the draft keeps at least one: "
                f"at most {most} can be skipped."
            )


def removed_keys_warning(keys: list[str]) -> str:
    names = " and ".join(f"'{key}'" for key in keys)
    one = len(keys) == 1
    return (
        f"vllm-layerskip clasp: {names} {'was' if one else 'were'} removed and "
        f"{'is' if one else 'are'} ignored: the DP now always runs in the engine step. "
        f"Remove {'it' if one else 'them'} from the speculative config; the next "
        f"release refuses {'it' if one else 'them'}."
    )
