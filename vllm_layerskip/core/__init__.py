"""What every method shares: the draft engine (a masked partial forward through
the target model, in its own KV cache), the cost model that chooses each step's
draft length, the proposer base with its failure boundary, tensor-parallel
agreement, the optimizer time budget and background worker, model identity and
the versioned-file loader. Nothing here imports a method."""
