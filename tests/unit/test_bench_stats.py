"""The benchmark's statistics: the paired speedup interval and the batch-1
blocks it rests on (no engine: turns are built by hand)."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks")
sys.path[:0] = [BENCHMARKS, os.path.join(BENCHMARKS, "analysis")]  # benchlib; the analysis tools

from benchlib.figures import ALL, speedup_intervals  # noqa: E402
from benchlib.report import cpu_vector_isa, floor_check  # noqa: E402
from benchlib.workloads import (Workload, latency_blocks, sustained_blocks,  # noqa: E402
                                warmup_questions)

WORKLOAD = "batch 1, T=0"


def turns_for(plain_seconds, config_seconds, config="method", categories=None, tokens=64):
    """One block per question; plain and the config ran each block back to back."""
    categories = categories or ["writing"] * len(plain_seconds)
    turns = []
    for b, (p, c, cat) in enumerate(zip(plain_seconds, config_seconds, categories)):
        for name, family, seconds in (("plain", "plain", p), (config, "plugin", c)):
            turns.append({"group": 0, "workload": WORKLOAD, "block": b, "category": cat,
                          "config": name, "family": family, "num_tokens": tokens,
                          "seconds": seconds})
    return turns


def test_interval_covers_the_point_speedup_and_shrinks_with_more_questions():
    rng = np.random.default_rng(1)
    plain = 4.0 * np.exp(rng.normal(0, 0.08, 40))  # machine noise per question
    method = plain / 0.97 * np.exp(rng.normal(0, 0.03, 40))  # 3% slower, paired
    few = speedup_intervals(turns_for(plain[:4], method[:4]))[(WORKLOAD, "writing", "method")]
    many = speedup_intervals(turns_for(plain, method))[(WORKLOAD, "writing", "method")]
    point = plain.sum() / method.sum()
    assert many[0] < point < many[1]
    assert many[0] < 0.97 < many[1]
    assert many[1] - many[0] < few[1] - few[0]
    assert many[1] - many[0] < 0.05


def test_interval_is_paired_drift_shared_by_both_engines_cancels():
    # The machine slows down 2x half way through; the config is always 10% slower
    # than plain on the same question. Unpaired, the spread would be huge.
    plain = np.array([4.0] * 5 + [8.0] * 5)
    low, high = speedup_intervals(turns_for(plain, plain * 1.1))[(WORKLOAD, "writing", "method")]
    assert low == pytest.approx(1 / 1.1) and high == pytest.approx(1 / 1.1)


def test_all_categories_resample_within_each_category():
    cats = ["writing"] * 3 + ["rag"] * 3
    plain = [4.0, 4.0, 4.0, 8.0, 8.0, 8.0]
    method = [4.0, 4.0, 4.0, 10.0, 10.0, 10.0]  # rag 20% slower
    got = speedup_intervals(turns_for(plain, method, categories=cats))
    assert got[(WORKLOAD, "writing", "method")] == pytest.approx((1.0, 1.0))
    assert got[(WORKLOAD, "rag", "method")] == pytest.approx((0.8, 0.8))
    # Every resample keeps 3 writing and 3 rag questions: the ALL interval is one
    # value, not a spread from drawing more of one category than the other.
    low, high = got[(WORKLOAD, ALL, "method")]
    assert low == pytest.approx(high)
    assert low == pytest.approx(sum(plain) / sum(method))  # equal tokens: a ratio of times


def test_one_question_per_category_is_not_called_exact():
    # With a single question in each category, resampling within categories has
    # nothing to draw from; the ALL interval must still show the spread.
    cats = ["writing", "rag", "qa", "math"]
    got = speedup_intervals(turns_for([4.0, 4.0, 4.0, 4.0], [4.0, 5.0, 3.6, 4.4],
                                      categories=cats))
    low, high = got[(WORKLOAD, ALL, "method")]
    assert high - low > 0.05


def test_no_interval_from_one_question_and_none_for_plain():
    got = speedup_intervals(turns_for([4.0], [4.1]))
    assert (WORKLOAD, "writing", "method") not in got
    assert not any(key[2] == "plain" for key in speedup_intervals(turns_for([4, 5], [4, 5])))


def test_batch1_blocks_are_one_call_each_question_major():
    questions = [{"category": cat, "rank": r} for cat in ("a", "b") for r in range(3)]
    blocks = latency_blocks(questions, per_category=2)
    assert [(b.category, b.questions) for b in blocks] == [("a", [0]), ("b", [3]),
                                                           ("a", [1]), ("b", [4])]
    paired = latency_blocks(questions, per_category=3, batch_size=2)
    assert [(b.category, b.questions) for b in paired] == [("a", [0, 1]), ("b", [3, 4]),
                                                           ("a", [2]), ("b", [5])]


def test_workloads_parse_batches_and_requests_kept_in_flight():
    assert Workload.parse("1:0") == Workload(1, 0.0)
    assert Workload.parse("8:1").label == "8 concurrent, T=1"
    sustained = Workload.parse("8s:0")
    assert sustained == Workload(8, 0.0, sustained=True)
    assert sustained.label == "8 in flight, T=0" and not sustained.latency
    for bad, says in (("8", "expected N:T or Ns:T"), ("x:0", "expected N:T or Ns:T"),
                      ("1s:0", ">= 2 with s"), ("0:0", "N must be >= 1")):
        with pytest.raises(ValueError, match=says):
            Workload.parse(bad)


def test_prompt_lookup_rows_take_max_dot_dot_min():
    from bench_methods import parse_args

    assert parse_args(["--prompt-lookup", "default", "4..4", "off"]).prompt_lookup == [
        "default", "4..4", "off"]
    for bad in ("2..4", "4..0", "4", "x..2"):
        with pytest.raises(SystemExit):
            parse_args(["--prompt-lookup", bad])
    from benchlib.configs import Config, with_variants

    base = Config("layer_skip", "layer_skip", {"method": "layer_skip"}, family="plugin")
    rows = with_variants([base], parse_args(["--prompt-lookup", "default", "4..4"]))
    assert [(c.name, c.spec.get("prompt_lookup_max"), c.spec.get("prompt_lookup_min"))
            for c in rows] == [("layer_skip", None, None), ("layer_skip, lookup 4..4", 4, 4)]


def test_lookup_replay_counts_acceptance_by_matched_length():
    from lookup_match_length import replay

    # The output repeats the prompt's "1 2 3 4 5", then parts from it (7, not 6).
    prompt, output = [1, 2, 3, 4, 5, 6, 9], [1, 2, 3, 4, 5, 7]
    by_n = replay([(prompt, output)], max_n=3, min_n=2, k=3)
    # After "1 2": only the 2-token match, its draft "3 4 5" accepted whole.
    drafts, offered, accepted = by_n[2]
    assert (drafts, offered.tolist(), accepted.tolist()) == (1, [1, 1, 1], [1, 1, 1])
    # After "1 2 3", "2 3 4", "3 4 5": 3-token matches (the longest wins), drafting
    # "4 5 6" (2 accepted), "5 6 9" (1), "6 9 1" (0); a draft position counts as
    # offered up to the first rejection and within the output's end.
    drafts, offered, accepted = by_n[3]
    assert (drafts, offered.tolist(), accepted.tolist()) == (3, [3, 2, 1], [2, 1, 0])
    assert sorted(by_n) == [2, 3]


def test_lookup_replay_refuses_min_above_max(tmp_path):
    from lookup_match_length import main

    with pytest.raises(SystemExit, match="need 1 <= min <= max"):
        main([str(tmp_path / "run.json"), "--model", "m", "--min-n", "5", "--max-n", "3"])


def test_sustained_blocks_hold_three_times_the_requests_in_flight_categories_mixed():
    questions = [{"category": cat, "rank": r} for cat in ("a", "b", "c") for r in range(5)]
    blocks = sustained_blocks(questions, in_flight=2, rounds=2)
    assert [b.questions for b in blocks] == [[0, 5, 10, 1, 6, 11], [2, 7, 12, 3, 8, 13]]
    assert {b.category for b in blocks} == {"mixed"}
    with pytest.raises(ValueError, match="18 questions needed"):
        sustained_blocks(questions, in_flight=3, rounds=2)


def test_warmup_uses_questions_outside_the_timed_set():
    questions = [{"category": c, "rank": r, "prompt": "x" * (10 - i)}
                 for i, (c, r) in enumerate((c, r) for c in ("a", "b") for r in range(3))]
    timed = {0, 1, 3, 4}
    assert warmup_questions(questions, timed, 2) == [5, 2]  # shortest first
    # Too few others: topped up from the timed ones, never repeated.
    assert warmup_questions(questions, timed, 4) == [5, 2, 0, 1]


def test_floor_check_names_categories_clearly_below():
    def row(config, cat, speedup, low, high):
        return {"workload": WORKLOAD, "config": config, "category": cat, "group": 0,
                "speedup": speedup, "speedup_low": low, "speedup_high": high}

    rows = [row("method", "writing", 1.01, 0.97, 1.05), row("method", "rag", 0.90, 0.86, 0.93),
            row("method", "qa", 0.96, 0.93, 0.99), row("plain", "writing", 1.0, None, None)]
    table = floor_check(rows, WORKLOAD, ["plain", "method"], ["writing", "rag", "qa"])
    lines = table.splitlines()
    assert len(lines) == 3  # header, rule, method: plain has no row
    assert lines[2] == "| method | 0.90 (rag, 0.86-0.93) | 2/3 | 1/3 | rag |"


def test_turn_figures_of_the_cost_model_from_its_cumulative_summary():
    from benchlib.engines import diff_stats

    before = {"cost_model": {"steps": 100, "drafting_fraction": 0.1, "mean_draft_length": 2.0}}
    # 50 more steps, 10 of them drafting 4 tokens each: 20 drafting steps, 60 tokens chosen.
    after = {"cost_model": {"steps": 150, "drafting_fraction": 20 / 150,
                            "mean_draft_length": 60 / 20}}
    turn = diff_stats(after, before)["cost_model"]
    assert (turn["turn_steps"], turn["turn_drafting_steps"], turn["turn_draft_length_sum"]) \
        == (50, 10, 40)


def test_every_engine_group_has_plain_and_the_aa_control():
    # With more methods than engines fit in memory, each group gets its own
    # plain engine and A/A control, so each group's noise floor is measured.
    from benchlib.configs import Config, engine_groups
    from benchlib.figures import plain_name

    plain = Config("plain", "plain", None, family="plain")
    control = Config("plain (A/A control)", "plain", None, family="control")
    methods = [Config(m, m, {"method": m}) for m in ("layer_skip", "swift", "clasp", "self_sd")]
    groups = engine_groups([plain, control, *methods], max_alive=4)
    assert [[c.name for c in g] for g in groups] == [
        ["plain", "plain (A/A control)", "layer_skip", "swift"],
        ["plain", "plain (A/A control)", "clasp", "self_sd"],
    ]
    assert engine_groups([plain, *methods], max_alive=4)[0] == [plain, *methods[:3]]
    # Two engines at a time (the 1.5B model in bf16): the control gets a group of its own.
    assert [[c.name for c in g] for g in engine_groups([plain, control, *methods[:2]], 2)] == [
        ["plain", "plain (A/A control)"], ["plain", "layer_skip"], ["plain", "swift"]]
    # Engines are renamed by group when they start: two references, two controls.
    assert plain_name(1) == "plain [group 2]"
    assert plain_name(1, control.name) == "plain (A/A control) [group 2]"


def test_sequential_groups_run_plain_first_and_the_control_last():
    # --sequential: one engine alive at a time; every speedup is against the one
    # plain engine, and the control, last, spans the whole run's drift.
    from benchlib.configs import Config, sequential_groups

    plain = Config("plain", "plain", None, family="plain")
    control = Config("plain (A/A control)", "plain", None, family="control")
    methods = [Config(m, m, {"method": m}) for m in ("ngram", "self_sd", "swift")]
    groups = sequential_groups([plain, control, *methods])
    assert [[c.name for c in g] for g in groups] == [
        ["plain"], ["ngram"], ["self_sd"], ["swift"], ["plain (A/A control)"]]
    assert sequential_groups([plain, *methods[:1]]) == [[plain], [methods[0]]]


def test_identity_padded_model_computes_the_base_model(tiny_model_dir):
    # The benchmark's sanity model for "a fixed draft length beats plain": an
    # identity layer after each layer leaves the logits bit for bit the base
    # model's, so the draft that skips the inserted layers is the base model.
    import torch
    from benchlib.padded_model import ensure_padded_model, identity_layers
    from transformers import AutoModelForCausalLM

    base = tiny_model_dir("llama")
    padded = ensure_padded_model(base)
    assert ensure_padded_model(base) == padded  # cached
    models = [AutoModelForCausalLM.from_pretrained(p, dtype=torch.float32).eval()
              for p in (base, padded)]
    assert models[1].config.num_hidden_layers == 2 * models[0].config.num_hidden_layers
    assert identity_layers(2) == [1, 3]
    ids = torch.randint(0, models[0].config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        base_logits, padded_logits = (m(ids).logits for m in models)
    assert torch.equal(base_logits, padded_logits)
    # ... and not because the padding is inert everywhere: the inserted layers
    # carry copies of real weights, only their output projections are zero.
    inserted = models[1].model.layers[1]
    assert torch.equal(inserted.self_attn.q_proj.weight, models[0].model.layers[0].self_attn.q_proj.weight)
    assert not inserted.self_attn.o_proj.weight.any() and not inserted.mlp.down_proj.weight.any()


def test_serve_speedups_are_over_each_groups_plain_server():
    # The A/A control's name starts with "plain" too; it must not become the
    # reference of the rows after it: the reference is the plain server of the
    # same group, level and round.
    from bench_serve import summarize
    from benchlib.figures import plain_name

    def record(group, name, family, tokens, level=1):
        return {"group": group, "config": name, "family": family, "prompt_tokens": None,
                "level": level, "round": 0,
                "result": {"total_output_tokens": tokens, "duration": 1.0, "completed": 1,
                           "median_tpot_ms": 1.0, "median_ttft_ms": 1.0}}
    records = [record(0, "plain", "plain", 100), record(0, plain_name(0, "plain (A/A control)"),
                                                        "control", 90),
               record(0, "swift", "plugin", 120), record(1, plain_name(1), "plain", 50),
               record(1, plain_name(1, "plain (A/A control)"), "control", 50),
               record(1, "clasp", "plugin", 40), record(0, "plain", "plain", 200, level=4),
               record(0, "swift", "plugin", 180, level=4)]
    speedups = {(r["config"], r["level"]): round(r["speedup"], 3) for r in summarize(records)}
    assert speedups == {("plain", 1): 1.0, ("plain (A/A control)", 1): 0.9, ("swift", 1): 1.2,
                        ("plain", 4): 1.0, ("swift", 4): 0.9, ("plain [group 2]", 1): 1.0,
                        ("plain (A/A control) [group 2]", 1): 1.0, ("clasp", 1): 0.8}


def test_serve_reports_how_much_each_server_drafted_per_output_token():
    """Draft tokens over output tokens, summed over rounds: the column that shows
    the cost model drafting less under load. Plain servers draft nothing: no figure."""
    from bench_serve import summarize, table

    def record(name, family, r, tokens, drafted):
        result = {"total_output_tokens": tokens, "duration": 1.0, "completed": 1,
                  "median_tpot_ms": 1.0, "median_ttft_ms": 1.0}
        if drafted is not None:
            result.update(spec_decode_num_drafts=10, spec_decode_draft_tokens=drafted,
                          spec_decode_accepted_tokens=drafted // 2)
        return {"group": 0, "config": name, "family": family, "prompt_tokens": None,
                "level": 8, "round": r, "result": result}
    records = [record("plain", "plain", 0, 100, None), record("plain", "plain", 1, 100, None),
               record("quantized", "plugin", 0, 100, 30), record("quantized", "plugin", 1, 300, 10)]
    rows = {r["config"]: r for r in summarize(records)}
    assert rows["quantized"]["drafted_per_output"] == pytest.approx(40 / 400)
    assert rows["plain"]["drafted_per_output"] is None
    text = table(list(rows.values()), None)
    assert text.splitlines()[0].endswith("| draft tokens / output token |")
    assert text.splitlines()[3].endswith("| 0.50 | 0.10 |")  # quantized: rate 20/40, 40/400


def test_pooled_runs_pair_each_question_with_its_own_runs_plain():
    # Two runs: in the second the method sat in engine group 2, beside that
    # group's plain engine ("plain [group 2]"). Pooled, each question is paired
    # with plain's turn of its own run and group, and the names are merged.
    from pool_runs import pooled_speedups, pooled_turns

    def turn(group, block, config, seconds, family="spec", category="qa"):
        return {"group": group, "workload": WORKLOAD, "block": block, "category": category,
                "config": config, "family": family, "num_tokens": 64, "seconds": seconds}
    run_a = [turn(0, 0, "plain", 4.0, "plain"), turn(0, 0, "swift", 5.0)]
    run_b = [turn(0, 0, "plain", 1.0, "plain"), turn(1, 0, "plain [group 2]", 2.0, "plain"),
             turn(1, 0, "swift [group 2]", 2.0)]
    speedups = pooled_speedups(pooled_turns([run_a, run_b]))
    # swift: 128 tokens in 7 s; plain on the same blocks: 128 tokens in 4 + 2 s
    # (run b's group-1 plain, not its faster group-0 one).
    assert speedups[(WORKLOAD, "qa", "swift")] == (pytest.approx(6 / 7), 2)
    assert speedups[(WORKLOAD, ALL, "swift")] == speedups[(WORKLOAD, "qa", "swift")]
    assert set(key[2] for key in speedups) == {"swift"}


def test_pooling_refuses_a_file_that_is_not_a_benchmark_result(tmp_path):
    from pool_runs import load_turns

    wrong = tmp_path / "load.json"
    wrong.write_text('{"rows": []}')  # e.g. a load_test.py result
    with pytest.raises(SystemExit, match=r"load.json: not a bench_methods.py result .*KeyError"):
        load_turns(str(wrong))
    broken = tmp_path / "cut.json"
    broken.write_text('{"turns": [')
    with pytest.raises(SystemExit, match=r"cut.json: not a bench_methods.py result .*pass the .json"):
        load_turns(str(broken))


@pytest.mark.parametrize("flags, isa", [
    ("fpu avx avx2 fma", "AVX2 (no AVX-512)"),
    ("avx2 avx512f avx512bw", "AVX-512 (no BF16)"),
    ("avx2 avx512f avx512_bf16", "AVX-512 BF16"),
    ("avx2 avx512f avx512_bf16 amx_bf16 amx_tile", "AMX-BF16"),
    ("fpu sse2", "no AVX2"),
])
def test_reports_name_the_cpus_vector_isa(tmp_path, flags, isa):
    """Reports named the CPU only ("AMD EPYC"), a name that has covered machines
    with and without AVX-512 here: every report now names the ISA it ran on."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: {flags}\n")
    assert cpu_vector_isa(str(cpuinfo)) == isa
    assert cpu_vector_isa(str(tmp_path / "missing")) == "unknown"


def test_swift_note_says_whether_it_left_its_initial_set():
    # A best matchness above the initial one does not mean a new set: the
    # incumbent re-scored on newer text moves it too (a Qwen run reported
    # 0.62 -> 0.78 while drafting with its initial set all along).
    from benchlib.report import learner_notes

    initial = {"skip_attn": [2, 4], "skip_mlp": [3]}
    swift = {"phase": "optimizing", "optimization_steps": 2, "initial_matchness": 0.62,
             "best_matchness": 0.78, "skip_ratio": 0.45, "initial_set": initial,
             "best_set": initial, "improvements": 0}
    (note,) = learner_notes({"swift": {"swift": swift}})
    assert "still its initial set" in note and "learned set" not in note
    learned = {"skip_attn": [2, 5], "skip_mlp": [3]}
    (note,) = learner_notes({"swift": {"swift": {**swift, "best_set": learned, "improvements": 1}}})
    assert f"learned set {learned} (switches: 1)" in note


@pytest.mark.parametrize("spec", ["held_out", "held_out:24", "held_out:a:b", "spec_bench:x"])
def test_set_acceptance_refuses_a_malformed_prompt_group(spec):
    from set_acceptance import prompt_groups

    with pytest.raises(SystemExit, match="expected NAME:START:END"):
        prompt_groups([spec])


def test_projection_counts_only_the_head_rows_a_pruned_draft_scores():
    """The memory-bound projection's c_w: a pruned draft vocabulary takes its
    unscored rows off the LM head's bytes (Qwen2.5-Coder-1.5B's shapes)."""
    from benchlib.configs import Config
    from benchlib.figures import draft_weight_fraction, projection, weight_params

    qwen = {"hidden_size": 1536, "num_attention_heads": 12, "num_key_value_heads": 2,
            "intermediate_size": 8960, "vocab_size": 151936, "num_hidden_layers": 28}
    p = weight_params(qwen)
    full = 28 * (p["attn"] + p["mlp"]) + p["head"]
    head_share = p["head"] / full
    assert 0.13 < head_share < 0.17  # the "about 15%"
    whole = draft_weight_fraction(qwen, 12, 11)
    pruned = draft_weight_fraction(qwen, 12, 11, draft_vocab_size=65536)
    assert whole - pruned == pytest.approx(head_share * (151936 - 65536) / 151936)
    assert draft_weight_fraction(qwen, 12, 11, draft_vocab_size=151936) == whole

    sets = {"skip_attn": list(range(12)), "skip_mlp": list(range(11))}
    configs = {name: Config(name=name, method="layer_skip", spec={}, family="plugin",
                            extra={"skip_sets": sets}) for name in ("full", "pruned")}
    rows = [{"config": name, "category": ALL, "workload": "batch 1, T=0", "M": 2.0, "alpha": 0.5}
            for name in configs]
    stats = {"full": {"draft_vocab_size": 0}, "pruned": {"draft_vocab_size": 65536}}
    out = {p["config"]: p for p in projection(rows, configs, stats, qwen)}
    assert out["full"]["c_w"] == pytest.approx(whole)
    assert out["pruned"]["c_w"] == pytest.approx(pruned)
    assert out["pruned"]["basis"].endswith("scores 65536 of 151936 head rows")
    assert out["pruned"]["projected_speedup"] > out["full"]["projected_speedup"]


def test_projection_reads_draft_weights_at_their_bytes():
    """int4 draft weights: the kept layers and the head's scored rows at 5 bits
    a weight (4 + a bf16 scale and zero per 32): Qwen2.5-Coder-1.5B's c_limit
    of an int4 full-depth draft with a 65,536-row head is ~0.29."""
    from benchlib.configs import Config
    from benchlib.figures import draft_weight_fraction, projection, weight_params

    qwen = {"hidden_size": 1536, "num_attention_heads": 12, "num_key_value_heads": 2,
            "intermediate_size": 8960, "vocab_size": 151936, "num_hidden_layers": 28}
    p = weight_params(qwen)
    full = 28 * (p["attn"] + p["mlp"]) + p["head"]
    layers = 28 * (p["attn"] + p["mlp"])
    int4 = draft_weight_fraction(qwen, 0, 0, draft_vocab_size=65536, draft_weights="int4")
    assert int4 == pytest.approx((layers * 5 / 16 + 65536 * 1536 * 5 / 16) / full)
    assert 0.28 < int4 < 0.30
    assert draft_weight_fraction(qwen, 0, 0) == pytest.approx(1.0)
    configs = {"q": Config(name="q", method="layer_skip", spec={}, family="plugin",
                           extra={"skip_sets": {"skip_attn": [], "skip_mlp": []}})}
    rows = [{"config": "q", "category": ALL, "workload": "batch 1, T=0", "M": 3.0, "alpha": 0.8}]
    stats = {"q": {"draft_vocab_size": 65536, "draft_weights": {"scheme": "int4"}}}
    (out,) = projection(rows, configs, stats, qwen)
    assert out["c_w"] == pytest.approx(int4) and "int4 draft weights" in out["basis"]


class _Drafter:
    """The proposer's two pause switches, as the interleaved benchmark sets them."""

    def __init__(self):
        self.drafting_paused = False
        self.prompt_lookup_paused = False

    def set_drafting_paused(self, paused):
        self.drafting_paused = paused

    def set_prompt_lookup_paused(self, paused):
        self.prompt_lookup_paused = paused
        return True


def test_interleaved_spans_own_the_step_that_verifies_their_last_drafts():
    import types

    from bench_interleaved import run_span

    drafter = _Drafter()
    worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(drafter=drafter))
    llm = types.SimpleNamespace(collective_rpc=lambda fn, args=(): [fn(worker, *args)])
    seen = []

    class Stream:
        def step(self):  # 0.1 s a step; 2 tokens while drafting, 1 paused; a prompt every 3rd
            seen.append((drafter.drafting_paused, drafter.prompt_lookup_paused))
            return 0.1, 1 if drafter.drafting_paused else 2, len(seen) % 3 == 0

    from bench_interleaved import plugin_mode_setter

    set_mode = plugin_mode_setter(llm, has_lookup=True)
    span = run_span(Stream(), "lookup paused", 4, set_mode)
    # Four drafting steps with lookup paused, then one paused step verifying the last drafts.
    assert seen == [(False, True)] * 4 + [(True, False)]
    assert span["steps"] == 5 and span["tokens"] == 9 and span["seconds"] == pytest.approx(0.5)
    assert span["decode_tokens"] == 7 and span["decode_seconds"] == pytest.approx(0.4)
    seen.clear()
    span = run_span(Stream(), "paused", 4, set_mode)
    assert seen == [(True, False)] * 4 and span["steps"] == 4 and span["tokens"] == 4


def test_interleaved_speedup_pairs_spans_of_one_cycle():
    from bench_interleaved import speedup

    spans = []
    for cycle, machine in enumerate([1.0, 0.6, 1.3, 0.8, 1.1, 0.7]):  # drift between cycles
        for mode, tps in (("on", 12.0), ("paused", 10.0), ("paused again", 10.0)):
            step = 8 / (tps * machine)  # 8 tokens a step
            spans.append({"cycle": cycle, "mode": mode, "tokens": 80, "seconds": 10 * step,
                          "decode_tokens": 80, "decode_seconds": 10 * step,
                          "step_seconds": [step] * 10, "step_prefill": [False] * 10})
    for figure in ("all", "decode", "modelled"):
        point, low, high = speedup(spans, "on", ("paused",), figure)
        assert point == pytest.approx(1.2) and low == pytest.approx(1.2) and high == pytest.approx(1.2)
    assert speedup(spans, "paused again", ("paused",))[0] == pytest.approx(1.0)
    assert speedup(spans, "on", ("paused", "paused again"), "decode")[0] == pytest.approx(1.2)
    assert speedup(spans, "lookup paused", ("paused",)) is None


def test_interleaved_modelled_speedup_adds_the_measured_prefill_cost_back():
    from bench_interleaved import prefill_excess, speedup

    # Paused: 10 steps of 0.1 s and 1 token each, one of them also prefilling a
    # prompt (0.6 s: 0.5 s of prefill). Drafting on: decode steps of 0.1 s make 2
    # tokens; its prefill steps fell elsewhere, which the modelled figure corrects.
    paused = {"mode": "paused", "step_seconds": [0.1] * 9 + [0.6], "step_prefill": [False] * 9 + [True]}
    paused.update(tokens=10, seconds=1.5, decode_tokens=9, decode_seconds=0.9)
    on = {"mode": "on", "step_seconds": [0.1] * 10, "step_prefill": [False] * 10,
          "tokens": 20, "seconds": 1.0, "decode_tokens": 20, "decode_seconds": 1.0}
    assert prefill_excess(paused) == pytest.approx(0.5) and prefill_excess(on) == 0.0
    spans = [{**paused, "cycle": c} for c in range(3)] + [{**on, "cycle": c} for c in range(3)]
    assert speedup(spans, "on", ("paused",), "decode")[0] == pytest.approx(2.0)
    # A token costs 0.1 s decoding plus 0.05 s of prefill paused, 0.05 + 0.05 s on.
    assert speedup(spans, "on", ("paused",), "modelled")[0] == pytest.approx(0.15 / 0.10)
    assert speedup(spans, "on", ("paused",), "all")[0] == pytest.approx(20 / 1.0 / (10 / 1.5))


def test_interleaved_refuses_ngram_beside_other_methods_before_starting_anything(monkeypatch):
    import bench_interleaved

    monkeypatch.setattr(sys, "argv", ["bench_interleaved.py", "--methods", "ngram", "swift"])
    with pytest.raises(SystemExit, match="--methods ngram runs alone: start it in a run of its own"):
        bench_interleaved.main()


# --- vLLM's own peers: draft_model (a second model) and suffix (arctic-inference) ---


def _checkpoint(path, vocab_size, vocab=None):
    """A checkpoint directory as configs.py reads it: config.json, tokenizer.json."""
    import json

    path.mkdir()
    (path / "config.json").write_text(json.dumps({"num_hidden_layers": 4,
                                                  "vocab_size": vocab_size}))
    if vocab is not None:
        (path / "tokenizer.json").write_text(json.dumps({
            "model": {"vocab": vocab}, "added_tokens": [{"id": len(vocab), "content": "<|e|>"}]}))
    return str(path)


def _peer_configs(target, *argv):
    from bench_methods import parse_args
    from benchlib.configs import build_configs

    return {c.method: c for c in build_configs(parse_args(["--k", "4", *argv]), target)}


def test_draft_model_runs_the_given_draft_at_k_beside_ngram(tmp_path):
    from benchlib.configs import DEFAULT_METHODS, METHODS

    vocab = {"a": 0, "b": 1}
    target = _checkpoint(tmp_path / "target", 3, vocab)
    draft = _checkpoint(tmp_path / "draft", 3, dict(vocab))
    configs = _peer_configs(target, "--methods", "ngram", "draft_model", "--draft-model", draft)
    row = configs["draft_model"]
    assert row.runs and row.name == "draft_model draft" and row.family == "vllm_model"
    assert row.spec == {"method": "draft_model", "model": draft, "num_speculative_tokens": 4}
    assert configs["ngram"].spec["num_speculative_tokens"] == 4 and configs["ngram"].family == "vllm"
    # Its K from --method-options, as every method's.
    configs = _peer_configs(target, "--methods", "draft_model", "--draft-model", draft,
                            "--method-options", '{"draft_model": {"num_speculative_tokens": 3}}')
    assert configs["draft_model"].spec["num_speculative_tokens"] == 3
    assert configs["draft_model"].name == "draft_model draft, K=3"  # not the run's K: named
    # Asked for only: it needs a second model prepared.
    assert "draft_model" in METHODS and "draft_model" not in DEFAULT_METHODS


def test_grid_variants_only_where_draft_weights_are_int4(tmp_path):
    from bench_methods import parse_args
    from benchlib.configs import build_configs

    target = _checkpoint(tmp_path / "target", 3, {"a": 0})
    rows = build_configs(parse_args(["--k", "4", "--methods", "plain", "quantized", "layer_skip",
                                     "--ratios", "0.5", "--draft-weights-grid", "auto", "minmax"]),
                         target)
    names = {c.name: c.spec for c in rows}
    assert names["quantized, auto grid"]["draft_weights_grid"] == "auto"
    assert names["quantized, minmax grid"]["draft_weights_grid"] == "minmax"
    assert "layer_skip r=0.5" in names and "draft_weights_grid" not in names["layer_skip r=0.5"]
    assert len(rows) == 4  # plain, two quantized rows, one layer_skip row (its weights: no grid)


def test_draft_model_defaults_to_the_prepared_qwen_0_5b(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_LAYERSKIP_CACHE", str(tmp_path / "cache"))
    target = _checkpoint(tmp_path / "target", 151936)
    row = _peer_configs(target, "--methods", "draft_model")["draft_model"]
    where = str(tmp_path / "cache" / "Qwen2.5-Coder-0.5B-Instruct")
    assert row.spec["model"] == where and row.name == "draft_model Qwen2.5-Coder-0.5B-Instruct"
    assert row.skip_reason == (f"no draft model at {where}: prepare it with `vllm-layerskip "
                               "prepare-model qwen2.5-coder-0.5b` (or `LAYERSKIP_PEERS=1 bash "
                               "scripts/install.sh`)")
    (tmp_path / "cache").mkdir()
    _checkpoint(tmp_path / "cache" / "Qwen2.5-Coder-0.5B-Instruct", 151936)
    assert _peer_configs(target, "--methods", "draft_model")["draft_model"].runs
    # A draft given by hand that is not there.
    row = _peer_configs(target, "--methods", "draft_model", "--draft-model",
                        str(tmp_path / "none"))["draft_model"]
    assert row.skip_reason == f"no draft model at {tmp_path / 'none'}: check --draft-model"


def test_draft_model_refuses_a_draft_of_another_vocabulary(tmp_path):
    # SmolLM2 (49152 tokens) cannot take Qwen's 0.5B (151936) as its draft.
    target = _checkpoint(tmp_path / "smollm2", 49152)
    draft = _checkpoint(tmp_path / "qwen", 151936)
    row = _peer_configs(target, "--methods", "draft_model", "--draft-model", draft)["draft_model"]
    assert row.skip_reason.startswith("the draft qwen has a vocabulary of 151936 tokens, the "
                                      "target 49152: vLLM's draft_model needs the target's")
    # Same size, other ids.
    target = _checkpoint(tmp_path / "t2", 3, {"a": 0, "b": 1})
    draft = _checkpoint(tmp_path / "d2", 3, {"a": 1, "b": 0})
    row = _peer_configs(target, "--methods", "draft_model", "--draft-model", draft)["draft_model"]
    assert row.skip_reason.startswith("the draft's tokenizer maps tokens to other ids than the "
                                      "target's (e.g. [('a', 0), ('a', 1)")


def test_suffix_runs_only_with_the_suffix_tree_and_no_arctic_plugin(tmp_path, monkeypatch):
    from benchlib import configs

    target = _checkpoint(tmp_path / "target", 3)
    monkeypatch.setattr(configs, "has_arctic_inference", lambda: False)
    row = _peer_configs(target, "--methods", "suffix")["suffix"]
    assert row.spec == {"method": "suffix", "num_speculative_tokens": 4} and row.family == "vllm"
    assert "not installed: `bash scripts/install_suffix.sh` builds it" in row.skip_reason
    monkeypatch.setattr(configs, "has_arctic_inference", lambda: True)
    monkeypatch.setattr(configs, "arctic_plugin_entry_points", lambda: [
        "arctic_inference = arctic_inference.vllm.plugin:arctic_inference_plugin"])
    row = _peer_configs(target, "--methods", "suffix")["suffix"]
    assert row.skip_reason.startswith(
        "the installed arctic-inference registers a vLLM plugin (arctic_inference = "
        "arctic_inference.vllm.plugin:arctic_inference_plugin) that patches vLLM in every engine")
    monkeypatch.setattr(configs, "arctic_plugin_entry_points", lambda: [])
    assert _peer_configs(target, "--methods", "suffix")["suffix"].runs


def test_method_k_gives_a_peer_one_named_row_per_draft_length(tmp_path):
    from bench_methods import parse_args
    from benchlib.configs import build_configs

    vocab = {"a": 0, "b": 1}
    target = _checkpoint(tmp_path / "target", 3, vocab)
    draft = _checkpoint(tmp_path / "draft", 3, dict(vocab))
    args = parse_args(["--k", "8", "--methods", "ngram", "draft_model", "--draft-model", draft,
                       "--method-k", "draft_model=2,3,8", "ngram=4"])
    rows = [(c.name, (c.spec or {}).get("num_speculative_tokens")) for c in build_configs(args, target)]
    assert rows == [("plain", None), ("ngram, K=4", 4), ("draft_model draft, K=2", 2),
                    ("draft_model draft, K=3", 3), ("draft_model draft", 8)]
    for bad in ("draft_model=", "draft_model=0", "nosuch=2", "draft_model=two"):
        with pytest.raises(SystemExit):
            parse_args(["--method-k", bad])


def test_serve_draws_a_spec_bench_sample_per_round_and_level(tmp_path):
    """vLLM's spec_bench dataset ignores --seed, so bench_serve writes each
    cell's sample itself: another sample in another round (a repeated prompt
    would hit the prefix cache and a suffix tree's memory), the same for every
    server of a cell, only the asked-for category."""
    import json
    import types

    from bench_serve import spec_bench_files

    qfile = tmp_path / "question.jsonl"
    qfile.write_text("".join(json.dumps({"category": "math" if i % 2 else "writing",
                                         "turns": [f"question {i}"]}) + "\n" for i in range(40)))
    args = types.SimpleNamespace(rounds=2, max_concurrency=[1, 4], num_prompts=4,
                                 prompts_per_level=2, output_len=16, category=None)
    files = spec_bench_files(args, str(qfile), str(tmp_path))

    def prompts(key):
        with open(files[key]) as f:
            return [json.loads(line)["prompt"] for line in f]

    assert sorted(files) == [(None, 0, 1), (None, 0, 4), (None, 1, 1), (None, 1, 4)]
    assert len(prompts((None, 0, 1))) == 4 and len(prompts((None, 0, 4))) == 8
    assert prompts((None, 0, 4)) != prompts((None, 1, 4))
    assert prompts((None, 0, 4)) == prompts((None, 0, 4))  # one file a cell, read by every server
    with open(files[(None, 1, 4)]) as f:
        assert json.loads(f.readline())["output_tokens"] == 16
    args.category = "math"
    files = spec_bench_files(args, str(qfile), str(tmp_path / "math"))
    assert all(int(p.split()[1]) % 2 for p in prompts((None, 0, 4)) + prompts((None, 1, 1)))


def test_serve_runs_a_method_with_drafting_paused_as_its_own_row(tmp_path):
    """bench_serve --draft-length paused: the method's server with the plugin
    loaded and drafting paused from the start, beside the drafting one, with
    the same speculative config (its --method-options included)."""
    from bench_serve import parse_args
    from benchlib.configs import build_configs

    from vllm_layerskip.core.measure import DRAFTING_PAUSED_ENV

    target = _checkpoint(tmp_path / "target", 3, {"a": 0})
    args = parse_args(["--k", "8", "--methods", "plain", "quantized", "--draft-length",
                       "adaptive", "paused", "--method-options",
                       '{"quantized": {"draft_weights": "w8a8"}}'])
    rows = {c.name: c for c in build_configs(args, target)}
    assert list(rows) == ["plain", "quantized", "quantized, drafting paused"]
    paused = rows["quantized, drafting paused"]
    assert paused.env == {DRAFTING_PAUSED_ENV: "1"} and paused.spec["draft_weights"] == "w8a8"
    assert paused.spec == rows["quantized"].spec
    assert rows["quantized"].env == {} and rows["plain"].env == {}
