"""`vllm-layerskip train-heads`: fit AdaDecode exit heads (Section 2.1).

With the model frozen, learn one d x d transform T(i) per chosen layer i
(initialised to the identity, i.e. the original LM head) so that
softmax(E*(T(i) h_i)) matches the final layer's distribution p*, by
KL(p* || p_i), on hidden states of the model's own greedy generations:

1. generate: greedy answers to chat prompts (HF transformers, batched);
2. collect: one forward over prompt + answer; for every answer position keep
   the residual stream after each chosen layer and the final normed state;
3. train: Adam with a cosine schedule and a short warm-up, mini-batches of
   positions, all heads at once (their losses are independent);
4. report the held-out KL per layer (positions of prompts not trained on)
   before and after, and save the heads with that in the file (heads.py).

Runs the model with HF transformers rather than vLLM: it needs gradients
through the frozen norm and LM head, and per-layer states of whole sequences.
"""

from __future__ import annotations

import argparse
import math
import shlex
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vllm_layerskip.methods.adadecode.heads import ExitHeads, save_heads
from vllm_layerskip.core.errors import LayerSkipConfigError
from vllm_layerskip.core.measure import interleave_categories, read_questions
from vllm_layerskip.core.identity import checkpoint_identity


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="model path (default: SmolLM2-135M-Instruct, converted)")
    parser.add_argument("--prompts",
                        help="prompts: JSON lines ('prompt', or Spec-Bench 'turns'; first turn of "
                             "each) or a text file with one prompt per line (default: the "
                             "project's own prompts)")
    parser.add_argument("--layers", required=True,
                        help="comma-separated exit layers, e.g. 8,15,22 (head i reads the "
                             "residual stream after the first i decoder layers)")
    parser.add_argument("--out", required=True, help="heads file to write (.safetensors)")
    parser.add_argument("--skip-per-category", type=int, default=0,
                        help="jsonl: skip the first N questions of each category (keeps "
                             "them for evaluation)")
    parser.add_argument("--num-prompts", type=int, default=64, help="training prompts")
    parser.add_argument("--heldout-prompts", type=int, default=8,
                        help="further prompts whose positions only measure the KL")
    parser.add_argument("--max-prompt-tokens", type=int, default=384,
                        help="prompts longer than this are left out")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-tokens", type=int, default=64, help="positions per step")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)


def parse_layers(text: str, num_layers: int) -> list[int]:
    try:
        layers = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError as e:
        raise LayerSkipConfigError(f"--layers must be comma-separated integers, got {text!r}.") from e
    bad = [i for i in layers if not 0 < i < num_layers]
    if not layers or bad:
        raise LayerSkipConfigError(
            f"--layers {text!r}: exit layers must be in 1..{num_layers - 1} (the model has "
            f"{num_layers} decoder layers; layer i = after the first i layers)."
        )
    return layers


def read_prompts(path: str, skip_per_category: int, count: int) -> list[str]:
    """`count` prompts from a prompt file (core.measure.read_questions): for JSON
    lines with categories, the categories take turns (question n of every
    category, then n + 1, ...), starting at each category's question
    `skip_per_category`; a text file's lines in order."""
    questions = read_questions(path)
    if not path.endswith(".jsonl"):
        return [q["prompt"] for q in questions][:count]
    return interleave_categories(questions, skip_per_category)[:count]


@dataclass
class States:
    """Per answer position: the stream after each chosen layer and the final state."""

    layer_states: torch.Tensor  # [H, N, d] residual stream after layers[h] layers
    final: torch.Tensor  # [N, d] after the final norm (p* = softmax(lm_head(final)))


@torch.inference_mode()
def generate(model, tokenizer, prompts: list[str], max_new_tokens: int, batch_size: int = 16):
    """Greedy answers; returns (token ids of prompt + answer, prompt length) per prompt."""
    tokenizer.padding_side = "left"
    out = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start:start + batch_size]
        enc = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False)
        gen = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id)
        for n in range(len(chunk)):
            prompt = enc.input_ids[n][enc.attention_mask[n].bool()].tolist()
            answer = gen[n, enc.input_ids.shape[1]:].tolist()
            if tokenizer.eos_token_id in answer:
                answer = answer[:answer.index(tokenizer.eos_token_id) + 1]
            out.append((prompt + answer, len(prompt)))
    return out


@torch.inference_mode()
def collect(model, sequences, layers: list[int]) -> States:
    """States at the positions that predict answer tokens (prompt_len - 1 .. end - 2)."""
    per_layer: list[list[torch.Tensor]] = [[] for _ in layers]
    finals = []
    for ids, prompt_len in sequences:
        if len(ids) <= prompt_len:
            continue
        out = model.model(torch.tensor([ids]), output_hidden_states=True)
        span = slice(prompt_len - 1, len(ids) - 1)
        # hidden_states[i]: the stream after the first i layers (0: embeddings).
        for h, layer in enumerate(layers):
            per_layer[h].append(out.hidden_states[layer][0, span].float())
        finals.append(out.last_hidden_state[0, span].float())
    return States(torch.stack([torch.cat(x) for x in per_layer]), torch.cat(finals))


class HeadLoss:
    """KL(p* || softmax(E*(T h))) per head, E* = the frozen final norm + LM head."""

    def __init__(self, model):
        self.norm = model.model.norm
        self.lm_head = model.lm_head

    def __call__(self, transforms, layer_states, final) -> torch.Tensor:  # [H] mean KL
        target = F.log_softmax(self.lm_head(final).float(), dim=-1)  # [N, V]
        mapped = torch.einsum("hij,hnj->hni", transforms, layer_states)  # T @ h
        logp = F.log_softmax(self.lm_head(self.norm(mapped)).float(), dim=-1)  # [H, N, V]
        kl = (target.exp() * (target - logp)).sum(-1)  # [H, N]
        return kl.mean(-1)


@torch.no_grad()
def heldout_kl(loss: HeadLoss, transforms, states: States, chunk: int = 256) -> list[float]:
    total = torch.zeros(transforms.shape[0])
    n = states.final.shape[0]
    for s in range(0, n, chunk):
        part = slice(s, s + chunk)
        size = states.final[part].shape[0]
        total += loss(transforms, states.layer_states[:, part], states.final[part]) * size
    return (total / n).tolist()


def train(loss: HeadLoss, states: States, steps: int, batch_tokens: int, lr: float, seed: int,
          progress: bool = True) -> torch.Tensor:
    """T for each head, from the identity: Adam, 3% warm-up, cosine decay."""
    num_heads, n, d = states.layer_states.shape
    transforms = torch.eye(d).expand(num_heads, d, d).clone().requires_grad_(True)
    optimizer = torch.optim.Adam([transforms], lr=lr)
    warmup = max(1, round(0.03 * steps))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: (s + 1) / warmup if s < warmup
        else 0.5 * (1 + math.cos(math.pi * (s - warmup) / max(1, steps - warmup))),
    )
    gen = torch.Generator().manual_seed(seed)
    bar = _progress(steps, progress)
    for _ in range(steps):
        batch = torch.randint(n, (min(batch_tokens, n),), generator=gen)
        kl = loss(transforms, states.layer_states[:, batch], states.final[batch])
        optimizer.zero_grad()
        kl.sum().backward()
        optimizer.step()
        schedule.step()
        bar.update(1)
        bar.set_postfix(kl=" ".join(f"{v:.3f}" for v in kl.tolist()))
    bar.close()
    return transforms.detach()


def _progress(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc="training heads", disable=not enabled)


def run_train_heads(args, progress: bool = True) -> ExitHeads:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    torch.manual_seed(args.seed)
    model_path = args.model  # the CLI fills in the default model
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    model.requires_grad_(False)
    identity = checkpoint_identity(str(model_path))
    layers = parse_layers(args.layers, identity.num_layers)

    questions = read_prompts(args.prompts, args.skip_per_category, 4 * (args.num_prompts + args.heldout_prompts))
    chats = [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                           add_generation_prompt=True) for q in questions]
    chats = [c for c in chats if len(tokenizer(c, add_special_tokens=False).input_ids) <= args.max_prompt_tokens]
    chats = chats[: args.num_prompts + args.heldout_prompts]
    if len(chats) <= args.heldout_prompts:
        raise LayerSkipConfigError(
            f"--prompts {args.prompts} gave {len(chats)} usable prompts (at most "
            f"{args.max_prompt_tokens} tokens each); need more than --heldout-prompts "
            f"{args.heldout_prompts}."
        )
    print(f"generating answers to {len(chats)} prompts ({args.max_new_tokens} tokens max) ...", flush=True)
    sequences = generate(model, tokenizer, chats, args.max_new_tokens)
    # Held-out prompts come last: their positions never enter training.
    train_states = collect(model, sequences[: -args.heldout_prompts or None], layers)
    heldout_states = collect(model, sequences[-args.heldout_prompts:], layers) if args.heldout_prompts else train_states
    print(f"{train_states.final.shape[0]} training positions, {heldout_states.final.shape[0]} held out", flush=True)

    loss = HeadLoss(model)
    identity_heads = ExitHeads.identity(identity, layers)
    before = heldout_kl(loss, identity_heads.transforms, heldout_states)
    transforms = train(loss, train_states, args.steps, args.batch_tokens, args.lr, args.seed, progress)
    after = heldout_kl(loss, transforms, heldout_states)
    seconds = time.perf_counter() - started

    print(f"{'layer':>6} {'held-out KL before':>20} {'after':>8}")
    for layer, b, a in zip(layers, before, after):
        print(f"{layer:>6} {b:>20.4f} {a:>8.4f}")
    heads = ExitHeads(
        model=identity, layers=layers, transforms=transforms,
        training={
            "prompts": args.prompts, "skip_per_category": args.skip_per_category,
            "num_prompts": len(chats) - args.heldout_prompts, "heldout_prompts": args.heldout_prompts,
            "max_new_tokens": args.max_new_tokens, "positions": int(train_states.final.shape[0]),
            "steps": args.steps, "batch_tokens": args.batch_tokens, "lr": args.lr, "seed": args.seed,
            "seconds": round(seconds, 1), "command": _command(args),
        },
        heldout_kl={"before": before, "after": after},
    )
    save_heads(args.out, heads)
    print(f"wrote {args.out} ({seconds:.0f} s)")
    return heads


def _command(args) -> str:
    parts = ["vllm-layerskip", "train-heads"]
    for key, value in vars(args).items():
        if key != "command" and value is not None:
            parts += [f"--{key.replace('_', '-')}", str(value)]
    return shlex.join(parts)
