"""How often a prompt-lookup draft is accepted, by the length n of the n-gram it
matched: replayed offline on plain decoding's greedy outputs from a
bench_methods.py run (its .json keeps every turn's token ids).

At every position of every output the lookup of core/lookup.py runs as the
proposer runs it (the longest suffix n-gram first, from --max-n down to
--min-n; the most recent occurrence in prompt and output so far), and its
continuation is compared with the tokens plain decoding produced next: what a
greedy verification would have accepted. Prints, per matched n, the drafts
found, the acceptance rate of each draft position given the ones before it, and
the mean tokens accepted of a --k token draft.

Why: the cost model keeps one acceptance estimate for all copied drafts. Where a
verified token is not free (8 requests a step here) a long match may pay and a
short one not; these figures say whether the difference is large enough to
weigh them apart.

With --token-cost R (one more verified token's cost over a request's share of a
step: ms per extra token x requests in the step / ms per step) it also decodes
every output again as greedy speculative decoding would, drafting by lookup
alone, under five policies: copy K whenever there is a match (vLLM's `ngram`),
one draft length from the acceptance of all copies (the cost model as built),
one length per matched n, one per (matched n, whether every earlier occurrence
went on alike, how the request's last copy fared), and an oracle that copies
exactly the tokens that will be accepted. Each prints its speedup over plain decoding in that cost
model: what the copies can gain at all at that verify cost. (The rates are the
replay's own, in sample: a bound, not a forecast.)

    .venv/bin/python benchmarks/analysis/lookup_match_length.py benchmarks/results/2026-11-29/bench_20261129-015007.json \\
        --model ~/.cache/vllm_layerskip/Qwen2.5-Coder-1.5B-Instruct --k 8 --token-cost 0.25 0.45
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass

import numpy as np

BENCHMARKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.dirname(BENCHMARKS), BENCHMARKS]  # the checkout, benchlib

from vllm_layerskip.core.lookup import find_continuation  # noqa: E402
from vllm_layerskip.tools.prompts import benchmark_dataset  # noqa: E402


def longest_match(tokens: np.ndarray, max_n: int, min_n: int, k: int) -> tuple[int, np.ndarray]:
    """(n, continuation) of the lookup the proposer makes: the longest n first."""
    for n in range(max_n, min_n - 1, -1):
        continuation = find_continuation(tokens, n, n, k)
        if len(continuation):
            return n, continuation
    return 0, tokens[:0]


def accepted_length(draft: np.ndarray, truth: list[int]) -> int:
    count = 0
    for drafted, produced in zip(draft.tolist(), truth):
        if drafted != produced:
            break
        count += 1
    return count


def replay(outputs: list[tuple[list[int], list[int]]], max_n: int, min_n: int, k: int) -> dict:
    """Per matched n: [drafts, offered per position, accepted per position]."""
    by_n: dict[int, list] = {}
    for prompt, output in outputs:
        context = np.array(prompt + output, dtype=np.int64)
        for j in range(len(output) - 1):  # the draft after output token j
            n, draft = longest_match(context[: len(prompt) + j + 1], max_n, min_n, k)
            truth = output[j + 1: j + 1 + len(draft)]
            if not len(draft) or not truth:
                continue
            count_draft(by_n, n, accepted_length(draft, truth), len(truth), k)
    return by_n


def count_draft(rows: dict, key, accepted: int, offered: int, k: int) -> None:
    """Add one draft to rows[key] = [drafts, offered per position, accepted per
    position]: position i was offered if the i before it were accepted and the
    output went on that far."""
    row = rows.setdefault(key, [0, np.zeros(k), np.zeros(k)])
    row[0] += 1
    row[1][: min(accepted + 1, offered)] += 1
    row[2][:accepted] += 1


def best_length(rates: np.ndarray, token_cost: float) -> int:
    """The draft length that maximizes a request's tokens per unit of time,
    (1 + expected accepted) / (1 + token_cost x length); 0: no draft."""
    gains = np.concatenate([[0.0], np.cumsum(np.cumprod(rates))])
    lengths = np.arange(len(gains))
    return int(np.argmax((1 + gains) / (1 + token_cost * lengths)))


def rates_of(rows: list) -> np.ndarray:
    offered = sum(r[1] for r in rows)
    accepted = sum(r[2] for r in rows)
    return accepted / np.maximum(offered, 1)


def occurrences_agree(context: np.ndarray, n: int) -> bool:
    """Whether every earlier occurrence of the last n tokens went on with the
    same next token (a cheap confidence a proposer could compute)."""
    suffix, length = context[-n:], len(context)
    starts = np.flatnonzero(context[: length - n] == suffix[0])
    following = {int(context[i + n]) for i in starts if np.array_equal(context[i:i + n], suffix)}
    return len(following) <= 1


@dataclass
class Copy:
    """One step's lookup draft, what a policy may know of it, and the tokens it
    will meet (`truth`, which only the oracle reads)."""
    n: int  # the matched n
    agree: bool  # occurrences_agree
    last: str  # the request's previous step: "none" (no copy), "full", "part", "zero"
    draft: np.ndarray
    truth: list

    def key(self) -> tuple:
        return (self.n, self.agree, self.last)


def decode_again(outputs, max_n: int, min_n: int, k: int, length_of,
                 seen: dict | None = None) -> tuple[int, int, int]:
    """Greedy speculative decoding of the outputs with lookup drafts whose
    length `length_of(copy)` picks: (steps, verified draft tokens, steps of
    plain decoding). `seen`, if given, collects per Copy.key() how a whole
    k-token copy would have been accepted (rows as replay's)."""
    steps = drafted = plain = 0
    for prompt, output in outputs:
        context = np.array(prompt + output, dtype=np.int64)
        plain += len(output) - 1  # the first output token comes from the prefill
        j, last = 0, "none"  # output[: j + 1] is decoded
        while j < len(output) - 1:
            known = context[: len(prompt) + j + 1]
            n, draft = longest_match(known, max_n, min_n, k)
            truth = output[j + 1: j + 1 + len(draft)]
            m = accepted = 0
            if len(draft):
                copy = Copy(n, occurrences_agree(known, n), last, draft, truth)
                m = min(length_of(copy), len(truth))
                accepted = accepted_length(draft[:m], truth)
                if seen is not None:
                    count_draft(seen, copy.key(), accepted_length(draft, truth), len(truth), k)
            last = "none" if not m else "full" if accepted == m else "part" if accepted else "zero"
            steps += 1
            drafted += m
            j += accepted + 1
    return steps, drafted, plain


def lengths_by_key(outputs, max_n: int, min_n: int, k: int, token_cost: float) -> dict:
    """A draft length per Copy.key(), from the acceptance each key's copies
    had (in sample). The previous step's outcome depends on the lengths, so
    the rates are gathered again under the lengths they chose, twice."""
    lengths = None
    for _ in range(3):
        seen: dict = {}
        decode_again(outputs, max_n, min_n, k,
                     lambda c: k if lengths is None else lengths.get(c.key(), 0), seen)
        lengths = {key: best_length(rates_of([row]), token_cost) for key, row in seen.items()}
    return lengths


def policies(outputs, by_n: dict, max_n: int, min_n: int, k: int, token_cost: float) -> str:
    pooled = best_length(rates_of(list(by_n.values())), token_cost)
    per_n = {n: best_length(rates_of([row]), token_cost) for n, row in by_n.items()}
    per_key = lengths_by_key(outputs, max_n, min_n, k, token_cost)
    rows = {
        f"copy K = {k} at every match (`ngram`)": lambda c: k,
        f"one length for all copies ({pooled})": lambda c: pooled,
        "a length per matched n (" + ", ".join(f"{n}: {m}" for n, m in sorted(per_n.items()))
        + ")": lambda c: per_n.get(c.n, 0),
        f"a length per (n, occurrences agree, last step's copy): {len(per_key)} classes":
            lambda c: per_key.get(c.key(), 0),
        "oracle: copies exactly the accepted tokens": lambda c: accepted_length(c.draft, c.truth),
    }
    lines = [f"Token cost {token_cost:g} (one more verified token over a request's share of a step)",
             "", "| policy | steps / plain | verified draft tokens | speedup over plain |",
             "|---|---:|---:|---:|"]
    for name, length_of in rows.items():
        steps, drafted, plain = decode_again(outputs, max_n, min_n, k, length_of)
        lines.append(f"| {name} | {steps / plain:.3f} | {drafted} | "
                     f"{plain / (steps + token_cost * drafted):.3f} |")
    return "\n".join(lines)


def table(by_n: dict, k: int) -> str:
    lines = ["| matched n | drafts | acceptance by position | tokens accepted of a "
             f"{k}-token draft |", "|---:|---:|---|---:|"]
    for n in sorted(by_n):
        rates = rates_of([by_n[n]])
        lines.append(f"| {n} | {by_n[n][0]} | {' '.join(f'{r:.2f}' for r in rates)} | "
                     f"{np.cumprod(rates).sum():.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="a bench_methods.py .json (it has plain's token ids)")
    p.add_argument("--model", required=True, help="the run's model (its tokenizer and chat template)")
    p.add_argument("--dataset-path", default=None, help="the run's question file")
    p.add_argument("--max-n", type=int, default=8)
    p.add_argument("--min-n", type=int, default=2)
    p.add_argument("--k", type=int, default=4, help="draft length replayed")
    p.add_argument("--token-cost", type=float, nargs="*", default=[],
                   help="also decode again under five lookup policies at each of these "
                        "verify costs of one more token (see above)")
    args = p.parse_args(argv)
    if not 1 <= args.min_n <= args.max_n:
        sys.exit(f"--min-n {args.min_n} / --max-n {args.max_n}: need 1 <= min <= max")
    if any(c < 0 for c in args.token_cost):
        sys.exit(f"--token-cost {args.token_cost}: a cost is >= 0 (0: a verified token is free)")

    from transformers import AutoTokenizer

    from benchlib.workloads import load_questions

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    questions = load_questions(benchmark_dataset(args.dataset_path))
    with open(args.run) as f:
        turns = json.load(f)["turns"]
    outputs, seen = [], set()
    for turn in turns:
        if turn["family"] != "plain":
            continue
        for q, ids in zip(turn["questions"], turn["token_ids"]):
            if q in seen:
                continue
            seen.add(q)
            text = tokenizer.apply_chat_template([{"role": "user", "content": questions[q]["prompt"]}],
                                                 tokenize=False, add_generation_prompt=True)
            outputs.append((tokenizer(text).input_ids, list(ids)))
    if not outputs:
        sys.exit(f"{args.run}: no plain turns with token ids")
    print(f"{len(outputs)} outputs of plain decoding, {sum(len(o) for _, o in outputs)} tokens; "
          f"lookup n {args.max_n}..{args.min_n}, drafts of {args.k}\n")
    by_n = replay(outputs, args.max_n, args.min_n, args.k)
    print(table(by_n, args.k))
    for token_cost in args.token_cost:
        print()
        print(policies(outputs, by_n, args.max_n, args.min_n, args.k, token_cost))


if __name__ == "__main__":
    main()
