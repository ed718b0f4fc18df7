"""`vllm-layerskip search`: Self-SD's offline Bayesian search of the skip set.

One `layer_skip` engine is built once; every iteration swaps its skip set (on
every worker, through collective_rpc), generates the calibration prompts with a
fixed draft length and scores the set:

- objective "speed" (the paper's): output tokens per second of self-speculative
  generation on the calibration set (= 1 / time per verified token);
- objective "proxy" (for slow or noisy machines): SWIFT's Eq. 6 expected speedup
  E = M alpha / ((M-1) c + alpha) from the measured mean acceptance length M,
  acceptance rate alpha and draft-step cost c (draft step time / rest of a step,
  measured in the same run); timing noise only enters through c.
- objective "acceptance": the mean acceptance length M alone (alpha breaks ties),
  free of timing. At a fixed set size it finds the set that keeps the most of
  the model's tokens, the measure the learned-set comparison uses; it does not
  weigh an MLP's cost against an attention sub-layer's, so it is for comparing
  sets of one size, not for choosing a size (refused with --free-size).

The Gaussian process and the suggestions are core.skip_set_optimizer.BayesianSetOptimizer.
The first candidates are the seed sets (`--init uniform`: the evenly spread set)
and a few random sets. `--strategy swaps` replaces the random sets and the
Gaussian process by a local search: each candidate swaps one skipped sub-layer
of the best set so far for a run one (on Qwen2.5-Coder-1.5B, float32, an
evaluation takes minutes: too few for a Gaussian process over 52 coordinates
to get past random sets, enough to refine a set found otherwise). Every
evaluation is appended to a checkpoint next to the output (`OUT.search.json`);
a later run with the same settings resumes from it.
Ctrl-C stops the search and still writes the profile of the best set so far.

`--validate-prompts N` scores the `--validate-top` best sets once more on the N
prompts that follow the calibration prompts, and the profile takes the best of
them there: near the end of a long local search the calibration prompts are
fitted rather than the model (Qwen2.5-Coder-1.5B, 12 prompts x 32 tokens: a swap
that raised M on them from 3.314 to 3.322 lowered it on 24 held-out prompts from
2.82 to 2.77 at K = 3, and on 17 further prompts from 2.81 to 2.66).
"""

from __future__ import annotations

import datetime
import os
import sys
import time
from pathlib import Path

import numpy as np

from vllm_layerskip.core.errors import LayerSkipConfigError
from vllm_layerskip.core.skip_set_optimizer import BayesianSetOptimizer, Coords, SubLayerSpace
from vllm_layerskip.methods.self_sd.evaluator import Evaluator
from vllm_layerskip.methods.self_sd.objective import rescore
from vllm_layerskip.methods.self_sd.profile import SkipProfile, save_profile
from vllm_layerskip.methods.self_sd.search_candidates import (
    best_coords,
    free_suggestion,
    neighbour,
    random_set,
    seed_set,
)
from vllm_layerskip.methods.self_sd.search_checkpoint import load_checkpoint, save_checkpoint

RANDOM_STARTS = 3


def load_prompts(path: str, n: int) -> list[str]:
    """`n` calibration prompts from a prompt file (core.measure.read_questions),
    the categories taking turns so that a few prompts are already varied."""
    from vllm_layerskip.core.measure import interleave_categories, read_questions

    prompts = interleave_categories(read_questions(path))
    if not prompts:
        raise ValueError(f"{path} holds no prompts")
    return prompts[:n]


def run_search(args) -> SkipProfile:
    from tqdm import tqdm

    from vllm_layerskip.core.identity import model_identity

    model = args.model  # the CLI fills in the default model
    if args.objective == "acceptance" and args.skip_ratio is None:
        # Skipping nothing accepts every token: with a free size, M alone would
        # search its way back to the full model.
        raise LayerSkipConfigError(
            "--objective acceptance compares sets of one size and cannot choose a size: "
            "give --skip-ratio R instead of --free-size, or use --objective proxy")
    strategy = getattr(args, "strategy", "bayes")
    if strategy == "swaps" and args.skip_ratio is None:
        raise LayerSkipConfigError(
            "--strategy swaps keeps the size of its starting set and cannot choose a size: "
            "give --skip-ratio R instead of --free-size, or use --strategy bayes")
    if strategy == "swaps" and args.init == "none" and not getattr(args, "init_from", None):
        raise LayerSkipConfigError(
            "--strategy swaps refines a starting set and was given none: drop --init none, "
            "or give --init-from FILE")
    num_validation = getattr(args, "validate_prompts", 0) or 0
    validate_top = getattr(args, "validate_top", 5)
    if num_validation < 0 or validate_top < 1:
        raise LayerSkipConfigError(
            f"--validate-prompts {num_validation} --validate-top {validate_top}: "
            "give --validate-prompts N >= 0 (0: no validation) and --validate-top T >= 1")
    loaded = load_prompts(args.prompts, args.num_prompts + num_validation)
    prompts, validation = loaded[:args.num_prompts], loaded[args.num_prompts:]
    if num_validation and len(validation) < num_validation:
        raise LayerSkipConfigError(
            f"--validate-prompts {num_validation}: the prompt file has {len(loaded)} prompts, "
            f"{len(validation)} after the {args.num_prompts} calibration prompts; give fewer "
            f"(--validate-prompts {len(validation)} or --num-prompts "
            f"{max(len(loaded) - num_validation, 0)}) or a longer --prompts file")
    settings = {
        "model": os.path.basename(str(model).rstrip("/")), "prompts": args.prompts,
        "num_prompts": len(prompts), "max_tokens": args.max_tokens, "k": args.k,
        "skip_ratio": args.skip_ratio, "objective": args.objective, "seed": args.seed,
        "dtype": args.dtype, "init": args.init,
        "init_from": getattr(args, "init_from", None),
    }
    if strategy != "bayes":  # (checkpoints of Bayesian searches predate the option)
        settings["strategy"] = strategy
    out = Path(args.out)
    checkpoint = Path(str(out) + ".search.json")
    history = load_checkpoint(checkpoint, settings) if args.resume else []
    if history:
        print(f"resuming from {checkpoint}: {len(history)} evaluations", flush=True)

    evaluator = Evaluator(model, prompts, args.k, args.max_tokens, args.dtype, args.max_model_len,
                          validation)
    identity = model_identity(evaluator.llm.llm_engine.model_config)
    space = SubLayerSpace(evaluator.num_layers)
    count = None if args.skip_ratio is None else max(1, round(args.skip_ratio * space.dim))
    bo = BayesianSetOptimizer(space, args.seed)
    rng = np.random.default_rng(args.seed + len(history))
    if history:
        rescore(args.objective, history)
    for h in history:
        bo.register(tuple(h["coords"]), h["value"])
    seeds: list[Coords] = [space.evenly_spread(count or space.dim // 2)] if args.init == "uniform" else []
    seeds += [seed_set(path, space, count) for path in getattr(args, "init_from", None) or []]

    start = time.perf_counter()
    bar = tqdm(total=args.iterations, initial=min(len(history), args.iterations),
               desc="skip-set search", file=sys.stdout)
    try:
        while len(history) < args.iterations:
            i = len(history)
            if i < len(seeds):
                coords = seeds[i]
            elif strategy == "swaps":
                coords = neighbour(space, rng, best_coords(history), history)
            elif i < len(seeds) + RANDOM_STARTS or bo.num_observations == 0:
                coords = random_set(space, rng, count)
            else:
                coords = bo.suggest(count) if count else free_suggestion(bo, space)
            if any(tuple(h["coords"]) == coords for h in history):
                # Greedy evaluation is deterministic: a set already scored would
                # score the same. Try a neighbour of the best set instead.
                coords = neighbour(space, rng, best_coords(history), history)
            result = evaluator.evaluate(space.mask(coords))
            history.append({"coords": list(coords), **result})
            rescore(args.objective, history)
            bo.register(coords, history[-1]["value"])
            value = history[-1]["value"]
            save_checkpoint(checkpoint, settings, history)
            best = max(history, key=lambda h: h["value"])
            bar.update(1)
            bar.set_postfix(best=f"{best['value']:.3f}", last=f"{value:.3f}",
                            M=f"{best['M']:.2f}", alpha=f"{best['alpha']:.2f}")
    except KeyboardInterrupt:
        print("\nstopped: writing the profile of the best set so far", flush=True)
    except BaseException:  # any other exit: nothing to validate, the engine closed
        evaluator.close()
        raise
    finally:
        bar.close()
    try:
        validated = _validate(evaluator, space, history, args.objective,
                              validate_top) if validation and history else []
    finally:
        evaluator.close()
    if not history:
        raise SystemExit("no evaluation finished; nothing to write")

    best = max(history, key=lambda h: h["value"])
    validation_record = None
    if validated:
        chosen = max(validated, key=lambda v: v["value"])
        best = next(h for h in history if h["coords"] == chosen["coords"])
        validation_record = {
            "num_prompts": len(validation), "top": len(validated),
            "sets": [{**space.layer_sets(tuple(v["coords"])), "calibration_value": v["calibration_value"],
                      "value": v["value"], "M": v["M"], "alpha": v["alpha"]} for v in validated],
        }
        print(f"validation on {len(validation)} prompts: the best set on calibration scores "
              f"{validated[0]['value']:.4f}; chosen: {chosen['value']:.4f} (calibration "
              f"{chosen['calibration_value']:.4f})", flush=True)
    sets = space.layer_sets(tuple(best["coords"]))
    profile = SkipProfile(
        model=identity,
        skip_attn=sets["skip_attn"],
        skip_mlp=sets["skip_mlp"],
        objective={"name": args.objective, "value": best["value"], "higher_is_better": True,
                   **{k: best[k] for k in ("tokens_per_second", "M", "alpha", "c",
                                           "expected_speedup")}},
        search={**settings, "iterations": len(history),
                **({"validation": validation_record} if validation_record else {}),
                "seconds_this_run": time.perf_counter() - start,
                "command": " ".join(["vllm-layerskip", *sys.argv[1:]])},
        created=datetime.datetime.now().isoformat(timespec="seconds"),
    )
    save_profile(out, profile)
    print(f"wrote {out}: {len(sets['skip_attn']) + len(sets['skip_mlp'])} sub-layers skipped, "
          f"{args.objective} {best['value']:.4f} (M {best['M']:.2f}, alpha {best['alpha']:.2f})")
    return profile


def _validate(evaluator: Evaluator, space: SubLayerSpace, history: list[dict], objective: str,
              top: int) -> list[dict]:
    """The `top` best distinct sets on calibration, scored on the validation
    prompts (best on calibration first). Ctrl-C keeps the sets scored so far."""
    from tqdm import tqdm

    candidates, seen = [], set()
    for h in sorted(history, key=lambda h: -h["value"]):
        if tuple(h["coords"]) not in seen and len(candidates) < top:
            seen.add(tuple(h["coords"]))
            candidates.append(h)
    results = []
    try:
        for h in tqdm(candidates, desc="validation", file=sys.stdout):
            result = evaluator.evaluate(space.mask(tuple(h["coords"])), validation=True)
            results.append({"coords": h["coords"], "calibration_value": h["value"], **result})
    except KeyboardInterrupt:
        print(f"\nvalidation stopped after {len(results)} of {len(candidates)} sets", flush=True)
    if results:
        rescore(objective, results)
    return results


def add_arguments(p) -> None:
    p.add_argument("--model", help="model path (default: SmolLM2-135M-Instruct, converted)")
    p.add_argument("--prompts", help="calibration prompts: JSON lines ('prompt', 'text' or "
                                     "Spec-Bench 'turns') or plain text lines (default: the "
                                     "project's own prompts, categories taking turns)")
    p.add_argument("--num-prompts", type=int, default=8, help="calibration prompts used (paper: 8)")
    p.add_argument("--max-tokens", type=int, default=48, help="new tokens per prompt")
    p.add_argument("--iterations", type=int, default=200, help="evaluations in all (paper: 1000)")
    p.add_argument("--objective", choices=("speed", "proxy", "acceptance"), default="speed",
                   help="speed: measured tokens/s (the paper's); proxy: Eq. 6 expected "
                        "speedup from measured M, alpha, c (less timing noise); acceptance: "
                        "mean acceptance length M alone, no timing (fixed set size only)")
    p.add_argument("--skip-ratio", type=float, default=0.45,
                   help="search sets of round(r * 2(L-2)) sub-layers; --free-size: any size")
    p.add_argument("--free-size", dest="skip_ratio", action="store_const", const=None,
                   help="let the search choose how many sub-layers to skip (the paper's)")
    p.add_argument("--k", type=int, default=4, help="draft length during the search")
    p.add_argument("--init", choices=("uniform", "none"), default="uniform",
                   help="seed the search with the evenly spread set")
    p.add_argument("--init-from", nargs="+", metavar="FILE",
                   help="also seed the search with the sets of these profiles or SWIFT "
                        "state files")
    p.add_argument("--strategy", choices=("bayes", "swaps"), default="bayes",
                   help="bayes: the seed sets, a few random sets, then Gaussian-process "
                        "suggestions (the paper's); swaps: from the best seed set, each "
                        "candidate swaps one skipped sub-layer for a run one (a local "
                        "search; fixed size only)")
    p.add_argument("--validate-prompts", type=int, default=0, metavar="N",
                   help="after the search, score the --validate-top best sets on the N prompts "
                        "after the calibration prompts and keep the best there (0: off)")
    p.add_argument("--validate-top", type=int, default=5, metavar="T",
                   help="how many of the best sets --validate-prompts scores")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--no-resume", dest="resume", action="store_false",
                   help="ignore an existing checkpoint (OUT.search.json)")
    p.add_argument("--out", required=True, help="profile JSON to write")
