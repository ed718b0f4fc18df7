"""What every layer-skip proposer shares: construction from the vLLM config, the
draft engine, and the entry point the model-runner patch calls."""

from __future__ import annotations

import logging
import time

from vllm_layerskip.draft_engine import DraftEngine, DraftResult
from vllm_layerskip.patches.config import get_selection

logger = logging.getLogger("vllm.layerskip")


class LayerSkipProposerBase:
    """A drafter that runs the target model itself with some sub-layers skipped.

    vLLM builds it from `speculative_config.model` (the `custom_class` path),
    calls `load_model(target_model)` once, and, through patches/model_runner.py,
    `propose_from_runner(...)` after every step that sampled tokens.
    """

    def __init__(self, vllm_config):
        spec = vllm_config.speculative_config
        selection = get_selection(spec)
        if selection is None:
            raise RuntimeError(
                f"{type(self).__name__} is built by the vllm-layerskip plugin from a "
                "speculative config with a layer-skip 'method'; it cannot be named as "
                "a custom_class model directly. Use e.g. "
                '{"method": "layer_skip", "num_speculative_tokens": 4}.'
            )
        self.vllm_config = vllm_config
        self.method = selection.method
        self.options = selection.options
        self.engine = DraftEngine(vllm_config, spec.num_speculative_tokens)
        self.stats = ProposerStats()

    def load_model(self, target_model) -> None:
        self.engine.load_model(target_model)
        self.on_model_loaded()

    def on_model_loaded(self) -> None:
        """Hook for subclasses: the model's layer count is known from here on."""

    def propose(self, *args, **kwargs):
        # vLLM's custom_class loader requires this method; the runner patch calls
        # propose_from_runner instead, which gets the runner's state.
        raise RuntimeError(
            "vllm-layerskip proposers are called through the plugin's model-runner "
            "patch; was the plugin loaded (vllm.general_plugins entry point)?"
        )

    def propose_from_runner(self, runner, sampled_token_ids: list[list[int]]) -> DraftResult:
        start = time.perf_counter()
        requests = self.engine.select_requests(runner, sampled_token_ids)
        result = self.draft(runner, requests)
        self.stats.record(result, time.perf_counter() - start)
        return result

    def draft(self, runner, requests) -> DraftResult:
        raise NotImplementedError


class ProposerStats:
    """Counters a benchmark or test reads from the proposer (worker process)."""

    def __init__(self):
        self.num_proposals = 0
        self.num_forward_steps = 0
        self.num_draft_tokens = 0
        self.draft_seconds = 0.0

    def record(self, result: DraftResult, seconds: float) -> None:
        self.num_proposals += 1
        self.num_forward_steps += result.num_forward_steps
        self.num_draft_tokens += sum(len(t) for t in result.token_ids)
        self.draft_seconds += seconds

    def as_dict(self) -> dict:
        return dict(vars(self))
