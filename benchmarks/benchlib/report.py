"""Output: markdown tables, a CSV of every aggregate, the JSON of every turn, PNG plots."""

from __future__ import annotations

import csv
import datetime
import json
import os
import platform
import sys

from .figures import ALL, plain_name
from .workloads import BLOCK_PER_IN_FLIGHT

# The issue's floor for every layer-skip method with the cost model on: at least
# this fraction of plain decoding's tokens/s in every category.
SPEEDUP_FLOOR = 0.95

CSV_FIELDS = (
    "workload", "category", "config", "group", "seconds", "num_tokens", "num_requests", "steps",
    "tokens_per_second", "speedup", "speedup_low", "speedup_high", "tpot_seconds",
    "tpot_speedup", "drafts", "draft_tokens", "accepted", "M", "alpha",
    "accepted_per_pos", "acceptance_distribution", "draft_seconds", "num_forward_steps",
    "num_proposals", "num_draft_tokens", "draft_step_seconds", "plain_step_seconds", "c", "v",
    "E_eq6", "optimizer_seconds", "optimizer_thread_seconds", "optimizer_share",
    "cost_model_steps", "cost_model_drafting_steps", "drafting_fraction", "mean_draft_length",
    "itl_sum", "itl_count", "ttft_sum", "ttft_count", "decode_time_sum", "decode_time_count",
    "parity", "peak_rss_gib",
)


def fmt(v, spec=".2f") -> str:
    return "-" if v is None else format(v, spec)


def cpu_vector_isa(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's widest vector instructions for bf16 matmuls, from /proc/cpuinfo.

    Why it is in every report: reports named the CPU only ("AMD EPYC x2"), and
    that name has covered two kinds of machine here. On the one of the runs up
    to 2026-11-25 11:07 (ISA not recorded) a bf16 decode step of
    Qwen2.5-Coder-1.5B was memory-bound: plain 3.7-4.0 tokens/s at batch 1,
    12-21 at 8 requests. On one with AVX2 and no AVX-512 (2026-11-25 13:00) it
    is compute-bound: 1.7 tokens/s at batch 1, 2.2 at 8 requests (a one-off
    check with vLLM's LLM, 32 tokens), so an extra verified token costs far
    more. Figures from the two are not comparable."""
    try:
        with open(cpuinfo) as f:
            flags = next((line.split(":", 1)[1].split() for line in f
                          if line.startswith("flags")), [])
    except OSError:
        return "unknown"
    for flag, name in (("amx_bf16", "AMX-BF16"), ("avx512_bf16", "AVX-512 BF16"),
                       ("avx512f", "AVX-512 (no BF16)"), ("avx2", "AVX2 (no AVX-512)")):
        if flag in flags:
            return name
    return "no AVX2"


def machine_info(args, model: str) -> dict:
    import psutil
    import torch
    import vllm

    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name")), platform.processor())
    except OSError:  # not Linux
        cpu = platform.processor()
    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "command": " ".join([os.path.relpath(sys.executable), *sys.argv]),
        "platform": platform.platform(), "cpu": cpu, "cpu_count": os.cpu_count(),
        "cpu_vector_isa": cpu_vector_isa(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "load_average_at_start": os.getloadavg(),
        "python": platform.python_version(), "torch": torch.__version__,
        "vllm": vllm.__version__, "model": model,
        "LD_PRELOAD": os.environ.get("LD_PRELOAD", ""),
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE"),
        "NUMBA_THREADING_LAYER": os.environ.get("NUMBA_THREADING_LAYER"),
        "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND"),
        "args": {k: v for k, v in vars(args).items() if k != "model_path"},
    }


def header(args, info: dict, workloads, n_engines: int, groups: int) -> str:
    iomp = "libiomp" in info["LD_PRELOAD"]
    wl = "; ".join(w.label for w, _ in workloads)
    lines = [
        f"{os.path.basename(info['model'])}, {info['date']}: {info['cpu']} x{info['cpu_count']} "
        f"cores, {info.get('cpu_vector_isa', 'vector ISA not recorded')}, {info['memory_gib']} GiB, vllm {info['vllm']}, torch {info['torch']}, "
        f"dtype={args.dtype}, {'compiled' if getattr(args, 'compile', False) else 'eager'}, "
        f"K={args.k}, max_tokens={args.max_tokens}, libiomp preloaded={iomp}, numba threading layer {info.get('NUMBA_THREADING_LAYER') or 'default'}, "
        f"worker cores {info.get('VLLM_CPU_OMP_THREADS_BIND') or 'vLLM auto (one kept back)'}, KV cache {info['VLLM_CPU_KVCACHE_SPACE']} GiB per engine, "
        f"load average at start {info['load_average_at_start'][0]:.1f}",
        "",
        f"Command: `{info['command']}`",
        "",
        f"Workloads: {wl}. Batch 1: {args.per_category} Spec-Bench question(s) per category "
        f"(first turn, chat template), one request at a time"
        + (f" ({args.batch_size} per call)" if args.batch_size > 1 else "")
        + f". Concurrent: {args.rounds} batch(es) of N questions drawn across categories, "
        f"submitted at once; N in flight: as many blocks of {BLOCK_PER_IN_FLIGHT}N, N requests "
        "running at a time. "
        + (f"{n_engines} engines, one alive at a time (--sequential), plain first: every "
         "configuration ran the same prompts after plain, not interleaved with it, so a "
         "change of the machine's speed over the run enters the speedups (the A/A control, "
         "if run, ran last and measures it)." if args.sequential else
         f"{n_engines} engines, kept alive all run, in {groups} group(s) (speedups within a "
         "group); configurations take turns on the same prompts, per category/batch, in a "
         "balanced order (Williams Latin square)."),
    ]
    return "\n".join(lines)


def interval(r: dict | None) -> str:
    if not r or r.get("speedup_low") is None:
        return "-"
    return f"{r['speedup_low']:.2f}-{r['speedup_high']:.2f}"


def _parity_cell(r: dict) -> str:
    if r["parity"] is None:
        return "-"
    return "yes" if r["parity"] else "**NO**"


def overall_table(rows: list[dict], workload: str, names: list[str]) -> str:
    out = ["| config | tok/s | speedup | 95% interval | TPOT speedup | M | alpha | c | c_limit | v | "
           "E (Eq. 6) | drafting | mean k | optimizer | peak RSS GiB | parity |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|"]
    by_name = {r["config"]: r for r in rows if r["workload"] == workload and r["category"] == ALL}
    for name in names:
        r = by_name.get(name)
        if r is None:
            continue
        out.append(
            f"| {name} | {fmt(r['tokens_per_second'], '.1f')} | {fmt(r['speedup'])} | "
            f"{interval(r)} | {fmt(r['tpot_speedup'])} | {fmt(r['M'])} | {fmt(r['alpha'])} | {fmt(r['c'], '.3f')} | "
            f"{fmt(r.get('c_limit'), '.3f')} | {fmt(r['v'])} | "
            f"{fmt(r['E_eq6'])} | {fmt(r['drafting_fraction'], '.0%')} | "
            f"{fmt(r.get('mean_draft_length'), '.1f')} | "
            f"{fmt(r['optimizer_share'], '.0%')} | {fmt(r['peak_rss_gib'], '.2f')} | "
            f"{_parity_cell(r)} |")
    return "\n".join(out)


def category_matrix(rows: list[dict], workload: str, names: list[str], cats: list[str],
                    key: str, spec: str, cell=None) -> str:
    """One row per config, one column per category; `cell(row)` formats a
    cell (default: the row's `key` with `spec`)."""
    cell = cell or (lambda r: fmt(r.get(key) if r else None, spec))
    index = {(r["config"], r["category"]): r for r in rows if r["workload"] == workload}
    out = ["| config | " + " | ".join(cats + [ALL]) + " |",
           "|---|" + "---:|" * (len(cats) + 1)]
    for name in names:
        if not any((name, c) in index for c in cats):
            continue
        out.append(f"| {name} | " + " | ".join(cell(index.get((name, c)))
                                              for c in cats + [ALL]) + " |")
    return "\n".join(out)


def floor_check(rows: list[dict], workload: str, names: list[str], cats: list[str]) -> str:
    """Per speculative config: does every category reach SPEEDUP_FLOOR? A category
    is clearly below when its whole interval is; clearly above when its whole
    interval is; anything else is within this run's noise."""
    index = {(r["config"], r["category"]): r for r in rows if r["workload"] == workload}
    out = [f"| config | lowest category | categories >= {SPEEDUP_FLOOR:.2f}x | interval wholly "
           f"above {SPEEDUP_FLOOR:.2f} | interval wholly below {SPEEDUP_FLOOR:.2f} |",
           "|---|---|---:|---:|---|"]
    for name in names:
        found = [(c, index[(name, c)]) for c in cats
                 if (name, c) in index and index[(name, c)].get("speedup") is not None]
        if not found or name == plain_name(found[0][1]["group"]):  # the reference itself
            continue
        low_cat, low = min(found, key=lambda cr: cr[1]["speedup"])
        above = sum(r["speedup"] >= SPEEDUP_FLOOR for _, r in found)
        sure = sum((r.get("speedup_low") or 0) >= SPEEDUP_FLOOR for _, r in found)
        below = [c for c, r in found
                 if r.get("speedup_high") is not None and r["speedup_high"] < SPEEDUP_FLOOR]
        out.append(f"| {name} | {low['speedup']:.2f} ({low_cat}, {interval(low)}) | "
                   f"{above}/{len(found)} | {sure}/{len(found)} | "
                   f"{', '.join(below) or 'none'} |")
    return "\n".join(out)


def category_long_table(rows: list[dict], workload: str, names: list[str], cats: list[str]) -> str:
    out = ["| category | config | tok/s | speedup | TPOT speedup | M | alpha | c | E (Eq. 6) | "
           "optimizer | parity |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|:---:|"]
    index = {(r["config"], r["category"]): r for r in rows if r["workload"] == workload}
    for cat in cats:
        for name in names:
            r = index.get((name, cat))
            if r is None:
                continue
            out.append(f"| {cat} | {name} | {fmt(r['tokens_per_second'], '.1f')} | "
                       f"{fmt(r['speedup'])} | {fmt(r['tpot_speedup'])} | {fmt(r['M'])} | "
                       f"{fmt(r['alpha'])} | "
                       f"{fmt(r['c'], '.3f')} | {fmt(r['E_eq6'])} | "
                       f"{fmt(r['optimizer_share'], '.0%')} | {_parity_cell(r)} |")
    return "\n".join(out)


def _swift_set(sw: dict) -> str:
    """The set SWIFT drafted with at the end. Its best matchness alone does not
    say it left its starting set: re-scoring the incumbent on newer text also
    moves that figure (2026-11-25, Qwen: 0.62 -> 0.78 with the initial set)."""
    if sw.get("best_set") == sw.get("initial_set"):
        return f"set in use: still its initial set {sw.get('best_set')} (no better set found)"
    return f"learned set {sw.get('best_set')} (switches: {sw.get('improvements')})"


def learner_notes(final_stats: dict) -> list[str]:
    """What each learning method ended with (its status() at the end of the run)."""
    notes = []
    for name, st in final_stats.items():
        sw, cl = st.get("swift"), st.get("clasp")
        if isinstance(sw, dict):
            reason = f" ({sw.get('stop_reason')})" if sw.get("stop_reason") else ""
            notes.append(
                f"- {name}: phase {sw.get('phase')}{reason}, {sw.get('optimization_steps')} "
                f"optimization steps, matchness {fmt(sw.get('initial_matchness'))} (initial set) -> "
                f"{fmt(sw.get('best_matchness'))} (best), r={sw.get('skip_ratio')}, scoring "
                f"{fmt(sw.get('score_seconds'), '.1f')} s on the engine thread, optimizer thread "
                f"{fmt(sw.get('worker_seconds'), '.1f')} s; " + _swift_set(sw))
        sd = st.get("self_sd")
        if isinstance(sd, dict):
            notes.append(
                f"- {name}: profile {sd.get('profile')}, skip set {sd.get('skip_set')}, "
                f"draft-exit threshold now {fmt(sd.get('threshold'), '.3f')} after "
                f"{sd.get('threshold_updates')} updates, acceptance {fmt(sd.get('acceptance'))}; "
                f"the profile's search: {sd.get('search_iterations')} iterations, "
                f"{sd.get('search_objective')} objective, {fmt(sd.get('search_seconds'), '.0f')} s")
        ada = st.get("adadecode")
        if isinstance(ada, dict):
            kl = ada.get("heldout_kl") or {}
            notes.append(
                f"- {name}: heads at layers {ada.get('layers')} (threshold "
                f"{ada.get('threshold')}), mean exit layer {fmt(ada.get('mean_exit_layer'), '.1f')} "
                f"of {ada.get('num_layers')}, trained in {fmt(ada.get('training_seconds'), '.0f')} s; "
                f"held-out KL {kl}")
        if isinstance(cl, dict):
            notes.append(
                f"- {name}: {cl.get('dp_runs')} DP runs ({fmt(cl.get('dp_seconds_per_run'), '.3f')} s "
                f"each, {fmt(cl.get('dp_seconds'), '.1f')} s in all), {cl.get('mask_changes')} skip-set "
                f"changes, mean Jaccard to the previous set {fmt(cl.get('mean_jaccard_to_previous'))}, "
                f"mean cosine {fmt(cl.get('mean_cosine'), '.3f')}; last set {cl.get('skipped_layers')}"
                + (f"; error: {cl.get('error')}" if cl.get("error") else ""))
    return notes


def projection_section(proj: list[dict], names: list[str]) -> str:
    if not proj:
        return ""
    out = [
        "## Projection (computed, NOT measured): hardware where decoding is memory-bound",
        "",
        "Not a measurement. On a GPU, decoding a small batch is memory-bound: verifying "
        "K+1 tokens costs about one decode step, and a forward's time is about proportional to "
        "the weight bytes it reads. Under those two assumptions SWIFT's Eq. 6 gives "
        "E = M*alpha / ((M-1)*c_w + alpha), with M and alpha measured above (batch 1, all "
        "categories) and c_w = weight bytes a draft step reads / a full forward's (LM head "
        "included, only the rows a pruned draft vocabulary scores; KV reads neglected; 0 for "
        "drafters that run no model). It ignores "
        "kernel-launch overheads, which make skipping cheaper sub-layers save less. With "
        "adaptive draft length, M and alpha come only from the drafts the CPU cost model allowed "
        "(often short probes); rows with `fixed K` (`--draft-length fixed`) draft K every step "
        "and project more faithfully.",
        "",
        "| workload | config | M (measured) | alpha (measured) | c_w (assumed) | projected speedup | basis |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for p in sorted(proj, key=lambda p: names.index(p["config"]) if p["config"] in names else 99):
        out.append(f"| {p['workload']} | {p['config']} | {fmt(p['M'])} | {fmt(p['alpha'])} | "
                   f"{fmt(p['c_w'], '.3f')} | {fmt(p['projected_speedup'])} | {p['basis']} |")
    return "\n".join(out)


def markdown(args, info, workloads, configs, rows, skipped, failed, final_stats, proj,
             cats, n_engines, groups) -> str:
    names = [c.name for c in configs]
    parts = [f"# Speculative decoding methods, {os.path.basename(info['model'])}", "",
             header(args, info, workloads, n_engines, groups), ""]
    for w, _ in workloads:
        label = w.label
        mode = ("" if w.latency else f" ({BLOCK_PER_IN_FLIGHT * w.concurrency} requests a block, "
                "a new one entering as one finishes)" if w.sustained
                else " (all requests of a batch together)")
        parts += [f"## {label}{mode}",
                  "", overall_table(rows, label, names), ""]
        controls = [r for r in rows if r["workload"] == label and r["category"] == ALL
                    and r["config"].startswith("plain (A/A") and r["speedup"]]
        if controls:
            ran = "; ".join(f"{r['speedup']:.2f}x plain (TPOT {fmt(r['tpot_speedup'])}x)"
                            + (f" in group {r['group'] + 1}" if len(controls) > 1 else "")
                            for r in controls)
            where = ("run last (--sequential: what the machine's drift alone does)"
                     if args.sequential else "in each group of engines")
            parts += [f"Noise floor: the A/A control, a second plain engine {where}, "
                      f"ran at {ran}; differences of that size between configurations "
                      "are not significant.", ""]
        if w.latency:
            parts += ["Speedup by category:", "",
                      category_matrix(rows, label, names, cats, "speedup", ".2f"), "",
                      "95% interval of the speedup by category (paired bootstrap over the "
                      "questions; the A/A control's intervals show what noise alone does):", "",
                      category_matrix(rows, label, names, cats, "", "", cell=interval), "",
                      f"Floor check ({SPEEDUP_FLOOR:.2f}x plain in every category):", "",
                      floor_check(rows, label, names, cats), "",
                      "Mean acceptance length M by category:", "",
                      category_matrix(rows, label, names, cats, "M", ".2f"), "",
                      "<details><summary>Every figure by category</summary>", "",
                      category_long_table(rows, label, names, cats), "", "</details>", ""]
        if w.temperature > 0:
            parts += ["T > 0: no token parity (outputs are samples). That speculative decoding "
                      "keeps the output distribution is tested in tests/test_sampling.py "
                      "(chi-square against plain decoding).", ""]
    parts += [
        "Columns: tok/s = output tokens / seconds in generate; speedup = over plain on the same "
        "prompts (interleaved unless --sequential); 95% interval = of the speedup, paired bootstrap over the "
        "questions (batch 1, resampled within each category) or batches (concurrent, with "
        "--rounds 2 or more); TPOT speedup = the same for the time per output token after the "
        "first (prefill excluded); M = 1 + accepted/drafts; alpha = accepted/drafted tokens; "
        "c = draft step / plain decode step (plain's mean inter-token latency); c_limit = the "
        "weight bytes a draft step reads / a plain step's (c on a machine where a pass costs "
        "its bytes; the projection below says its basis); v = non-draft "
        "time per engine step / plain decode step (batch 1); E = SWIFT Eq. 6 from M, alpha, c "
        "(assumes v = 1); drafting = share of engine steps the cost model drafted in; "
        "mean k = the draft length it chose in those steps; "
        "optimizer = share of wall time the skip-set optimizer ran on the engine thread "
        "(SWIFT scoring, CLaSp DP); peak RSS = sum of VmHWM of the engine's processes "
        "(KV cache included, the same size for every engine); parity = greedy token ids "
        "equal to plain's.", ""]
    if skipped or failed:
        parts += ["## Not run here", ""]
        parts += [f"- {c.name}: skipped, {c.skip_reason}" for c in skipped]
        parts += [f"- {name}: failed, {err}" for name, err in failed.items()]
        parts += [""]
    notes = learner_notes(final_stats)
    if notes:
        parts += ["## What the learning methods ended with", ""] + notes + [""]
    bad = [r for r in rows if r["parity"] is False and r["category"] == ALL]
    for r in bad:
        parts += [f"PARITY FAILURE {r['workload']} {r['config']}: {r.get('parity_failure')}", ""]
    proj_text = projection_section(proj, names)
    if proj_text:
        parts += [proj_text, ""]
    return "\n".join(parts)


def write_csv(path: str, rows: list[dict], info: dict) -> None:
    with open(path, "w", newline="") as f:
        # Metadata as comment lines: pandas.read_csv(path, comment="#").
        for key in ("date", "command", "model", "vllm", "torch", "cpu", "cpu_count", "platform"):
            f.write(f"# {key}: {info[key]}\n")
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (";".join(map(str, r[k])) if isinstance(r.get(k), list) else r.get(k))
                        for k in CSV_FIELDS})


def write_run(out_dir: str, stem: str, text: str, payload: dict) -> str:
    """A run's report (`text`, printed too) and raw figures as OUT/STEM.md and
    .json; returns OUT/STEM, where the caller puts its plot."""
    print("\n" + text)
    os.makedirs(out_dir, exist_ok=True)
    base = os.path.join(out_dir, stem)
    with open(base + ".md", "w") as f:
        f.write(text)
    write_json(base + ".json", payload)
    return base


def write_json(path: str, payload: dict) -> None:
    with open(path, "w") as f:
        json.dump(payload, f, indent=1, default=str)


# ---- plots -------------------------------------------------------------------------

def plots(base: str, rows: list[dict], workloads, names: list[str], cats: list[str],
          info: dict, k: int) -> list[str]:
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: no plots (.venv/bin/pip install matplotlib)")
        return []
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    footer = (f"{os.path.basename(info['model'])}, vllm {info['vllm']}, {info['cpu']} "
              f"x{info['cpu_count']}, {info['date']}")
    spec_names = [n for n in names if not n.startswith("plain")]
    index = {(r["workload"], r["category"], r["config"]): r for r in rows}
    files = []

    # Speedup by category and method: one panel per batch-1 workload, one for
    # the concurrent workloads (aggregate per workload).
    latency = [w for w, _ in workloads if w.latency]
    concurrent = [w for w, _ in workloads if not w.latency]
    panels = len(latency) + (1 if concurrent else 0)
    width_in = min(24, max(10, 3 + 0.3 * (len(cats) + 1) * max(1, len(spec_names))))
    fig, axes = plt.subplots(panels, 1, figsize=(width_in, 3.6 * panels), squeeze=False)
    width = 0.8 / max(1, len(spec_names))
    for ax, w in zip(axes[:, 0], latency):
        xs = cats + [ALL]
        for i, name in enumerate(spec_names):
            cells = [index.get((w.label, c, name)) or {} for c in xs]
            vals = np.array([r.get("speedup") or np.nan for r in cells])
            # The 95% interval as an error bar (none where there is no interval).
            low = np.array([r.get("speedup_low") or np.nan for r in cells])
            high = np.array([r.get("speedup_high") or np.nan for r in cells])
            err = np.nan_to_num(np.clip([vals - low, high - vals], 0, None))
            ax.bar(np.arange(len(xs)) + (i - (len(spec_names) - 1) / 2) * width, vals, width,
                   yerr=err, error_kw={"elinewidth": 0.7, "capsize": 1.5}, label=name)
        ax.axhline(SPEEDUP_FLOOR, color="red", linestyle="--", linewidth=0.8)
        ax.set_xticks(np.arange(len(xs)), xs, rotation=30, ha="right")
        ax.set_title(f"{w.label}: speedup over plain decoding (measured; bars: 95% interval, "
                     f"dashed: {SPEEDUP_FLOOR:g}x floor)")
    if concurrent:
        ax = axes[-1, 0]
        xs = [w.label for w in concurrent]
        for i, name in enumerate(spec_names):
            vals = [(index.get((x, ALL, name)) or {}).get("speedup") or np.nan for x in xs]
            ax.bar(np.arange(len(xs)) + (i - (len(spec_names) - 1) / 2) * width, vals, width, label=name)
        ax.set_xticks(np.arange(len(xs)), xs)
        ax.set_title("concurrent requests: throughput speedup over plain decoding (measured)")
    for ax in axes[:, 0]:
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_ylabel("speedup")
    axes[0, 0].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.text(0.01, 0.005, footer, fontsize=7)
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    path = base + "_speedup.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    files.append(path)

    # Acceptance length distribution: share of drafts by tokens per verify step
    # (accepted + 1), per method, batch 1 over all categories.
    fig, axes = plt.subplots(1, max(1, len(latency)), figsize=(7 * max(1, len(latency)), 4),
                             squeeze=False)
    for ax, w in zip(axes[0], latency):
        drafters = [n for n in spec_names
                    if (index.get((w.label, ALL, n)) or {}).get("acceptance_distribution")]
        bw = 0.8 / max(1, len(drafters))
        for i, name in enumerate(drafters):
            r = index[(w.label, ALL, name)]
            dist = np.array(r["acceptance_distribution"], dtype=float)
            dist = dist / dist.sum() if dist.sum() else dist
            xs = np.arange(1, len(dist) + 1)
            ax.bar(xs + (i - (len(drafters) - 1) / 2) * bw, dist, bw,
                   label=f"{name} (M={r['M']:.2f}, n={r['drafts']})")
        ax.set_xticks(np.arange(1, k + 2))
        ax.set_xlabel("tokens per verify step (accepted draft tokens + 1)")
        ax.set_ylabel("share of drafts")
        ax.set_title(f"{w.label}: acceptance length")
        ax.legend(fontsize=7)
    fig.text(0.01, 0.005, footer, fontsize=7)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    path = base + "_acceptance.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    files.append(path)
    return files
