"""Pool several bench_methods.py runs: per configuration and category, the speedup
over plain from every question any of the runs timed, with a paired bootstrap
interval, and the 0.95x floor check on the pooled figures.

    python benchmarks/analysis/pool_runs.py benchmarks/results/bench_A.json benchmarks/results/bench_B.json

Why: at 5 questions per category a single run's lowest category sits at the noise
floor (two plain engines differ by up to ~5% in a category), so the minimum over
13 categories of a method that runs at plain's speed falls under 0.95 in about
every other run. Pooling runs of the same configurations multiplies the questions
per category. Every question stays paired with plain's turn of its own run and
engine group; configurations are matched by name across runs ("[group N]" dropped).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchlib

from benchlib.figures import ALL, paired_blocks, speedup_intervals  # noqa: E402
from benchlib.report import SPEEDUP_FLOOR  # noqa: E402

GROUP_SUFFIX = re.compile(r" \[group \d+\]$")


def pooled_turns(runs: list[list[dict]]) -> list[dict]:
    """The runs' turns as one run: each (run, group) its own group, names unified."""
    return [{**t, "group": (r, t["group"]), "config": GROUP_SUFFIX.sub("", t["config"])}
            for r, turns in enumerate(runs) for t in turns]


def pooled_speedups(turns: list[dict]) -> dict[tuple, tuple[float, int]]:
    """(workload, category, config) -> (speedup over plain, blocks): tokens/s from
    summed tokens and seconds of the blocks, over plain's on the same blocks."""
    out = {}
    for key, by_cat in paired_blocks(turns).items():
        pairs = [pair for rows in by_cat.values() for pair in rows]
        tokens, seconds, plain_tokens, plain_seconds = map(sum, zip(*pairs))
        out[key] = ((tokens / seconds) / (plain_tokens / plain_seconds), len(pairs))
    return out


def report(turns: list[dict]) -> str:
    speedups = pooled_speedups(turns)
    intervals = speedup_intervals(turns)
    workloads = list(dict.fromkeys(t["workload"] for t in turns))
    configs = list(dict.fromkeys(t["config"] for t in turns if t["family"] != "plain"))
    lines = []
    for workload in workloads:
        cats = list(dict.fromkeys(t["category"] for t in turns
                                  if t["workload"] == workload and t["category"] != "mixed"))
        cats = cats or [ALL]
        lines += [f"## {workload}", "",
                  f"| config | blocks | all | lowest category (95% interval) | "
                  f"categories >= {SPEEDUP_FLOOR:.2f}x | interval wholly below {SPEEDUP_FLOOR:.2f} |",
                  "|---|---:|---:|---|---:|---|"]
        for config in configs:
            found = {c: speedups[(workload, c, config)] for c in cats
                     if (workload, c, config) in speedups}
            if not found:
                continue
            low = min(found, key=lambda c: found[c][0])
            lo, hi = intervals.get((workload, low, config), (None, None))
            below = [c for c in found
                     if intervals.get((workload, c, config), (0, 1))[1] < SPEEDUP_FLOOR]
            overall = speedups.get((workload, ALL, config), (float("nan"), 0))
            spread = f"{lo:.2f}-{hi:.2f}" if lo is not None else "-"
            lines.append(
                f"| {config} | {overall[1]} | {overall[0]:.2f} | {found[low][0]:.3f} ({low}, {spread}) | "
                f"{sum(s >= SPEEDUP_FLOOR for s, _ in found.values())}/{len(found)} | "
                f"{', '.join(below) or 'none'} |")
        lines.append("")
    return "\n".join(lines)


def load_turns(path: str) -> list[dict]:
    """The timed turns of one bench_methods.py run (its JSON file)."""
    try:
        with open(path) as f:
            return json.load(f)["turns"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(
            f"{path}: not a bench_methods.py result ({type(e).__name__}: {e}); pass the "
            ".json files bench_methods.py saves, e.g. benchmarks/results/bench_*.json"
        ) from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="bench_methods.py JSON files")
    parser.add_argument("--out", help="also write the report here (markdown)")
    args = parser.parse_args()
    runs = [load_turns(path) for path in args.runs]
    text = (f"Pooled over {len(runs)} runs: {', '.join(os.path.basename(p) for p in args.runs)}\n\n"
            + report(pooled_turns(runs)))
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
