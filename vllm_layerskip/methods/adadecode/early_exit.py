"""AdaDecode's draft path: each token leaves the model at the first confident
exit head, never deeper than the shallowest exit earlier in its chain.

A token that exits at layer e writes its K/V for layers < e only; the next
draft token would read layers >= e at that position, which hold nothing valid.
So within one chain a token may exit no deeper than the shallowest exit before
it (`cap`): every K/V a draft attends to was written by the target or by this
chain, and drafts stay deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from vllm.forward_context import set_forward_context

from vllm_layerskip.core.draft_engine import DraftPath


@dataclass
class EarlyExit:
    """Confidence-gated early exit (AdaDecode): a draft token leaves the model at
    the first head whose top-1 probability exceeds `threshold`; with no
    confident head the request's draft stops there."""

    layers: tuple[int, ...]  # [H] ascending: head h reads the stream after layers[h] layers
    transforms: torch.Tensor  # [H, hidden, hidden] T(i), model dtype and device
    threshold: float


class EarlyExitPath(DraftPath):
    """The engine's draft loop with exits instead of a mask."""

    # An exit head's draft writes no K/V above its exit layer, which the tokens
    # after a continued copy would read.
    continues_copies = False

    def __init__(self, early_exit: EarlyExit, num_layers: int):
        self.early_exit = early_exit
        self.num_layers = num_layers
        self.cap = np.zeros(0, dtype=np.int64)

    def start(self, num_requests: int) -> None:
        # The deepest layer each request's next draft token may reach.
        self.cap = np.full(num_requests, self.num_layers, dtype=np.int64)

    def forward(self, engine, runner, active, rows, input_ids, positions, step):
        logits, exit_layer = forward_early_exit(engine, runner, rows, input_ids, positions,
                                                self.early_exit, self.cap[active], step)
        exited = exit_layer > 0
        self.cap[active[exited]] = exit_layer[exited]
        return logits, exit_layer


@torch.inference_mode()
def forward_early_exit(
    engine,
    runner,
    rows: np.ndarray,  # [B] input-batch rows
    input_ids: np.ndarray,  # [B]
    positions: np.ndarray,  # [B]
    early_exit: EarlyExit,
    exit_cap: np.ndarray,  # [B] deepest exit layer allowed per row
    draft_index: int = 0,
) -> tuple[torch.Tensor, np.ndarray]:  # [B, vocab] float32 logits, [B] exit layer
    """One decode-shaped pass that runs each row only up to its exit head.

    Layers run segment by segment between heads, on the rows still going
    deeper, and write their KV at `positions`. A row exits at the first head
    (at or above no cap) whose top-1 probability exceeds the threshold; its
    logits are that head's, E*(T h). Exit layer 0: no head was confident
    (the row's logits are then meaningless).
    """
    stack, head = engine.stack, engine.head
    device = runner.device
    num = len(rows)
    exit_layer = np.zeros(num, dtype=np.int64)
    logits_out: torch.Tensor | None = None
    going = np.arange(num)  # rows still running, in the order of `hidden`
    pos_all = torch.from_numpy(positions.astype(np.int64)).to(device)
    hidden = stack.embed(torch.from_numpy(input_ids.astype(np.int64)).to(device))
    residual = None
    layers_run = 0
    for h, layer in enumerate(early_exit.layers):
        allowed = exit_cap[going] >= layer
        if not allowed.all():  # rows capped above this head stop here
            keep = torch.from_numpy(allowed).to(device)
            going, hidden = going[allowed], hidden[keep]
            residual = None if residual is None else residual[keep]
        if going.size == 0:
            break
        attn_metadata, slot_mapping = engine.decode_metadata(
            runner, rows[going], positions[going], draft_index, True
        )
        with set_forward_context(
            attn_metadata, engine.vllm_config, num_tokens=len(going), slot_mapping=slot_mapping
        ):
            hidden, residual = stack.run_layers(hidden, residual, pos_all[going], layers_run, layer)
        layers_run = layer
        logits = head.logits(stack.exit_stream(hidden + residual, early_exit.transforms[h]))
        if logits_out is None:
            logits_out = torch.zeros(num, logits.shape[-1], dtype=torch.float32, device=device)
        confident = torch.softmax(logits, dim=-1).amax(dim=-1) > early_exit.threshold
        confident_np = confident.cpu().numpy()
        leaving = going[confident_np]
        logits_out[torch.from_numpy(leaving).to(device)] = logits[confident]
        exit_layer[leaving] = layer
        going, hidden, residual = going[~confident_np], hidden[~confident], residual[~confident]
        if going.size == 0:
            break
    if logits_out is None:  # every row capped below the first head
        width = head.num_columns(runner.model_config.get_vocab_size())
        logits_out = torch.zeros(num, width, dtype=torch.float32, device=device)
    return logits_out, exit_layer
