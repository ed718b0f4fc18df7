"""The benchmarks a user runs (benchmarks/*.py, benchmarks/analysis/,
benchmarks/kernels/): each one's --help exits 0, and where a benchmark renders
a run from saved figures, that part runs on a tiny synthetic input. No engine
starts and nothing is timed: speed figures come from the benchmarks, never from
tests."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType
from unittest import mock

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))  # benchlib

# The maintained benchmarks at benchmarks/ top level (benchmarks/README.md).
MAINTAINED = ("bench_methods", "bench_interleaved", "bench_serve", "bench_step_cost",
              "bench_engine_startup", "load_test", "bench_memory_bandwidth",
              "draft_pass_breakdown", "bench_quantized_startup")
TOOLS = ("analysis/pool_runs", "analysis/lookup_match_length", "analysis/set_acceptance",
         "analysis/dithered_checkpoint",
         "kernels/bench_draft_linears", "kernels/draft_weights_startup")


@pytest.fixture
def isolated(monkeypatch):
    """A benchmark sets environment variables and sys.path as it is imported
    (draft_pass_breakdown.py runs vLLM in-process, for one): none of it leaks
    into the tests that follow."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    with mock.patch.dict(os.environ):
        yield


def load(script: str) -> ModuleType:
    """benchmarks/<script>.py imported as a module of its own name."""
    name = "smoke_" + script.replace("/", "_")
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("script", MAINTAINED + TOOLS)
def test_help_exits_0(script, isolated, monkeypatch, capsys):
    module = load(script)
    monkeypatch.setattr(sys, "argv", [f"{script}.py", "--help"])
    with pytest.raises(SystemExit) as stop:
        module.main()
    assert stop.value.code == 0
    assert capsys.readouterr().out.startswith("usage:")


def test_every_maintained_benchmark_is_there():
    assert all((BENCHMARKS / f"{script}.py").is_file() for script in MAINTAINED + TOOLS)


def test_bench_interleaved_renders_a_saved_run_again(tmp_path, isolated):
    """--from-json: the table (and plot) of a run's .json, no engine. Two cycles:
    drafting on makes 120 tokens in 10 s, paused and paused again 100."""
    bench = load("bench_interleaved")

    def span(mode, cycle, tokens, drafted=0):
        return {"method": "swift", "mode": mode, "cycle": cycle, "at": 30.0 * cycle,
                "steps": 13, "seconds": 10.0, "tokens": tokens, "decode_seconds": 9.0,
                "decode_tokens": tokens - 4, "step_seconds": [0.5] * 12 + [4.0],
                "step_prefill": [False] * 12 + [True], "self_drafted": drafted,
                "self_accepted": drafted // 2, "copied": 0, "copied_accepted": 0,
                "idle_proposals": 4 if mode == bench.ON else 0,
                "idle_seconds": 0.002 if mode == bench.ON else 0.0,
                "idle_method_seconds": 0.0012 if mode == bench.ON else 0.0,
                "empty_passes": cycle if mode == bench.ON else 0,
                "empty_pass_seconds": 0.03 * cycle if mode == bench.ON else 0.0}

    spans = [span(mode, cycle, tokens, drafted)
             for cycle in range(2)
             for mode, tokens, drafted in ((bench.ON, 120, 40), (bench.PAUSED, 100, 0),
                                           (bench.AGAIN, 100, 0))]
    run = tmp_path / "interleaved_test.json"
    run.write_text(json.dumps({"methods": {"swift": {}}, "spans": spans}))
    (tmp_path / "interleaved_test.md").write_text("# the run's header\n\n| method | old table |\n")
    bench.rerender(str(run))
    text = (tmp_path / "interleaved_test.md").read_text()
    assert text.startswith("# the run's header\n\n| method | mode |")
    on = next(line for line in text.splitlines() if "| drafting on |" in line)
    assert on.startswith("| swift | drafting on | 2 | 26 | 12.00 | 1.20 (1.20-1.20) |")
    assert "| 80 (40) | 0 (0) |" in on
    again = next(line for line in text.splitlines() if "A/A control" in line)
    assert "| 1.00 (1.00-1.00) |" in again
    # 8 idle proposals of 0.5 ms (0.3 ms of it the method's) against a 500 ms step
    assert ("- swift: the proposer took 0.50 ms a step in the 8 drafting-span steps where it "
            "drafted nothing: 0.10% of a paused decode step (median 500.0 ms), of which "
            "0.30 ms the method's own work (before_draft); 1 steps ran "
            "a draft pass that drafted nothing, 30.00 ms each") in text


def test_bench_interleaved_reports_each_repeat_and_the_spread(tmp_path, isolated):
    """--repeat 2: a row per repeat (its speedup, A/A, the cost model's share of
    self-drafting steps) and the spread of the repeats around their mean."""
    bench = load("bench_interleaved")

    def span(mode, repeat, cycle, tokens):
        return {"method": "quantized", "mode": mode, "repeat": repeat,
                "cycle": repeat * bench.CYCLES_PER_REPEAT + cycle, "at": 0.0, "steps": 10,
                "seconds": 10.0, "tokens": tokens, "decode_seconds": 10.0,
                "decode_tokens": tokens, "step_seconds": [1.0] * 10, "step_prefill": [False] * 10,
                "self_drafted": 0, "self_accepted": 0, "copied": 0, "copied_accepted": 0}

    # Repeat 1: drafting on 110 tokens against 100 paused; repeat 2: 130.
    spans = [span(mode, r, c, tokens)
             for r, on in ((0, 110), (1, 130)) for c in range(2)
             for mode, tokens in ((bench.ON, on), (bench.PAUSED, 100), (bench.AGAIN, 100))]
    infos = {"quantized#0": {"cost_model": {"drafting_fraction": 0.40}},
             "quantized#1": {"cost_model": {"drafting_fraction": 0.75}}}
    run = tmp_path / "interleaved_rep.json"
    run.write_text(json.dumps({"methods": infos, "spans": spans}))
    bench.rerender(str(run))
    text = (tmp_path / "interleaved_rep.md").read_text()
    assert "| quantized | 1 | 1.10 (1.10-1.10) | 1.10 (1.10-1.10) | 1.00 (1.00-1.00) | 40% |" in text
    assert "| quantized | 2 | 1.30 (1.30-1.30) | 1.30 (1.30-1.30) | 1.00 (1.00-1.00) | 75% |" in text
    assert ("- quantized: drafting on over paused (decode steps) 1.10-1.30x over 2 repeats, "
            "mean 1.20x, each within +-8.3% of it") in text
    # The pooled table pairs spans within a cycle of one repeat only.
    on = next(line for line in text.splitlines() if "| drafting on |" in line)
    assert on.startswith("| quantized | drafting on | 4 | 40 | 12.00 | 1.20 (1.10-1.30) |")


def test_bench_methods_report_renders_from_synthetic_turns(tmp_path, isolated):
    """What bench_methods.py does with its turns once the engines are gone:
    parity, sums, paired intervals, the markdown report and the CSV."""
    bench = load("bench_methods")
    from benchlib import figures, report
    from benchlib.configs import Config
    from benchlib.workloads import Workload

    args = bench.parse_args(["--quick", "--methods", "plain", "layer_skip"])
    workload = Workload.parse("1:0")
    cats = ["coding", "writing"]
    turns = []
    for block in range(4):
        cat = cats[block % 2]
        for config, family, seconds, drafts in (("plain", "plain", 4.0, 0),
                                                ("layer_skip", "plugin", 2.0, 10)):
            turns.append({
                "group": 0, "workload": workload.label, "block": block, "category": cat,
                "config": config, "family": family, "temperature": 0.0,
                "questions": [block], "token_ids": [[1, 2, 3]], "num_tokens": 32,
                "num_requests": 1, "steps": 32 - 2 * drafts, "seconds": seconds,
                "counters": {"drafts": drafts, "draft_tokens": 4 * drafts,
                             "accepted": 2 * drafts, "accepted_per_pos": [drafts, drafts],
                             "hist": {"decode_time": (seconds - 0.5, 1), "itl": (seconds - 0.5, 31)}},
                "stats": {"draft_seconds": 0.2 * drafts, "num_forward_steps": 4 * drafts,
                          "num_proposals": 32 - 2 * drafts} if drafts else {},
            })
    figures.check_parity(turns)
    rows = figures.derive(figures.aggregate(turns), {}, figures.speedup_intervals(turns))
    configs = [Config("plain", "plain", None, family="plain"),
               Config("layer_skip", "layer_skip", {"method": "layer_skip"})]
    info = {"model": "/models/Tiny", "date": "2026-01-01T00:00:00", "cpu": "a CPU",
            "cpu_count": 2, "cpu_vector_isa": "AVX2 (no AVX-512)", "memory_gib": 8.0,
            "vllm": "0.32.0", "torch": "2", "LD_PRELOAD": "", "VLLM_CPU_KVCACHE_SPACE": "1",
            "load_average_at_start": (0.5, 0.5, 0.5), "command": "bench_methods.py --quick",
            "platform": "Linux"}
    text = report.markdown(args, info, [(workload, [])], configs, rows, [], {}, {}, [], cats,
                           2, 1)
    assert text.startswith("# Speculative decoding methods, Tiny")
    overall = next(line for line in text.splitlines() if line.startswith("| layer_skip | 16.0 |"))
    assert "| 2.00 | 2.00-2.00 |" in overall and overall.endswith("| yes |")
    assert "| layer_skip | 2.00 (coding, 2.00-2.00) | 2/2 | 2/2 | none |" in text  # floor check
    report.write_csv(str(tmp_path / "run.csv"), rows, info)
    lines = (tmp_path / "run.csv").read_text().splitlines()
    assert lines[0] == "# date: 2026-01-01T00:00:00"
    assert len([line for line in lines if not line.startswith("#")]) == 1 + len(rows)


def test_bench_serve_builds_vllms_own_commands(isolated):
    bench = load("bench_serve")
    args = bench.parse_args(["--quick", "--methods", "plain", "swift", "--category", "coding"])
    assert (args.num_prompts, args.output_len, args.max_concurrency) == (8, 32, [1])
    spec = {"method": "swift", "num_speculative_tokens": 4}
    serve = bench.server_command(args, "/models/m", 8311, spec)
    assert serve[1:3] == ["serve", "/models/m"] and json.loads(serve[-1]) == spec
    assert serve[serve.index("--max-model-len") + 1] == "2048"
    assert "--speculative-config" not in bench.server_command(args, "/models/m", 8310, None)
    client = bench.bench_command(args, "/models/m", 8311, "q.jsonl", "out", "swift", seed=2)
    assert client[1:3] == ["bench", "serve"]
    # Always vLLM's custom dataset: the cell's prompts were drawn by spec_bench_files.
    for flag, value in (("--num-prompts", "8"), ("--seed", "2"), ("--dataset-path", "q.jsonl"),
                        ("--base-url", "http://127.0.0.1:8311"), ("--max-concurrency", "1"),
                        ("--dataset-name", "custom"), ("--metric-percentiles", "50,99")):
        assert client[client.index(flag) + 1] == value
    assert "--spec-bench-category" not in client


def test_bench_serve_sweeps_levels_and_prompt_lengths(isolated):
    """--max-concurrency takes several levels, --prompts-per-level scales the
    prompts with them, --prompt-tokens swaps Spec-Bench for the custom dataset
    (and the servers' context grows to hold the longest prompt)."""
    bench = load("bench_serve")
    args = bench.parse_args(["--max-concurrency", "4", "1", "16", "--num-prompts", "10",
                             "--prompts-per-level", "2", "--prompt-tokens", "256", "3072",
                             "--output-len", "128"])
    assert [bench.prompts_at(args, c) for c in (1, 4, 16)] == [10, 10, 32]
    assert bench.sweep_cells(args, 0) == [(256, 1), (256, 4), (256, 16), (3072, 1), (3072, 4),
                                          (3072, 16)]
    assert bench.sweep_cells(args, 1)[:3] == [(256, 16), (256, 4), (256, 1)]  # down in odd rounds
    serve = bench.server_command(args, "/models/m", 8310, None)
    assert serve[serve.index("--max-model-len") + 1] == "3328"  # 3072 + 64 + 128, in steps of 256
    client = bench.bench_command(args, "/models/m", 8310, "p.jsonl", "out", "plain.json",
                                 level=16, num_prompts=32)
    for flag, value in (("--dataset-name", "custom"), ("--dataset-path", "p.jsonl"),
                        ("--custom-output-len", "128"), ("--max-concurrency", "16"),
                        ("--num-prompts", "32")):
        assert client[client.index(flag) + 1] == value
    assert "--spec-bench-output-len" not in client


def _serve_record(config, family, level, rnd, tps, ttft=100.0, spec=False):
    """One server's `vllm bench serve` result of a cell, as bench_serve keeps it."""
    result = {"duration": 10.0, "completed": 8, "total_output_tokens": tps * 10,
              "output_throughput": tps, "median_tpot_ms": 50.0, "median_ttft_ms": ttft,
              "p99_ttft_ms": 2 * ttft}
    if spec:
        result.update(spec_decode_num_drafts=10, spec_decode_draft_tokens=40,
                      spec_decode_accepted_tokens=20, spec_decode_acceptance_rate=50.0,
                      spec_decode_acceptance_length=3.0)
    return {"group": 0, "config": config, "family": family, "prompt_tokens": None,
            "level": level, "round": rnd, "num_prompts": 8, "result": result}


def test_bench_serve_renders_a_sweep_from_its_json(tmp_path, isolated):
    """The summary, table, "stops paying" lines and plot of a synthetic sweep
    (plain, its A/A control, ngram and swift; levels 1, 2, 4; 2 rounds), as
    --from-json renders them from a run's .json."""
    bench = load("bench_serve")
    plain = {1: (10, 10), 2: (20, 20), 4: (40, 40)}  # tokens/s in rounds 1 and 2
    others = {"plain (A/A control)": ("control", {1: (9.8, 10.2), 2: (19.6, 20.4), 4: (39.2, 40.8)}),
              "ngram": ("spec", {1: (12, 13), 2: (21, 19), 4: (34, 38)}),
              "swift": ("spec", {1: (11, 11), 2: (22, 24), 4: (40, 44)})}
    records = []
    for level in (1, 2, 4):
        for rnd in range(2):
            records.append(_serve_record("plain", "plain", level, rnd, plain[level][rnd]))
            for name, (family, tps) in others.items():
                records.append(_serve_record(name, family, level, rnd, tps[level][rnd],
                                             ttft=(110.0, 130.0)[rnd] if name == "ngram" else 100.0,
                                             spec=family == "spec"))
    args = vars(bench.parse_args(["--max-concurrency", "1", "2", "4", "--rounds", "2"]))
    run = {"args": args, "model": "/models/Tiny", "stamp": "20260101-120000", "groups": 1,
           "command": "bench_serve.py --rounds 2", "commands": [], "records": records,
           "skipped": {}, "failed": []}
    path = tmp_path / "serve_20260101-120000.json"
    path.write_text(json.dumps(run))
    text = bench.rerender(str(path))
    assert text == (tmp_path / "serve_20260101-120000.md").read_text()
    assert (tmp_path / "serve_20260101-120000.png").stat().st_size > 0
    rows = {(line.split(" | ")[0][2:], line.split(" | ")[1]): line for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| config")}
    # config | level | requests | tok/s | speedup | interval | TPOT | TTFT p50 | p99 | TTFT/plain | M | alpha
    # | drafted / output tokens (ngram at 1: 2 x 40 over 120 + 130)
    assert rows[("plain", "1")] == "| plain | 1 | 16 | 10.0 | 1.00 | - | 50.0 | 100.0 | 200.0 | 1.00 | - | - | - |"
    assert rows[("ngram", "1")] == "| ngram | 1 | 16 | 12.5 | 1.25 | 1.20-1.30 | 50.0 | 120.0 | 240.0 | 1.20 | 3.00 | 0.50 | 0.32 |"
    assert rows[("ngram", "2")].startswith("| ngram | 2 | 16 | 20.0 | 1.00 | 0.95-1.05 |")
    assert rows[("ngram", "4")].startswith("| ngram | 4 | 16 | 36.0 | 0.90 | 0.85-0.95 |")
    assert [rows[("swift", lvl)].split(" | ")[4:6] for lvl in "124"] == [
        ["1.10", "1.10-1.10"], ["1.15", "1.10-1.20"], ["1.05", "1.00-1.10"]]
    assert rows[("plain (A/A control)", "4")].split(" | ")[4:6] == ["1.00", "0.98-1.02"]
    assert "- ngram: stops paying at concurrency 4 (speedup 0.90 < 0.97)" in text
    assert "- swift: pays at every level measured (1, 2, 4)" in text
    assert "- plain (A/A control):" not in text  # the control is not speculation
    assert "Interval: the lowest and highest of the per-round speedups" in text


def test_bench_serve_reports_the_cost_models_predictions_against_measurements(tmp_path, isolated):
    """Each speculative server's last status (VLLM_LAYERSKIP_STATUS_FILE) is
    read at the end of its group: the report says, per batch-size bucket, what
    the cost model predicted drafting steps would take and what they took."""
    bench = load("bench_serve")
    pam = {"verify": {"16": {"steps": 40, "predicted_ms": 310.2, "measured_ms": 352.9}},
           "draft": {"16": {"steps": 3, "predicted_ms": 170.0, "measured_ms": 181.5}}}
    status = {"method": "quantized", "cost_model": {
        "steps": 900, "drafting_fraction": 0.08, "lookup_steps": 700, "lookup_steps_prefilling": 90,
        "verify_ms": {},
        "draft_ms": {}, "predicted_against_measured": pam, "acceptance_by_position": [0.5]}}
    (tmp_path / "status_quantized.json").write_text(json.dumps(status))
    servers = {"plain": (None, 0, "", "plain"), "quantized": (None, 0, "", "spec"),
               "ngram": (None, 0, "", "spec")}  # vLLM's own method: no status file
    checks = bench.cost_model_checks(servers, str(tmp_path))
    assert list(checks) == ["quantized"] and "acceptance_by_position" not in checks["quantized"]
    assert bench.cost_model_lines(checks) == [
        "- quantized: self-drafted in 8.0% of 900 steps, copies in 700 (90 of them beside prompt "
        "chunks); verify at 16 requests "
        "310.2 ms predicted, 352.9 measured (40 steps); draft at 16 requests 170.0 ms "
        "predicted, 181.5 measured (3 steps)"]


def test_long_prompts_land_near_the_asked_length(tmp_path):
    """Code to edit and documents to answer from, alternating, each within 10% of
    the asked token count (SmolLM2's tokenizer where it is prepared, else words
    and punctuation), every prompt opening with its own tag; the jsonl is what
    vLLM's custom dataset reads."""
    import re

    from benchlib.long_prompts import DOC_QUESTIONS, build_prompts, token_counter, write_jsonl

    smollm2 = Path.home() / ".cache" / "vllm_layerskip" / "SmolLM2-135M-Instruct"
    count = (token_counter(str(smollm2)) if (smollm2 / "tokenizer.json").is_file()
             else lambda text: len(re.findall(r"\w+|[^\w\s]", text)))
    for target in (256, 1024):
        prompts = build_prompts(count, target, 4, start=1, tags=[f"Request {i}.\n\n" for i in range(4)])
        assert [p["kind"] for p in prompts] == ["code", "docs", "code", "docs"]
        for i, p in enumerate(prompts):
            assert abs(count(p["prompt"]) - target) <= 0.1 * target, (target, i, p["prompt_tokens"])
            assert p["prompt"].startswith(f"Request {i}.\n\n")
        assert "# file: vllm_layerskip/" in prompts[0]["prompt"]
        assert prompts[0]["prompt"].rstrip().endswith("```")
        assert any(prompts[1]["prompt"].endswith(f"\n\nQuestion: {q}") for q in DOC_QUESTIONS)
        assert len({p["prompt"] for p in prompts}) == 4
    path = write_jsonl(str(tmp_path / "p.jsonl"), prompts, 64)
    rows = [json.loads(line) for line in open(path)]
    assert [set(r) >= {"prompt", "output_tokens"} and r["output_tokens"] == 64 for r in rows] == [True] * 4


def test_load_test_report_names_a_server_that_failed(isolated):
    bench = load("load_test")
    meta = {"date": "2026-01-01", "command": "load_test.py --quick", "model_name": "Tiny",
            "max_model_len": 1024, "requests": 16, "max_tokens": 40, "long": 1, "cancel": 2,
            "machine": "2 cores"}
    text = bench.markdown([{"name": "swift", "ok": False, "problems": ["did not start"]}], meta)
    assert text.startswith("# Serving under load (2026-01-01)")
    assert "| swift | failed: did not start |" in text
    assert "Problems:\n- swift: did not start" in text


def test_dithered_checkpoint_leaves_no_grid_and_keeps_weights_within_half_a_step(isolated):
    import torch

    from vllm_layerskip.core.draft_weights import _int4_steps

    tool = load("analysis/dithered_checkpoint")
    gen = torch.Generator().manual_seed(0)
    # 8 rows of 4 groups: rows 0-5 on a 16-level grid (as a 4-bit checkpoint's), 6-7 not.
    levels = torch.randint(0, 16, (6, 128), generator=gen).float()
    on_grid = -0.05 + levels * 0.01
    weight = torch.cat([on_grid, torch.randn(2, 128, generator=gen) * 0.02]).to(torch.bfloat16)
    groups = weight.float().reshape(8, 4, 32)
    low = groups.amin(dim=-1, keepdim=True)
    minmax = (groups.amax(dim=-1, keepdim=True) - low) / 15
    assert not torch.equal(_int4_steps(groups, low), minmax)  # the grid is found
    out, dithered, total = tool.dither(weight, torch.Generator().manual_seed(1))
    assert (dithered, total) == (24, 32)
    assert torch.equal(out[6:], weight[6:])  # off the grid: untouched
    moved = (out[:6].float() - weight[:6].float()).abs()
    assert moved.max() <= 0.005 + 1e-3 and moved.mean() > 0.001  # within half a step, and moved
    groups = out.float().reshape(8, 4, 32)
    low = groups.amin(dim=-1, keepdim=True)
    assert torch.equal(_int4_steps(groups, low),
                       ((groups.amax(dim=-1, keepdim=True) - low) / 15).clamp(min=1e-10))


def test_dithered_copy_of_a_checkpoint_leaves_no_weight_for_the_grid_search(tmp_path):
    import torch
    from safetensors.torch import save_file

    tool = load("analysis/dithered_checkpoint")
    levels = torch.randint(0, 16, (8, 128), generator=torch.Generator().manual_seed(0)).float()
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    save_file({"model.layers.0.mlp.down_proj.weight": (-0.05 + levels * 0.01).to(torch.bfloat16),
               "model.norm.weight": torch.ones(8)}, str(src / "model.safetensors"))
    (src / "config.json").write_text("{}")
    assert tool.grid_left(str(src)) == 1.0
    assert tool.write_copy(str(src), str(dst), seed=0) == {"groups_dithered": 32, "groups": 32}
    assert tool.grid_left(str(dst)) == 0.0 and (dst / "config.json").exists()
