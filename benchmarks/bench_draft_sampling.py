"""Sampled drafts (temperature > 0): what drawing one draft token per request
costs, the exponential race against core/categorical.py's two-level inverse CDF.

The draft draws each request's token from q with that request's own generator
(seeded requests stay reproducible), so the cost is per row. The exponential
race (argmax q / E, E ~ Exp(1)) spends one random number per vocabulary entry
and row; the inverse CDF spends two per row and two float64 sums. Times per
draft token, for all rows of a batch together, at the vocabulary sizes of the
shipped draft vocabularies and the full heads (SmolLM2 16384 / 49152, Qwen2.5
65536 / 151936). A few seconds on the CPU:

    .venv/bin/python benchmarks/bench_draft_sampling.py --out benchmarks/results/draft_sampling.md
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from vllm_layerskip.core import categorical  # noqa: E402

VOCABS = (16_384, 49_152, 65_536, 151_936)
ROWS = (1, 8)


def exponential_race(q: torch.Tensor, generators: list) -> torch.Tensor:
    """How the draft sampled before: one Exp(1) per entry, per row's generator."""
    noise = torch.empty_like(q)
    for n, gen in enumerate(generators):
        noise[n].exponential_(generator=gen)
    return (q / noise).argmax(dim=-1)


def inverse_cdf(q: torch.Tensor, generators: list) -> torch.Tensor:
    rows = list(range(len(generators)))
    return categorical.draw(q, categorical.uniforms(rows, dict(enumerate(generators)), q.device))


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--out", help="also write the table here (markdown)")
    args = parser.parse_args()

    lines = [f"Draft-token sampling, ms per draft token for the whole batch (median of "
             f"{args.repeats}); {platform.processor() or platform.machine()}, "
             f"{torch.get_num_threads()} torch threads, fp32 q, every row seeded", "",
             "| vocabulary | rows | exponential race | inverse CDF | ratio |",
             "|---:|---:|---:|---:|---:|"]
    for vocab in VOCABS:
        for rows in ROWS:
            q = torch.softmax(torch.randn(rows, vocab) * 3, dim=-1)
            gens = [torch.Generator().manual_seed(r) for r in range(rows)]
            race = median_ms(lambda: exponential_race(q, gens), args.repeats)
            cdf = median_ms(lambda: inverse_cdf(q, gens), args.repeats)
            lines.append(f"| {vocab} | {rows} | {race:.2f} | {cdf:.2f} | {race / cdf:.1f}x |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
