"""The draft's sampler (core/categorical.py) draws exactly from q: the rejection
sampler's guarantee rests on it (the engine-level check is test_sampling.py)."""

import numpy as np
import torch
from scipy.stats import chisquare

from vllm_layerskip.core.categorical import BLOCK, draw, uniforms


def _q(vocab: int, seed: int, zero_every: int = 0) -> torch.Tensor:
    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(seed)) * 2
    if zero_every:
        logits[::zero_every] = float("-inf")  # mass 0, as outside a pruned vocabulary
    return torch.softmax(logits, -1)


def _counts(q: torch.Tensor, num: int, seed: int) -> np.ndarray:
    u = torch.rand(num, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    ids = draw(q.expand(num, -1), u)
    return np.bincount(ids.numpy(), minlength=q.numel())


def _p_value(counts: np.ndarray, q: torch.Tensor) -> float:
    """Goodness of fit, ids with under 5 expected draws pooled into one bin."""
    expected = q.double().numpy() * counts.sum()
    big = expected >= 5
    observed = np.append(counts[big], counts[~big].sum())
    expected = np.append(expected[big], expected[~big].sum())
    return chisquare(observed, expected * observed.sum() / expected.sum()).pvalue


def test_draws_follow_q_across_blocks_and_never_a_zero():
    # 1300 ids: two full blocks and a padded third; every 7th id has no mass.
    q = _q(1300, seed=0, zero_every=7)
    counts = _counts(q, 200_000, seed=1)
    assert counts[::7].sum() == 0
    assert _p_value(counts, q) > 1e-3


def test_the_fit_test_has_power():
    """The same test rejects draws from a q that differs a little."""
    q = _q(1300, seed=0, zero_every=7)
    other = q.clone()
    other[1:200] *= 1.1
    other /= other.sum()
    assert _p_value(_counts(other, 200_000, seed=1), q) < 1e-6


def test_extreme_uniforms_land_on_ids_with_mass():
    vocab = 3 * BLOCK + 10
    q = torch.zeros(2, vocab)
    q[:, [5, BLOCK + 3, 2 * BLOCK + 1]] = torch.tensor([0.25, 0.5, 0.25])
    below_one = torch.nextafter(torch.tensor(1.0, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64))
    u = torch.tensor([[0.0, 0.0], [below_one, below_one]], dtype=torch.float64)
    assert draw(q, u).tolist() == [5, 2 * BLOCK + 1]
    # Even a uniform of exactly 1 (rounding) takes the last id with mass.
    assert draw(q, torch.ones(2, 2, dtype=torch.float64)).tolist() == [2 * BLOCK + 1] * 2


def test_seeded_rows_draw_from_their_own_generator():
    def generators():
        return {3: torch.Generator().manual_seed(11), 7: torch.Generator().manual_seed(12)}

    first, again = uniforms([3, 5, 7], generators(), "cpu"), uniforms([3, 5, 7], generators(), "cpu")
    assert torch.equal(first[[0, 2]], again[[0, 2]])  # seeded: reproducible
    assert not torch.equal(first[1], again[1])  # unseeded: the global generator
    assert first.dtype == torch.float64 and ((first >= 0) & (first < 1)).all()
