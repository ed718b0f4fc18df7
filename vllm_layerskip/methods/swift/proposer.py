"""Method `swift`: on-the-fly skip-set optimization, then confidence-aware drafting
(SWIFT, Xia et al., ICLR 2025; defaults from its Appendix B.2 and reference code).

Phases, engine-wide (the set is shared by every request; state carries across
requests, so later requests start from what earlier ones taught):

1. accumulating: draft with an evenly spread set of round(r * 2(L-2)) sub-layers
   until the running requests have `context_window` (gamma) generated tokens.
2. optimizing: before each decoding step, score one candidate set by its
   matchness: the fraction of the recent generated tokens (up to gamma per
   request, `max_score_tokens` in all) that the candidate draft predicts
   exactly, in ONE pass over those positions that reads the target's KV cache
   and writes none (DraftEngine.score). Every `bo_interval`-th candidate comes
   from Bayesian optimization, the others from random search. A candidate that
   beats the best set's score is checked against the best set re-scored on the
   same tokens (scores from different text are not comparable) and replaces it
   if it still wins. Drafting uses the best set throughout.
3. accelerating: after the target matchness, the patience or the step limit,
   draft with the best set. Drafts stop early when the top-1 probability falls
   under `draft_confidence_threshold`.

Beyond the paper:
- If an optimization phase ends with draft acceptance under
  `acceptance_tolerance`, r drops by `skip_ratio_step` and optimization starts
  again from a subset of the best set (the paper lowered r 0.5 -> 0.4 this way).
- If acceptance during acceleration falls under `reoptimize_below` times what
  it was right after optimizing (the text stream changed), optimization resumes
  from the current best set with a fresh step budget.
- While the cost model keeps self-drafts off (its probes find they do not pay),
  optimizing runs at an eighth of its rate and time share, and at full rate
  again once a probe finds they pay.
- Decoding never waits for the optimizer: the Gaussian-process fit and the
  suggestions run in a background thread; a candidate is scored once it is
  ready. A failure there (or in a scoring pass) is logged once, optimization
  stops, and drafting goes on with the last good set.
- `state_file` warm-starts the best set and the optimizer's history.

Tensor parallelism (rank_agreement.py): every scoring pass is a chain of
all-reduces, so all ranks must score the same candidate in the same step and
switch sets in the same step. Rank 0 alone runs the optimizer thread and makes
the rank-local decisions (candidate ready or not, time budget, thread failure);
at each due optimization step it shares one decision ("score this candidate",
"wait", "over budget", "failed") and, after each scoring pass, its score.
Everything else (phases, the best set, r-lowering subsets from the seed) follows
from those shared values and from the sampled tokens, which every rank holds,
so all ranks switch sets at the same decode step however slow rank 0's thread
is. With one rank, sharing is a plain return: nothing changes without TP.

Not possible in vLLM 0.32 V1: the paper's dynamic top-k tree verification
(vLLM verifies one chain of draft tokens per request).
"""

from __future__ import annotations

from vllm_layerskip.core.draft_batch import DraftRequests, DraftResult
from vllm_layerskip.core.identity import model_identity
from vllm_layerskip.core.proposer import SelfDraftProposer
from vllm_layerskip.methods.swift.optimizer import SwiftOptimizer
from vllm_layerskip.methods.swift.scoring import WindowScorer


class SwiftProposer(SelfDraftProposer):
    def on_model_loaded(self) -> None:
        self.optimizer = SwiftOptimizer(
            self.options,
            self.engine.num_layers,
            model_identity(self.vllm_config.model_config),
            agreement=self.agreement,
        )
        self.scorer = WindowScorer(self.engine)

    def before_draft(self, runner, requests: DraftRequests) -> None:
        # While the cost model keeps self-drafts off (its probes find they do not
        # pay), optimizing slows down (optimizer.IDLE_SLOWDOWN): at full rate and
        # share, swift took 0.60 ms a step where it drafted nothing on SmolLM2
        # (2.2% of a plain step, against 0.19 ms for the proposer alone).
        self.optimizer.step(runner, self.scorer, requests, self.self_drafts_in_use)

    def draft(self, runner, requests: DraftRequests) -> DraftResult:
        return self.engine.draft(
            runner, requests, self.optimizer.mask, self.options.draft_confidence_threshold
        )

    def on_drafting_paused(self) -> None:
        self.optimizer.budget.pause()

    def on_verified(self, num_drafted: int, num_accepted: int) -> None:
        self.optimizer.observe_acceptance(num_drafted, num_accepted)

    def status(self) -> dict:
        return {**super().status(), "swift": self.optimizer.summary()}
