"""A method against plain decoding in its own engine: drafting on, then paused.

bench_methods.py compares a method's engine with a separate plain engine. On a
machine whose memory bandwidth depends on where an engine's weights land, two
identical plain engines differ by more than any method gains: on the 2-core
Xeon VM (2026-11-29) a second plain engine ran 1.32x the first at 8 requests in
flight, and two 3 GiB copies of the same tensor streamed at 12.8 and 15.7 GB/s
on average in one run (16.0 and 16.2 in another), 11-23 GB/s from pass to pass
(bench_memory_bandwidth.py). Here the baseline is the
same engine with its drafting paused (the proposer's set_drafting_paused: every
step decodes as plain decoding, on the same weights and KV cache), so only the
machine's drift over time is left, which only many blocks average out: on that
VM a paused turn of 8 requests took 9-20 s where the one before it took 12.

Per method, one engine at a time: per block of Spec-Bench questions, three
turns in a rotating order: drafting on, paused, and paused again (the A/A
control: its "speedup" over the first paused turn is the noise floor). Prints
and writes a table: speedup with a paired bootstrap interval over blocks,
drafted and accepted tokens, and greedy parity with the paused
turn.

What it leaves out: the cost of the speculative path itself (a paused engine
still schedules and samples as a speculative one). The plugin's methods ran at
0.99-1.00x separate plain engines on SmolLM2 while drafting almost never
(benchmarks/RESULTS.md), so that cost is within 1% there.

    .venv/bin/python benchmarks/bench_paused.py --methods swift clasp self_sd --workload 8s:0
    .venv/bin/python benchmarks/bench_paused.py --methods self_sd --workload 1:0 --rounds 13
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchlib.configs import PLUGIN_METHODS, SHIPPED_FILE_OPTIONS  # noqa: E402
from benchlib.engines import (add_method_engine_arguments, prepare_method_engine_run,  # noqa: E402
                              start_method_engine)
from benchlib.report import write_run  # noqa: E402
from benchlib.workloads import (Workload, concurrent_blocks, load_questions,  # noqa: E402
                                sustained_blocks, warmup_questions, williams_orders)

KINDS = ("on", "paused", "paused again")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", nargs="+", default=["swift", "clasp", "self_sd"],
                   choices=PLUGIN_METHODS)
    p.add_argument("--workload", default="8s:0",
                   help="N:T (batches of N; 1: one request at a time) or Ns:T (N in flight)")
    p.add_argument("--rounds", type=int, default=3, help="blocks of questions")
    p.add_argument("--block-size", type=int, default=0,
                   help="questions a block (default: 3 x N in flight, as bench_methods.py; 1 at "
                        "batch 1). Where the machine drifts within a minute, short blocks pair better")
    add_method_engine_arguments(p)
    return p.parse_args(argv)


def run_method(method: str, args, model: str, workload: Workload, blocks, questions, warmup) -> list[dict]:
    """One engine: every block's three turns. Returns the turns (figures.py's shape:
    the paused turn is the block's "plain", the one paused again the control)."""
    from vllm import SamplingParams

    from vllm_layerskip.core.measure import chat_prompts, set_drafting_paused

    engine = start_method_engine(method, args, model, SHIPPED_FILE_OPTIONS.get(method, {}))
    texts = chat_prompts(engine.llm, [q["prompt"] for q in questions])
    params = SamplingParams(temperature=workload.temperature, max_tokens=args.max_tokens)
    turns = []
    try:
        for paused in (False, True):  # untimed: the first calls at this batch size allocate
            set_drafting_paused(engine.llm, paused)
            engine.generate([texts[i] for i in warmup[:workload.concurrency]], params)
        orders = williams_orders(len(KINDS))
        for b, block in enumerate(blocks):
            for kind in (KINDS[i] for i in orders[b % len(orders)]):
                set_drafting_paused(engine.llm, kind != "on")
                prompts = [texts[i] for i in block.questions]
                turn = (engine.generate_in_flight(prompts, params, workload.concurrency)
                        if workload.sustained else
                        engine.generate(prompts, params, batch_size=1 if workload.latency else None))
                turns.append({
                    "group": 0, "workload": workload.label, "block": b, "category": block.category,
                    "config": f"{method}" if kind == "on" else f"{method}, {kind}",
                    "family": {"on": "plugin", "paused": "plain", "paused again": "control"}[kind],
                    "kind": kind, "method": method, "seconds": turn.seconds,
                    "num_tokens": sum(len(t) for t in turn.token_ids),
                    "token_ids": turn.token_ids, "drafted": turn.counters.draft_tokens,
                    "accepted": turn.counters.accepted,
                })
                print(f"  block {b} {kind:>12}: {turn.seconds:6.1f} s, "
                      f"{turns[-1]['drafted']} drafted, {turns[-1]['accepted']} accepted", flush=True)
    finally:
        engine.shutdown()
    return turns


def table(turns: list[dict], methods: list[str]) -> str:
    from benchlib.figures import ALL, speedup_intervals

    lines = ["| method | turns | speedup over paused (95% interval) | per block | over both paused "
             "turns | drafted (accepted) | greedy outputs equal to paused's |",
             "|---|---|---:|---|---:|---:|---:|"]
    for method in methods:
        mine = [t for t in turns if t["method"] == method]
        if not mine:
            continue
        intervals = speedup_intervals(mine)
        both = intervals_over_both_paused(mine)
        paused = {t["block"]: t for t in mine if t["kind"] == "paused"}
        for kind in ("on", "paused again"):
            rows = [t for t in mine if t["kind"] == kind and t["block"] in paused]
            if not rows:
                continue
            tps = sum(t["num_tokens"] for t in rows) / sum(t["seconds"] for t in rows)
            ref = [paused[t["block"]] for t in rows]
            ref_tps = sum(t["num_tokens"] for t in ref) / sum(t["seconds"] for t in ref)
            per_block = [block_ratio(t, r) for t, r in zip(rows, ref)]
            low, high = intervals.get((rows[0]["workload"], ALL, rows[0]["config"]), (None, None))
            ci = f" ({low:.2f}-{high:.2f})" if low is not None else ""
            equal = sum(a == b for t, r in zip(rows, ref) for a, b in zip(t["token_ids"], r["token_ids"]))
            total = sum(len(t["token_ids"]) for t in rows)
            drafted = sum(t["drafted"] for t in rows)
            accepted = sum(t["accepted"] for t in rows)
            label = method if kind == "on" else f"{method}: paused again (A/A control)"
            over_both = both.get(kind, "-") if kind == "on" else "-"
            lines.append(
                f"| {label} | {len(rows)} | **{tps / ref_tps:.2f}**{ci} | "
                f"{', '.join(f'{x:.2f}' for x in per_block)} | {over_both} | {drafted} ({accepted}) | "
                f"{equal}/{total} |")
    return "\n".join(lines)


def block_ratio(turn: dict, paused: dict) -> float:
    """A turn's tokens/s over its block's paused turn."""
    return (turn["num_tokens"] / turn["seconds"]) / (paused["num_tokens"] / paused["seconds"])


def intervals_over_both_paused(turns: list[dict]) -> dict[str, str]:
    """Drafting on against both paused turns of each block pooled (tokens and
    seconds summed): the same plain decoding measured twice, so half the
    baseline's noise. {"on": "1.18 (1.01-1.35)"}."""
    from benchlib.figures import ALL, speedup_intervals

    pooled, on = [], []
    for b in sorted({t["block"] for t in turns}):
        paused = [t for t in turns if t["block"] == b and t["kind"] != "on"]
        mine = [t for t in turns if t["block"] == b and t["kind"] == "on"]
        if len(paused) != 2 or not mine:
            continue
        pooled.append({**paused[0], "family": "plain", "kind": "paused, both",
                       "num_tokens": sum(t["num_tokens"] for t in paused),
                       "seconds": sum(t["seconds"] for t in paused)})
        on += mine
    if not on:
        return {}
    point = (sum(t["num_tokens"] for t in on) / sum(t["seconds"] for t in on)) / (
        sum(t["num_tokens"] for t in pooled) / sum(t["seconds"] for t in pooled))
    low, high = speedup_intervals(pooled + on).get((on[0]["workload"], ALL, on[0]["config"]),
                                                   (None, None))
    return {"on": f"{point:.2f}" + (f" ({low:.2f}-{high:.2f})" if low is not None else "")}


def main() -> None:
    args = parse_args()
    model = prepare_method_engine_run(args)
    from vllm_layerskip.tools.prompts import benchmark_dataset

    try:
        workload = Workload.parse(args.workload)
    except ValueError as e:
        sys.exit(f"--workload: {e}")
    questions = load_questions(benchmark_dataset(args.dataset_path))
    if args.block_size:
        blocks = concurrent_blocks(questions, args.block_size, args.rounds)
    elif workload.sustained:
        blocks = sustained_blocks(questions, workload.concurrency, args.rounds)
    else:
        blocks = concurrent_blocks(questions, workload.concurrency, args.rounds)
    timed = {i for block in blocks for i in block.questions}
    warmup = warmup_questions(questions, timed, workload.concurrency)
    started = datetime.datetime.now(datetime.timezone.utc)
    turns = []
    for method in args.methods:
        turns += run_method(method, args, model, workload, blocks, questions, warmup)
    header = (f"# Drafting on against paused, in the same engine ({workload.label})\n\n"
              f"`{' '.join(['bench_paused.py', *sys.argv[1:]])}`; model `{model}`, dtype "
              f"{args.dtype}, {'compiled' if args.compile else 'eager'}, K = {args.k}, "
              f"{args.max_tokens} tokens a request, {len(blocks)} blocks of "
              f"{len(blocks[0].questions)} questions; {started:%Y-%m-%d %H:%M}-"
              f"{datetime.datetime.now(datetime.timezone.utc):%H:%M} UTC.\n")
    text = header + "\n" + table(turns, args.methods) + "\n"
    base = write_run(args.out, f"paused_{started:%Y%m%d-%H%M%S}", text,
                     {"args": vars(args), "turns": turns})
    plot(base, turns, args.methods)
    print(f"wrote {base}.md, .json, .png")


def plot(base: str, turns: list[dict], methods: list[str]) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 3))
    for i, method in enumerate(methods):
        paused = {t["block"]: t for t in turns if t["method"] == method and t["kind"] == "paused"}
        for kind, color in (("on", "tab:blue"), ("paused again", "tab:gray")):
            ratios = [block_ratio(t, paused[t["block"]]) for t in turns
                      if t["method"] == method and t["kind"] == kind and t["block"] in paused]
            ax.scatter([i + (0.1 if kind == "on" else -0.1)] * len(ratios), ratios, color=color,
                       label=kind if i == 0 else None)
    ax.axhline(1.0, color="black", linewidth=0.5)
    ax.set_xticks(range(len(methods)), methods)
    ax.set_ylabel("tokens/s over paused, per block")
    ax.legend()
    fig.tight_layout()
    fig.savefig(base + ".png", dpi=100)


if __name__ == "__main__":
    main()
