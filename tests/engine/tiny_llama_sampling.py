"""Temperature-1 samples on a tiny random Llama, and the two-sample test that
two samples of tokens come from one distribution (test_sampling.py,
test_adadecode.py, test_draft_sources.py). Plain decoding's samples on the tiny
Llama come from one session fixture (conftest.py's plain_samples): its engine
starts and samples once (~20 s of CI on a 2-core CPU)."""

import numpy as np
from scipy.stats import chi2_contingency
from vllm import SamplingParams

NUM_SAMPLES = 1500
NUM_TOKENS = 4
PROMPT = "The old lighthouse keeper"
# Significance per position; three positions are tested (Bonferroni ~0.003).
ALPHA = 0.001
GREEDY_PROMPTS = ["Once upon a time", "The capital of France is", "1, 2, 3, 4,"]


def sample(llm, temperature=1.0, num_samples=NUM_SAMPLES, prompt=PROMPT):
    """Sample i draws with seed i: the same i gives the same tokens on any engine
    that samples exactly as plain decoding does. `prompt`: text or a vLLM prompt."""
    params = [SamplingParams(temperature=temperature, max_tokens=NUM_TOKENS, seed=i,
                             ignore_eos=True) for i in range(num_samples)]
    outs = llm.generate([prompt] * num_samples, params, use_tqdm=False)
    return np.array([list(o.outputs[0].token_ids) for o in outs])


def greedy(llm):
    outs = llm.generate(GREEDY_PROMPTS, SamplingParams(temperature=0, max_tokens=24,
                                                        ignore_eos=True), use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def two_sample_p_value(a: np.ndarray, b: np.ndarray) -> float:
    """Chi-square test that two samples of token ids come from one distribution.
    Tokens seen fewer than 10 times in total are pooled into one bin."""
    tokens, counts = np.unique(np.concatenate([a, b]), return_counts=True)
    frequent = set(tokens[counts >= 10].tolist())
    keys = sorted(frequent) + ["rare"]
    table = np.zeros((2, len(keys)))
    for row, sample_ in enumerate((a, b)):
        for t in sample_.tolist():
            table[row, keys.index(t if t in frequent else "rare")] += 1
    table = table[:, table.sum(axis=0) > 0]
    return chi2_contingency(table)[1]
