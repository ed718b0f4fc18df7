"""A never-quantized proxy of a checkpoint that was dequantized from 4 bits.

Qwen2.5-Coder-1.5B-Instruct here comes from a Q4_K_M GGUF: most groups of 32
weights of its linear layers hold at most 16 levels, and the int4 draft copy
finds that grid (`draft_weights_grid` "auto"), so its drafts read weights within
bf16 rounding of the model's own. A checkpoint that was never quantized has no
grid. This writes a copy of the checkpoint in which every group on such a grid
gets uniform noise of plus or minus half its grid step: a statistically plausible
stand-in for the weights before quantization (round-to-nearest leaves each
original weight within half a step of its level), with no grid left to find.

`--check` compares the two models' next-token loss and top-1 agreement on text
neither was tuned on (this repository's own Python files), so that the proxy's
quality is known before its speed is.

    .venv/bin/python benchmarks/analysis/dithered_checkpoint.py \\
        --model qwen2.5-coder-1.5b --out ~/.cache/vllm_layerskip/Qwen2.5-Coder-1.5B-Instruct-dithered --check
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import sys

BENCHMARKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(BENCHMARKS)
sys.path[:0] = [ROOT, BENCHMARKS]

GROUP = 32  # the int4 copy's group size (core/draft_weights.py)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b",
                   help="a checkpoint directory or a name `vllm-layerskip prepare-model` knows")
    p.add_argument("--out", required=True, help="directory for the dithered copy")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check", action="store_true",
                   help="also compare the two models' loss on the repository's Python files")
    p.add_argument("--check-tokens", type=int, default=4096, help="tokens --check scores")
    return p.parse_args(argv)


def dither(weight, generator):
    """(dithered weight, groups dithered, groups): noise of +-step/2 in each
    group of 32 input weights that lies on a grid of at most 16 levels."""
    import torch

    from vllm_layerskip.core.draft_weights import _grid_steps

    rows, cols = weight.shape
    if cols % GROUP:
        return weight, 0, 0
    groups = weight.float().reshape(-1, GROUP)
    low = groups.amin(dim=-1, keepdim=True)
    span = groups.amax(dim=-1, keepdim=True) - low
    step, found = _grid_steps(groups, low, span)
    noise = (torch.rand(groups.shape, generator=generator) - 0.5) * step
    out = torch.where(found, groups + noise, groups)
    return out.reshape(rows, cols).to(weight.dtype), int(found.sum()), groups.shape[0]


def write_copy(src: str, dst: str, seed: int) -> dict:
    import torch
    from safetensors.torch import load_file, save_file

    os.makedirs(dst, exist_ok=True)
    for name in os.listdir(src):
        path = os.path.join(src, name)
        if os.path.isfile(path) and not name.endswith(".safetensors"):
            shutil.copy2(path, os.path.join(dst, name))
    generator = torch.Generator().manual_seed(seed)
    dithered = total = 0
    for shard in sorted(glob.glob(os.path.join(src, "*.safetensors"))):
        tensors = load_file(shard)
        for key, tensor in tensors.items():
            if key.startswith("model.layers.") and key.endswith("proj.weight"):
                tensors[key], d, t = dither(tensor, generator)
                dithered, total = dithered + d, total + t
        save_file(tensors, os.path.join(dst, os.path.basename(shard)), metadata={"format": "pt"})
    return {"groups_dithered": dithered, "groups": total}


def grid_left(path: str) -> float:
    """Share of the decoder's linear weights in which the int4 copy (`"auto"`)
    looks for a grid: those whose sampled groups mostly lie on one."""
    from safetensors.torch import load_file

    from vllm_layerskip.core.draft_weights import _shows_grid

    hits = seen = 0
    for shard in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        for key, tensor in load_file(shard).items():
            if key.startswith("model.layers.") and key.endswith("proj.weight"):
                groups = tensor.float().reshape(-1, GROUP)
                low = groups.amin(dim=-1, keepdim=True)
                hits += _shows_grid(groups, low, groups.amax(dim=-1, keepdim=True) - low)
                seen += 1
    return hits / max(seen, 1)


def check(original: str, dithered: str, num_tokens: int) -> dict:
    """Loss and top-1 agreement of both models on this repository's Python files."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(original)
    text = "\n\n".join(open(f).read() for f in sorted(glob.glob(
        os.path.join(ROOT, "vllm_layerskip", "core", "*.py"))))
    ids = tok(text, return_tensors="pt").input_ids[:, :num_tokens]
    chunks = ids.split(1024, dim=1)
    result = {}
    for label, path in (("original", original), ("dithered", dithered)):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
        nll, top1 = [], []
        with torch.inference_mode():
            for chunk in chunks:
                logits = model(chunk).logits[0, :-1].float()
                nll.append(torch.nn.functional.cross_entropy(logits, chunk[0, 1:], reduction="none"))
                top1.append(logits.argmax(-1))
        result[label] = {"nll": float(torch.cat(nll).mean()), "top1": torch.cat(top1)}
        del model
    agree = float((result["original"]["top1"] == result["dithered"]["top1"]).float().mean())
    return {"tokens": int(ids.shape[1]), "nll_original": result["original"]["nll"],
            "nll_dithered": result["dithered"]["nll"], "top1_agreement": agree}


def main(argv=None) -> None:
    args = parse_args(argv)
    from benchlib.engines import model_path

    src = os.path.expanduser(model_path(args.model))
    dst = os.path.expanduser(args.out)
    report = {"model": src, "out": dst, "seed": args.seed, **write_copy(src, dst, args.seed)}
    report["layers_with_a_grid_before"] = grid_left(src)
    report["layers_with_a_grid_after"] = grid_left(dst)
    if args.check:
        report.update(check(src, dst, args.check_tokens))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
