"""Drawing one token per row from a draft distribution q, cheaply and exactly.

Sampled draft tokens must be drawn from exactly the q handed to vLLM's
rejection sampler, or the output distribution is no longer the target's. A
seeded request must draw from its own generator, one row at a time. The
exponential race (argmax q / E, E ~ Exp(1), vLLM's own sampler) spends one
random number per vocabulary entry and row: per draft token at 8 requests,
12.8 ms at 49,152 ids, 13.3 ms at 65,536 and 39.2 ms at 151,936 on the 2-core
AVX2 CPU (benchmarks/results/2026-11-26/draft_sampling_avx2_2026-11-26.md); at
temperature 1 it took 41 s of an 86 s test under cProfile (1500 seeded
requests, K = 3).

Here each row spends two uniforms instead, on an inverse CDF in two levels:
the first picks a block of BLOCK ids by the blocks' masses, the second an id
inside that block by its cumulative sum. Sums are float64, so rounding cannot
move mass between ids that float32's cumulative sum over 150k ids would; a
target strictly below each level's total never lands on an id of zero mass
(ids outside a pruned vocabulary, the padding). At 8 requests 0.48, 0.55 and
2.27 ms (17-26x less); at one request 0.21-0.34 ms against 1.3-3.8 ms.
"""

from __future__ import annotations

import torch

BLOCK = 512


def uniforms(rows, generators: dict, device) -> torch.Tensor:
    """[len(rows), 2] float64 uniforms: seeded rows from their request's
    generator (a seeded request stays reproducible), the rest in one call."""
    u = torch.empty(len(rows), 2, dtype=torch.float64)
    unseeded = []
    for n, row in enumerate(rows):
        gen = generators.get(int(row))
        if gen is None:
            unseeded.append(n)
        else:
            u[n] = torch.rand(2, generator=gen, dtype=torch.float64, device=gen.device).cpu()
    if unseeded:
        u[unseeded] = torch.rand(len(unseeded), 2, dtype=torch.float64)
    return u.to(device)


def draw(q: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One id per row of q [B, V] (rows sum to 1; zeros allowed), given the
    uniforms u [B, 2] in [0, 1): P(id i) = q[i] up to float64 rounding."""
    batch, vocab = q.shape
    pad = (-vocab) % BLOCK
    # pad copies q: only when the vocabulary is not a whole number of blocks.
    blocks = (torch.nn.functional.pad(q, (0, pad)) if pad else q).reshape(batch, -1, BLOCK)
    block_cdf = blocks.sum(-1, dtype=torch.float64).cumsum(-1)  # [B, V / BLOCK]
    block = _search(block_cdf, u[:, 0])
    inner_cdf = blocks[torch.arange(batch, device=q.device), block].to(torch.float64).cumsum(-1)
    return block * BLOCK + _search(inner_cdf, u[:, 1])


def _search(cdf: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The first index whose cumulative mass exceeds u * total: never an index
    of zero mass. Should u * total round up to the total, the last index with
    mass is taken, not the end of the row."""
    total = cdf[:, -1:]
    found = torch.searchsorted(cdf, u.unsqueeze(1) * total, right=True).squeeze(1)
    last_with_mass = (cdf < total).sum(-1)
    return torch.minimum(found, last_with_mass)
