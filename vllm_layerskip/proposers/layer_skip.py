"""Method `layer_skip`: draft with a fixed set of skipped attention/MLP sub-layers."""

from __future__ import annotations

import logging

from vllm_layerskip.draft_engine import DraftResult
from vllm_layerskip.options import build_mask
from vllm_layerskip.proposers.base import LayerSkipProposerBase

logger = logging.getLogger("vllm.layerskip")


class LayerSkipProposer(LayerSkipProposerBase):
    def on_model_loaded(self) -> None:
        self.mask = build_mask(self.options, self.engine.num_layers)
        logger.info("vllm-layerskip layer_skip: %s", self.mask.describe())

    def draft(self, runner, requests) -> DraftResult:
        return self.engine.draft(
            runner, requests, self.mask, self.options.draft_confidence_threshold
        )
