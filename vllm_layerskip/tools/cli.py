"""`vllm-layerskip` command: prepare a model, run the demo, search and train
what some methods load.

    vllm-layerskip prepare-model [NAME]   # build a known model once, print its path
    vllm-layerskip demo              # plain vs layer_skip on Spec-Bench prompts
    vllm-layerskip search --out P    # Self-SD: Bayesian search of a skip profile
    vllm-layerskip train-heads --prompts F --layers 8,15,22 --out H   # AdaDecode exit heads
    vllm-layerskip draft-vocab --size 32768 --out F   # rank the vocabulary for a pruned draft head
    vllm-layerskip learn-swift-set --out S   # SWIFT: learn a skip set offline, write a state file
    vllm-layerskip recommend --model M [--dtype D] [--max-concurrency N]   # the config to use
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vllm-layerskip", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    from vllm_layerskip.tools import demo as demo_tool
    from vllm_layerskip.tools.prepare_model import CATALOG, DEFAULT_MODEL

    prepare = sub.add_parser(
        "prepare-model", help="build a known model once (cached) and print its path",
        description="Known models: " + "; ".join(f"{m.name}: {m.about}" for m in CATALOG.values()))
    prepare.add_argument("name", nargs="?", default=DEFAULT_MODEL,
                         help=f"one of {', '.join(CATALOG)} (default: {DEFAULT_MODEL})")
    demo = sub.add_parser(
        "demo", help="plain vs speculative decoding, side by side, on a known model",
        description=demo_tool.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    demo.add_argument("--model", help=f"a known model ({', '.join(CATALOG)}; default "
                                      f"{demo_tool.DEFAULT_DEMO_MODEL}) or a model path")
    demo.add_argument("--speculative-config", default=None,
                      help="JSON, as for vllm serve (default: what `vllm-layerskip "
                           "recommend` prints for the model and dtype)")
    demo.add_argument("--dtype", help="default: bfloat16 for qwen2.5-coder-1.5b, float32 for smollm2-135m")
    demo.add_argument("--num-prompts", type=int, default=6)
    demo.add_argument("--max-tokens", type=int, default=None)
    from vllm_layerskip.methods.self_sd.offline_search import add_arguments

    search = sub.add_parser("search", help="Bayesian search of a skip set; writes a profile "
                                           "for method self_sd")
    add_arguments(search)
    from vllm_layerskip.methods.adadecode import training as heads_training

    train_heads = sub.add_parser("train-heads", help="train AdaDecode exit heads (model frozen); "
                                                     "writes a heads file for method adadecode")
    heads_training.add_arguments(train_heads)
    from vllm_layerskip.tools import draft_vocab

    vocab = sub.add_parser("draft-vocab", help="rank the vocabulary by the model's own answers; "
                                               "writes a file for 'draft_vocab'")
    draft_vocab.add_arguments(vocab)
    from vllm_layerskip.methods.swift import learn_offline as swift_learning

    learn_swift = sub.add_parser("learn-swift-set", help="run SWIFT's optimizer to the end offline; "
                                                         "writes a state file for 'state_file'",
                                 description=swift_learning.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    swift_learning.add_arguments(learn_swift)
    from vllm_layerskip.tools import recommend as recommend_tool

    recommend = sub.add_parser(
        "recommend", help="print the speculative config recommended for a model on this machine",
        description=recommend_tool.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    recommend_tool.add_arguments(recommend)
    args = parser.parse_args(argv)

    if args.command == "recommend":
        return recommend_tool.run_recommend(args)

    if args.command in ("train-heads", "search", "draft-vocab", "learn-swift-set"):
        from vllm_layerskip.tools.prepare_model import ensure_default_model
        from vllm_layerskip.tools.prompts import OWNED_PROMPTS

        args.model = args.model or ensure_default_model()
        args.prompts = args.prompts or str(OWNED_PROMPTS)

    if args.command == "learn-swift-set":
        return swift_learning.run_learn_swift_set(args)

    if args.command == "draft-vocab":
        draft_vocab.run_draft_vocab(args)
        return 0

    if args.command == "train-heads":
        heads_training.run_train_heads(args)
        return 0

    if args.command == "search":
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        from vllm_layerskip.methods.self_sd.offline_search import run_search

        run_search(args)
        return 0

    if args.command == "prepare-model":
        from vllm_layerskip.tools.gguf_parts import ModelPreparationError
        from vllm_layerskip.tools.prepare_model import ensure_model

        try:
            path = ensure_model(args.name)
        except ModelPreparationError as e:
            print(f"vllm-layerskip prepare-model: {e}", file=sys.stderr)
            return 1
        print(path)  # the last line: scripts read it
        return 0
    return demo_tool.run_demo(args)


if __name__ == "__main__":
    sys.exit(main())
