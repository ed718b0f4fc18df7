"""Measuring offline runs: Spec-Bench prompts, vLLM's spec-decode counters, timing.

Shared by the demo (`vllm-layerskip demo`), the benchmarks and the tests.
"""

from __future__ import annotations

import gc
import json
import os
import time
from dataclasses import dataclass

SPEC_BENCH_DEFAULT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "..",
    "shared",
    "data",
    "spec_bench",
    "question.jsonl",
)


def spec_bench_path() -> str:
    """Spec-Bench questions: $SPEC_BENCH_QUESTIONS, else ../shared/data/spec_bench."""
    path = os.environ.get("SPEC_BENCH_QUESTIONS", os.path.normpath(SPEC_BENCH_DEFAULT))
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"Spec-Bench questions not found at {path}; set SPEC_BENCH_QUESTIONS to "
            "the path of question.jsonl."
        )
    return path


def load_spec_bench(per_category: int, path: str | None = None) -> list[dict]:
    """The first `per_category` questions of each Spec-Bench category (first turn)."""
    counts: dict[str, int] = {}
    out = []
    with open(path or spec_bench_path()) as f:
        for line in f:
            q = json.loads(line)
            cat = q["category"]
            if counts.get(cat, 0) < per_category:
                counts[cat] = counts.get(cat, 0) + 1
                out.append({"category": cat, "prompt": q["turns"][0]})
    return out


def chat_prompts(llm, questions: list[str]) -> list[str]:
    """Apply the model's chat template to single-turn user questions."""
    tok = llm.get_tokenizer()
    return [
        tok.apply_chat_template(
            [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
        )
        for q in questions
    ]


@dataclass
class SpecDecodeCounters:
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_pos: tuple[int, ...] = ()

    def __sub__(self, other: "SpecDecodeCounters") -> "SpecDecodeCounters":
        n = max(len(self.accepted_per_pos), len(other.accepted_per_pos))
        a = list(self.accepted_per_pos) + [0] * (n - len(self.accepted_per_pos))
        b = list(other.accepted_per_pos) + [0] * (n - len(other.accepted_per_pos))
        return SpecDecodeCounters(
            self.drafts - other.drafts,
            self.draft_tokens - other.draft_tokens,
            self.accepted_tokens - other.accepted_tokens,
            tuple(x - y for x, y in zip(a, b)),
        )

    @property
    def acceptance_rate(self) -> float:
        """alpha: accepted draft tokens / proposed draft tokens."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """M: tokens produced per verify step that had a draft (accepted + 1)."""
        return 1.0 + self.accepted_tokens / self.drafts if self.drafts else 1.0


def spec_decode_counters(llm) -> SpecDecodeCounters:
    """vLLM's own spec-decode counters of an LLM built with disable_log_stats=False."""
    c = SpecDecodeCounters()
    for m in llm.get_metrics():
        if m.name == "vllm:spec_decode_num_drafts":
            c.drafts = int(m.value)
        elif m.name == "vllm:spec_decode_num_draft_tokens":
            c.draft_tokens = int(m.value)
        elif m.name == "vllm:spec_decode_num_accepted_tokens":
            c.accepted_tokens = int(m.value)
        elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            c.accepted_per_pos = tuple(int(v) for v in m.values)
    return c


@dataclass
class RunResult:
    token_ids: list[list[int]]
    seconds: float
    counters: SpecDecodeCounters

    @property
    def num_tokens(self) -> int:
        return sum(len(t) for t in self.token_ids)

    @property
    def tokens_per_second(self) -> float:
        return self.num_tokens / self.seconds if self.seconds else 0.0


def timed_generate(llm, prompts, sampling_params) -> RunResult:
    before = spec_decode_counters(llm)
    start = time.perf_counter()
    outputs = llm.generate(prompts, sampling_params, use_tqdm=False)
    seconds = time.perf_counter() - start
    token_ids = [list(o.outputs[0].token_ids) for o in outputs]
    return RunResult(token_ids, seconds, spec_decode_counters(llm) - before)


def shutdown(llm) -> None:
    """Stop an LLM's engine processes now, so the next engine gets the memory."""
    engine = getattr(llm, "llm_engine", None)
    core = getattr(engine, "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()
    del llm
    gc.collect()


def _drafter_stats(worker) -> dict:
    drafter = getattr(worker.model_runner, "drafter", None)
    return drafter.status() if hasattr(drafter, "status") else {}


def proposer_stats(llm) -> dict:
    """The layer-skip proposer's counters from the (first) worker: time spent
    drafting, forward steps, and the cost model's decisions. Needs VLLM_ALLOW_INSECURE_SERIALIZATION=1 set before the LLM
    is built, since it sends a function to the worker."""
    return llm.collective_rpc(_drafter_stats)[0]
