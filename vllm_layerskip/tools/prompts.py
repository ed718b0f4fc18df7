"""Prompts: the project's own (tools/data/prompts.jsonl: chat, code, code edits,
math, summaries, extraction, document QA, translation; written for this project)
for the demo, the tests and `draft-vocab`; and Spec-Bench's questions, the
benchmarks' dataset, which the repository does not ship.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

OWNED_PROMPTS = Path(__file__).parent / "data" / "prompts.jsonl"
SPEC_BENCH_ENV = "SPEC_BENCH_QUESTIONS"
# Where this workplace keeps Spec-Bench beside a checkout (benchmarks only).
SPEC_BENCH_BESIDE_CHECKOUT = Path(__file__).resolve().parents[3] / "shared" / "data" / "spec_bench" / "question.jsonl"
SPEC_BENCH_SOURCE = ("Spec-Bench's question.jsonl (Apache-2.0), from "
                     "https://github.com/hemingkx/Spec-Bench (data/spec_bench/question.jsonl)")


def owned_prompts(categories: list[str] | None = None) -> list[dict]:
    """The project's prompts: [{"id", "category", "prompt"}], in file order."""
    rows = [json.loads(line) for line in OWNED_PROMPTS.read_text().splitlines() if line.strip()]
    return [r for r in rows if categories is None or r["category"] in categories]


def spec_bench_path(required: bool = True) -> str | None:
    """Spec-Bench questions: $SPEC_BENCH_QUESTIONS, else beside the checkout."""
    path = os.environ.get(SPEC_BENCH_ENV) or str(SPEC_BENCH_BESIDE_CHECKOUT)
    if os.path.isfile(path):
        return path
    if not required:
        return None
    raise FileNotFoundError(
        f"Spec-Bench questions not found at {path}. Get {SPEC_BENCH_SOURCE} and set "
        f"{SPEC_BENCH_ENV} to its path (or pass --dataset-path)."
    )


def benchmark_dataset(path: str | None = None) -> str:
    """The questions a benchmark prompts with, as a Spec-Bench-format file: the
    path given (--dataset-path), else $SPEC_BENCH_QUESTIONS or the copy beside
    the checkout; if there is none, the project's own prompts written in that
    format to a temporary file, with a notice saying where Spec-Bench is."""
    if path:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"--dataset-path {path} does not exist. Get {SPEC_BENCH_SOURCE}.")
        return path
    found = spec_bench_path(required=False)
    if found:
        return found
    import sys
    import tempfile

    print(f"notice: Spec-Bench questions not found (set {SPEC_BENCH_ENV} or pass --dataset-path; "
          f"get {SPEC_BENCH_SOURCE}); running on the project's own {len(owned_prompts())} "
          "prompts instead, whose figures are not Spec-Bench figures.", file=sys.stderr, flush=True)
    fd, tmp = tempfile.mkstemp(prefix="owned-prompts-", suffix=".jsonl")
    with os.fdopen(fd, "w") as f:
        for row in owned_prompts():
            f.write(json.dumps({"question_id": row["id"], "category": row["category"],
                                "turns": [row["prompt"]]}) + "\n")
    return tmp
