"""Options of method `self_sd`."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_layerskip.core.errors import LayerSkipConfigError
from vllm_layerskip.core.identity import ModelIdentity
from vllm_layerskip.core.options import DraftingOptions, check_bool, check_number
from vllm_layerskip.methods.self_sd.profile import load_profile


@dataclass(frozen=True)
class SelfSdOptions(DraftingOptions):
    """Options of method `self_sd` (Draft & Verify, Zhang et al., ACL 2024):
    a skip set searched offline (a profile) and the adaptive draft-exiting
    threshold of its Eq. 2-4 (defaults: Appendix B)."""

    profile: str | None = None
    """Path of a skip profile written by `vllm-layerskip search`, or "shipped"
    for the profile that ships with the plugin for this model."""
    draft_confidence_threshold: float = 0.6
    """gamma_0: the initial draft-exiting threshold (adapted while serving)."""
    adaptive_threshold: bool = True
    """Adapt the threshold to keep acceptance near `target_acceptance` (Eq. 2-4)."""
    target_acceptance: float = 0.85
    """alpha: the acceptance rate the threshold steers towards."""
    threshold_step: float = 0.01
    """epsilon: step of the threshold update."""
    acceptance_smoothing: float = 0.5
    """beta_1: AR <- beta_1 AR + (1 - beta_1) AR_e."""
    threshold_smoothing: float = 0.9
    """beta_2: gamma <- beta_2 gamma + (1 - beta_2) gamma~."""

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.profile, str) or not self.profile:
            raise LayerSkipConfigError(
                "Method 'self_sd' needs 'profile': the path of a skip profile from "
                "`vllm-layerskip search --model MODEL --out PROFILE.json`, or \"shipped\" "
                f"for the profile shipped for the model; got {self.profile!r}."
            )
        check_bool("adaptive_threshold", self.adaptive_threshold)
        check_number("target_acceptance", self.target_acceptance, 0.0, 1.0)
        check_number("threshold_step", self.threshold_step, 0.0, 1.0)
        check_number("acceptance_smoothing", self.acceptance_smoothing, 0.0, 1.0)
        check_number("threshold_smoothing", self.threshold_smoothing, 0.0, 1.0)

    def validate_for_model(self, model: ModelIdentity) -> None:
        super().validate_for_model(model)
        load_profile(self.profile, model)
