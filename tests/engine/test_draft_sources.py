"""At temperature 1 the output distribution stays the target's with a pruned draft
vocabulary (q is zero outside it; on a tiny random Llama, the vocabulary leaving
out about a third of what it samples; also read through draft weights' 4-bit
copy of its rows) and with drafts copied from the context
(q one-hot; on SmolLM2 copying a list, since a random model never repeats its
context): the same two-sample test as test_sampling.py."""

from collections import Counter

import numpy as np
import pytest
from conftest import make_llm
from tiny_llama_sampling import ALPHA, NUM_TOKENS, sample, two_sample_p_value
from vllm.inputs import TokensPrompt

from vllm_layerskip.core.draft_vocab import DraftVocab, save_draft_vocab
from vllm_layerskip.core.identity import checkpoint_identity
from vllm_layerskip.core.measure import proposer_stats, shutdown, spec_decode_counters
from vllm_layerskip.tools.draft_vocab import rank

# Samples per source. On SmolLM2 (lookup) 600 tell T = 1 from T = 0.85 at
# p < 1e-8 (test_lookup_distribution_test_has_power); the tiny Llama's are cheap.
NUM_SAMPLES = {"draft_vocab": 1200, "lookup": 600, "suffix_tree": 600}
# Seeded requests must not have their prompts split over steps (chunked prefill):
# vLLM 0.32 then rewinds their generators, which CPU generators do not support.
# 128 requests of the copy prompt fit one step's 4096-token budget. Blocks of 32
# tokens: every request after the first finds the copy prompt's first 32 tokens
# in the prefix cache (CPU's default block of 128 holds no full block of it), so
# SmolLM2 computes 1 prompt token a request instead of 33: plain decoding's 600
# samples took 13 s instead of ~66 (1200: 133 s), the lookup engine's 61 s instead
# of 100 (2026-11-26, the AVX2 CPU).
ENGINE = dict(in_process=True, max_model_len=256, max_num_seqs=128, block_size=32)


def sample_ids(llm, prompt_ids, num_samples, temperature=1.0):
    return sample(llm, temperature, num_samples, prompt=TokensPrompt(prompt_token_ids=prompt_ids))


def _plain_samples(model, prompt_ids, num_samples, temperatures=(1.0,)):
    llm = make_llm(model, **ENGINE)
    try:
        return {t: sample_ids(llm, prompt_ids, num_samples, t) for t in temperatures}
    finally:
        shutdown(llm)


def _copy_prompt(smollm2_path) -> list[int]:
    """A list that repeats, then a stretch whose period is shorter than K: there
    the most recent match sits right before the end of the context and its copy
    runs out after a token or two, so the draft continues it by itself. 33
    tokens: one full block of 32 to share through the prefix cache."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_path)
    fruit = ", ".join(["apple", "pear", "plum", "fig", "lime"] * 2)
    text = "Fruit on the list: " + fruit + ", ha, ha, ha, ha,"
    ids = tok(text, add_special_tokens=False).input_ids
    assert len(ids) == 33, len(ids)
    return ids


@pytest.fixture(scope="module")
def plain(tiny_llama, smollm2_path):
    """Per source, the prompt and plain decoding's samples on it by temperature.
    Lookup: SmolLM2 continuing a list that repeats, which it often goes on
    copying at T = 1; at T = 0.85 too, for the power check."""
    copy_prompt = _copy_prompt(smollm2_path)
    return {"draft_vocab": ([1, 2, 3, 4], _plain_samples(tiny_llama, [1, 2, 3, 4],
                                                         NUM_SAMPLES["draft_vocab"])),
            "lookup": (copy_prompt, _plain_samples(smollm2_path, copy_prompt,
                                                   NUM_SAMPLES["lookup"], (1.0, 0.85)))}


@pytest.fixture(scope="module")
def vocab_file(tiny_llama, plain, tmp_path_factory):
    """A draft vocabulary of the ids plain decoding samples most often, just
    enough of them for about 70% of what it samples: the rest lies outside."""
    samples = plain["draft_vocab"][1][1.0]
    counts = Counter(samples.ravel().tolist())
    share = np.cumsum(sorted(counts.values(), reverse=True)) / samples.size
    size = int(np.searchsorted(share, 0.7)) + 1
    identity = checkpoint_identity(tiny_llama)
    path = tmp_path_factory.mktemp("vocab") / "tiny.draft-vocab.safetensors"
    save_draft_vocab(path, DraftVocab(model=identity, token_ids=rank(counts, [], identity.vocab_size),
                                      source={"size": size}))
    kept = set(rank(counts, [], identity.vocab_size)[:size].tolist())
    outside = sum(c for t, c in counts.items() if t not in kept)
    return str(path), size, outside / samples.size


CONFIGS = {
    "draft_vocab": {},
    # With draft weights the pruned head's rows are read at 4 bits (8 where the
    # int4 kernel's tiles do not fit the subset), best columns rescored: q is
    # that softmax over the subset. Two requests at a time, so every pass is
    # small enough to read the copies (int8's limit is 2 tokens).
    "draft_vocab-int4-draft-weights": {"draft_weights": "int4"},
    "lookup": {"prompt_lookup_max": 2, "prompt_lookup_min": 1},
    # Copies from suffix trees: the prompt's and every earlier sample's.
    "suffix_tree": {"copy_source": "suffix_tree"},
}


@pytest.mark.parametrize("source", list(CONFIGS))
def test_sampling_distribution_matches_plain(tiny_llama, smollm2_path, plain, vocab_file, source):
    pruned = source.startswith("draft_vocab")
    prompt, by_temperature = plain["draft_vocab" if pruned else "lookup"]
    plain_samples = by_temperature[1.0]
    num_samples = NUM_SAMPLES["draft_vocab" if pruned else source]
    path, size, outside = vocab_file
    config = {"method": "layer_skip", "skip_attn": [1], "skip_mlp": [2], "num_speculative_tokens": 3,
              "adaptive_draft_length": False, **CONFIGS[source]}
    model = tiny_llama
    if pruned:
        config.update(draft_vocab=path, draft_vocab_size=size)
    else:
        model = smollm2_path
        config.update(skip_attn=[10, 20], skip_mlp=[15], draft_vocab_size=0)
    engine = {**ENGINE, "max_num_seqs": 2} if "draft_weights" in config else ENGINE
    llm = make_llm(model, speculative_config=config, **engine)
    try:
        samples = sample_ids(llm, prompt, num_samples)
        counters = spec_decode_counters(llm)
        status = proposer_stats(llm)
        head_copy = llm.collective_rpc(_draft_head_copy)[0]
    finally:
        shutdown(llm)
    verified = status["verified"]
    # The head's rows: a quantized copy with draft weights, the model's without.
    assert head_copy in (("int4", "int8") if "draft_weights" in config else (None,)), head_copy
    if pruned:
        assert outside > 0.1, outside  # the pruned vocabulary leaves real mass out
        assert verified["self"]["draft_tokens"] > num_samples
    else:
        # Most drafts copied from the context, some of them rejected; lookup's
        # copies that ran out continued by the skip set's draft, which q covers
        # too (the suffix tree's fill the room of 3 where offered: it offers
        # only copies expected to be 2 tokens accepted, core/suffix_copies.py).
        assert verified["lookup"]["draft_tokens"] > num_samples, verified
        assert 0.02 < verified["lookup"]["acceptance"] < 0.98, verified
        if source == "lookup":
            assert verified["continuation"]["draft_tokens"] > 100, verified
            assert 0.02 < verified["continuation"]["acceptance"] < 0.98, verified
    assert 0.02 < counters.acceptance_rate < 0.98, counters
    for pos in range(1, NUM_TOKENS):  # position 0 comes from the prefill, no draft
        p = two_sample_p_value(plain_samples[:, pos], samples[:, pos])
        assert p > ALPHA, f"token distribution at position {pos} differs (p={p:.2e})"


def test_lookup_distribution_test_has_power(plain):
    """At the lookup test's sample size the same test tells plain decoding at
    T = 1 from T = 0.85 on the copy prompt: a bug that shifts the distribution
    by that much fails it."""
    _, by_temperature = plain["lookup"]
    p_values = [two_sample_p_value(by_temperature[1.0][:, pos], by_temperature[0.85][:, pos])
                for pos in range(1, NUM_TOKENS)]
    assert min(p_values) < 1e-6, p_values


def test_pruned_draft_head_is_on(tiny_llama, vocab_file):
    """The proposer's head scores only the chosen ids (read in the worker)."""
    path, size, _ = vocab_file
    config = {"method": "layer_skip", "skip_layers": [1], "num_speculative_tokens": 2,
              "draft_vocab": path, "draft_vocab_size": size}
    llm = make_llm(tiny_llama, speculative_config=config, **ENGINE)
    try:
        ids = llm.collective_rpc(_draft_head_ids)[0]
    finally:
        shutdown(llm)
    assert len(ids) == size and len(set(ids)) == size


def _draft_head_copy(worker):
    """The scheme of the pruned head's quantized copy; None: its model rows alone."""
    head_slice = worker.model_runner.drafter.engine.head._slice
    copy = None if head_slice is None else head_slice.quantized
    return None if copy is None else copy.scheme


def _draft_head_ids(worker):
    head = worker.model_runner.drafter.engine.head
    return head.token_ids.tolist() if head.pruned else []



def test_a_copy_that_runs_out_goes_on_as_the_target_would(smollm2_path):
    """Nothing skipped and the full LM head: the draft is the target, so a
    continuation after a copied draft is accepted whole, if its first pass fed
    the copied tokens and wrote their K/V where the later draft steps read it."""
    config = {"method": "layer_skip", "num_speculative_tokens": 3, "draft_vocab_size": 0,
              "adaptive_draft_length": False, "prompt_lookup_max": 2, "prompt_lookup_min": 1}
    llm = make_llm(smollm2_path, speculative_config=config, **ENGINE)
    try:
        sample_ids(llm, _copy_prompt(smollm2_path), 128)
        verified = proposer_stats(llm)["verified"]
    finally:
        shutdown(llm)
    assert verified["continuation"]["draft_tokens"] > 10, verified
    assert verified["continuation"]["acceptance"] >= 0.95, verified
    assert verified["self"]["acceptance"] >= 0.95, verified
