"""Method `clasp`: the skip set follows the context (CLaSp, Chen et al., ACL 2025).

Every `layer_optimization_interval` verify steps, before drafting, a dynamic
program (layer_dp.clasp_dp, the paper's Algorithm 1) re-chooses which M whole
decoder layers the draft skips, so that the skipped model's residual stream
stays closest (cosine) to the full model's on the last verified token. Drafts
then stop per request once the draft's top-1 probability falls under the
draft-exiting threshold (`draft_confidence_threshold`).

One DP run, for the R requests it looks at, on each request's last verified
token (position p - 1, p = the token just sampled; the verify pass already
wrote its K/V):
- Layer by layer, the layer runs once on the row g(i-1, 0..M) of every
  request, as one batch of up to R * (M + 1) one-token queries at p - 1 (rows
  repeat), each attending to its request's cached prefix and writing no KV;
  kernels.clasp_dp.dp_select keeps computed or skipped per j. Column 0 is the
  full model, so it yields the targets x_1..x_L on the way. Deviation from the
  paper, which takes x_i from the verify pass: they are recomputed (R more rows
  per layer call), so vLLM's verify pass needs no patch.
- As in any no-write pass, the query at p - 1 attends to the K/V the cache
  holds there, the target's, not to K/V made from the candidate itself: for
  skipped-layer candidates one of p attended positions differs from a draft.
- Backtracking from g(L, M) gives the skip set; the mask is swapped here, at
  the step boundary, before this step's draft.
Cost per run: L batched layer calls over sum_i R * (min(i-1, M) + 1) rows,
about R * (L * (M + 1) - M^2 / 2) layer-token evaluations (SmolLM2, L = 30,
M = 8, R = 1: ~8 single-token forwards of compute, in 30 layer calls).

Batches: one engine-wide mask. The DP objective is the mean cosine over the
last verified tokens of up to `max_dp_requests` running requests (they take
turns when more run): a candidate skip set is shared by the requests, so its
score is the mean of theirs. Cost grows linearly with R. Per-request masks
would fit each context better but split every draft step into one forward per
distinct mask; a round-robin DP on one request would be cheaper but would fit
one request's context at a time.

Why in the engine step, not in a background thread: the DP's layer calls go
through vLLM's attention layers, which read the forward context (attention
metadata, KV slot mappings) from a process-global that the engine's own
forward sets; run concurrently, either forward could see the other's context.
The DP also reads the requests' KV blocks, which the engine frees and reuses
as requests finish, and vLLM's CPU kernels are not safe to call from two
threads at once. A thread on a copy of the K/V was tried and removed: where
the engine keeps the cores busy it only moved the DP's work, and its masks
arrived many steps late (git history: background_dp, removed). So the DP runs synchronously
in `before_draft`, every N steps (put off while the cost model keeps drafting
off, and while the runs so far have used up `max_optimizer_share` of the
engine's time: optimizer_budget.py).

A failing DP run is logged; drafting goes on with the last good mask. After
MAX_CONSECUTIVE_FAILURES failures in a row the DP is stopped for good.

Tensor parallelism: every rank runs the DP (its layer calls are collectives)
on the same rows in the same step, since when it runs depends only on the
step count and the requests, which all ranks share. Its cosines come from
all-reduced states and should pick the same set everywhere, but an argmax over
near-equal floats must not split the ranks: rank 0's result (or failure) is
broadcast and adopted by all (rank_agreement.py), one small message per run.
"""

from __future__ import annotations

from vllm_layerskip.core.draft_batch import DraftRequests, DraftResult
from vllm_layerskip.core.proposer import SelfDraftProposer
from vllm_layerskip.methods.clasp.dp_scheduler import ClaspDPScheduler
from vllm_layerskip.methods.clasp.layer_states import LayerStates


class ClaspProposer(SelfDraftProposer):
    def on_model_loaded(self) -> None:
        self.dp = ClaspDPScheduler(self.options, self.engine.num_layers, self.agreement)
        self.layers = LayerStates(self.engine)

    def before_draft(self, runner, requests: DraftRequests) -> None:
        # A DP run only pays off if this step drafts, but the cost model decides
        # that after this hook: the last step's decision stands in. While the
        # cost model keeps drafting off, a due DP run waits, and runs on the
        # step after drafting resumes (e.g. after a probe), at an eighth of the
        # time share while the probes find self-drafts do not pay.
        drafting = self.policy is None or self.self_drafted_last_step
        self.dp.step(runner, self.layers, requests, drafting, self.self_drafts_in_use)

    def draft(self, runner, requests: DraftRequests) -> DraftResult:
        return self.engine.draft(
            runner, requests, self.dp.mask, self.options.draft_confidence_threshold
        )

    def on_drafting_paused(self) -> None:
        self.dp.budget.pause()

    def status(self) -> dict:
        return {**super().status(), "clasp": self.dp.summary()}
