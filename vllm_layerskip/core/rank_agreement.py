"""Decisions that every tensor-parallel rank must take alike.

Under tensor parallelism each rank runs its own copy of the proposer over its
shard of the model, and every draft, scoring or DP pass is a chain of
collectives (an all-reduce per kept attention or MLP sub-layer). The ranks must
run the same passes, over the same rows, with the same masks, in the same
steps; otherwise they hang in an all-reduce or add up partial sums of
different layers.

What the proposers decide from falls in two kinds:
- Data every rank holds identically: the input batch, the sampled tokens and
  the logits (gathered onto every rank). vLLM relies on this itself: in V1 each
  tensor-parallel rank samples its own tokens from its own copy of the logits.
  Decisions made only from such data agree without any message: fixed masks,
  a draft's stop on a low top-1 probability, acceptance counters, seeded
  random choices.
- Rank-local inputs: wall-clock time (the draft-length cost model, SWIFT's
  optimizer time budget), whether a background thread has finished (SWIFT's
  suggestions), a failure. For these, rank 0 decides and every rank applies
  rank 0's decision at the same call: `share()`. A few float results that
  should agree anyway (SWIFT's matchness scores, CLaSp's DP choice) are
  shared too, so that no rounding difference between ranks can split them.

`share()` is a broadcast from rank 0 over vLLM's tensor-parallel group (on one
node, the group's shared-memory message queue; a small pickled object). Every
rank must call it at the same point of the same step, so call sites sit on
paths that all ranks reach from identical data. With one rank nothing is sent:
`share()` returns its argument.
"""

from __future__ import annotations

from typing import Any, TypeVar

T = TypeVar("T")


class SingleRank:
    """No tensor parallelism: every decision is already shared."""

    is_leader = True
    rank = 0
    num_shared = 0

    def share(self, value: T) -> T:
        return value


class TensorParallelAgreement:
    """Rank 0 of a group decides; the others take its decision."""

    def __init__(self, group):
        self.group = group  # vLLM GroupCoordinator (or a stand-in with broadcast_object)
        self.rank = group.rank_in_group
        # Rank 0 decides, runs optimizer threads and writes state files.
        self.is_leader = self.rank == 0
        self.num_shared = 0

    def share(self, value: Any) -> Any:
        """Rank 0's `value`, on every rank (the others' argument is ignored)."""
        self.num_shared += 1
        return self.group.broadcast_object(value if self.is_leader else None, src=0)


def rank_agreement() -> SingleRank | TensorParallelAgreement:
    """The agreement for this worker process: over vLLM's tensor-parallel
    group when it has more than one rank."""
    try:
        from vllm.distributed import get_tp_group

        group = get_tp_group()
    except (ImportError, AssertionError):  # not initialised: one process (unit tests)
        return SingleRank()
    return TensorParallelAgreement(group) if group.world_size > 1 else SingleRank()
