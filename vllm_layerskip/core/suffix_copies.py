"""Suffix-tree copies: drafts copied from the request's context and from earlier
requests' outputs ("copy_source": "suffix_tree").

Prompt lookup (core/lookup.py) copies what followed the most recent occurrence
of the request's last 2..4 tokens in its own context. A suffix tree
(SuffixDecoding, arXiv 2411.04975; the tree is arctic-inference's, the one
vLLM's `suffix` method uses) matches up to 24 tokens, in the request's prompt
and output and in the outputs of up to 10,000 earlier requests, and follows the
continuation seen most often while its estimated probability stays >= 0.1; a
draft is at most as long as its match, and offered only where it expects two or
more of its tokens accepted. On Qwen2.5-Coder-1.5B vLLM's `suffix`
read above its `ngram` in extraction, qa, math_reasoning and rag (one question
each: benchmarks/results/2026-12-03/bench_20261203-121422.md). Here such a copy
is one more draft source that the cost model weighs against self-drafts per
request and step, as it weighs lookups.

The trees follow vLLM's input batch: a request's tree is built from its prompt
the first time it drafts, its new tokens are added every time it drafts (all
tokens since the last time, accepted drafts included), and a request gone from
the batch has its output kept for later requests. Token ids are the same on
every tensor-parallel rank, so every rank's trees and drafts are the same.
"""

from __future__ import annotations

import numpy as np

# vLLM's defaults for its `suffix` method (SpeculativeConfig.suffix_decoding_*).
MAX_TREE_DEPTH = 24
MAX_CACHED_REQUESTS = 10000
MAX_SPEC_FACTOR = 1.0
MIN_TOKEN_PROB = 0.1
# A copy is offered only where the tree expects at least this many of its
# tokens accepted (the draft's score, the sum of its tokens' estimated
# probabilities): a request with a copy does not self-draft, and with every
# copy offered (mostly 1-2 tokens, from matches of 1-2 tokens) `quantized`
# self-drafted in 17% of steps instead of prompt lookup's 57%, M 2.36 against
# 4.01, 1.38x against 1.46x (benchmarks/results/2026-12-05/bench_20261205-090359.md).
# With this bound: M 4.86 against 3.98, but fewer free copies (self-drafts in 75%
# of steps), 1.31x against 1.38x (bench_20261205-092356.md): prompt lookup stays
# the default copy source.
MIN_EXPECTED_ACCEPTED = 2.0

INSTALL_HINT = ("arctic-inference's suffix tree is not installed in this environment: "
                "run `bash scripts/install_suffix.sh` (builds only the suffix tree, ~30 s)")


def suffix_tree_available() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("arctic_inference.suffix_decoding") is not None
    except ImportError:  # arctic_inference itself missing
        return False


class SuffixTreeCopies:
    """One engine's suffix trees and the copies they draft."""

    def __init__(self):
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.cache = SuffixDecodingCache(max_tree_depth=MAX_TREE_DEPTH,
                                         max_cached_requests=MAX_CACHED_REQUESTS)
        self._known: dict[str, int] = {}  # req id -> tokens its tree holds

    def drafts(self, batch, rows: np.ndarray, budget: np.ndarray) -> list[np.ndarray]:
        """For each request row of vLLM's input batch `batch` (`rows`), its copy
        of at most `budget[i]` tokens (possibly empty)."""
        self._forget_gone(batch.req_id_to_index)
        out = []
        for row, b in zip(rows.tolist(), budget.tolist()):
            # The tree takes contiguous int32 arrays (vLLM's token_ids_cpu is int32).
            tokens = np.ascontiguousarray(
                batch.token_ids_cpu[row, : batch.num_tokens_no_spec[row]], dtype=np.int32)
            req_id = batch.req_ids[row]
            self._update(req_id, tokens, int(batch.num_prompt_tokens[row]))
            if b <= 0:
                out.append(tokens[:0])
                continue
            draft = self.cache.speculate(req_id, tokens[-MAX_TREE_DEPTH:], max_spec_tokens=b,
                                         max_spec_factor=MAX_SPEC_FACTOR,
                                         min_token_prob=MIN_TOKEN_PROB)
            keep = draft.score >= MIN_EXPECTED_ACCEPTED
            out.append(np.asarray(draft.token_ids if keep else (), dtype=tokens.dtype))
        return out

    def _update(self, req_id: str, tokens: np.ndarray, num_prompt: int) -> None:
        known = self._known.get(req_id)
        if known is None or known > len(tokens):
            # New here, or its tokens went back (a request id reused): a fresh tree.
            if req_id in self.cache.active_requests:
                self.cache.stop_request(req_id)
            if req_id in self.cache.cached_requests:
                self.cache.evict_cached_response(req_id)
            num_prompt = min(num_prompt, len(tokens))
            self.cache.start_request(req_id, tokens[:num_prompt])
            known = num_prompt
        if len(tokens) > known:
            self.cache.add_active_response(req_id, tokens[known:])
        self._known[req_id] = len(tokens)

    def _forget_gone(self, in_batch) -> None:
        """Requests no longer in the batch: their outputs stay in the global
        tree for later requests; their own trees go."""
        for req_id in [r for r in self._known if r not in in_batch]:
            del self._known[req_id]
            if req_id in self.cache.active_requests:
                self.cache.stop_request(req_id)

    @property
    def request_ids(self) -> set[str]:
        return set(self._known)
