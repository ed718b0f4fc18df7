"""From turns to figures: aggregates per (workload, category, configuration) and
the derived columns.

- tok/s: output tokens / seconds inside generate; speedup: over plain decoding
  of the same engine group, workload and category (same prompts, interleaved).
- TPOT speedup: the same for the time per output token after the first
  (vLLM's per-request decode time), i.e. without prefill.
- M = 1 + accepted / drafts (tokens per verify step that had a draft); alpha =
  accepted / drafted tokens (vLLM's spec-decode counters).
- c = draft step seconds (proposer's draft time / draft forward steps) / plain
  decode step seconds (plain's mean inter-token latency on the same prompts,
  which excludes prefill).
- v (batch 1 only): everything but drafting per engine step (verify forward,
  sampling, scheduling) relative to a plain step; SWIFT's Eq. 6 assumes 1.
- E = M*alpha / ((M-1)*c + alpha), SWIFT Eq. 6; (M-1)/alpha is the number of
  draft steps per verify step.
- speedup interval: a 95% paired bootstrap interval of the speedup over the
  blocks (questions at batch 1, batches in concurrent mode), resampled within
  each category; it says how far the point figure could move with other
  questions and another stretch of this shared machine.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

ALL = "all"

# Seconds an optimizer spends on the engine thread (it delays decoding), and in
# a background thread (it competes for the cores), per method's status().
OPTIMIZER_KEYS = {"swift": ("score_seconds",), "clasp": ("dp_seconds",),
                  "self_sd": ("search_seconds", "optimizer_seconds"),
                  "adadecode": ("optimizer_seconds",)}
OPTIMIZER_THREAD_KEYS = {"swift": ("worker_seconds",)}


def optimizer_seconds(stats: dict, keys_by_method: dict) -> float | None:
    found = None
    for method, keys in keys_by_method.items():
        sub = stats.get(method)
        if isinstance(sub, dict):
            for key in keys:
                if isinstance(sub.get(key), (int, float)):
                    found = (found or 0.0) + sub[key]
    return found


def _add(acc: dict, key: str, value) -> None:
    if value is None:
        return
    acc[key] = acc.get(key, 0) + value


def aggregate(turns: list[dict]) -> dict:
    """Sums per (workload, category, config), categories plus ALL."""
    sums: dict[tuple, dict] = defaultdict(dict)
    for t in turns:
        for cat in (t["category"], ALL):
            if cat == "mixed":  # concurrent batches: only the ALL aggregate
                continue
            acc = sums[(t["workload"], cat, t["config"])]
            acc.setdefault("group", t["group"])
            for key in ("seconds", "num_tokens", "num_requests", "steps"):
                _add(acc, key, t[key])
            c = t["counters"]
            for key in ("drafts", "draft_tokens", "accepted"):
                _add(acc, key, c[key])
            per_pos = acc.setdefault("accepted_per_pos", [])
            per_pos.extend([0] * (len(c["accepted_per_pos"]) - len(per_pos)))
            for i, v in enumerate(c["accepted_per_pos"]):
                per_pos[i] += v
            for name, (s, n) in c["hist"].items():
                _add(acc, f"{name}_sum", s)
                _add(acc, f"{name}_count", n)
            st = t["stats"]
            for key in ("draft_seconds", "num_forward_steps", "num_proposals", "num_draft_tokens"):
                _add(acc, key, st.get(key) if isinstance(st.get(key), (int, float)) else None)
            _add(acc, "optimizer_seconds", optimizer_seconds(st, OPTIMIZER_KEYS))
            _add(acc, "optimizer_thread_seconds", optimizer_seconds(st, OPTIMIZER_THREAD_KEYS))
            cm = st.get("cost_model")
            if isinstance(cm, dict):
                _add(acc, "cost_model_steps", cm.get("turn_steps"))
                _add(acc, "cost_model_drafting_steps", cm.get("turn_drafting_steps"))
                _add(acc, "cost_model_draft_length_sum", cm.get("turn_draft_length_sum"))
            parity = t.get("parity")
            if parity is not None:
                acc.setdefault("parity_checked", 0)
                acc["parity_checked"] += 1
                if not parity["equal"] and "parity_failure" not in acc:
                    acc["parity_failure"] = parity
    return sums


def plain_turns(turns: list[dict]) -> dict[tuple, dict]:
    """(group, workload, block) -> plain decoding's turn on that block."""
    return {(t["group"], t["workload"], t["block"]): t for t in turns if t["family"] == "plain"}


def check_parity(turns: list[dict]) -> None:
    """Greedy turns: token ids equal to plain's on the same prompts (same group)?"""
    plain = plain_turns(turns)
    for t in turns:
        ref = plain.get((t["group"], t["workload"], t["block"]))
        if t["temperature"] != 0 or t["family"] == "plain" or ref is None:
            continue
        t["parity"] = {"equal": True}
        for i, (a, b) in enumerate(zip(t["token_ids"], ref["token_ids"])):
            if a != b:
                pos = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                t["parity"] = {"equal": False, "question": t["questions"][i], "position": pos,
                               "got": a[pos:pos + 8], "plain": b[pos:pos + 8]}
                break


def paired_blocks(turns: list[dict]) -> dict[tuple, dict[str, list[tuple]]]:
    """(workload, category, config) -> {category of the block: [(tokens, seconds,
    plain's tokens, plain's seconds), ...]}: every non-plain turn paired with plain's
    turn on the same block of the same group, under its category and under ALL
    (concurrent batches, category "mixed", under ALL only)."""
    plain = plain_turns(turns)
    pairs: dict[tuple, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for t in turns:
        ref = plain.get((t["group"], t["workload"], t["block"]))
        if ref is None or t["family"] == "plain":
            continue
        pair = (t["num_tokens"], t["seconds"], ref["num_tokens"], ref["seconds"])
        for cat in (ALL,) if t["category"] == "mixed" else (t["category"], ALL):
            pairs[(t["workload"], cat, t["config"])][t["category"]].append(pair)
    return pairs


def speedup_intervals(turns: list[dict], level: float = 0.95, reps: int = 4000,
                      seed: int = 0) -> dict[tuple, tuple[float, float]]:
    """(workload, category, config) -> (low, high): a paired bootstrap interval of
    the tokens/s speedup over plain of the same group.

    The unit is a block (a question at batch 1, a batch in concurrent mode): a
    configuration and plain ran it back to back, so the pair shares the machine's
    state. Blocks are resampled with replacement within each category (the ALL
    interval keeps every category's share; with one block in some category, all
    blocks together), and each resample's speedup is a ratio of sums, as the
    point figure is. Needs two blocks or more."""
    rng = np.random.default_rng(seed)
    out = {}
    for key, by_cat in paired_blocks(turns).items():
        if sum(len(v) for v in by_cat.values()) < 2:
            continue
        strata = list(by_cat.values())
        if min(len(rows) for rows in strata) < 2:
            # A category with one block has no spread to resample: within-category
            # resampling would call its figure exact. Resample all blocks together.
            strata = [[pair for rows in strata for pair in rows]]
        sums = np.zeros((reps, 4))
        for rows in strata:
            arr = np.asarray(rows, dtype=float)
            pick = rng.integers(0, len(arr), size=(reps, len(arr)))
            sums += arr[pick].sum(axis=1)
        speedup = (sums[:, 0] / sums[:, 1]) / (sums[:, 2] / sums[:, 3])
        low, high = np.quantile(speedup, [(1 - level) / 2, (1 + level) / 2])
        out[key] = (float(low), float(high))
    return out


def acceptance_distribution(drafts: int, per_pos: list[int]) -> list[int]:
    """Drafts whose first j tokens were accepted, j = 0..K. Acceptance is a
    prefix, so `per_pos[j]` counts drafts with more than j accepted."""
    at_least = [drafts] + list(per_pos) + [0]
    return [max(at_least[j] - at_least[j + 1], 0) for j in range(len(per_pos) + 1)]


def swift_eq6(m: float | None, alpha: float | None, c: float | None) -> float | None:
    """SWIFT Eq. 6: E = M*alpha / ((M-1)*c + alpha). Assumes a verify step costs
    one plain decode step."""
    if m is None or alpha is None or c is None or alpha <= 0:
        return None
    return m * alpha / ((m - 1) * c + alpha)


def derive(sums: dict, engines_info: dict, intervals: dict | None = None) -> list[dict]:
    """One row per (workload, category, config) with every derived column;
    `intervals` from speedup_intervals."""
    rows = []
    for (workload, cat, name), acc in sums.items():
        # Plain decoding of the same engine group: interleaved with this config.
        ref = sums.get((workload, cat, plain_name(acc["group"])))
        r = {"workload": workload, "category": cat, "config": name, **acc}
        r["tokens_per_second"] = acc["num_tokens"] / acc["seconds"] if acc["seconds"] else None
        r["speedup"] = (r["tokens_per_second"] / (ref["num_tokens"] / ref["seconds"])
                        if ref and r["tokens_per_second"] else None)
        r["speedup_low"], r["speedup_high"] = (intervals or {}).get((workload, cat, name),
                                                                    (None, None))
        # Time per output token after the first (prefill left out): separates
        # what speculation does to decoding from prefill-time noise.
        r["tpot_seconds"] = _tpot(acc)
        r["tpot_speedup"] = (_tpot(ref) / r["tpot_seconds"]
                             if ref and _tpot(ref) and r["tpot_seconds"] else None)
        drafts = acc.get("drafts", 0)
        r["M"] = 1 + acc["accepted"] / drafts if drafts else None
        r["alpha"] = acc["accepted"] / acc["draft_tokens"] if acc.get("draft_tokens") else None
        r["acceptance_distribution"] = (acceptance_distribution(drafts, acc["accepted_per_pos"])
                                        if drafts else None)
        plain_step = _decode_step(ref) if ref else None
        r["plain_step_seconds"] = plain_step
        r["draft_step_seconds"] = (acc["draft_seconds"] / acc["num_forward_steps"]
                                   if acc.get("num_forward_steps") else None)
        r["c"] = (r["draft_step_seconds"] / plain_step
                  if r["draft_step_seconds"] is not None and plain_step else None)
        r["v"] = None
        # Decode steps: proposals less the one after each request's prefill step
        # (that one falls in the time to first token, not in the decode time).
        decode_steps = (acc.get("num_proposals") or 0) - acc["num_requests"]
        if "batch 1" in workload and decode_steps > 0 and plain_step and \
                acc.get("decode_time_sum") is not None:
            r["v"] = ((acc["decode_time_sum"] - acc.get("draft_seconds", 0.0))
                      / decode_steps / plain_step)
        r["E_eq6"] = swift_eq6(r["M"], r["alpha"], r["c"])
        r["optimizer_share"] = (acc["optimizer_seconds"] / acc["seconds"]
                                if acc.get("optimizer_seconds") is not None else None)
        r["drafting_fraction"] = (acc["cost_model_drafting_steps"] / acc["cost_model_steps"]
                                  if acc.get("cost_model_steps") else None)
        # The draft length the cost model chose, over the steps it drafted in.
        chosen = acc.get("cost_model_draft_length_sum")
        r["mean_draft_length"] = (chosen / acc["cost_model_drafting_steps"]
                                  if chosen is not None and acc.get("cost_model_drafting_steps")
                                  else None)
        if "parity_checked" in acc:
            r["parity"] = "parity_failure" not in acc
        else:
            r["parity"] = None
        info = engines_info.get((acc["group"], name), {})
        r["peak_rss_gib"] = (info.get("memory", {}).get("peak_rss_mib", 0) / 1024) or None
        rows.append(r)
    return rows


def _tpot(acc: dict) -> float | None:
    """Mean seconds per output token after the first, over the requests."""
    tokens = acc["num_tokens"] - acc["num_requests"]
    return acc["decode_time_sum"] / tokens if acc.get("decode_time_sum") and tokens > 0 else None


def plain_name(group: int, name: str = "plain") -> str:
    """Each engine group has its own plain engine (speedups are within a group)
    and its own A/A control: `name` as it is called in group `group`."""
    return name if group == 0 else f"{name} [group {group + 1}]"


def _decode_step(ref: dict) -> float | None:
    """Plain's seconds per decode step: mean inter-token latency (prefill left
    out), else seconds per engine step."""
    if ref.get("itl_count"):
        return ref["itl_sum"] / ref["itl_count"]
    return ref["seconds"] / ref["steps"] if ref.get("steps") else None


# ---- projection --------------------------------------------------------------------

def weight_params(model_cfg: dict) -> dict:
    """Parameters a forward reads per attention and MLP sub-layer (the plugin's
    own count, core.skip_mask.sublayer_params) and in the LM head (the token
    embedding is a gather of one row per token, left out)."""
    from types import SimpleNamespace

    from vllm_layerskip.core.skip_mask import sublayer_params

    attn, mlp = sublayer_params(SimpleNamespace(**model_cfg))
    return {"attn": attn, "mlp": mlp, "head": model_cfg["vocab_size"] * model_cfg["hidden_size"],
            "layers": model_cfg["num_hidden_layers"]}


# Bytes a draft weight reads relative to bf16, by draft_weights scheme
# (core/draft_weights.py): int4 with a bf16 scale and zero per 32 weights is
# 5 bits a weight; int8 and w8a8 with a scale per row about 8.
BYTES_VS_BF16 = {None: 1.0, "int4": 5 / 16, "int8": 0.5, "w8a8": 0.5}


def draft_weight_fraction(model_cfg: dict, num_attn_skipped: int, num_mlp_skipped: int,
                          draft_vocab_size: int = 0, draft_weights: str | None = None) -> float:
    """Weight bytes a draft step reads over a full forward's: the kept
    sub-layers, and the LM head's rows the draft scores (all of them unless a
    pruned draft vocabulary of draft_vocab_size ids is on); with draft_weights
    the layers at that scheme's bytes and the head's rows at 4 bits (the draft
    head quantizes its rows whenever the layers are, core/draft_head.py). On a
    memory-bound machine this is the draft pass's cost limit, c_limit. KV reads
    are left out: at 2,048 tokens they are ~2% of Qwen2.5-Coder-1.5B's weights."""
    p = weight_params(model_cfg)
    full = p["layers"] * (p["attn"] + p["mlp"]) + p["head"]
    head_rows = model_cfg["vocab_size"]
    if 0 < draft_vocab_size < model_cfg["vocab_size"]:
        head_rows = draft_vocab_size
    kept_layers = (p["layers"] * (p["attn"] + p["mlp"]) - num_attn_skipped * p["attn"]
                   - num_mlp_skipped * p["mlp"])
    head = head_rows * model_cfg["hidden_size"] * (BYTES_VS_BF16["int4"] if draft_weights else 1.0)
    return (kept_layers * BYTES_VS_BF16[draft_weights] + head) / full


def skipped_counts(config, final_stats: dict) -> tuple[int, int] | None:
    """(attention, MLP) sub-layers a draft step skips: the fixed set, or the set
    a learning method ended with."""
    sets = config.extra.get("skip_sets")
    if sets is None:
        for value in final_stats.values():
            if not isinstance(value, dict):
                continue
            best = value.get("best_set") or value.get("skip_set")  # swift / self_sd
            if isinstance(best, dict):
                sets = best
            elif isinstance(value.get("skipped_layers"), list):  # whole layers
                sets = {"skip_attn": value["skipped_layers"], "skip_mlp": value["skipped_layers"]}
            elif isinstance(value.get("skip_attn"), list):
                sets = value
    if sets is None:
        return None
    return len(sets.get("skip_attn", [])), len(sets.get("skip_mlp", []))


def projection(rows: list[dict], configs: dict, final_stats: dict, model_cfg: dict) -> list[dict]:
    """Expected speedup where a verify pass over a few tokens costs one decode
    step and a forward's time is proportional to the weight bytes it reads
    (memory-bound decoding): E = M*alpha / ((M-1)*c_w + alpha), c_w = the
    fraction of weights a draft step reads (0 for n-gram style drafters).
    Inputs M and alpha are this run's batch-1 figures over all categories."""
    out = []
    for r in rows:
        if r["category"] != ALL or "batch 1" not in r["workload"] or r["M"] is None:
            continue
        cfg = configs.get(r["config"])
        if cfg is None:
            continue
        if cfg.family == "vllm":
            c_w, basis = 0.0, "no model forward"
        else:
            stats = final_stats.get(r["config"], {})
            counts = skipped_counts(cfg, stats)
            if counts is None:
                continue
            # A pruned draft head reads only its rows (the proposer reports
            # the size it used; 0: the full head).
            vocab = stats.get("draft_vocab_size") or 0
            scheme = (stats.get("draft_weights") or {}).get("scheme")
            c_w = draft_weight_fraction(model_cfg, *counts, draft_vocab_size=vocab,
                                        draft_weights=scheme)
            basis = f"skips {counts[0]} attn + {counts[1]} MLP sub-layers"
            if scheme:
                basis += f", {scheme} draft weights"
            if 0 < vocab < model_cfg["vocab_size"]:
                basis += f", scores {vocab} of {model_cfg['vocab_size']} head rows"
        out.append({"workload": r["workload"], "config": r["config"], "M": r["M"],
                    "alpha": r["alpha"], "c_w": c_w, "basis": basis,
                    "projected_speedup": swift_eq6(r["M"], r["alpha"], c_w)})
    return out
