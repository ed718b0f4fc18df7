"""What a draft step takes and returns: the requests drafting this step (rows of
vLLM's input batch) and their draft tokens with the draft distribution q."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class DraftRequests:
    """The requests that draft this step, as rows of the runner's input batch."""

    rows: np.ndarray  # [num_drafting] input-batch row of each request
    last_token: np.ndarray  # [num_drafting] the token just sampled (position p)
    last_position: np.ndarray  # [num_drafting] p
    budget: np.ndarray  # [num_drafting] most draft tokens allowed
    temperature: np.ndarray  # [num_drafting] 0 for greedy
    # [num_drafting] tokens copied from the context (prompt lookup) that a
    # request's self-draft continues: they open its draft and count against its
    # budget (empty: the draft starts at p). None: no request continues one.
    prefix: list[np.ndarray] | None = None


def query_positions(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """[sum(lengths)] the positions of queries that start at `starts`, one
    query after the other."""
    return np.concatenate([np.arange(s, s + n, dtype=np.int64) for s, n in zip(starts, lengths)])


def write_one_hot(probs: torch.Tensor, row: int, tokens) -> None:
    """A copied draft's q at `row` ([K, vocab], zeroed first): all mass on each
    copied token, so the rejection sampler accepts it with probability p(x), as
    vLLM's own n-gram drafts; a self-draft continuing the copy writes after it."""
    tokens = torch.as_tensor(np.asarray(tokens, dtype=np.int64))
    probs[row].zero_()
    probs[row, torch.arange(len(tokens)), tokens] = 1.0


def empty_probs(runner, num_speculative_tokens: int) -> torch.Tensor:
    """[num_reqs, K, vocab] zeros: the draft q of a step with sampled requests."""
    vocab = runner.model_config.get_vocab_size()
    return torch.zeros(runner.input_batch.num_reqs, num_speculative_tokens, vocab,
                       dtype=torch.float32, device=runner.device)


@dataclass
class DraftResult:
    token_ids: list[list[int]]  # [num_reqs][<= K], per input-batch row
    probs: torch.Tensor | None  # [num_reqs, K, vocab] draft q, None if all greedy
    num_forward_steps: int  # draft forward passes run
    top1_probs: list[list[float]]  # [num_reqs][<= K] draft confidence per token
    # [num_reqs][<= K] layers each draft token ran (early exit only, else empty)
    exit_layers: list[list[int]] = field(default_factory=list)
    # Rows the forward passes ran, summed over them: what a draft pass costs.
    # More than the tokens drafted where an early-exit row found no confident head.
    num_rows_run: int = 0

    @classmethod
    def none(cls, num_rows: int) -> "DraftResult":
        """No draft for any of `num_rows` requests (the step decodes plainly)."""
        return cls([[] for _ in range(num_rows)], None, 0, [[] for _ in range(num_rows)])

    @property
    def num_draft_tokens(self) -> int:
        return sum(len(t) for t in self.token_ids)
