"""Method self_sd (Draft & Verify) in an engine: the offline search on a tiny
model (runs, resumes, writes a profile the proposer loads), and the shipped
SmolLM2 profile against the uniform set of the same size."""

import argparse
import json

import pytest
from conftest import engine_layout, make_llm, owned_questions
from vllm import SamplingParams

from vllm_layerskip.core.measure import (
    chat_prompts,
    proposer_stats,
    shutdown,
    spec_decode_counters,
)
from vllm_layerskip.core.errors import LayerSkipConfigError
from vllm_layerskip.core.identity import ModelIdentity
from vllm_layerskip.core.skip_set_optimizer import SubLayerSpace
from vllm_layerskip.methods.self_sd.profile import load_profile

SMOLLM2 = ModelIdentity("/somewhere/SmolLM2-135M-Instruct", "LlamaForCausalLM", 30, 576, 49152)


def _search_args(model, prompts, out, iterations):
    return argparse.Namespace(
        model=model, prompts=str(prompts), num_prompts=2, max_tokens=8, iterations=iterations,
        objective="proxy", skip_ratio=0.5, k=3, init="uniform", seed=0, dtype="float32",
        max_model_len=256, resume=True, out=str(out))


def test_search_runs_resumes_and_writes_a_loadable_profile(tiny_model_dir, tmp_path):
    from vllm_layerskip.methods.self_sd.offline_search import run_search

    model = tiny_model_dir("llama", num_layers=5, out_proj_std=0.03)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The old lighthouse keeper\nOnce upon a time\n")
    out = tmp_path / "profile.json"
    # The search's engine in this process: 5 s to start instead of ~35, twice.
    with engine_layout(in_process=True):
        first = run_search(_search_args(model, prompts, out, 2))
    checkpoint = json.loads((tmp_path / "profile.json.search.json").read_text())
    assert len(checkpoint["history"]) == 2
    # The first candidate is the evenly spread seed set.
    space = SubLayerSpace(5)
    assert checkpoint["history"][0]["coords"] == list(space.evenly_spread(3))
    first_sets = [h["coords"] for h in checkpoint["history"]]
    with engine_layout(in_process=True):
        second = run_search(_search_args(model, prompts, out, 4))  # resumes: 2 more
    checkpoint = json.loads((tmp_path / "profile.json.search.json").read_text())
    assert len(checkpoint["history"]) == 4 and second.search["iterations"] == 4
    assert [h["coords"] for h in checkpoint["history"][:2]] == first_sets  # kept, not redone
    assert first.search["iterations"] == 2
    # The profile holds the best set of all four evaluations.
    best = max(checkpoint["history"], key=lambda h: h["value"])
    assert second.objective["value"] == pytest.approx(best["value"])
    assert second.skip_attn + second.skip_mlp and second.search["objective"] == "proxy"
    assert second.num_skipped == 3 and second.objective["name"] == "proxy"
    # A changed setting is not silently mixed into the old history.
    with pytest.raises(LayerSkipConfigError, match="was written with other settings"):
        run_search(argparse.Namespace(**{**vars(_search_args(model, prompts, out, 5)), "k": 2}))

    # The proposer loads it, and greedy output is plain decoding's.
    config = {"method": "self_sd", "profile": str(out), "num_speculative_tokens": 3,
              "adaptive_draft_length": False, "prompt_lookup_max": 0}
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts_list = ["The old lighthouse keeper", "Once upon a time", "In the beginning"]
    plain = make_llm(model, in_process=True, max_model_len=256)
    try:
        expected = [o.outputs[0].token_ids for o in plain.generate(prompts_list, params, use_tqdm=False)]
    finally:
        shutdown(plain)
    llm = make_llm(model, in_process=True, speculative_config=config, max_model_len=256)
    try:
        got = [o.outputs[0].token_ids for o in llm.generate(prompts_list, params, use_tqdm=False)]
        status = proposer_stats(llm)["self_sd"]
    finally:
        shutdown(llm)
    assert got == expected
    assert status["profile"] == str(out) and status["threshold_updates"] > 0


def test_shipped_profile_beats_uniform_set_of_same_size(smollm2_path):
    profile = load_profile("shipped", SMOLLM2)
    space = SubLayerSpace(30)
    uniform = space.layer_sets(space.evenly_spread(profile.num_skipped))
    # Held out: the search calibrated on Spec-Bench questions, not these.
    questions = owned_questions(10, skip_per_category=1)
    results = {}
    for name, sets in (("profile", {"skip_attn": profile.skip_attn, "skip_mlp": profile.skip_mlp}),
                       ("uniform", uniform)):
        config = {"method": "layer_skip", "num_speculative_tokens": 4,
                  "adaptive_draft_length": False, "prompt_lookup_max": 0, **sets}
        llm = make_llm(smollm2_path, in_process=True, speculative_config=config, max_model_len=1024)
        try:
            llm.generate(chat_prompts(llm, questions),
                         SamplingParams(temperature=0, max_tokens=64), use_tqdm=False)
            results[name] = spec_decode_counters(llm)
        finally:
            shutdown(llm)
    print({k: (c.mean_acceptance_length, c.acceptance_rate) for k, c in results.items()})
    assert (results["profile"].mean_acceptance_length
            > results["uniform"].mean_acceptance_length + 0.05), results
