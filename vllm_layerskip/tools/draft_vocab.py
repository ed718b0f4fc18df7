"""`vllm-layerskip draft-vocab`: rank a model's vocabulary for a pruned draft head.

The model answers prompts the project owns (tools/data/prompts.jsonl, or
`--prompts FILE`) greedily, in batches on one vLLM engine; the ranking is

1. special tokens and the chat template's own tokens (every draft keeps them),
2. the ids of those answers by their expected count under the model's own
   next-token distributions: at every answer position, the probabilities of
   its `--top-logprobs` likeliest tokens are added up (soft counts). A draft
   proposes what the model finds likely, chosen or not; argmax counts alone
   saw 1.8k distinct ids in 10k tokens of Qwen2.5-Coder answers, soft counts
   rank tens of thousands of ids from the same answers. Ties: lower id first.
3. the rest of the vocabulary in id order: byte-level BPE vocabularies number
   their tokens in merge order, which follows frequency in the tokenizer's
   training text, a prior for the ids the answers never made likely.

Counts are checkpointed after every batch next to the output
(`OUT.counts.json`, removed once the file is written): the same command
resumes where it stopped.

    vllm-layerskip draft-vocab --model MODEL --size 32768 --out MODEL.draft-vocab.safetensors
"""

from __future__ import annotations

import json
import math
import os
import shlex
import time
from collections import Counter
from pathlib import Path

import torch

from vllm_layerskip.core.draft_vocab import DraftVocab, save_draft_vocab
from vllm_layerskip.core.errors import LayerSkipConfigError
from vllm_layerskip.core.identity import model_identity

DEFAULT_SIZE = 32768


def add_arguments(p) -> None:
    p.add_argument("--model", help="model path (default: SmolLM2-135M-Instruct, converted)")
    p.add_argument("--size", type=int, default=DEFAULT_SIZE,
                   help=f"token ids a draft scores by default with this file (default {DEFAULT_SIZE}); "
                        "the file ranks the whole vocabulary, so any draft_vocab_size works")
    p.add_argument("--out", required=True, help="the draft vocabulary file to write")
    p.add_argument("--prompts", default=None,
                   help="JSONL with a 'prompt' (or Spec-Bench 'turns') per line; default: the "
                        "project's own prompts")
    p.add_argument("--max-tokens", type=int, default=384, help="tokens per answer")
    p.add_argument("--batch", type=int, default=16, help="prompts answered at once")
    p.add_argument("--top-logprobs", type=int, default=20,
                   help="likeliest tokens per answer position whose probabilities are counted")
    p.add_argument("--dtype", default="bfloat16")


def special_and_template_ids(tokenizer) -> list[int]:
    """Token ids every draft vocabulary keeps: the tokenizer's special tokens
    and the tokens its chat template writes around the messages."""
    ids = set(tokenizer.all_special_ids)
    ids |= {i for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items() if t.special}
    if getattr(tokenizer, "chat_template", None):
        filler = "x"
        chat = [{"role": "system", "content": filler}, {"role": "user", "content": filler},
                {"role": "assistant", "content": filler}]
        rendered = tokenizer.apply_chat_template(chat, tokenize=True)
        if isinstance(rendered, dict) or hasattr(rendered, "input_ids"):
            rendered = rendered["input_ids"]
        ids |= set(rendered) - set(tokenizer.encode(filler, add_special_tokens=False))
    return sorted(ids)


def rank(counts: Counter | dict, first: list[int], vocab_size: int) -> torch.Tensor:
    """first, then ids by count (descending, ties by id), then the rest by id."""
    head = list(dict.fromkeys(first))
    seen = set(head)
    by_count = sorted((i for i in counts if i not in seen and 0 <= i < vocab_size),
                      key=lambda i: (-counts[i], i))
    seen.update(by_count)
    rest = [i for i in range(vocab_size) if i not in seen]
    return torch.tensor(head + by_count + rest, dtype=torch.int64)


def run_draft_vocab(args, progress: bool = True) -> DraftVocab:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from tqdm import tqdm
    from vllm import LLM, SamplingParams

    from vllm_layerskip.core.measure import chat_prompts, read_questions, shutdown

    if args.size < 1:
        raise LayerSkipConfigError(f"--size must be a positive number of token ids, got {args.size}.")
    prompt_path = args.prompts
    questions = [q["prompt"] for q in read_questions(prompt_path)]
    out = Path(args.out)
    checkpoint = Path(str(out) + ".counts.json")
    settings = {"model": os.path.basename(str(args.model).rstrip("/")), "prompts": prompt_path,
                "max_tokens": args.max_tokens, "dtype": args.dtype, "top_logprobs": args.top_logprobs}
    done, counts, soft = _load_checkpoint(checkpoint, settings)
    started = time.perf_counter()
    llm = LLM(model=args.model, dtype=args.dtype, enforce_eager=True, seed=0,
              max_model_len=4096, disable_log_stats=True)
    try:
        identity = model_identity(llm.llm_engine.model_config)
        if args.size > identity.vocab_size:
            raise LayerSkipConfigError(
                f"--size {args.size} is larger than the model's vocabulary ({identity.vocab_size}).")
        tokenizer = llm.get_tokenizer()
        texts = chat_prompts(llm, questions)
        params = SamplingParams(temperature=0, max_tokens=args.max_tokens,
                                logprobs=args.top_logprobs or None)
        todo = list(range(done, len(texts)))
        bar = tqdm(total=len(texts), initial=done, unit="prompt", disable=not progress,
                   desc="answering")
        for start in range(0, len(todo), args.batch):
            batch = todo[start:start + args.batch]
            for o in llm.generate([texts[i] for i in batch], params, use_tqdm=False):
                counts.update(o.outputs[0].token_ids)
                for position in o.outputs[0].logprobs or []:
                    for token, lp in position.items():
                        soft[token] = soft.get(token, 0.0) + math.exp(lp.logprob)
            done = batch[-1] + 1
            _save_checkpoint(checkpoint, settings, done, counts, soft)
            bar.update(len(batch))
        bar.close()
        first = special_and_template_ids(tokenizer)
    finally:
        shutdown(llm)
    ranking = rank(soft or counts, first, identity.vocab_size)
    vocab = DraftVocab(
        model=identity, token_ids=ranking, always_included=len(first),
        source={"prompts": _portable(prompt_path), "answers": done, "max_tokens": args.max_tokens,
                "generated_tokens": sum(counts.values()), "distinct_generated": len(counts),
                "top_logprobs": args.top_logprobs, "distinct_likely": len(soft),
                "size": args.size, "seconds_this_run": round(time.perf_counter() - started, 1),
                "command": _command(args)},
    )
    save_draft_vocab(out, vocab)
    checkpoint.unlink(missing_ok=True)  # the counts are in the file now
    covered = sum(c for i, c in counts.items() if i in set(ranking[:args.size].tolist()))
    print(f"wrote {out}: {identity.vocab_size} ids ranked, {len(counts)} distinct ids in "
          f"{sum(counts.values())} generated tokens ({len(soft)} among their top "
          f"{args.top_logprobs}); the first {args.size} cover "
          f"{covered / max(1, sum(counts.values())):.1%} of the generated tokens")
    return vocab


def _load_checkpoint(path: Path, settings: dict) -> tuple[int, Counter, dict]:
    if not path.exists():
        return 0, Counter(), {}
    data = json.loads(path.read_text())
    if data.get("settings") != settings:
        print(f"{path} was made with other settings; starting over", flush=True)
        return 0, Counter(), {}
    print(f"resuming from {path}: {data['done']} prompts answered", flush=True)
    return (int(data["done"]), Counter({int(k): v for k, v in data["counts"].items()}),
            {int(k): v for k, v in data["soft"].items()})


def _save_checkpoint(path: Path, settings: dict, done: int, counts: Counter, soft: dict) -> None:
    from vllm_layerskip.core.versioned_file import write_json_atomic

    write_json_atomic(path, {"settings": settings, "done": done, "counts": dict(counts),
                             "soft": soft})


def _command(args) -> str:
    parts = ["vllm-layerskip", "draft-vocab"]
    for key, value in vars(args).items():
        if key not in ("command",) and value is not None:
            parts += [f"--{key.replace('_', '-')}", _portable(str(value))]
    return shlex.join(parts)


def _portable(value: str) -> str:
    """The owned prompts by their place in the package, not this machine's path."""
    from vllm_layerskip.tools.prompts import OWNED_PROMPTS

    return "<package>/tools/data/prompts.jsonl" if value == str(OWNED_PROMPTS) else value
