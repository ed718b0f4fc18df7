"""CLaSp in an engine: the layer-selection DP against exhaustive search on a
real engine's layers, float32 greedy parity with plain vLLM while the DP
re-chooses the mask every step, and that its masks beat an evenly spread set of
the same size in acceptance on SmolLM2; a failing DP run keeps serving."""

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import make_llm, owned_questions
from vllm import SamplingParams

from vllm_layerskip.core.faults import ENV_VAR
from vllm_layerskip.core.measure import (
    chat_prompts,
    proposer_stats,
    shutdown,
    spec_decode_counters,
)
from vllm_layerskip.methods.clasp.dp_scheduler import evenly_spread_layers

# ---- a real engine's layers: DP vs exhaustive search on a tiny model --------

EXHAUSTIVE_RUNS = 8
KV_CHECKS = 2  # DP runs whose KV cache bytes are compared before and after


def _install_exhaustive_check(worker):
    """Wrap the drafter's DP run: check that it writes no KV, and score every
    skip set of the same size with the same objective on the same tokens,
    through the engine's own layers."""
    drafter = worker.model_runner.drafter
    search = drafter.dp
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
              "layer_optimization_interval": 1, "max_optimizer_share": 1.0, "adaptive_draft_length": False, "prompt_lookup_max": 0}
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
FIXED = {"num_speculative_tokens": 4, "adaptive_draft_length": False, "prompt_lookup_max": 0,
         "draft_confidence_threshold": 0.0}
CLASP = {"method": "clasp", "num_skip_layers": NUM_SKIP, "layer_optimization_interval": 1,
         "max_optimizer_share": 1.0, **FIXED}
MAX_TOKENS = 48


def run_workload(llm, single=True):
    questions = owned_questions(8)
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

