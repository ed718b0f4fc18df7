"""At temperature 1 the output distribution with `layer_skip` is the target's.

Drafts are sampled from the draft distribution q and vLLM's rejection sampler
accepts them with probability min(1, p/q), resampling from max(0, p - q)
otherwise. A bug anywhere in that chain (wrong q handed over, drafts not drawn
from q, misaligned rows) shifts the distribution of the tokens that follow a
draft. On a tiny random model with peaked next-token distributions we draw many
fixed-seed samples with and without speculation and compare the token
distributions at the drafted positions with a chi-square two-sample test.
"""

import pytest
from conftest import make_llm
from tiny_llama_sampling import ALPHA, NUM_SAMPLES, NUM_TOKENS, greedy, sample, two_sample_p_value

from vllm_layerskip.core.measure import proposer_stats, shutdown, spec_decode_counters


def _set_fault(worker, spec):
    """Runs in the worker: change which calls of the fault points raise."""
    import os

    from vllm_layerskip.core.faults import ENV_VAR

    os.environ[ENV_VAR] = spec


def _count_rejection_sampler_calls(worker):
    """Runs in the worker: count (from zero) the calls of vLLM's rejection sampler."""
    sampler = worker.model_runner.rejection_sampler
    original = getattr(sampler, "uncounted_forward", sampler.forward)
    sampler.uncounted_forward, sampler.calls = original, 0

    def counted(*args, **kwargs):
        sampler.calls += 1
        return original(*args, **kwargs)

    sampler.forward = counted


def _rejection_sampler_calls(worker):
    return worker.model_runner.rejection_sampler.calls


def test_failed_draft_passes_fall_back_to_plain_decoding(tiny_llama, plain_samples, monkeypatch):
    """A draft pass that raises costs its step the drafts, not the engine or the
    output; and a step without drafts samples exactly as plain decoding does
    (patches/model_runner.py: no rejection sampler there), so seeded requests
    draw the same tokens as on a plain engine."""
    from vllm_layerskip.core.faults import ENV_VAR

    monkeypatch.setenv(ENV_VAR, "draft@3")  # read by the engine (call counts are per engine)
    config = {"method": "layer_skip", "num_speculative_tokens": 3, "adaptive_draft_length": False,
              **CONFIGS["layer_skip"]}
    llm = make_llm(tiny_llama, in_process=True, speculative_config=config, max_model_len=256)
    try:
        llm.collective_rpc(_count_rejection_sampler_calls)
        assert greedy(llm) == plain_samples["greedy"]
        once = proposer_stats(llm)
        before = spec_decode_counters(llm)
        verify_calls_while_drafting = llm.collective_rpc(_rejection_sampler_calls)[0]
        llm.collective_rpc(_set_fault, args=("draft",))  # from now on every pass fails
        llm.collective_rpc(_count_rejection_sampler_calls)
        spec = sample(llm, 1.0, num_samples=300)
        always = proposer_stats(llm)
        after = spec_decode_counters(llm)
        verify_calls_without_drafts = llm.collective_rpc(_rejection_sampler_calls)[0]
    finally:
        shutdown(llm)
    # One failed pass, then drafting went on.
    assert once["draft_failures"] == 1, once
    assert "InjectedFault" in once["last_draft_error"], once
    assert once["num_draft_tokens"] > 0 and before.draft_tokens > 0, once
    # Without early exit every row a draft forward runs drafts a token.
    assert once["num_rows_run"] == once["num_draft_tokens"], once
    # Every pass failed: no drafts reached vLLM, and the seeded samples are the
    # plain engine's, token for token.
    assert always["draft_failures"] > 1 and always["num_draft_tokens"] == once["num_draft_tokens"]
    assert after.draft_tokens == before.draft_tokens, (before, after)
    assert spec.tolist() == plain_samples[1.0][:300].tolist()
    # Steps without drafts skip vLLM's rejection sampler (its T > 0 path draws
    # noise over the whole vocabulary for nothing); steps with drafts use it.
    assert verify_calls_while_drafting > 0
    assert verify_calls_without_drafts == 0


# The skip set's own drafts: lookup (on by default) is tested apart, in
# test_draft_sources.py; copied drafts would not go through a failing draft pass.
CONFIGS = {
    "layer_skip": {"method": "layer_skip", "skip_attn": [1], "skip_mlp": [2], "prompt_lookup_max": 0},
    # SWIFT re-chooses its set while sampling (a 1-token context window: every
    # step scores a candidate); no confidence stop, so drafts are long enough.
    "swift": {"method": "swift", "skip_ratio": 0.5, "context_window": 1,
              "draft_confidence_threshold": 0.0, "patience": 100000,
              "max_optimizer_share": 1.0, "prompt_lookup_max": 0},
    # Drafts through int4 copies of the linear weights (q is the copy's
    # distribution). Passes of more than 4 tokens run the model's own weights,
    # so this engine runs at most 4 requests a step: every draft reads the copies.
    "layer_skip-int4-draft-weights": {"method": "layer_skip", "skip_mlp": [2], "prompt_lookup_max": 0,
                                      "draft_weights": "int4"},
    # Int8 weights and per-token int8 activations: passes of any size read the copies.
    "layer_skip-w8a8-draft-weights": {"method": "layer_skip", "skip_mlp": [2], "prompt_lookup_max": 0,
                                      "draft_weights": "w8a8"},
}


@pytest.mark.parametrize("method", list(CONFIGS))
def test_sampling_distribution_matches_plain(tiny_llama, plain_samples, method):
    config = {"num_speculative_tokens": 3, "adaptive_draft_length": False, **CONFIGS[method]}
    narrow = {"max_num_seqs": 4} if config.get("draft_weights") == "int4" else {}
    llm = make_llm(tiny_llama, in_process=True, speculative_config=config, max_model_len=256, **narrow)
    try:
        spec = sample(llm, 1.0)
        counters = spec_decode_counters(llm)
        status = proposer_stats(llm)
    finally:
        shutdown(llm)
    if "draft_weights" in config:
        assert status["draft_weights"]["scheme"] == config["draft_weights"], status["draft_weights"]
    if method == "swift":
        # ~1500 requests of 4 tokens run in a few waves of 4 steps each: every
        # step scored a candidate.
        assert status["swift"]["optimization_steps"] >= 10, status["swift"]

    plain = plain_samples[1.0]
    # The rejection path really ran: drafts were proposed, some rejected.
    assert counters.draft_tokens > NUM_SAMPLES
    assert 0.05 < counters.acceptance_rate < 0.95, counters

    for pos in range(1, NUM_TOKENS):  # position 0 comes from the prefill, no draft
        p = two_sample_p_value(plain[:, pos], spec[:, pos])
        assert p > ALPHA, f"token distribution at position {pos} differs (p={p:.2e})"


def test_distribution_test_has_power(plain_samples):
    """The same test tells temperature 1 from temperature 0.7 apart."""
    p_values = [
        two_sample_p_value(plain_samples[1.0][:, pos], plain_samples[0.7][:, pos])
        for pos in range(1, NUM_TOKENS)
    ]
    assert min(p_values) < 1e-6, p_values
