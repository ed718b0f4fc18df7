"""The search space of skip sets, and the Bayesian optimizer over it.

Searches (SWIFT online, Self-SD offline) choose which attention and MLP
sub-layers of layers 1..L-2 the draft skips; the first and last layer always run.
A set is a tuple of coordinates c in [0, 2(L-2)):

    c <  L-2: the attention sub-layer of layer c + 1
    c >= L-2: the MLP sub-layer of layer c - (L-2) + 1

For Bayesian optimization a set is the 0/1 vector over those coordinates (1 =
skipped). The optimizer suggests a point in [0, 1]^(2(L-2)); its `count` largest
coordinates become the set, so every suggestion maps to a valid set of exactly
the current size, and what is registered is the set's 0/1 vector, i.e. what was
actually scored.
"""

from __future__ import annotations

import numpy as np

from vllm_layerskip.core.skip_mask import SkipMask

Coords = tuple[int, ...]


class SubLayerSpace:
    def __init__(self, num_layers: int):
        if num_layers < 3:
            raise ValueError(f"a skip-set search needs >= 3 layers, got {num_layers}")
        self.num_layers = num_layers
        self.dim = 2 * (num_layers - 2)
        self.param_names = [f"x{c:03d}" for c in range(self.dim)]

    def sublayer(self, c: int) -> tuple[str, int]:
        """('attn' | 'mlp', layer index) of coordinate c."""
        middle = self.num_layers - 2
        return ("attn", c + 1) if c < middle else ("mlp", c - middle + 1)

    def mask(self, coords: Coords) -> SkipMask:
        attn = {layer for kind, layer in map(self.sublayer, coords) if kind == "attn"}
        mlp = {layer for kind, layer in map(self.sublayer, coords) if kind == "mlp"}
        return SkipMask.from_sets(self.num_layers, attn, mlp)

    def coords(self, skip_attn, skip_mlp) -> Coords:
        """The coordinates of explicit layer sets (layers 0 and L-1 not allowed)."""
        middle = self.num_layers - 2
        out = []
        for layers, offset in ((skip_attn, 0), (skip_mlp, middle)):
            for layer in layers:
                if not 1 <= layer <= middle:
                    raise ValueError(
                        f"layer {layer} cannot be in a searched skip set (layers 1..{middle})"
                    )
                out.append(layer - 1 + offset)
        return tuple(sorted(set(out)))

    def layer_sets(self, coords: Coords) -> dict[str, list[int]]:
        mask = self.mask(coords)
        return {
            "skip_attn": [i for i, run in enumerate(mask.run_attn) if not run],
            "skip_mlp": [i for i, run in enumerate(mask.run_mlp) if not run],
        }

    def vector(self, coords: Coords) -> np.ndarray:
        v = np.zeros(self.dim)
        v[list(coords)] = 1.0
        return v

    def evenly_spread(self, count: int) -> Coords:
        """`count` sub-layers as whole layers spread evenly over layers 1..L-2
        (SWIFT's initial set: at r = 0.5 every other layer), plus, for an odd
        count, the attention of the kept layer nearest the middle."""
        count = min(max(count, 0), self.dim)
        middle = self.num_layers - 2
        whole = count // 2
        step = middle / whole if whole else 0.0
        layers = sorted({int(step * k + step / 2) for k in range(whole)})  # 0-based in 1..L-2
        coords = [c for layer in layers for c in (layer, layer + middle)]
        if count % 2:
            kept = [layer for layer in range(middle) if layer not in layers]
            coords.append(min(kept, key=lambda layer: abs(layer - (middle - 1) / 2)))
        return tuple(sorted(coords))

    def random(self, rng: np.random.Generator, count: int) -> Coords:
        return tuple(sorted(int(c) for c in rng.choice(self.dim, size=count, replace=False)))

    def top(self, point, count: int) -> Coords:
        """The `count` largest coordinates of a suggested point (dict or array)."""
        values = np.array([point[n] for n in self.param_names]) if isinstance(point, dict) else np.asarray(point)
        # Stable: ties go to the lower coordinate, so equal suggestions give equal sets.
        order = np.argsort(-values, kind="stable")
        return tuple(sorted(int(c) for c in order[:count]))


class BayesianSetOptimizer:
    """Gaussian-process Bayesian optimization (the `bayesian-optimization`
    package, 3.x API) over skip sets of a given size.

    UCB acquisition with kappa 2.5 and GP noise alpha 1e-2, as SWIFT's reference
    code. The acquisition is maximized with fewer random and L-BFGS starts than
    the package's default (10000 / 10), which took ~10 s per suggestion at 200
    observations in 56 dimensions on a 2-core CPU; 1000 / 1 takes ~1 s. (Random
    starts alone, without L-BFGS, missed an obvious optimum in a synthetic check.)
    """

    def __init__(self, space: SubLayerSpace, seed: int, kappa: float = 2.5,
                 n_random: int = 1000, n_smart: int = 1):
        from bayes_opt import BayesianOptimization, acquisition

        class _UCB(acquisition.UpperConfidenceBound):
            def suggest(self, gp, target_space, n_random=n_random, n_smart=n_smart,
                        fit_gp=True, random_state=None):
                return super().suggest(gp, target_space, n_random=n_random,
                                       n_smart=n_smart, fit_gp=fit_gp,
                                       random_state=random_state)

        self.space = space
        self.optimizer = BayesianOptimization(
            f=None,
            pbounds={n: (0.0, 1.0) for n in space.param_names},
            acquisition_function=_UCB(kappa=kappa, random_state=seed),
            random_state=seed,
            verbose=0,
            # A safety net: register() moves a repeated set off its earlier points.
            allow_duplicate_points=True,
        )
        self.optimizer.set_gp_params(alpha=1e-2)
        self.times_seen: dict[Coords, int] = {}

    def register(self, coords: Coords, score: float) -> None:
        if not np.isfinite(score):
            raise ValueError(f"cannot register a non-finite score {score!r}")
        point = self.space.vector(coords)
        # A set scored again (SWIFT re-scores its best set every few candidates)
        # goes in a hair's breadth (1e-6 a repeat, on one 0/1 coordinate) from
        # its earlier scores: the Gaussian process averages the noisy scores
        # there as it does exact repeats, and the package, which prints every
        # exact repeat to stdout in red (588 lines for one SWIFT state file),
        # stays quiet.
        repeats = self.times_seen.get(coords, 0)
        self.times_seen[coords] = repeats + 1
        if repeats:
            point[0] += 1e-6 * repeats if point[0] == 0.0 else -1e-6 * repeats
        params = dict(zip(self.space.param_names, point.tolist()))
        # Into the target space itself: BayesianOptimization.register also
        # rebuilds every earlier point as a dict to log the last one, which made
        # registering the 941 scores of a SWIFT state file take 17 s of CPU, in
        # the optimizer thread beside decoding (quadratic in the scores).
        self.optimizer.space.register(params, float(score))

    @property
    def num_observations(self) -> int:
        return len(self.optimizer.space)

    def suggest(self, count: int) -> Coords:
        return self.space.top(self.optimizer.suggest(), count)
