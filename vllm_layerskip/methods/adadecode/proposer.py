"""Method `adadecode`: confidence-gated early exit through trained exit heads
(AdaDecode, Wei et al., ICML 2025, Sections 2.1-2.2).

Each draft token runs the target's decoder layers only up to the first exit
head (heads.py: softmax(E*(T(i) h_i)) at chosen layers i) whose top-1
probability exceeds `threshold`; the token and, for sampled requests, the
draft distribution q come from that head, so vLLM's rejection sampler keeps
the output distribution exactly the target's. With no confident head the
request's draft stops (no token this step).

KV of layers a draft token did not run: a token that exits at layer e writes
its K/V at its position for layers < e only. The next draft token would read
layers >= e at that position, which hold nothing valid (an older draft's or
another request's data, or never-written memory). So within one draft chain
a token may exit no deeper than the shallowest exit before it (the engine's
`EarlyExitPath.cap`, early_exit.py): every K/V a draft attends to was written by the target or by this
chain, and drafts stay deterministic. The price: after an early shallow exit
the rest of the chain can only use the shallower heads. Verification recomputes
every layer at every drafted position, so none of this affects the output.

Differences from the paper: in AdaDecode a token that exits early has only its
deep layers deferred, and they run later in parallel with the next tokens'
shallow layers; here vLLM's verify pass recomputes all layers of all drafted
tokens (their shallow layers run twice). Deferring only the deep layers would
need a verify pass that starts at each token's exit layer from a saved
residual stream (per-token start layers in one batch, i.e. a patched model
forward and attention metadata per layer group) and a rejection step that
discards the deferred work of rejected tokens.
"""

from __future__ import annotations

import logging

from vllm_layerskip.core.draft_batch import DraftRequests, DraftResult
from vllm_layerskip.methods.adadecode.heads import load_heads
from vllm_layerskip.core.identity import model_identity
from vllm_layerskip.core.proposer import SelfDraftProposer
from vllm_layerskip.methods.adadecode.early_exit import EarlyExit, EarlyExitPath

logger = logging.getLogger("vllm.layerskip")


class AdaDecodeProposer(SelfDraftProposer):
    def on_model_loaded(self) -> None:
        self.set_heads(self.options.heads)

    def set_heads(self, heads: str) -> None:
        """Load exit heads (a path or "shipped") and draft with them from the next
        step on; start-up does this with the configured heads, and tests call it
        through collective_rpc to compare heads on one engine."""
        self.heads = load_heads(heads, model_identity(self.vllm_config.model_config))
        weight = next(self.engine.stack.layers[0].parameters())
        self.path = EarlyExitPath(EarlyExit(
            layers=tuple(self.heads.layers),
            transforms=self.heads.transforms.to(device=weight.device, dtype=weight.dtype),
            threshold=self.options.threshold,
        ), self.engine.num_layers)
        self.num_exits = 0
        self.exit_layer_sum = 0
        logger.info(
            "vllm-layerskip adadecode: heads %s at layers %s, threshold %.2f",
            self.heads.path, self.heads.layers, self.options.threshold,
        )

    @property
    def continues_copies(self) -> bool:
        # An exit head's draft writes no K/V above its exit layer, which the
        # tokens after a continued copy would read (core/proposer.py).
        return False

    def draft(self, runner, requests: DraftRequests) -> DraftResult:
        result = self.engine.draft(
            runner, requests, confidence_threshold=self.options.draft_confidence_threshold,
            path=self.path,
        )
        for layers in result.exit_layers:
            self.num_exits += len(layers)
            self.exit_layer_sum += sum(layers)
        return result

    def status(self) -> dict:
        return {
            **super().status(),
            "adadecode": {
                "heads": self.heads.path,
                "layers": self.heads.layers,
                "threshold": self.options.threshold,
                # Layers run per draft token, averaged over all drafted tokens.
                "mean_exit_layer": self.exit_layer_sum / self.num_exits if self.num_exits else None,
                "num_layers": self.engine.num_layers,
                "training_seconds": self.heads.training.get("seconds"),
                "heldout_kl": self.heads.heldout_kl,
            },
        }
