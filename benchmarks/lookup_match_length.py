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

    .venv/bin/python benchmarks/lookup_match_length.py benchmarks/results/2026-11-28/bench_20261128-182920.json \\
        --model ~/.cache/vllm_layerskip/SmolLM2-135M-Instruct
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

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
            accepted = accepted_length(draft, truth)
            row = by_n.setdefault(n, [0, np.zeros(k), np.zeros(k)])
            row[0] += 1
            row[1][: min(accepted + 1, len(truth))] += 1
            row[2][:accepted] += 1
    return by_n


def table(by_n: dict, k: int) -> str:
    lines = ["| matched n | drafts | acceptance by position | tokens accepted of a "
             f"{k}-token draft |", "|---:|---:|---|---:|"]
    for n in sorted(by_n):
        drafts, offered, accepted = by_n[n]
        rates = accepted / np.maximum(offered, 1)
        lines.append(f"| {n} | {drafts} | {' '.join(f'{r:.2f}' for r in rates)} | "
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
    args = p.parse_args(argv)
    if not 1 <= args.min_n <= args.max_n:
        sys.exit(f"--min-n {args.min_n} / --max-n {args.max_n}: need 1 <= min <= max")

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
    print(table(replay(outputs, args.max_n, args.min_n, args.k), args.k))


if __name__ == "__main__":
    main()
