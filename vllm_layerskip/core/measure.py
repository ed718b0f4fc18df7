"""Measuring offline runs: prompt files, vLLM's spec-decode counters, timing,
the proposer's status.

Shared by the tools (demo, draft-vocab), the methods' offline searches, the
benchmarks and the tests.
"""

from __future__ import annotations

import gc
import json
import os
import time
from dataclasses import dataclass

def read_questions(path: str) -> list[dict]:
    """Prompts from a file: JSON lines with a "prompt" (this project's prompt
    files) or "turns" (Spec-Bench; the first turn) and an optional "category",
    or plain text, one prompt per line. [{"category", "prompt"}]"""
    out = []
    with open(path) as f:
        lines = [line.strip() for line in f if line.strip()]
    for n, line in enumerate(lines, 1):
        if not path.endswith(".jsonl"):
            out.append({"category": "", "prompt": line})
            continue
        row = json.loads(line)
        text = row.get("prompt") or row.get("text") or (row.get("turns") or [None])[0]
        if not isinstance(text, str):
            raise ValueError(f"{path}:{n}: no 'prompt', 'text' or 'turns' in {line[:80]!r}")
        out.append({"category": row.get("category", ""), "prompt": text})
    return out


def interleave_categories(questions: list[dict], skip_per_category: int = 0) -> list[str]:
    """Prompts with the categories taking turns (question n of every category,
    then n + 1, ...), starting at each category's question `skip_per_category`:
    a few of them already make a varied set."""
    by_category: dict[str, list[str]] = {}
    for q in questions:
        by_category.setdefault(q["category"], []).append(q["prompt"])
    rounds = max((len(qs) for qs in by_category.values()), default=0)
    return [qs[n] for n in range(skip_per_category, rounds)
            for qs in by_category.values() if n < len(qs)]


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

    @property
    def acceptance_per_position(self) -> tuple[float, ...]:
        """Per draft position i, the share of drafts whose token i was accepted;
        the first is what SWIFT's matchness scores."""
        return tuple(a / max(self.drafts, 1) for a in self.accepted_per_pos)


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


def _pause(worker, what: str, paused: bool) -> bool | None:
    """On one worker: None without a layer-skip proposer, else what its setter says
    (set_drafting_paused returns None: taken as done)."""
    drafter = getattr(worker.model_runner, "drafter", None)
    setter = getattr(drafter, f"set_{what}_paused", None)
    if setter is None:
        return None
    done = setter(paused)
    return True if done is None else done


# Set to "1" in a server's environment, its engine starts with drafting paused
# (the proposer reads it once): `vllm serve` has no collective_rpc for
# set_drafting_paused, and a server with the plugin loaded but drafting nothing
# tells what a served method pays beside its drafts (benchmarks/bench_serve.py
# --draft-length paused).
DRAFTING_PAUSED_ENV = "VLLM_LAYERSKIP_DRAFTING_PAUSED"


def drafting_paused_at_start() -> bool:
    """Whether DRAFTING_PAUSED_ENV asks the engine to start paused ("1"; unset,
    empty or "0": no). Any other value raises ValueError: a benchmark that
    meant to pause and did not would measure the wrong server."""
    value = os.environ.get(DRAFTING_PAUSED_ENV, "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"{DRAFTING_PAUSED_ENV}={value!r}: expected 1 (start with drafting "
                         f"paused) or 0 / unset (draft); set it to one of those")
    return value == "1"

_NO_PROPOSER = ("this engine has no vllm-layerskip proposer to pause; start it with "
                "a layer-skip method in speculative_config")


def set_drafting_paused(llm, paused: bool) -> None:
    """Pause or resume a layer-skip engine's drafting on every worker (tensor
    parallel ranks alike): paused, it decodes as plain decoding. Raises
    ValueError for an engine without a layer-skip proposer. Needs
    VLLM_ALLOW_INSECURE_SERIALIZATION=1, as proposer_stats does."""
    if None in llm.collective_rpc(_pause, args=("drafting", paused)):
        raise ValueError(_NO_PROPOSER)


def set_prompt_lookup_paused(llm, paused: bool) -> None:
    """Pause or resume copies (prompt lookup, or the suffix tree) on every
    worker: paused, the method self-drafts alone, as with `prompt_lookup_max` 0.
    Raises ValueError for an engine without a layer-skip proposer or without copies."""
    done = llm.collective_rpc(_pause, args=("prompt_lookup", paused))
    if None in done:
        raise ValueError(_NO_PROPOSER)
    if not all(done):
        raise ValueError("prompt lookup is off in this engine, so there is nothing to pause: "
                         "start it with prompt_lookup_max (and prompt_lookup_min) set")
