"""SWIFT on real engines: what it learns on SmolLM2 is better than where it
started, its scoring pass leaves the KV cache untouched, and a failing
optimizer thread leaves serving running with the last good set."""

import os

import pytest
import torch
from conftest import make_llm, owned_questions
from vllm import SamplingParams

from vllm_layerskip.core.background_worker import SYNC_ENV
from vllm_layerskip.core.faults import ENV_VAR
from vllm_layerskip.core.measure import (
    chat_prompts,
    proposer_stats,
    shutdown,
    spec_decode_counters,
)

MAX_MODEL_LEN = 1024
KV_CHECKS = 8  # scoring passes whose KV cache bytes are compared (1 GiB clones)


def _install_kv_check(worker):
    """Wrap the drafter's scoring pass: compare every KV cache tensor before
    and after the first KV_CHECKS calls."""
    drafter = worker.model_runner.drafter
    scorer = drafter.scorer
    original = scorer.score
    drafter.kv_check_results = []

    def checked(runner, windows, mask):
        if len(drafter.kv_check_results) >= KV_CHECKS:
            return original(runner, windows, mask)
        before = [t.clone() for t in runner.kv_caches]
        out = original(runner, windows, mask)
        same = all(torch.equal(a, b) for a, b in zip(before, runner.kv_caches))
        drafter.kv_check_results.append((same, windows.num_tokens))
        return out

    scorer.score = checked


def _kv_check_results(worker):
    return worker.model_runner.drafter.kv_check_results


def _generate(llm, questions, max_tokens):
    prompts = chat_prompts(llm, questions)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens),
                        use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.fixture(scope="module")
def questions():
    qs = owned_questions(52)
    return {"train": qs[0::2], "held_out": qs[1::2][:8]}


@pytest.fixture(scope="module")
def learned(smollm2_path, questions):
    """SWIFT with the paper's defaults (r 0.45, gamma 32, a candidate scored
    every step) and the project's (two confirming duels), run over 26 prompts.

    128 new tokens each (~94 candidates): the search kept 2 sets in CI and in
    the checkout alike, the outcome of the 256-token CI run (175 candidates)
    whose held-out figures set the margins below; 256 tokens sometimes kept a
    3rd set and took ~65 s more (fixture 119 s against 181-189; held out, two
    128-token runs of 2026-11-27 both reached M 1.376 against the starting
    set's 1.352, as the 256-token CI run had)."""
    config = {"method": "swift", "num_speculative_tokens": 4, "adaptive_draft_length": False, "prompt_lookup_max": 0,
              "max_optimizer_share": 1.0}
    # The optimizer's jobs run in the engine thread (core/background_worker.py):
    # which set the search ends on no longer depends on the thread's timing.
    previous = os.environ.get(SYNC_ENV)
    os.environ[SYNC_ENV] = "1"
    try:
        llm = make_llm(smollm2_path, in_process=True, speculative_config=config,
                       max_model_len=MAX_MODEL_LEN)
    finally:
        if previous is None:
            del os.environ[SYNC_ENV]
        else:
            os.environ[SYNC_ENV] = previous
    try:
        llm.collective_rpc(_install_kv_check)
        _generate(llm, questions["train"], 128)
        status = proposer_stats(llm)
        kv_checks = llm.collective_rpc(_kv_check_results)[0]
    finally:
        shutdown(llm)
    return status["swift"], kv_checks


def test_scoring_pass_leaves_kv_cache_untouched(learned):
    _, kv_checks = learned
    assert len(kv_checks) == KV_CHECKS
    assert all(n >= 32 for _, n in kv_checks), kv_checks  # real windows were scored
    assert all(same for same, _ in kv_checks), kv_checks


def test_learned_set_beats_the_initial_uniform_set(smollm2_path, questions, learned):
    swift, _ = learned
    assert swift["optimization_steps"] >= 60 and swift["improvements"] >= 1, swift
    # Matchness on the generated text (measured runs: initial ~0.3, best ~0.6).
    assert swift["best_matchness"] > swift["initial_matchness"] + 0.1, swift

    # Draft with each set, fixed, on held-out prompts.
    results = {}
    for name, sets in (("learned", swift["best_set"]), ("initial", swift["initial_set"])):
        assert len(sets["skip_attn"]) + len(sets["skip_mlp"]) == swift["num_skipped"]
        config = {"method": "layer_skip", "num_speculative_tokens": 4,
                  "adaptive_draft_length": False, "prompt_lookup_max": 0, **sets}
        llm = make_llm(smollm2_path, in_process=True, speculative_config=config,
                       max_model_len=MAX_MODEL_LEN)
        try:
            _generate(llm, questions["held_out"], 64)
            results[name] = spec_decode_counters(llm)
        finally:
            shutdown(llm)
    learned_c, initial_c = results["learned"], results["initial"]
    print({k: (c.mean_acceptance_length, c.acceptance_rate) for k, c in results.items()})
    search = {k: swift[k] for k in ("optimization_steps", "improvements", "challengers", "bayes_suggestions",
                                     "initial_matchness", "best_matchness")}
    # With the optimizer in the engine thread, where the search ends no longer
    # depends on the thread's timing: held out, M 1.380 against the starting
    # set's 1.352 (a checkout run of this test), the first
    # drafted token accepted more often (what matchness scores). The margin is
    # the smallest gain earlier runs of the threaded search showed. M must not fall.
    first_token = learned_c.acceptance_per_position[0], initial_c.acceptance_per_position[0]
    assert first_token[0] > first_token[1] + 0.02, (results, search)
    assert learned_c.mean_acceptance_length > initial_c.mean_acceptance_length, (results, search)


def test_optimizer_thread_failure_keeps_serving(smollm2_path, questions, monkeypatch):
    qs = questions["held_out"][:4]
    plain = make_llm(smollm2_path, in_process=True, max_model_len=MAX_MODEL_LEN)
    try:
        expected = _generate(plain, qs, 48)
    finally:
        shutdown(plain)
    # The engine reads the fault setting from the environment: the optimizer thread raises
    # on its 4th job, while requests are in flight.
    monkeypatch.setenv(ENV_VAR, "swift.optimizer@4")
    # No share cap: at the default 0.01 a pass waits until the share has earned
    # what the last cost, and this short run scores too few candidates for a 4th job.
    config = {"method": "swift", "num_speculative_tokens": 4, "context_window": 4,
              "adaptive_draft_length": False, "prompt_lookup_max": 0, "max_optimizer_share": 1.0}
    llm = make_llm(smollm2_path, in_process=True, speculative_config=config,
                   max_model_len=MAX_MODEL_LEN)
    try:
        first = _generate(llm, qs, 48)
        second = _generate(llm, qs, 48)  # the engine still serves afterwards
        swift = proposer_stats(llm)["swift"]
        counters = spec_decode_counters(llm)
    finally:
        shutdown(llm)
    assert first == expected and second == expected
    assert swift["phase"] == "stopped" and "fault injected" in swift["error"], swift
    assert counters.drafts > 50  # drafting went on with the last good set


def test_shipped_state_drafts_with_the_learned_set(smollm2_path, questions):
    """"state_file": "shipped" on SmolLM2: SWIFT starts accelerating with the
    set learned offline (vllm-layerskip learn-swift-set, 2026-12-02) and drafts
    with it from the first step, without scoring a candidate first."""
    config = {"method": "swift", "num_speculative_tokens": 4, "adaptive_draft_length": False,
              "prompt_lookup_max": 0, "state_file": "shipped"}
    llm = make_llm(smollm2_path, in_process=True, speculative_config=config,
                   max_model_len=MAX_MODEL_LEN)
    try:
        _generate(llm, questions["held_out"], 64)
        swift = proposer_stats(llm)["swift"]
        counters = spec_decode_counters(llm)
    finally:
        shutdown(llm)
    assert swift["best_set"] == {"skip_attn": [2, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 16, 17, 20, 23],
                                 "skip_mlp": [2, 4, 5, 6, 7, 9, 10, 11, 13, 14]}, swift
    assert swift["phase"] == "accelerating" and swift["optimization_steps"] == 0, swift
    # On these prompts (float32, K = 4, 64 tokens) the evenly spread set it would
    # start from has its first drafted token accepted 0.247 (85 of 344, the same on
    # two CPUs: test above), this set run as layer_skip 0.300; SWIFT's own drafts
    # here 0.311 (109 of 351, most of them one token long: its confidence exit).
    # On 24 other held-out prompts, as layer_skip: M 1.75 against 1.36 at K = 8
    # (benchmarks/results/2026-12-02/set_acceptance_swift_smollm2_20261202.md).
    assert counters.acceptance_per_position[0] > 0.28, counters
