"""The pruned draft head on a GPU: a draft token's LM-head time with the full
vocabulary and with a frequency-ranked subset, at the shapes of real models.

Needs a CUDA GPU. Runs core/draft_head.py's DraftHead itself (logits and the
argmax mapped back to vocabulary ids) on random bf16 weights of each model's
head shape, so the figures are the head's alone: how much of a draft step's
head time a pruned vocabulary saves, before the layers' time is added. Also the
one-off cost the head used to pay per call before it kept its id table on the
device (a pageable host-to-device copy of the ids).

    python benchmarks/bench_draft_head_gpu.py --out benchmarks/results/draft_head_h200.md

Times are medians of triton.testing.do_bench, in microseconds.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from vllm_layerskip.core.draft_head import DraftHead  # noqa: E402

# (model, vocabulary, hidden size)
SHAPES = [("Qwen2.5-Coder-1.5B", 151_936, 1536), ("Llama-3-8B", 128_256, 4096)]
SUBSETS = (65_536, 32_768)
ROWS = (1, 8)


class _Head(nn.Module):
    """What DraftHead reads of a vLLM model: lm_head.weight and logits_processor."""

    def __init__(self, vocab: int, hidden: int):
        super().__init__()
        self.lm_head = nn.Linear(hidden, vocab, bias=False, device="cuda", dtype=torch.bfloat16)
        self.logits_processor = type("P", (), {"scale": 1.0, "soft_cap": None})()


def _draft_head(model: _Head, token_ids: torch.Tensor | None) -> DraftHead:
    stack = type("Stack", (), {"model": model, "logits": lambda self, h: model.lm_head(h)})()
    return DraftHead(stack, token_ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="also write the table here (markdown)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_draft_head_gpu.py needs a CUDA GPU")
    from triton.testing import do_bench

    def us(fn) -> float:
        return 1000 * do_bench(fn, warmup=25, rep=200)

    lines = [f"Draft LM head on {torch.cuda.get_device_name()}, torch {torch.__version__}, bf16; "
             "microseconds (median of do_bench): logits + argmax + ids", "",
             "| model | rows | full head | " + " | ".join(f"{n} ids | saved" for n in SUBSETS) + " |",
             "|---|---:|---:|" + "---:|---:|" * len(SUBSETS)]
    for name, vocab, hidden in SHAPES:
        torch.manual_seed(0)
        model = _Head(vocab, hidden)
        heads = {None: _draft_head(model, None)}
        heads.update({n: _draft_head(model, torch.randperm(vocab)[:n]) for n in SUBSETS})
        for rows in ROWS:
            h = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
            t = {n: us(lambda head=head: head.to_token_ids(head.logits(h).argmax(-1)))
                 for n, head in heads.items()}
            cells = " | ".join(f"{t[n]:.1f} | {1 - t[n] / t[None]:.0%}" for n in SUBSETS)
            lines.append(f"| {name} | {rows} | {t[None]:.1f} | {cells} |")
            print(lines[-1], flush=True)
        del heads, model
        torch.cuda.empty_cache()

    ids = torch.randperm(SHAPES[0][1])[:SUBSETS[0]]
    copy = us(lambda: ids.to("cuda"))
    lines += ["", f"A pageable host-to-device copy of {SUBSETS[0]} int64 ids (what "
              f"`to_token_ids`/`scatter` paid per call before the id table stayed on the "
              f"device): {copy:.1f} us"]
    print(lines[-1])
    table = "\n".join(lines)
    print("\n" + table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
