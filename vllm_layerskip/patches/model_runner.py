"""Model-runner patch: give layer-skip drafters the runner's state.

1. `GPUModelRunner.propose_draft_token_ids` (CPUModelRunner inherits it): vLLM's
   custom_class path passes a drafter token ids only, but a layer-skip draft needs
   the model, the input batch (positions, block tables, sampling parameters) and
   the attention groups, and must hand back draft probabilities for sampled
   requests. For a layer-skip drafter this calls `propose_from_runner(runner, ...)`
   and sets the runner's `_draft_probs` / `_draft_prob_req_ids`, which vLLM's
   rejection sampler reads on the next step. Other drafters take vLLM's own path.
2. `GPUModelRunner._input_fits_in_drafter`: when one request of the batch is
   within K tokens of max_model_len, vLLM skips the drafter for the whole batch
   and hands the scheduler K zero tokens per request as "drafts". Those are
   verified and rejected: K wasted verify tokens for every request of the batch,
   and acceptance counters that count them (under load with a few long requests,
   acceptance fell to 0.01-0.10 and every method ran at 0.66-0.76x plain). A
   layer-skip drafter caps each request's draft at max_model_len itself
   (draft_engine.select_requests), so for it the batch always fits.
3. `GPUModelRunner._sample`: with speculative decoding configured, vLLM builds
   spec-decode metadata and runs the rejection sampler every step, even when no
   request of the batch has a draft. For sampled requests (temperature > 0) that
   path draws exponential noise over the whole vocabulary per request for
   "recovered" tokens it then throws away: 7 ms per step at 8 requests on this
   CPU (SmolLM2's 49k vocabulary), which alone made every method 10% slower than
   plain decoding at T = 1 while the cost model had drafting off (vLLM's ngram
   pays the same). For a layer-skip drafter, a step with no drafts goes through
   vLLM's plain sampler instead: the same tokens and logprobs plain decoding
   gives (with one row per request the runner reads the output as plain
   decoding's), and seeded requests draw their random numbers as plain
   decoding does.
4. `GPUModelRunner.sample_tokens`: for a layer-skip drafter it attaches the
   step's drafts to its output, which saves the engine core a call to the
   worker per step (patches/engine_core.py). Otherwise it is vLLM's own.
"""

from __future__ import annotations

from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from vllm_layerskip.patches import Patch, call_original
from vllm_layerskip.patches.engine_core import DRAFTS_ATTR


def _has_layerskip_drafter(runner) -> bool:
    # Imported on use, as each patch function did before: a module-level import
    # would load the proposers wherever vLLM loads the plugin's patches.
    from vllm_layerskip.core.proposer import SelfDraftProposer

    return isinstance(getattr(runner, "drafter", None), SelfDraftProposer)


def propose_draft_token_ids(self, scheduler_output, sampled_token_ids, *args, **kwargs):
    # The remaining arguments (sampling metadata, hidden states, attention
    # metadata, slot mappings) are only for vLLM's own drafters.
    if not _has_layerskip_drafter(self):
        return call_original(GPUModelRunner, "propose_draft_token_ids")(
            self, scheduler_output, sampled_token_ids, *args, **kwargs
        )
    try:
        result = self.drafter.propose_from_runner(self, sampled_token_ids, scheduler_output)
    except Exception as e:
        # Draft passes contain their own failures (core/proposer.py). Anything
        # else (bookkeeping, the cost model, a method's per-step work) may have
        # left the proposer inconsistent: stop the engine with a message that
        # says where, rather than risk drafts that do not match the requests.
        method = getattr(self.drafter, "method", type(self.drafter).__name__)
        raise RuntimeError(
            f"vllm-layerskip: the '{method}' proposer failed outside a draft pass "
            f"({type(e).__name__}: {e}). The engine stops instead of serving with a "
            "proposer in an unknown state; restart without --speculative-config to "
            "serve meanwhile, and please report this with the traceback above."
        ) from e
    self._draft_probs = result.probs
    self._draft_prob_req_ids = (
        None if result.probs is None else list(self.input_batch.req_ids)
    )
    return result.token_ids


def _input_fits_in_drafter(self, common_attn_metadata):
    if common_attn_metadata is not None and _has_layerskip_drafter(self):
        return True
    return call_original(GPUModelRunner, "_input_fits_in_drafter")(self, common_attn_metadata)


def _sample(self, logits, spec_decode_metadata):
    if (
        spec_decode_metadata is not None
        and spec_decode_metadata.max_spec_len == 0
        and _has_layerskip_drafter(self)
    ):
        spec_decode_metadata = None
    return call_original(GPUModelRunner, "_sample")(self, logits, spec_decode_metadata)


def sample_tokens(self, *args, **kwargs):
    output = call_original(GPUModelRunner, "sample_tokens")(self, *args, **kwargs)
    if _has_layerskip_drafter(self) and isinstance(output, ModelRunnerOutput):
        # This step's drafts, handed to the engine core with the output
        # (patches/engine_core.py says why).
        setattr(output, DRAFTS_ATTR, self.take_draft_token_ids())
    return output


def patches() -> list[Patch]:
    return [
        Patch(GPUModelRunner, "sample_tokens", sample_tokens),
        Patch(GPUModelRunner, "_input_fits_in_drafter", _input_fits_in_drafter),
        Patch(GPUModelRunner, "_sample", _sample),
        Patch(GPUModelRunner, "propose_draft_token_ids", propose_draft_token_ids),
    ]
