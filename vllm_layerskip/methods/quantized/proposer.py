"""Method `quantized`: the whole model as its own draft, read through a
quantized copy of its linear weights. On a memory-bound CPU a draft token
costs about the bytes it reads: 4.5 bits a weight instead of 16 (int4)."""

from __future__ import annotations

import logging

from vllm_layerskip.core.draft_batch import DraftResult
from vllm_layerskip.core.proposer import SelfDraftProposer
from vllm_layerskip.core.skip_mask import SkipMask

logger = logging.getLogger("vllm.layerskip")


class QuantizedProposer(SelfDraftProposer):
    def on_model_loaded(self) -> None:
        self.mask = SkipMask.from_sets(self.engine.num_layers, (), ())
        logger.info("vllm-layerskip quantized: every layer drafts through %s weights",
                    self.options.draft_weights)

    def draft(self, runner, requests) -> DraftResult:
        return self.engine.draft(
            runner, requests, self.mask, self.options.draft_confidence_threshold
        )
