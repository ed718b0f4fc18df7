"""The skip sets Self-SD's offline search (offline_search.py) evaluates next, apart
from the Gaussian process's suggestions: the seed sets given, random sets, and
sets one swap away from the best so far."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from vllm_layerskip.core.errors import LayerSkipConfigError
from vllm_layerskip.core.skip_set_optimizer import BayesianSetOptimizer, Coords, SubLayerSpace


def best_coords(history: list[dict]) -> Coords:
    return tuple(max(history, key=lambda h: h["value"])["coords"])


def neighbour(space: SubLayerSpace, rng, coords: Coords, history: list[dict]) -> Coords:
    """A set one swap away from `coords` (one skipped sub-layer run, one run
    sub-layer skipped) that has not been scored yet."""
    seen = {tuple(h["coords"]) for h in history}
    skipped = list(coords)
    kept = [c for c in range(space.dim) if c not in coords]
    for _ in range(100):
        out = set(skipped)
        out.remove(skipped[rng.integers(len(skipped))])
        out.add(kept[rng.integers(len(kept))])
        candidate = tuple(sorted(out))
        if candidate not in seen:
            return candidate
    return space.random(rng, len(coords))


def seed_set(path: str, space: SubLayerSpace, count: int | None) -> Coords:
    """The skip set of a profile or a SWIFT state file, to start the search from
    (cut to `count` sub-layers, keeping the lowest coordinates, if it is larger)."""
    try:
        data = json.loads(Path(path).read_text())
        sets = data["best"] if data.get("format") == "vllm-layerskip/swift-state" else data
        coords = space.coords(sets["skip_attn"], sets["skip_mlp"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise LayerSkipConfigError(
            f"--init-from {path}: not a skip profile or SWIFT state file ({e!r})") from e
    return coords[:count] if count else coords


def random_set(space: SubLayerSpace, rng, count: int | None) -> Coords:
    if count:
        return space.random(rng, count)
    return space.random(rng, int(rng.integers(1, space.dim)))


def free_suggestion(bo: BayesianSetOptimizer, space: SubLayerSpace) -> Coords:
    """Free-size search (the paper's): skip every coordinate suggested above 0.5,
    at least one and never all."""
    point = np.array([bo.optimizer.suggest()[n] for n in space.param_names])
    n = int(np.clip((point > 0.5).sum(), 1, space.dim - 1))
    return space.top(point, n)
