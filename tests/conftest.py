"""Shared fixtures. Engines are expensive to start, so every engine a test
module needs is built once per module and shut down after it, and most are
built in this process (make_llm's in_process)."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager

# Before vLLM is imported anywhere: a small KV cache suits this 24 GB machine,
# and tests must not pick up a user's plugin selection.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.pop("VLLM_PLUGINS", None)
# Tests read the proposer's status from the worker with collective_rpc, which
# sends a function: vLLM only allows that with insecure serialization on.
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")

import pytest

# Helpers (tiny_models.py) and the fakes some test modules share across the tiers.
for folder in ("", "unit", "engine"):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), folder))

# Engine settings every test engine shares: float32 because exactness is only
# defined there (bf16 verify-vs-decode rounding differs even for vLLM's ngram),
# eager because compile time is not under test.
ENGINE_DEFAULTS = dict(dtype="float32", enforce_eager=True, disable_log_stats=False, seed=0)


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    from vllm_layerskip.tools.prepare_model import ensure_default_model

    return ensure_default_model(quiet=True)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, smollm2_path):
    """Builds tiny random models on demand: tiny_model_dir(family) -> path."""
    from tiny_models import make_tiny_model

    root = tmp_path_factory.mktemp("tiny_models")

    def build(family: str, num_layers: int = 4, **kwargs) -> str:
        suffix = "".join(f"-{k}{v}" for k, v in sorted(kwargs.items()))
        return make_tiny_model(
            family, str(root / f"{family}-{num_layers}{suffix}"), num_layers=num_layers,
            tokenizer_src=smollm2_path, **kwargs,
        )

    return build


@pytest.fixture(scope="session")
def tiny_llama(tiny_model_dir) -> str:
    # Small residual updates: a draft with skipped sub-layers agrees with the
    # target part of the time, so both accept and reject paths run.
    return tiny_model_dir("llama", num_layers=4, out_proj_std=0.03)


@pytest.fixture(scope="session")
def plain_samples(tiny_llama) -> dict:
    """Plain decoding on the tiny Llama: seeded samples at T = 1 and 0.7, and
    greedy outputs (tiny_llama_sampling.py); the engine is gone once they are."""
    from tiny_llama_sampling import greedy, sample

    from vllm_layerskip.core.measure import shutdown

    llm = make_llm(tiny_llama, in_process=True, max_model_len=256)
    try:
        samples = {t: sample(llm, t) for t in (1.0, 0.7)}
        samples["greedy"] = greedy(llm)
    finally:
        shutdown(llm)
    return samples


def owned_questions(count: int, skip_per_category: int = 0) -> list[str]:
    """`count` of the project's own prompts (tools/data/prompts.jsonl), the
    categories taking turns, from each category's prompt `skip_per_category` on."""
    from vllm_layerskip.core.measure import interleave_categories
    from vllm_layerskip.tools.prompts import owned_prompts

    return interleave_categories(owned_prompts(), skip_per_category)[:count]


IN_PROCESS_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"


@contextmanager
def engine_layout(in_process: bool):
    """Engines built inside run in this process (in_process, vLLM's uniprocess
    executor) or in vLLM's default layout; for tools that build their own LLM
    (the Self-SD search) as for make_llm."""
    import vllm.envs as envs

    saved = os.environ.get(IN_PROCESS_ENV)
    if in_process:
        os.environ[IN_PROCESS_ENV] = "0"
    # vLLM caches its environment variables once an in-process engine has
    # started: read them afresh, so every engine sees the current setting.
    envs.disable_envs_cache()
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(IN_PROCESS_ENV, None)
        else:
            os.environ[IN_PROCESS_ENV] = saved
        envs.disable_envs_cache()


def make_llm(model: str, speculative_config: dict | None = None, *, in_process: bool = False,
             **kwargs):
    """An offline engine. in_process: engine core and worker run in this
    process (VLLM_ENABLE_V1_MULTIPROCESSING=0, vLLM's uniprocess executor):
    the same model runner and plugin code. benchmarks/bench_engine_startup.py
    here (SmolLM2, 2 cores): start 3.5-5 s instead of 31-38 s and stop 2 s
    instead of 6 s, since vLLM's default spawns two processes that each import
    vLLM and torch anew; the same outputs and draft counts. Tensor-parallel
    engines run their engine core here too (their workers are processes either
    way): 32-39 s an engine against 50-65 s. Tests of process-level behaviour
    (the server, aborts) and of how much a background thread gets done next to
    the engine keep the default."""
    from vllm import LLM

    with engine_layout(in_process):
        return LLM(model=model, speculative_config=speculative_config,
                   **{**ENGINE_DEFAULTS, **kwargs})


@pytest.fixture(autouse=True)
def fault_counts_start_at_zero():
    """Fault injection (vllm_layerskip/faults.py) counts calls per process: the
    engines built in this process and the tests' own searches share the counts,
    so that "swift.optimizer@3" means the 3rd call in the test, they restart
    at every test."""
    from vllm_layerskip.core.faults import reset_counts

    reset_counts()
