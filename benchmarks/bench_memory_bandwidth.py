"""How steady this machine's memory bandwidth is: two buffers the size of a
model's weights, each streamed through a matrix-vector product (as a decode step
reads its weights), in turns, then each several times in a row.

Decoding a 1.5B model on a CPU is bound by memory bandwidth, so a benchmark can
only tell methods apart by more than this machine's own spread. Where the two
buffers differ on average, two engines with the same weights will too, as their
weights land in different memory; where passes differ from one to the next,
turns must be short and many. On the 2-core Xeon VM (2026-11-29) passes ranged
11-23 GB/s and the two 3 GiB buffers averaged 12.8 and 15.7 GB/s in turns
(benchmarks/RESULTS.md); bench_interleaved.py compares a method with plain decoding
in its own engine for that reason. Seconds to a minute.

    .venv/bin/python benchmarks/bench_memory_bandwidth.py --gib 3 --rounds 10
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=3.0, help="each buffer (the 1.5B model's bf16 weights: ~3)")
    p.add_argument("--rounds", type=int, default=10, help="turns of the two buffers")
    p.add_argument("--passes", type=int, default=5, help="passes through a buffer per reading")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    return p.parse_args(argv)


def gbps(buffer: torch.Tensor, vector: torch.Tensor, passes: int) -> float:
    start = time.perf_counter()
    for _ in range(passes):
        (buffer @ vector).sum()
    return buffer.numel() * buffer.element_size() * passes / (time.perf_counter() - start) / 1e9


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    width = 1536
    rows = int(args.gib * 2**30 / 2 / width)
    buffers = {name: torch.ones(rows, width, dtype=torch.bfloat16) for name in "AB"}
    vector = torch.ones(width, dtype=torch.bfloat16)
    readings = {"A": [], "B": []}
    print(f"{torch.get_num_threads()} threads, two buffers of {args.gib:g} GiB (bf16); GB/s a reading")
    print("| round | A | B |\n|---:|---:|---:|")
    for r in range(args.rounds):
        order = "AB" if r % 2 == 0 else "BA"
        got = {name: gbps(buffers[name], vector, args.passes) for name in order}
        for name in "AB":
            readings[name].append(got[name])
        print(f"| {r} | {got['A']:.1f} | {got['B']:.1f} |", flush=True)
    in_a_row = {name: [gbps(buffers[name], vector, args.passes) for _ in range(3)] for name in "AB"}
    print()
    for name in "AB":
        turns = readings[name]
        print(f"{name}: in turns mean {statistics.mean(turns):.1f} GB/s (range {min(turns):.1f}-"
              f"{max(turns):.1f}); three in a row {', '.join(f'{x:.1f}' for x in in_a_row[name])}")
    a, b = (statistics.mean(readings[n]) for n in "AB")
    print(f"B over A in turns: {b / a:.2f}x (1.00: the buffers stream alike)")


if __name__ == "__main__":
    main()
