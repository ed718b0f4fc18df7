"""CLaSp: the layer-selection DP against exhaustive search (on random layers and
on a real engine's layers), its scheduling and failure handling, float32 greedy
parity with plain vLLM while the DP re-chooses the mask every step, and that its
masks beat an evenly spread set of the same size in acceptance on SmolLM2; the
background DP (on a copy of the requests' K/V) against the engine's DP, with
parity and a fault in its thread."""

import gc
import itertools
import os
import time
import weakref
from collections import Counter

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import make_llm
from vllm import SamplingParams

from vllm_layerskip.dp_snapshot import SnapshotTaker
from vllm_layerskip.draft_engine import DraftRequests
from vllm_layerskip.faults import ENV_VAR
from vllm_layerskip.layer_dp import clasp_dp
from vllm_layerskip.measure import (
    chat_prompts,
    load_spec_bench,
    proposer_stats,
    shutdown,
    spec_decode_counters,
)
from vllm_layerskip.options import ClaspOptions
from vllm_layerskip.proposers.clasp import BackgroundDP, ClaspSearch, evenly_spread_layers

# ---- the DP on random layers (no engine) -------------------------------------


def random_layers(num_layers, hidden, seed):
    """Residual layers x + tanh(x W_i): small updates, like a trained model's."""
    gen = torch.Generator().manual_seed(seed)
    weights = [torch.randn(hidden, hidden, generator=gen) * 0.4 for _ in range(num_layers)]
    return lambda i, x: x + torch.tanh(x @ weights[i])


def seeded_randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def full_states(layer, x0, num_layers):
    states = [x0]
    for i in range(num_layers):
        states.append(layer(i, states[-1]))
    return torch.stack(states)


def set_score(layer, targets, skipped):
    """The DP's objective for one skip set: mean cosine of the final state to x_L."""
    x = targets[0]
    for i in range(targets.shape[0] - 1):
        if i not in skipped:
            x = layer(i, x)
    return F.cosine_similarity(x, targets[-1], dim=-1).mean().item()


def test_dp_against_exhaustive_search_on_random_layers():
    num_layers, m, found, ranks = 8, 3, 0, []
    for seed in range(20):
        layer = random_layers(num_layers, 32, seed)
        num_reqs = 1 + seed % 3  # the batch objective too: mean over requests
        targets = full_states(layer, seeded_randn(num_reqs, 32, seed=100 + seed), num_layers)
        result = clasp_dp(layer, targets[0], num_layers, m)
        assert len(result.skipped) == m == len(set(result.skipped))
        # The DP's score is that of the set it returns.
        assert result.score == pytest.approx(set_score(layer, targets, result.skipped), abs=1e-5)
        scores = sorted(set_score(layer, targets, s) for s in itertools.combinations(range(num_layers), m))
        assert result.score >= np.median(scores) - 1e-6
        found += result.score >= scores[-1] - 1e-6
        ranks.append(len(scores) - int(np.searchsorted(scores, result.score - 1e-6)))
    print(f"random layers: DP found the optimum in {found}/20 cases; ranks among 56 sets: {ranks}")
    # Measured: the optimum in 11 of 20 cases, never worse than 5th of 56.
    assert found >= 8 and max(ranks) <= 6


def test_dp_respects_protected_layers_and_limits():
    num_layers = 6
    layer = random_layers(num_layers, 16, 0)
    targets = full_states(layer, seeded_randn(2, 16, seed=1), num_layers)
    protected = frozenset({0, 1, 5})
    result = clasp_dp(layer, targets[0], num_layers, 3, protected)
    assert result.skipped == (2, 3, 4)  # the only unprotected ones
    result = clasp_dp(layer, targets[0], num_layers, 2, protected)
    assert set(result.skipped) <= {2, 3, 4}
    scores = {s: set_score(layer, targets, s) for s in itertools.combinations((2, 3, 4), 2)}
    assert result.score >= np.median(list(scores.values())) - 1e-6
    assert len(clasp_dp(layer, targets[0], num_layers, 5).skipped) == 5
    with pytest.raises(ValueError, match="no way to skip 4 of 6 layers"):
        clasp_dp(layer, targets[0], num_layers, 4, protected)


def test_evenly_spread_layers():
    assert evenly_spread_layers(30, 8) == (2, 6, 9, 13, 16, 20, 23, 27)
    assert evenly_spread_layers(6, 5) == (0, 1, 3, 4, 5)  # too many for the inner layers
    assert not {0, 1, 29} & set(evenly_spread_layers(30, 12, frozenset({0, 1, 29})))


# ---- scheduling and failures, on a fake engine ---------------------------------

NUM_LAYERS, HIDDEN = 6, 16


class FakeEngine:
    """Layers whose effect depends on the request row and position, so that
    mixing up candidate rows would change the result."""

    num_layers = NUM_LAYERS

    def __init__(self):
        gen = torch.Generator().manual_seed(0)
        self.table = torch.randn(64, HIDDEN, generator=gen)
        self.layer = random_layers(NUM_LAYERS, HIDDEN, 1)
        self.stack = type("Stack", (), {"embed": lambda _, ids: 3 * self.table[ids % 64]})()
        self.dp_rows = []  # the rows of each DP run

    def state_metadata(self, runner, rows, positions):
        return (rows.copy(), positions.copy())

    def run_layer(self, runner, i, rows, positions, states, metadata):
        assert np.array_equal(metadata[0], rows) and np.array_equal(metadata[1], positions)
        if i == 0 and len(set(rows.tolist())) == len(rows):
            self.dp_rows.append(rows.tolist())
        context = self.table[torch.from_numpy((rows * 7 + positions) % 64)]
        return self.layer(i, states + 0.1 * context)


class FakeRunner:
    device = "cpu"

    def __init__(self):
        self.input_batch = type("Batch", (), {})()
        self.input_batch.token_ids_cpu = np.arange(800, dtype=np.int64).reshape(8, 100)


def requests(num, step):
    p = np.arange(num) + 10 + step
    return DraftRequests(np.arange(num), p, p, np.full(num, 4), np.zeros(num))


def test_search_schedule_batch_objective_and_turns():
    opts = ClaspOptions(num_skip_layers=2, max_optimizer_share=1.0, layer_optimization_interval=3,
                        max_dp_requests=2)
    search, engine = ClaspSearch(opts, NUM_LAYERS), FakeEngine()
    assert search.skipped == (2, 4)  # even spread until the first DP run
    for step in range(9):
        search.step(FakeRunner(), engine, requests(3, step))
    s = search.summary()
    assert s["dp_runs"] == 3 and s["steps"] == 9 and s["failures"] == 0  # steps 1, 4, 7
    # Three running requests, two per DP run, taking turns.
    assert engine.dp_rows == [[0, 1], [2, 0], [1, 2]]
    assert s["dp_requests"] == 6 and len(search.skipped) == 2
    assert search.mask.run_attn == search.mask.run_mlp  # whole layers
    # The last run's set and score are those of the chosen set on those
    # requests, chaining the kept layers one request per row.
    req, picked = requests(3, 6), np.array([1, 2])
    rows, pos = req.rows[picked], req.last_position[picked] - 1
    result = search.run_dp(FakeRunner(), engine, req, picked)
    assert result.skipped == search.skipped and result.score == pytest.approx(s["last_cosine"])

    def layer(i, x):
        return engine.run_layer(None, i, rows, pos, x, (rows, pos))

    x0 = engine.stack.embed(torch.from_numpy(FakeRunner().input_batch.token_ids_cpu[rows, pos]))
    targets = full_states(layer, x0, NUM_LAYERS)
    assert result.score == pytest.approx(set_score(layer, targets, result.skipped), abs=1e-5)


def test_background_thread_does_not_keep_the_search_alive():
    """The DP thread outlives its engine (it waits for jobs forever): it must not
    hold the search, which holds the model, once the engine lets go of it."""

    class Search:
        def run(self, snapshot):
            return snapshot * 2

    search = Search()
    updater = BackgroundDP(search.run)
    updater.submit(21)
    deadline = time.monotonic() + 10
    while (done := updater.take()) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert done is not None and done[0] == 42
    alive = weakref.ref(search)
    del search
    gc.collect()
    assert alive() is None
    updater.submit(1)  # the thread sees the search is gone and ends
    updater.thread.join(timeout=10)
    assert not updater.thread.is_alive()


def test_dp_waits_while_drafting_is_off():
    search, engine = ClaspSearch(ClaspOptions(num_skip_layers=2, max_optimizer_share=1.0,
                                              layer_optimization_interval=2),
                                 NUM_LAYERS), FakeEngine()
    drafting = [True, False, False, False, True, True, False, True]
    for step, on in enumerate(drafting):
        search.step(FakeRunner(), engine, requests(1, step), drafting=on)
    # Runs at step 1, is due again from step 3 but waits until step 5, then step 7
    # is due but drafting is off, step 8 runs it.
    s = search.summary()
    assert (s["dp_runs"], s["dp_deferred"]) == (3, 3), s


def test_dp_time_is_capped_by_the_optimizer_share(monkeypatch):
    # Fake clock: an engine step takes 0.1 s and a DP run 0.5 s. The DP is due
    # every step; a 10% share allows about one run per 0.5 / 0.1 / 0.1 = 50 steps
    # once the first (which may overdraw) is repaid.
    from vllm_layerskip.proposers import clasp as clasp_module

    clock = [0.0]
    monkeypatch.setattr(clasp_module.time, "perf_counter", lambda: clock[0])

    class SlowEngine(FakeEngine):
        def run_layer(self, *args):
            clock[0] += 0.5 / NUM_LAYERS
            return super().run_layer(*args)

    search, engine = ClaspSearch(ClaspOptions(num_skip_layers=2, max_optimizer_share=0.1,
                                              layer_optimization_interval=1),
                                 NUM_LAYERS), SlowEngine()
    for step in range(200):
        clock[0] += 0.1
        search.step(FakeRunner(), engine, requests(1, step % 50))
    s = search.summary()
    assert 4 <= s["dp_runs"] <= 5, s  # 20 s of steps: 2 s of DP at 10%, +1 overdrawing run
    assert s["dp_budget_skips"] == 200 - s["dp_runs"], s
    assert s["dp_seconds"] == pytest.approx(0.5 * s["dp_runs"])


@pytest.mark.parametrize("fault,runs,stopped", [("clasp.dp@2", 3, False), ("clasp.dp", 0, True)])
def test_dp_failures_keep_the_last_good_mask(monkeypatch, fault, runs, stopped):
    monkeypatch.setenv(ENV_VAR, fault)
    monkeypatch.setattr("vllm_layerskip.faults._calls", Counter())
    search, engine = ClaspSearch(ClaspOptions(num_skip_layers=2, max_optimizer_share=1.0,
                                              layer_optimization_interval=1),
                                 NUM_LAYERS), FakeEngine()
    initial = search.mask
    for step in range(4):
        search.step(FakeRunner(), engine, requests(2, step))
    s = search.summary()
    assert "fault injected at 'clasp.dp'" in s["error"], s
    assert s["dp_runs"] == runs and s["stopped"] == stopped, s
    assert s["failures"] == (1 if runs else 3), s
    if stopped:
        assert search.mask == initial and search.mask.num_skipped == 4
        search.step(FakeRunner(), engine, requests(2, 9))
        assert search.summary()["failures"] == 3  # no more DP runs


# ---- a real engine's layers: DP vs exhaustive search on a tiny model --------

EXHAUSTIVE_RUNS = 8
KV_CHECKS = 2  # DP runs whose KV cache bytes are compared before and after


def _install_exhaustive_check(worker):
    """Wrap the drafter's DP run: check that it writes no KV, and score every
    skip set of the same size with the same objective on the same tokens,
    through the engine's own layers."""
    drafter = worker.model_runner.drafter
    search = drafter.search
    original = search.run_dp
    drafter.dp_checks = []

    def checked(runner, engine, requests, picked):
        check_kv = len(drafter.dp_checks) < KV_CHECKS
        before = [t.clone() for t in runner.kv_caches] if check_kv else []
        result = original(runner, engine, requests, picked)
        if len(drafter.dp_checks) < EXHAUSTIVE_RUNS:
            kv_same = all(torch.equal(a, b) for a, b in zip(before, runner.kv_caches))
            scores = _all_set_scores(runner, engine, requests, picked, search)
            drafter.dp_checks.append(
                dict(dp_set=result.skipped, dp_score=result.score, scores=scores,
                     kv_same=kv_same if check_kv else None, num_requests=len(picked)))
        return result

    search.run_dp = checked


@torch.inference_mode()
def _all_set_scores(runner, engine, requests, picked, search):
    rows = requests.rows[picked]
    positions = requests.last_position[picked] - 1
    ids = runner.input_batch.token_ids_cpu[rows, positions]
    targets = engine.layer_states(runner, rows, ids, positions)
    metadata = engine.state_metadata(runner, rows, positions)
    scores = {}
    for skip in itertools.combinations(range(engine.num_layers), search.num_skip):
        x = targets[0]
        for i in range(engine.num_layers):
            if i not in skip:
                x = engine.run_layer(runner, i, rows, positions, x, metadata)
        scores[skip] = F.cosine_similarity(x.float(), targets[-1].float(), dim=-1).mean().item()
    return scores


def _dp_checks(worker):
    return worker.model_runner.drafter.dp_checks


def test_dp_against_exhaustive_search_on_engine_layers(tiny_model_dir):
    path = tiny_model_dir("llama", num_layers=6, out_proj_std=0.03)
    config = {"method": "clasp", "num_speculative_tokens": 2, "num_skip_layers": 3,
              "layer_optimization_interval": 1, "max_optimizer_share": 1.0, "adaptive_draft_length": False}
    llm = make_llm(path, in_process=True, speculative_config=config, max_model_len=256)
    try:
        llm.collective_rpc(_install_exhaustive_check)
        prompts = [f"Story {i}: once upon a time" for i in range(4)]
        llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)
        checks = llm.collective_rpc(_dp_checks)[0]
    finally:
        shutdown(llm)
    assert len(checks) == EXHAUSTIVE_RUNS
    assert [c["kv_same"] for c in checks[:KV_CHECKS]] == [True] * KV_CHECKS
    assert max(c["num_requests"] for c in checks) == 4  # the batch objective ran
    optimum = 0
    for c in checks:
        scores = c["scores"]
        assert len(scores) == 20  # C(6, 3)
        # The DP's own score is that of the set it chose, through the same layers.
        assert c["dp_score"] == pytest.approx(scores[c["dp_set"]], abs=1e-4)
        assert scores[c["dp_set"]] >= np.median(list(scores.values())) - 1e-6, c
        optimum += scores[c["dp_set"]] >= max(scores.values()) - 1e-6
    print(f"engine layers: DP found the optimum in {optimum}/{len(checks)} runs")
    assert optimum >= len(checks) // 2  # measured: 7 of 8, 11 of 12


# ---- SmolLM2: parity while the mask changes every step, acceptance, faults ---

NUM_SKIP = 8
FIXED = {"num_speculative_tokens": 4, "adaptive_draft_length": False,
         "draft_confidence_threshold": 0.0}
CLASP = {"method": "clasp", "num_skip_layers": NUM_SKIP, "layer_optimization_interval": 1,
         "max_optimizer_share": 1.0, **FIXED}
MAX_TOKENS = 48


def run_workload(llm, single=True):
    questions = [q["prompt"] for q in load_spec_bench(per_category=1)][:8]
    prompts = chat_prompts(llm, questions)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    batch = llm.generate(prompts, params, use_tqdm=False)
    counters = spec_decode_counters(llm)  # of the batch of 8 only
    single_ids = None
    if single:  # batch 1: the 4th prompt alone
        single_ids = list(llm.generate(prompts[3:4], params, use_tqdm=False)[0].outputs[0].token_ids)
    return [list(o.outputs[0].token_ids) for o in batch], single_ids, counters


@pytest.fixture(scope="module")
def plain(smollm2_path):
    llm = make_llm(smollm2_path, in_process=True, max_model_len=1024)
    try:
        return run_workload(llm)
    finally:
        shutdown(llm)


@pytest.fixture(scope="module")
def clasp_run(smollm2_path):
    llm = make_llm(smollm2_path, in_process=True, speculative_config=CLASP, max_model_len=1024)
    try:
        return (*run_workload(llm), proposer_stats(llm))
    finally:
        shutdown(llm)


def test_greedy_parity_while_the_dp_runs_every_step(plain, clasp_run):
    batch, single, counters, status = clasp_run
    assert batch == plain[0]
    assert single == plain[1]
    clasp = status["clasp"]
    assert not clasp["error"] and clasp["failures"] == 0, clasp
    # One DP run per step with running requests (batch and single runs).
    assert clasp["dp_runs"] == clasp["steps"] > 40, clasp
    assert clasp["mask_changes"] > 10, clasp
    assert clasp["dp_requests"] > clasp["dp_runs"]  # batch objective over several requests
    assert counters.drafts > 50 and counters.draft_tokens <= 4 * counters.drafts


def test_dp_masks_beat_an_even_spread_of_the_same_size(smollm2_path, plain, clasp_run):
    uniform = {"method": "layer_skip", "skip_layers": list(evenly_spread_layers(30, NUM_SKIP)),
               **FIXED}
    llm = make_llm(smollm2_path, in_process=True, speculative_config=uniform, max_model_len=1024)
    try:
        batch, _, uniform_c = run_workload(llm, single=False)
    finally:
        shutdown(llm)
    assert batch == plain[0]
    clasp_c = clasp_run[2]
    print(f"mean acceptance length: clasp {clasp_c.mean_acceptance_length:.2f} "
          f"(alpha {clasp_c.acceptance_rate:.2f}), even spread "
          f"{uniform_c.mean_acceptance_length:.2f} (alpha {uniform_c.acceptance_rate:.2f})")
    # Measured (8 prompts x 48 tokens, K=4, 8 of 30 layers skipped): clasp
    # M ~2.8 / alpha ~0.45, even spread M ~1.8 / alpha ~0.2.
    assert clasp_c.mean_acceptance_length > uniform_c.mean_acceptance_length + 0.5
    assert clasp_c.acceptance_rate > uniform_c.acceptance_rate + 0.1


def test_dp_failure_keeps_serving(smollm2_path, plain, monkeypatch):
    # The engine reads the fault setting from the environment: its 2nd DP run raises.
    monkeypatch.setenv(ENV_VAR, "clasp.dp@2")
    llm = make_llm(smollm2_path, in_process=True, speculative_config=CLASP, max_model_len=1024)
    try:
        batch, _, counters = run_workload(llm, single=False)
        clasp = proposer_stats(llm)["clasp"]
    finally:
        shutdown(llm)
    assert batch == plain[0]
    assert "fault injected at 'clasp.dp'" in clasp["error"], clasp
    assert clasp["failures"] == 1 and not clasp["stopped"], clasp
    assert clasp["dp_runs"] == clasp["steps"] - 1  # the DP went on after the failure
    assert counters.drafts > 50 and clasp["mask_changes"] > 5


# ---- background DP: the copy gives the engine's result; a fault in the thread -

SNAPSHOT_CHECKS = 3


def _install_snapshot_check(worker):
    """For the first snapshots the background DP gets: run the DP on the copy and
    the engine's own DP (paged cache, vLLM's attention) on the same requests, on
    the engine thread, and keep both results."""
    drafter = worker.model_runner.drafter
    search, engine = drafter.search, drafter.engine
    search.snapshots = SnapshotTaker(engine.stack, search.options.max_dp_context)
    take = search.snapshots.take
    drafter.snapshot_checks = []

    def checked(runner, rows, positions):
        snapshot = take(runner, rows, positions)
        if len(drafter.snapshot_checks) < SNAPSHOT_CHECKS:
            n = len(rows)
            requests = DraftRequests(rows, np.zeros(n, np.int64), positions + 1,
                                     np.ones(n, np.int64), np.zeros(n))
            # The check's DP calls must not count towards the injected fault
            # (no job is in the thread while a snapshot is being taken).
            fault = os.environ.pop(ENV_VAR, None)
            try:
                in_engine = search.run_dp(runner, engine, requests, np.arange(n))
            finally:
                if fault is not None:
                    os.environ[ENV_VAR] = fault
            with torch.inference_mode():
                on_copy = clasp_dp(snapshot.layer, snapshot.x0, search.num_layers,
                                   search.num_skip, search.protected)
            drafter.snapshot_checks.append(dict(
                requests=n, engine_set=in_engine.skipped, engine_score=in_engine.score,
                copy_set=on_copy.skipped, copy_score=on_copy.score))
        return snapshot

    search.snapshots.take = checked


def _snapshot_checks(worker):
    return worker.model_runner.drafter.snapshot_checks


def test_background_dp_matches_the_engine_dp_and_survives_a_fault(smollm2_path, plain,
                                                                   monkeypatch):
    # The engine reads the fault setting from the environment: the thread's 3rd run raises.
    monkeypatch.setenv(ENV_VAR, "clasp.dp@3")
    config = {**CLASP, "background_dp": True}
    # vLLM's default process layout: how many runs the thread gets done depends
    # on what shares its process (in the pytest process: 1 snapshot of 3).
    llm = make_llm(smollm2_path, speculative_config=config, max_model_len=1024)
    try:
        llm.collective_rpc(_install_snapshot_check)
        batch, single, counters = run_workload(llm)
        checks = llm.collective_rpc(_snapshot_checks)[0]
        clasp = proposer_stats(llm)["clasp"]
    finally:
        shutdown(llm)
    assert batch == plain[0]
    assert single == plain[1]
    assert clasp["background"] and clasp["snapshot_bytes"] > 0, clasp
    # The DP on the copied K/V (own layer code, torch attention) chooses what the
    # engine's DP chooses, with the same objective value.
    assert len(checks) == SNAPSHOT_CHECKS and max(c["requests"] for c in checks) > 1, checks
    for c in checks:
        assert c["copy_set"] == c["engine_set"], c
        assert c["copy_score"] == pytest.approx(c["engine_score"], abs=1e-4), c
    # The fault: reported with where it happened; the thread went on with the
    # next runs, whose masks were adopted at later step boundaries.
    assert "fault injected at 'clasp.dp'" in clasp["error"], clasp
    assert "in the background thread" in clasp["error"], clasp
    assert clasp["failures"] == 1 and not clasp["stopped"], clasp
    assert clasp["dp_runs"] >= 3 and clasp["mask_changes"] >= 2, clasp
    assert clasp["mean_mask_delay_steps"] >= 1, clasp  # adopted after launch, never before
    assert counters.drafts > 50
