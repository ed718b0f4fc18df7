"""A method against plain decoding in its own engine, the two taking turns every few steps.

Turns of whole requests (10-20 s each at 8 in flight on the 1.5B model) pair
badly where memory drifts: on the 2-core Xeon VM the memory's speed drifted by a
third between such turns, so their A/A controls read 0.88-0.98x and four blocks
could not tell 1.1x from 1.0x. Here one engine serves a steady stream of requests (N in
flight, the next entering as one finishes, as `vllm bench serve --max-concurrency
N`), and its drafting mode changes every W engine steps (~3 s): drafting on,
paused (plain decoding), paused again (the A/A control), and with prompt lookup
paused (the method alone, where the engine has lookup on). A cycle runs each mode
once, in a rotating (Williams) order; the speedup is output tokens per second of
a mode over the paused spans', with a bootstrap interval over cycles.

Which steps a span owns: in vLLM's V1 loop a step verifies the drafts of the
step before and proposes the next ones. A drafting span is W steps with drafting
on and one more with it paused (verifying the last drafts, proposing none), so
every draft pass it pays for is verified inside it and no other span is credited
with its tokens; a paused span is W steps of plain decoding. Tokens a span did
not make start in it only through requests admitted when another finished.

vLLM's own `ngram` runs the same way (on, paused, paused again), its proposer
silenced while paused by shadowing its propose() on the worker: each method over
its own engine paused, so that the ratios compare across engines.

The engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so that the
mode changes between two known steps and each step is timed on its own. Greedy
parity is the test suite's business: a request here spans several modes.

    .venv/bin/python benchmarks/bench_interleaved.py --methods swift clasp self_sd --compile
    .venv/bin/python benchmarks/bench_interleaved.py --methods ngram --compile
    .venv/bin/python benchmarks/bench_interleaved.py --model smollm2-135m --methods swift --minutes 4 --window 48
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchlib.configs import PLUGIN_METHODS, SHIPPED_FILE_OPTIONS  # noqa: E402
from benchlib.engines import (add_method_engine_arguments, prepare_method_engine_run,  # noqa: E402
                              start_method_engine)
from benchlib.report import write_run  # noqa: E402
from benchlib.workloads import load_questions, williams_orders  # noqa: E402

ON, ALONE, PAUSED, AGAIN = "on", "lookup paused", "paused", "paused again"
DRAFTING = (ON, ALONE)
NGRAM = {"prompt_lookup_max": 4, "prompt_lookup_min": 2}  # as bench_methods.py runs vLLM's ngram


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", nargs="+", default=["swift", "clasp", "self_sd"],
                   choices=[*PLUGIN_METHODS, "ngram"],
                   help="layer-skip methods, or vLLM's ngram alone (4..2, paused by shadowing its propose())")
    p.add_argument("--in-flight", type=int, default=8, help="requests kept in flight")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--window", type=int, default=12, help="engine steps a mode runs at a time")
    p.add_argument("--minutes", type=float, default=8.0, help="timed minutes per method")
    p.add_argument("--repeat", type=int, default=1,
                   help="run each method this many times, each in a fresh engine (its cost "
                        "model learning from nothing): the report gives each repeat and the spread")
    p.add_argument("--no-alone", action="store_true",
                   help="leave out the mode with prompt lookup paused (the method alone)")
    add_method_engine_arguments(p)
    p.add_argument("--from-json", default=None, metavar="FILE",
                   help="no engines: render the table and plot again from a run's .json")
    return p.parse_args(argv)


class RequestStream:
    """Requests kept `in_flight` in an in-process engine, one engine step at a
    time: step() runs one step, admits a new request for each that finished,
    and returns (seconds, output tokens the step made, whether it ran a prompt:
    a request admitted after the step before is prefilled in it)."""

    def __init__(self, llm_engine, prompts: list[str], params, in_flight: int):
        self.engine = llm_engine
        self.prompts = prompts
        self.params = params
        self.next_prompt = 0
        self.seen: dict[str, int] = {}  # request id -> output tokens so far
        self.num_added = 0
        self.num_finished = 0
        self.admitted_since_step = 0
        for _ in range(in_flight):
            self._admit()

    def _admit(self) -> None:
        prompt = self.prompts[self.next_prompt % len(self.prompts)]
        self.next_prompt += 1
        self.num_added += 1
        request_id = f"stream-{self.num_added}"
        self.engine.add_request(request_id, prompt, self.params)
        self.seen[request_id] = 0
        self.admitted_since_step += 1

    def step(self) -> tuple[float, int, bool]:
        prefill = self.admitted_since_step > 0
        self.admitted_since_step = 0
        start = time.perf_counter()
        tokens = 0
        for out in self.engine.step():
            n = len(out.outputs[0].token_ids)
            tokens += n - self.seen[out.request_id]
            self.seen[out.request_id] = n
            if out.finished:
                del self.seen[out.request_id]
                self.num_finished += 1
                self._admit()
        return time.perf_counter() - start, tokens, prefill


def plugin_mode_setter(llm, has_lookup: bool):
    """set_mode(mode) for a layer-skip engine: the proposer's two pause switches."""
    from vllm_layerskip.core.measure import set_drafting_paused, set_prompt_lookup_paused

    def set_mode(mode: str) -> None:
        set_drafting_paused(llm, mode not in DRAFTING)
        if has_lookup:
            set_prompt_lookup_paused(llm, mode == ALONE)
    return set_mode


def _pause_vllm_ngram(worker, paused: bool) -> None:
    """On the worker: vLLM's NgramProposer proposes nothing while paused (its
    propose() shadowed on the instance; a benchmark's device, not the plugin's)."""
    drafter = worker.model_runner.drafter
    if paused:
        drafter.propose = lambda num_tokens, sampled_token_ids, *args, **kwargs: [
            [] for _ in sampled_token_ids]
    else:
        drafter.__dict__.pop("propose", None)


def ngram_mode_setter(llm):
    """set_mode(mode) for an engine of vLLM's own `ngram`."""
    def set_mode(mode: str) -> None:
        llm.collective_rpc(_pause_vllm_ngram, args=(mode not in DRAFTING,))
    return set_mode


def lookup_is_on(llm) -> bool:
    from vllm_layerskip.core.measure import set_prompt_lookup_paused

    try:
        set_prompt_lookup_paused(llm, False)
    except ValueError as e:
        if "prompt lookup is off" in str(e):
            return False
        raise
    return True


def run_span(stream: RequestStream, mode: str, window: int, set_mode) -> dict:
    """One mode's span (see the module's docstring for which steps it owns)."""
    set_mode(mode)
    steps = [stream.step() for _ in range(window)]
    if mode in DRAFTING:  # the step that verifies the span's last drafts
        set_mode(PAUSED)
        steps.append(stream.step())
    decode = [(s, n) for s, n, prefill in steps if not prefill]
    return {"mode": mode, "steps": len(steps), "seconds": sum(s for s, _, _ in steps),
            "tokens": sum(n for _, n, _ in steps),
            "decode_seconds": sum(s for s, _ in decode), "decode_tokens": sum(n for _, n in decode),
            "step_seconds": [s for s, _, _ in steps], "step_prefill": [p for _, _, p in steps]}


def draft_counts(engine) -> dict:
    """Drafted and accepted tokens so far by source: the proposer's own counters,
    or vLLM's for its `ngram` (all copied)."""
    from vllm_layerskip.core.measure import proposer_stats

    if engine.config.family == "vllm":
        c = engine.counters()
        return {"self_drafted": 0, "self_accepted": 0, "copied": c.draft_tokens,
                "copied_accepted": c.accepted, "idle_proposals": 0, "idle_seconds": 0.0,
                "idle_method_seconds": 0.0,
                "empty_passes": 0, "empty_pass_seconds": 0.0}
    s = proposer_stats(engine.llm)
    v = s["verified"]
    return {"self_drafted": v["self"]["draft_tokens"] + v["continuation"]["draft_tokens"],
            "self_accepted": v["self"]["accepted"] + v["continuation"]["accepted"],
            "copied": v["lookup"]["draft_tokens"], "copied_accepted": v["lookup"]["accepted"],
            "idle_proposals": s["num_idle_proposals"], "idle_seconds": s["idle_seconds"],
            "idle_method_seconds": s.get("idle_method_seconds", 0.0),
            "empty_passes": s["num_empty_passes"], "empty_pass_seconds": s["empty_pass_seconds"]}


def idle_overhead(spans: list[dict], method: str) -> str:
    """What the proposer cost a step in which it drafted nothing (the cost
    model's "no draft"), in the drafting spans, against a paused span's step:
    the never-slower floor's per-step overhead."""
    mine = [s for s in spans if s["method"] == method]
    idle = sum(s.get("idle_proposals", 0) for s in mine if s["mode"] in DRAFTING)
    paused = [s for s in mine if s["mode"] == PAUSED]
    if not idle or not paused:
        return f"{method}: no step without drafts in the drafting spans"
    ms = 1e3 * sum(s.get("idle_seconds", 0.0) for s in mine if s["mode"] in DRAFTING) / idle
    method_ms = 1e3 * sum(s.get("idle_method_seconds", 0.0) for s in mine
                          if s["mode"] in DRAFTING) / idle
    decode = [t for s in paused for t, p in zip(s["step_seconds"], s["step_prefill"]) if not p]
    step_ms = 1e3 * float(np.median(decode)) if decode else float("nan")
    empty = sum(s.get("empty_passes", 0) for s in mine if s["mode"] in DRAFTING)
    empty_ms = 1e3 * sum(s.get("empty_pass_seconds", 0.0) for s in mine
                         if s["mode"] in DRAFTING) / max(empty, 1)
    return (f"{method}: the proposer took {ms:.2f} ms a step in the {idle} drafting-span steps "
            f"where it drafted nothing: {100 * ms / step_ms:.2f}% of a paused decode step (median {step_ms:.1f} ms)"
            + (f", of which {method_ms:.2f} ms the method's own work (before_draft)" if method_ms else "")
            + (f"; {empty} steps ran a draft pass that drafted nothing, {empty_ms:.2f} ms each"
               if empty else ""))


CYCLES_PER_REPEAT = 100_000


def cost_model_summary(engine) -> dict | None:
    """The plugin's cost model at the end of a run (its share of steps that
    self-drafted, its estimates); None for vLLM's ngram or without it."""
    from vllm_layerskip.core.measure import proposer_stats

    if engine.config.family != "plugin":
        return None
    return proposer_stats(engine.llm).get("cost_model")


def repeat_lines(spans: list[dict], methods: list[str], infos: dict) -> str:
    """With --repeat: each repeat's speedup (decode steps, and decode + prefill
    cost) over paused, its A/A control and the cost model's share of steps
    that self-drafted; then the spread of the repeats around their mean."""
    repeats = sorted({s.get("repeat", 0) for s in spans})
    if len(repeats) < 2:
        return ""
    lines = ["", "| method | repeat | drafting on, decode steps | decode + prefill cost | "
             "A/A control, decode steps | steps self-drafting (cost model) |",
             "|---|---:|---:|---:|---:|---:|"]
    spread = []
    for method in methods:
        points = []
        for r in repeats:
            mine = [s for s in spans if s["method"] == method and s.get("repeat", 0) == r]
            on = speedup(mine, ON, (PAUSED,), "decode")
            modelled = speedup(mine, ON, (PAUSED,), "modelled")
            again = speedup(mine, AGAIN, (PAUSED,), "decode")
            summary = (infos.get(f"{method}#{r}") or {}).get("cost_model") or {}
            share = summary.get("drafting_fraction")
            lines.append(f"| {method} | {r + 1} | {_fmt(on)} | {_fmt(modelled)} | {_fmt(again)} | "
                         + ("-" if share is None else f"{100 * share:.0f}%") + " |")
            if on is not None:
                points.append(on[0])
        if len(points) >= 2:
            mean = float(np.mean(points))
            worst = max(abs(p / mean - 1) for p in points)
            spread.append(f"- {method}: drafting on over paused (decode steps) {min(points):.2f}-"
                          f"{max(points):.2f}x over {len(points)} repeats, mean {mean:.2f}x, "
                          f"each within +-{100 * worst:.1f}% of it")
    return "\n".join(lines + [""] + spread) + "\n"


def run_method(method: str, args, model: str, questions: list[dict],
               repeat: int = 0) -> tuple[list[dict], dict]:
    from vllm import SamplingParams

    from vllm_layerskip.core.measure import chat_prompts

    family = "vllm" if method == "ngram" else "plugin"
    engine = start_method_engine(
        method, args, model, NGRAM if method == "ngram" else SHIPPED_FILE_OPTIONS.get(method, {}),
        family)
    llm = engine.llm
    has_lookup = family == "plugin" and lookup_is_on(llm)
    set_mode = plugin_mode_setter(llm, has_lookup) if family == "plugin" else ngram_mode_setter(llm)
    modes = [ON, ALONE, PAUSED, AGAIN] if has_lookup and not args.no_alone else [ON, PAUSED, AGAIN]
    print(f"  modes: {', '.join(modes)}", flush=True)
    # A fixed shuffle of every question, so that each stretch of the stream mixes
    # categories and prompt lengths.
    order = np.random.default_rng(0).permutation(len(questions))
    prompts = chat_prompts(llm, [questions[i]["prompt"] for i in order])
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=0)
    stream = RequestStream(llm.llm_engine, prompts, params, args.in_flight)
    spans = []
    try:
        for mode in modes:  # untimed: compiles, first allocations, the cost model's first probes
            run_span(stream, mode, 2 * args.window, set_mode)
        orders = williams_orders(len(modes))
        start = time.perf_counter()
        cycle = 0
        while time.perf_counter() - start < 60 * args.minutes:
            for mode in (modes[i] for i in orders[cycle % len(orders)]):
                before = draft_counts(engine)
                span = run_span(stream, mode, args.window, set_mode)
                after = draft_counts(engine)
                # Cycles are numbered apart per repeat: intervals pair a cycle's spans.
                span.update({k: after[k] - before[k] for k in after}, method=method,
                            repeat=repeat, cycle=repeat * CYCLES_PER_REPEAT + cycle,
                            at=time.perf_counter() - start)
                spans.append(span)
            last = [s for s in spans if s["cycle"] == repeat * CYCLES_PER_REPEAT + cycle]
            print(f"  cycle {cycle:3d}: " + ", ".join(
                f"{s['mode']} {s['tokens'] / s['seconds']:.1f} tok/s" for s in last), flush=True)
            cycle += 1
        info = {"startup_seconds": engine.startup_seconds, "spec": engine.config.spec, "modes": modes,
                "requests_finished": stream.num_finished, "status": draft_counts(engine),
                "cost_model": cost_model_summary(engine)}
    finally:
        engine.shutdown()
    return spans, info


FIGURES = ("all", "decode", "modelled")


def prefill_excess(span: dict) -> float:
    """Seconds the span's prompt-prefilling steps took beyond as many of its
    decode-only steps (their median): what its prefills cost."""
    decode = [t for t, p in zip(span["step_seconds"], span["step_prefill"]) if not p]
    prefill = [t for t, p in zip(span["step_seconds"], span["step_prefill"]) if p]
    if not prefill or not decode:
        return 0.0
    return max(sum(prefill) - len(prefill) * float(np.median(decode)), 0.0)


def _ratio(m: np.ndarray, r: np.ndarray, figure: str) -> np.ndarray:
    """Columns: tokens, seconds, decode tokens, decode seconds, prefill excess
    (summed over cycles; rows of a bootstrap in the leading axes)."""
    if figure == "all":
        return (m[..., 0] / m[..., 1]) / (r[..., 0] / r[..., 1])
    if figure == "decode":
        return (m[..., 2] / m[..., 3]) / (r[..., 2] / r[..., 3])
    # modelled: seconds a token = the mode's decode seconds a token + the
    # reference's prefill seconds a token (a request's prompt is the same work
    # whatever the mode).
    prefill = r[..., 4] / r[..., 0]
    return (r[..., 3] / r[..., 2] + prefill) / (m[..., 3] / m[..., 2] + prefill)


def speedup(spans: list[dict], mode: str, over: tuple[str, ...], figure: str = "all",
            reps: int = 4000, seed: int = 0) -> tuple[float, float, float] | None:
    """Tokens/s of `mode`'s spans over the pooled spans of the modes `over`, with a
    95% bootstrap interval over cycles (each cycle's spans kept together: they ran
    within seconds of each other); ratios of sums, as the point figure.
    figure: "all" steps; "decode", steps that prefilled no prompt; "modelled",
    the decode steps' rates plus the reference's measured prefill cost a token:
    the all-steps figure without the noise of which span drew which prompt."""
    def columns(rows):
        return [sum(s["tokens"] for s in rows), sum(s["seconds"] for s in rows),
                sum(s["decode_tokens"] for s in rows), sum(s["decode_seconds"] for s in rows),
                sum(prefill_excess(s) for s in rows)]

    pairs = []
    for c in sorted({s["cycle"] for s in spans}):
        mine = [s for s in spans if s["cycle"] == c and s["mode"] == mode]
        ref = [s for s in spans if s["cycle"] == c and s["mode"] in over]
        if mine and len(ref) == len(over):
            pairs.append((columns(mine), columns(ref)))
    if not pairs:
        return None
    m = np.asarray([p[0] for p in pairs], dtype=float)
    r = np.asarray([p[1] for p in pairs], dtype=float)
    point = float(_ratio(m.sum(axis=0), r.sum(axis=0), figure))
    if len(pairs) < 2:
        return point, float("nan"), float("nan")
    pick = np.random.default_rng(seed).integers(0, len(pairs), size=(reps, len(pairs)))
    ratios = _ratio(m[pick].sum(axis=1), r[pick].sum(axis=1), figure)
    low, high = np.quantile(ratios, [0.025, 0.975])
    return point, float(low), float(high)


def _fmt(figure) -> str:
    if figure is None:
        return "-"
    point, low, high = figure
    return f"{point:.2f}" if np.isnan(low) else f"{point:.2f} ({low:.2f}-{high:.2f})"


NOTE = """
"over paused": tokens per second of the mode's spans over the paused spans of the same
cycles; all steps, then the steps that prefilled no prompt (decode steps), then those
plus the paused spans' measured prefill cost a token ("decode + prefill cost": a
request's prompt is the same work in every mode, and which span draws a long prompt
is luck that the all-steps figure carries). Intervals: 95% bootstrap over cycles.
The A/A control's row is the noise floor of each column.
"""

LABELS = {ON: "drafting on", ALONE: "prompt lookup paused (the method alone)",
          PAUSED: "paused (plain decoding)", AGAIN: "paused again (A/A control)"}


def table(spans: list[dict], methods: list[str]) -> str:
    """Per method and mode: speedups over the paused spans (all steps; steps
    that prefilled no prompt; those with the prefill cost added back), over both
    paused spans and over the method alone (decode steps), drafts by source."""
    lines = ["| method | mode | cycles | steps | tokens/s | over paused: all steps (95% interval) | "
             "decode steps | decode + prefill cost | decode steps, over both paused | decode steps, "
             "over the method alone | self-drafted (accepted) | copied (accepted) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for method in methods:
        mine = [s for s in spans if s["method"] == method]
        for mode in (ON, ALONE, AGAIN, PAUSED):
            rows = [s for s in mine if s["mode"] == mode]
            if not rows:
                continue
            tps = sum(s["tokens"] for s in rows) / sum(s["seconds"] for s in rows)
            cells = [method, LABELS[mode], str(len(rows)), str(sum(s["steps"] for s in rows)),
                     f"{tps:.2f}"]
            if mode == PAUSED:
                cells += ["-"] * 7
            else:
                over_paused = [_fmt(speedup(mine, mode, (PAUSED,), figure)) for figure in FIGURES]
                over_paused[1] = f"**{over_paused[1]}**"
                drafting = mode in DRAFTING
                cells += over_paused + [
                    _fmt(speedup(mine, mode, (PAUSED, AGAIN), "decode")) if drafting else "-",
                    _fmt(speedup(mine, ON, (ALONE,), "decode")) if mode == ON else "-",
                    f"{sum(s['self_drafted'] for s in rows)} ({sum(s['self_accepted'] for s in rows)})"
                    if drafting else "-",
                    f"{sum(s['copied'] for s in rows)} ({sum(s['copied_accepted'] for s in rows)})"
                    if drafting else "-"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def overhead_lines(spans: list[dict], methods: list[str]) -> str:
    return "\n" + "\n".join(f"- {idle_overhead(spans, m)}" for m in methods
                             if m != "ngram") + "\n"


def plot(base: str, spans: list[dict], methods: list[str]) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(len(methods), 1, figsize=(7, 2.4 * len(methods)), squeeze=False)
    colors = {ON: "tab:blue", ALONE: "tab:orange", PAUSED: "black", AGAIN: "tab:gray"}
    for ax, method in zip(axes[:, 0], methods):
        for mode, color in colors.items():
            rows = [s for s in spans if s["method"] == method and s["mode"] == mode]
            if rows:
                ax.plot([s["at"] / 60 for s in rows],
                        [s["decode_tokens"] / max(s["decode_seconds"], 1e-9) for s in rows],
                        ".", color=color, label=mode, markersize=4)
        ax.set_title(method, fontsize=9)
        ax.set_ylabel("tokens/s, decode steps")
        ax.legend(fontsize=7, ncol=4)
    axes[-1, 0].set_xlabel("minutes")
    fig.tight_layout()
    fig.savefig(base + ".png", dpi=100)


def rerender(path: str) -> None:
    """The table (printed, and written next to the .json as .md after the run's
    header) and the plot, from a run's saved spans."""
    with open(path) as f:
        run = json.load(f)
    methods = list(dict.fromkeys(name.split("#")[0] for name in run["methods"]))
    base = path[: -len(".json")]
    text = (table(run["spans"], methods) + "\n" + overhead_lines(run["spans"], methods)
            + repeat_lines(run["spans"], methods, run["methods"]) + NOTE)
    header = ""
    if os.path.exists(base + ".md"):
        with open(base + ".md") as f:
            header = f.read().split("\n| method |")[0].rstrip("\n") + "\n\n"
    with open(base + ".md", "w") as f:
        f.write(header + text)
    plot(base, run["spans"], methods)
    print(header + text)


def main() -> None:
    args = parse_args()
    if args.from_json:
        return rerender(args.from_json)
    if args.window < 1 or args.in_flight < 1:
        sys.exit("--window and --in-flight must be at least 1")
    if "ngram" in args.methods and len(args.methods) > 1:
        # Seen 2026-11-29: a plugin engine started in this process after an ngram
        # one fails in vLLM's CPU start-up (register_triton_kernel_overrides:
        # '_lib_fn_wrapper' object has no attribute 'get').
        sys.exit("--methods ngram runs alone: start it in a run of its own "
                 "(a second in-process engine after vLLM's ngram fails to start)")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # mode changes between two known steps
    model = prepare_method_engine_run(args)
    from vllm_layerskip.tools.prompts import benchmark_dataset
    questions = load_questions(benchmark_dataset(args.dataset_path))
    started = datetime.datetime.now(datetime.timezone.utc)
    spans, infos = [], {}
    for repeat in range(args.repeat):
        for method in args.methods:
            mine, info = run_method(method, args, model, questions, repeat)
            infos[method if args.repeat == 1 else f"{method}#{repeat}"] = info
            spans += mine
    header = (f"# Drafting on against paused, taking turns every {args.window} steps in one engine\n\n"
              f"`{' '.join(['bench_interleaved.py', *sys.argv[1:]])}`; model `{model}`, dtype "
              f"{args.dtype}, {'compiled' if args.compile else 'eager'}, K = {args.k}, "
              f"{args.in_flight} requests in flight, {args.max_tokens} tokens a request, T = "
              f"{args.temperature:g}, {args.minutes:g} timed minutes a method"
              f"{f' in each of {args.repeat} fresh engines' if args.repeat > 1 else ''}; "
              f"{started:%Y-%m-%d %H:%M}-{datetime.datetime.now(datetime.timezone.utc):%H:%M} UTC.\n")
    text = (header + "\n" + table(spans, args.methods) + "\n" + overhead_lines(spans, args.methods)
            + repeat_lines(spans, args.methods, infos) + NOTE)
    base = write_run(args.out, f"interleaved_{started:%Y%m%d-%H%M%S}", text,
                     {"args": vars(args), "methods": infos, "spans": spans})
    plot(base, spans, args.methods)
    print(f"wrote {base}.md, .json, .png")


if __name__ == "__main__":
    main()
