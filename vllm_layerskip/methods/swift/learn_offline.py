"""`vllm-layerskip learn-swift-set`: SWIFT's optimizer run to the end offline, the
set it learns at a fixed size written to a state file (the files shipped in
methods/swift/shipped/ come from it).

While serving, `swift` scores one candidate set per decoding step within
`max_optimizer_share` (1% by default), so on a slow CPU a run of a few hundred
tokens ends before it has scored many (2 candidates in 384 tokens on
Qwen2.5-Coder-1.5B). This command gives the optimizer every step (share 1, as in
the paper) on the project's own prompts or `--prompts`, with every 2nd candidate
from the Gaussian process (`--bo-interval`; the paper's 25, random-heavy, settled
at a set 1.25x the evenly spread set's M at K = 8, every 2nd went on to 1.51x),
the set size fixed (no lowering of r on low acceptance) and no prompt lookup. It
stops when the optimizer does (patience, or the step limit) or the prompts run
out, prints the learned set as `--layer-skip-sets` JSON for bench_methods.py and
leaves the state file, which `swift` loads with `"state_file"`. `--resume` goes
on from an earlier run's state file (its best set and every candidate it
scored), on other text with `--prompts` (e.g. Spec-Bench questions past the ones
a benchmark measures on):

    vllm-layerskip learn-swift-set --model ~/.cache/vllm_layerskip/Qwen2.5-Coder-1.5B-Instruct \\
        --dtype bfloat16 --out swift-qwen.state.json
    vllm-layerskip learn-swift-set --model ... --resume swift-qwen.state.json \\
        --prompts question.jsonl --skip-per-category 5 --out swift-qwen-round2.state.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below {minimum}")
        return value
    return parse


def _ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(
            f"{value:g} is not in (0, 1): the share of the sub-layers the draft skips")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    positive = _at_least(1)
    parser.add_argument("--model", help="model path (default: SmolLM2-135M-Instruct, converted)")
    parser.add_argument("--out", required=True, help="the SWIFT state file to write (JSON)")
    parser.add_argument("--skip-ratio", type=_ratio, default=0.45, help="swift's r (its default)")
    parser.add_argument("--k", type=positive, default=3, help="draft length, fixed")
    parser.add_argument("--batch", type=positive, default=4,
                        help="requests generated together: a scoring pass covers the "
                             "recent tokens of all of them")
    parser.add_argument("--rounds", type=positive, default=6, help="most batches of prompts")
    parser.add_argument("--max-tokens", type=positive, default=96, help="new tokens per prompt")
    parser.add_argument("--patience", type=positive, default=150,
                        help="candidates without a better set before the optimizer stops")
    parser.add_argument("--max-steps", type=positive, default=400, help="most candidates scored")
    parser.add_argument("--max-score-tokens", type=positive, default=64,
                        help="tokens one scoring pass covers (cost of a candidate)")
    parser.add_argument("--confirm-duels", type=_at_least(0), default=2,
                        help="fresh windows a challenger must also win before it replaces "
                             "the best set (swift's default; 0: the paper's single duel)")
    parser.add_argument("--bo-interval", type=positive, default=2, metavar="BETA",
                        help="every BETA-th candidate from Bayesian optimization, the "
                             "others random (swift's bo_interval). 2, not the paper's 25 "
                             "(swift's default while serving, where the Gaussian process's "
                             "CPU time counts against max_optimizer_share): resumed from "
                             "the set it kept at 25, it found a set at 1.51x the evenly "
                             "spread set's M at K = 8 where 25 had found none better in 350 "
                             "candidates (benchmarks/results/2026-12-01/set_acceptance_bo2_20261201.md)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--resume", metavar="STATE",
                        help="an earlier run's state file to go on from (copied to --out; "
                             "it is not changed)")
    parser.add_argument("--prompts", help="JSON lines (`prompt`, or Spec-Bench `turns`, and "
                        "`category`); default: the project's own prompts")
    parser.add_argument("--skip-per-category", type=_at_least(0), default=0,
                        help="leave out the first N prompts of every category (the ones a "
                             "benchmark measures on)")


def _score(matchness: float | None) -> str:
    return "not scored" if matchness is None else f"{matchness:.3f}"  # None: resumed


def copy_state_to_resume(source: str, out: str) -> None:
    """Copies an earlier run's state file to `out`, marked as still optimizing.

    A run that stopped by patience marked its state finished, and swift loads
    such a file as a learned set to draft with, not to go on from: resumed
    as it was, a run scored no candidate at all."""
    from vllm_layerskip.core.versioned_file import write_json_atomic

    try:
        with open(source) as f:
            state = json.load(f)
    except (OSError, ValueError) as e:
        state = e
    if not isinstance(state, dict):
        sys.exit(f"--resume {source}: not a SWIFT state file ({state!r:.200}); give the "
                 "state file an earlier learn-swift-set run wrote with --out")
    state["optimization_finished"] = False
    write_json_atomic(out, state)  # as swift writes its state file


def learning_spec(args: argparse.Namespace) -> dict:
    """The speculative config of the learning engine: every step scores a candidate."""
    return {"method": "swift", "num_speculative_tokens": args.k, "skip_ratio": args.skip_ratio,
            "adaptive_draft_length": False, "prompt_lookup_max": 0, "state_file": args.out,
            "max_optimizer_share": 1.0, "optimize_interval": 1, "target_matchness": 1.0,
            "patience": args.patience, "max_optimization_steps": args.max_steps,
            "acceptance_tolerance": 0.0, "reoptimize_below": 0.0,
            "max_score_tokens": args.max_score_tokens, "confirm_duels": args.confirm_duels,
            "bo_interval": args.bo_interval}


def run_learn_swift_set(args: argparse.Namespace) -> int:
    """Learns the set; args.model and args.prompts are paths (the CLI fills them in)."""
    if os.path.exists(args.out):
        sys.exit(f"{args.out} exists: swift would start from it. Remove it or choose another "
                 "--out (--resume FILE goes on from an earlier run).")
    if args.resume and not os.path.isfile(args.resume):
        sys.exit(f"--resume {args.resume}: no such file (a state file from an earlier run)")
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # proposer_stats
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB; a CPU engine needs a size
    from vllm import LLM, SamplingParams

    from vllm_layerskip.core.measure import (chat_prompts, interleave_categories, proposer_stats,
                                             read_questions, shutdown)

    questions = read_questions(args.prompts)
    if args.resume:
        copy_state_to_resume(args.resume, args.out)
    llm = LLM(model=args.model, speculative_config=learning_spec(args), dtype=args.dtype,
              enforce_eager=True, max_model_len=2048, disable_log_stats=False, seed=0)
    prompts = chat_prompts(llm, interleave_categories(questions, args.skip_per_category))
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    start = time.perf_counter()
    try:
        for round_ in range(args.rounds):
            batch = prompts[round_ * args.batch:(round_ + 1) * args.batch]
            if not batch:
                break
            llm.generate(batch, params, use_tqdm=False)
            s = proposer_stats(llm)["swift"]
            print(f"round {round_ + 1}: {s['optimization_steps']} candidates scored, phase "
                  f"{s['phase']}, matchness best {s['best_matchness']:.3f} (initial set "
                  f"{_score(s['initial_matchness'])}), {s['improvements']} improvements "
                  f"({s['challengers']} challengers, {s['challengers_rejected']} turned down on "
                  f"fresh windows), {time.perf_counter() - start:.0f} s", flush=True)
            if s["phase"] == "accelerating":  # the optimizer stopped
                break
    finally:
        s = proposer_stats(llm)["swift"]
        shutdown(llm)
    print(f"stopped: {s['stop_reason'] or 'prompts used up'}; state file {args.out}")
    print("initial set:", json.dumps(s["initial_set"]))
    print("learned set:", json.dumps(s["best_set"]))
    return 0
