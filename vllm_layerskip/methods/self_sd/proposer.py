"""Method `self_sd`: draft with a skip set searched offline (Draft & Verify,
Zhang et al., ACL 2024) and stop each draft with the adaptive draft-exiting
threshold of the paper's Eq. 2-4.

The profile comes from `vllm-layerskip search` (offline_search.py). The threshold is
engine-wide: after each verify step, AR_e is the acceptance rate of the drafts
it verified (all requests together), and

    AR    <- beta_1 AR + (1 - beta_1) AR_e        (AR = AR_1 at the first step)
    g~     = gamma + eps  if AR <= alpha  else  gamma - eps
    gamma <- beta_2 gamma + (1 - beta_2) g~

so a draft stops at the first token whose top-1 probability is below gamma, and
gamma rises while acceptance is under the target alpha.
"""

from __future__ import annotations

import logging
from vllm_layerskip.core.draft_batch import DraftRequests, DraftResult
from vllm_layerskip.core.identity import model_identity
from vllm_layerskip.core.skip_mask import SkipMask
from vllm_layerskip.methods.self_sd.profile import load_profile
from vllm_layerskip.methods.self_sd.threshold import AdaptiveThreshold
from vllm_layerskip.core.proposer import SelfDraftProposer

logger = logging.getLogger("vllm.layerskip")


class SelfSdProposer(SelfDraftProposer):
    def on_model_loaded(self) -> None:
        identity = model_identity(self.vllm_config.model_config)
        self.profile = load_profile(self.options.profile, identity)
        self.mask = SkipMask.from_sets(
            self.engine.num_layers, self.profile.skip_attn, self.profile.skip_mlp
        )
        o = self.options
        self.threshold = AdaptiveThreshold(
            gamma=o.draft_confidence_threshold, target=o.target_acceptance,
            step=o.threshold_step, beta1=o.acceptance_smoothing, beta2=o.threshold_smoothing,
        )
        logger.info(
            "vllm-layerskip self_sd: profile %s (%s %.4g), %s", self.profile.path,
            self.profile.objective.get("name"), self.profile.objective.get("value", float("nan")),
            self.mask.describe(),
        )

    def draft(self, runner, requests: DraftRequests) -> DraftResult:
        return self.engine.draft(runner, requests, self.mask, self.threshold.gamma)

    def on_verified(self, num_drafted: int, num_accepted: int) -> None:
        if self.options.adaptive_threshold:
            self.threshold.update(num_accepted / num_drafted)

    def status(self) -> dict:
        return {
            **super().status(),
            "self_sd": {
                "profile": self.profile.path,
                "skip_set": {"skip_attn": self.profile.skip_attn, "skip_mlp": self.profile.skip_mlp},
                "threshold": self.threshold.gamma,
                "acceptance": self.threshold.acceptance,
                "threshold_updates": self.threshold.updates,
                # What the offline search cost, as recorded in the profile.
                "search_iterations": self.profile.search.get("iterations"),
                "search_seconds": self.profile.search.get("seconds_this_run"),
                "search_objective": self.profile.search.get("objective"),
            },
        }
