"""Method adadecode (AdaDecode) in an engine: heads refused at start-up, training
(held-out KL falls for every head), float32 greedy parity with plain vLLM at
batch 1 and 8 on SmolLM2, the shipped heads against identity heads (the
original LM head at the same layers: the paper's ablation), the status the
benchmark reads, and the temperature-1 output distribution on a tiny Llama."""

import argparse
import json
from pathlib import Path

import pytest
from conftest import make_llm, owned_questions
from tiny_llama_sampling import NUM_TOKENS, sample, two_sample_p_value
from vllm import SamplingParams

from vllm_layerskip.core.errors import LayerSkipConfigError
from vllm_layerskip.core.identity import ModelIdentity
from vllm_layerskip.methods.adadecode.heads import ExitHeads, load_heads, save_heads
from vllm_layerskip.core.measure import (
    chat_prompts,
    proposer_stats,
    shutdown,
    spec_decode_counters,
)

SMOLLM2 = ModelIdentity("/somewhere/SmolLM2-135M-Instruct", "LlamaForCausalLM", 30, 576, 49152)
MAX_MODEL_LEN = 1024
MAX_TOKENS = 64
THRESHOLD = 0.6  # tiny Llama, T=1 test


def identity_of(model_path: str) -> ModelIdentity:
    config = json.loads((Path(model_path) / "config.json").read_text())
    return ModelIdentity(model_path, config["architectures"][0], config["num_hidden_layers"],
                         config["hidden_size"], config["vocab_size"])


def write_identity_heads(path, model: ModelIdentity, layers) -> str:
    save_heads(path, ExitHeads.identity(model, layers))
    return str(path)


# ---- the heads file --------------------------------------------------------


def test_bad_heads_refused_at_startup(smollm2_path, tmp_path):
    from vllm.engine.arg_utils import EngineArgs

    heads = ExitHeads.identity(ModelIdentity(smollm2_path, "LlamaForCausalLM", 30, 576, 49152), [8])
    heads.transforms = heads.transforms[:, :64, :64]
    heads.model = ModelIdentity(smollm2_path, "LlamaForCausalLM", 30, 64, 49152)
    save_heads(tmp_path / "h.safetensors", heads)
    spec = {"method": "adadecode", "heads": str(tmp_path / "h.safetensors"), "num_speculative_tokens": 4}
    with pytest.raises(LayerSkipConfigError, match="hidden_size: file 64 vs running 576"):
        EngineArgs(model=smollm2_path, dtype="float32", speculative_config=spec).create_engine_config()


# ---- training ----------------------------------------------------------------


def test_training_lowers_heldout_kl_for_every_head(smollm2_path, tmp_path):
    from vllm_layerskip.methods.adadecode.training import run_train_heads
    from vllm_layerskip.tools.prompts import OWNED_PROMPTS

    # Small on purpose (~20 s): a few prompts, short answers, 40 steps. (On a
    # tiny random model a linear head barely beats the identity held out.)
    args = argparse.Namespace(
        model=smollm2_path, prompts=str(OWNED_PROMPTS), layers="8,22",
        out=str(tmp_path / "h.safetensors"), skip_per_category=0, num_prompts=12,
        heldout_prompts=4, max_prompt_tokens=256, max_new_tokens=32, steps=40,
        batch_tokens=64, lr=2e-3, seed=0,
    )
    run_train_heads(args, progress=False)
    heads = load_heads(args.out, identity_of(smollm2_path))
    before, after = heads.heldout_kl["before"], heads.heldout_kl["after"]
    print("held-out KL before", before, "after", after)
    assert heads.layers == [8, 22] and len(before) == len(after) == 2
    for b, a in zip(before, after):
        assert a < 0.8 * b, (before, after)
    assert heads.training["steps"] == 40 and heads.training["seconds"] > 0
    assert "--layers 8,22" in heads.training["command"]


# ---- SmolLM2: parity, trained vs identity heads, status ------------------------


def workload(llm):
    questions = owned_questions(8)
    return chat_prompts(llm, questions), SamplingParams(temperature=0, max_tokens=MAX_TOKENS)


def generate(llm, prompts, params):
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]


@pytest.fixture(scope="module")
def plain(smollm2_path):
    llm = make_llm(smollm2_path, in_process=True, max_model_len=MAX_MODEL_LEN)
    try:
        prompts, params = workload(llm)
        return {"batch": generate(llm, prompts, params), "single": generate(llm, prompts[5:6], params)[0]}
    finally:
        shutdown(llm)


def _set_heads(path):
    def call(worker):
        worker.model_runner.drafter.set_heads(path)
    return call


@pytest.fixture(scope="module")
def adadecode(smollm2_path, tmp_path_factory):
    """One engine: shipped heads (batch 8, then batch 1), then identity heads at
    the same layers on the same batch."""
    shipped = load_heads("shipped", SMOLLM2)
    identity = write_identity_heads(
        tmp_path_factory.mktemp("heads") / "identity.safetensors",
        identity_of(smollm2_path), shipped.layers)
    config = {"method": "adadecode", "heads": "shipped", "num_speculative_tokens": 8,
              "adaptive_draft_length": False, "prompt_lookup_max": 0}
    llm = make_llm(smollm2_path, in_process=True, speculative_config=config,
                   max_model_len=MAX_MODEL_LEN)
    try:
        prompts, params = workload(llm)
        out = {"batch": generate(llm, prompts, params)}
        out["trained"] = spec_decode_counters(llm)
        out["status"] = proposer_stats(llm)
        out["single"] = generate(llm, prompts[5:6], params)[0]
        before = spec_decode_counters(llm)
        llm.collective_rpc(_set_heads(identity))
        out["identity_batch"] = generate(llm, prompts, params)
        out["identity"] = spec_decode_counters(llm) - before
        out["identity_status"] = proposer_stats(llm)
        return out
    finally:
        shutdown(llm)


def test_greedy_parity_batch_8_and_1(plain, adadecode):
    assert adadecode["batch"] == plain["batch"]
    assert adadecode["single"] == plain["single"]
    assert adadecode["identity_batch"] == plain["batch"]
    assert adadecode["trained"].draft_tokens > 50, adadecode["trained"]


def test_trained_heads_accept_more_than_identity_heads(adadecode):
    trained, identity = adadecode["trained"], adadecode["identity"]
    print("trained", trained, trained.mean_acceptance_length,
          "identity", identity, identity.mean_acceptance_length)
    # Measured (8 prompts x 64 tokens, K 8, threshold 0.85): 1.94 vs 1.39, and
    # acceptance rate 0.74 vs 0.21 (the original LM head on middle layers is
    # often confidently wrong, so identity heads draft more and lose most).
    assert trained.mean_acceptance_length > identity.mean_acceptance_length + 0.3
    assert trained.acceptance_rate > 2 * identity.acceptance_rate


def test_status_reports_exit_layer_and_training_time(adadecode):
    status = adadecode["status"]["adadecode"]
    shipped = load_heads("shipped", SMOLLM2)
    assert status["layers"] == shipped.layers
    assert shipped.layers[0] <= status["mean_exit_layer"] <= shipped.layers[-1]
    assert status["training_seconds"] == shipped.training["seconds"] > 0
    assert status["heldout_kl"]["after"] == shipped.heldout_kl["after"]
    # A draft forward costs the rows it ran, token or not: a row whose heads
    # were all unsure ran to the last head and drafted nothing. The cost model
    # learns the draft cost per row from these counts.
    stats = adadecode["status"]
    assert stats["num_rows_run"] > stats["num_draft_tokens"] > 0, stats
    print("mean exit layer", status["mean_exit_layer"],
          "identity heads", adadecode["identity_status"]["adadecode"]["mean_exit_layer"])


# ---- temperature 1: the output distribution is the target's --------------------


NUM_SAMPLES = 800  # fewer than test_sampling.py: this file's time budget is small


def test_sampling_distribution_matches_plain(tiny_llama, plain_samples, tmp_path):
    heads = write_identity_heads(tmp_path / "tiny.safetensors", identity_of(tiny_llama), [1, 2])
    plain = plain_samples[1.0]  # 1500 samples (conftest.py)
    config = {"method": "adadecode", "heads": heads, "threshold": THRESHOLD,
              "num_speculative_tokens": 3, "adaptive_draft_length": False, "prompt_lookup_max": 0}
    llm = make_llm(tiny_llama, in_process=True, speculative_config=config, max_model_len=256)
    try:
        spec = sample(llm, 1.0, NUM_SAMPLES)
        counters = spec_decode_counters(llm)
        status = proposer_stats(llm)["adadecode"]
    finally:
        shutdown(llm)
    print(counters, counters.acceptance_rate, status["mean_exit_layer"])
    # Drafts were proposed, from both heads, and some were rejected.
    assert counters.draft_tokens > NUM_SAMPLES // 2
    assert 1.0 < status["mean_exit_layer"] < 2.0, status
    assert 0.05 < counters.acceptance_rate < 0.95, counters
    for pos in range(1, NUM_TOKENS):
        p = two_sample_p_value(plain[:, pos], spec[:, pos])
        assert p > 1e-3, f"token distribution at position {pos} differs (p={p:.2e})"
