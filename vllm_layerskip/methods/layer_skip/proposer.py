"""Method `layer_skip`: draft with a fixed set of skipped attention/MLP sub-layers."""

from __future__ import annotations

import logging

from vllm_layerskip.core.draft_batch import DraftResult
from vllm_layerskip.methods.layer_skip.options import build_mask
from vllm_layerskip.core.proposer import SelfDraftProposer

logger = logging.getLogger("vllm.layerskip")


class LayerSkipProposer(SelfDraftProposer):
    def on_model_loaded(self) -> None:
        self.mask = build_mask(self.options, self.engine.num_layers)
        logger.info("vllm-layerskip layer_skip: %s", self.mask.describe())
        if self.mask.num_skipped == 0 and self.options.draft_weights:
            # The spelling of releases before method 'quantized' existed: it
            # keeps working for this release.
            logger.warning(
                "vllm-layerskip: 'layer_skip' with no sub-layer skipped and draft_weights "
                "%r is method 'quantized': write {\"method\": \"quantized\", "
                "\"draft_weights\": %r}; this spelling keeps working for one release.",
                self.options.draft_weights, self.options.draft_weights)

    def set_mask(self, mask) -> None:
        """Swap the skip set at the next step (used by `vllm-layerskip search`
        through collective_rpc, which reaches every tensor-parallel rank)."""
        if mask.num_layers != self.engine.num_layers:
            raise ValueError(f"mask has {mask.num_layers} layers, model {self.engine.num_layers}")
        self.mask = mask

    def draft(self, runner, requests) -> DraftResult:
        return self.engine.draft(
            runner, requests, self.mask, self.options.draft_confidence_threshold
        )
