"""Workloads and the interleaved schedule.

Latency mode (concurrency 1): per Spec-Bench category, its questions one request
at a time (or `--batch-size` per call), one block per call. Concurrent mode
(concurrency N): N requests submitted at once, which vLLM's scheduler batches;
prompts are drawn round-robin across categories (the first question of every
category, then the second, ...), so one batch mixes short QA prompts with long
RAG and summarization ones as a server would. Figures in concurrent mode are per
batch, not per category: requests of different categories share every engine
step, so their time cannot be split (and categories with 10 questions cannot
fill a batch of 32 alone).

A batch ends when its slowest request does, so its time is the makespan: a method
that finishes some requests early and none later gains nothing there. Sustained
mode (N in flight, `--workloads 8s:0`) is what `vllm bench serve --max-concurrency
N` measures: a block of 3N questions, N requests in flight, a new one entering as
soon as one finishes, so the engine's batch stays full until the block drains.

Schedule: the unit is a turn = (workload, block, configuration), a block being
one generate call's questions of a category (latency) or one batch (concurrent).
Within a block every configuration runs the same prompts back to back, so slow
drift of the machine hits all of them alike. The order within a block follows a
Williams Latin square: over n blocks (2n for an odd number n of configurations)
each configuration runs in every position equally often and right after every
other configuration equally often, so neither a position (first after a switch
of workload) nor a neighbour (e.g. one whose background optimizer thread is
still finishing) favours one configuration. A plain rotation would keep the
neighbours fixed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

# A sustained block holds this many times the requests in flight: long enough
# that most of it runs with the batch full before it drains.
BLOCK_PER_IN_FLIGHT = 3


@dataclass(frozen=True)
class Workload:
    concurrency: int  # 1: latency mode
    temperature: float
    sustained: bool = False  # N requests kept in flight instead of batches of N

    @classmethod
    def parse(cls, text: str) -> "Workload":
        """'N:T' (batches of N at temperature T; N = 1: batch 1) or 'Ns:T'
        (N requests kept in flight)."""
        n, _, t = text.partition(":")
        sustained = n.endswith("s")
        try:
            workload = cls(int(n[:-1] if sustained else n), float(t), sustained)
        except ValueError:
            raise ValueError(f"workload {text!r}: expected N:T or Ns:T, e.g. 1:0, 8:1, 8s:0") from None
        if workload.concurrency < 1 or (sustained and workload.concurrency < 2):
            raise ValueError(f"workload {text!r}: N must be >= 1 (>= 2 with s)")
        return workload

    @property
    def latency(self) -> bool:
        return self.concurrency == 1

    @property
    def label(self) -> str:
        mode = ("batch 1" if self.latency else f"{self.concurrency} in flight" if self.sustained
                else f"{self.concurrency} concurrent")
        return f"{mode}, T={self.temperature:g}"


@dataclass
class Block:
    category: str  # a Spec-Bench category, or "mixed" for a concurrent batch
    questions: list[int]  # indices into the question list


def load_questions(path: str) -> list[dict]:
    """Every Spec-Bench question (first turn), in file order, with its index
    within its category."""
    out, seen = [], {}
    with open(path) as f:
        for line in f:
            q = json.loads(line)
            rank = seen.get(q["category"], 0)
            seen[q["category"]] = rank + 1
            out.append({"id": q.get("question_id", q.get("id")), "category": q["category"],
                        "rank": rank, "prompt": (q.get("turns") or [q.get("prompt")])[0]})
    return out


def categories_in_order(questions: list[dict]) -> list[str]:
    return list(dict.fromkeys(q["category"] for q in questions))


def latency_blocks(questions: list[dict], per_category: int,
                   categories: list[str] | None = None, batch_size: int = 1) -> list[Block]:
    """One block per generate call: `batch_size` questions of one category.

    Small blocks make every question a paired sample: all configurations run it
    back to back, so a slow stretch of the machine hits them alike, and the
    spread of the per-question ratios gives each category's speedup an interval
    (figures.speedup_intervals). Blocks go question-major (the first question of
    every category, then the second, ...), so each category is spread over the
    whole run, as learning methods and machine drift move along."""
    cats = categories or categories_in_order(questions)
    blocks = []
    for start in range(0, per_category, batch_size):
        for cat in cats:
            chosen = [i for i, q in enumerate(questions) if q["category"] == cat
                      and start <= q["rank"] < min(start + batch_size, per_category)]
            if chosen:
                blocks.append(Block(cat, chosen))
    return blocks


def concurrent_blocks(questions: list[dict], concurrency: int, rounds: int,
                      categories: list[str] | None = None) -> list[Block]:
    """`rounds` batches of `concurrency` distinct questions, categories mixed."""
    cats = categories or categories_in_order(questions)
    order = sorted((i for i, q in enumerate(questions) if q["category"] in cats),
                   key=lambda i: (questions[i]["rank"], cats.index(questions[i]["category"])))
    need = concurrency * rounds
    if need > len(order):
        raise ValueError(f"{need} questions needed for {rounds} x {concurrency} concurrent "
                         f"requests, only {len(order)} available")
    return [Block("mixed", order[r * concurrency:(r + 1) * concurrency]) for r in range(rounds)]


def sustained_blocks(questions: list[dict], in_flight: int, rounds: int,
                     categories: list[str] | None = None) -> list[Block]:
    """`rounds` blocks of BLOCK_PER_IN_FLIGHT x `in_flight` distinct questions,
    categories mixed."""
    return concurrent_blocks(questions, BLOCK_PER_IN_FLIGHT * in_flight, rounds, categories)


def warmup_questions(questions: list[dict], timed: set[int], n: int) -> list[int]:
    """n questions for the untimed warm-up: the shortest prompts outside the timed
    set (no timed prompt is in the prefix cache before its turn, and warming with
    the file's last 32, RAG prompts, took a minute per engine), topped up from the
    timed ones if the file has too few others."""
    spare = sorted((i for i in range(len(questions)) if i not in timed),
                   key=lambda i: (len(questions[i]["prompt"]), i))
    return (spare + sorted(timed))[:n]


def williams_orders(n: int) -> list[list[int]]:
    """Orders of n items, balanced for position and for the preceding item:
    first row 0, 1, n-1, 2, n-2, ...; row r adds r (mod n); for odd n the
    mirrored rows follow."""
    first, lo, hi = [0], 1, n - 1
    while len(first) < n:
        first.append(lo)
        lo += 1
        if len(first) < n:
            first.append(hi)
            hi -= 1
    rows = [[(x + r) % n for x in first] for r in range(n)]
    return rows if n % 2 == 0 else rows + [row[::-1] for row in rows]


def schedule(workloads: list[tuple[Workload, list[Block]]], names: list[str]):
    """(workload, block index, block, configuration name) in run order."""
    orders = williams_orders(len(names))
    turn = 0
    for workload, blocks in workloads:
        for b, block in enumerate(blocks):
            for i in orders[turn % len(orders)]:
                yield workload, b, block, names[i]
            turn += 1
