"""The shared draft engine: the target model, run with a mask of skipped sub-layers.

After each verify step, vLLM's runner hands us the tokens it just sampled. For
every request that sampled one, the draft pass runs K one-token decode steps
through the kept sub-layers of the target itself:

- step j feeds the token at position p + j (p: the request's last sampled token)
  and predicts the token at p + j + 1;
- kept attention layers read the target's paged KV cache (positions < p hold the
  full model's KV) and write the draft's own K/V at p + j into the lookahead slot
  vLLM allocated there (see patches/config.py); the next verify pass overwrites
  those slots with the full model's KV, so drafting needs no KV memory of its own;
- requests stop independently: at their budget (K, or the room left before
  max_model_len) or when the draft's top-1 probability falls under a threshold;
- a request whose draft copied m tokens from its context (prompt lookup) that
  ended before its budget continues it: the first pass feeds p .. p + m in one
  causal query and the steps go on from p + m + 1;
- a method whose draft is not a mask passes its own `DraftPath` (adadecode's
  early exits, methods/adadecode/early_exit.py): the loop, the stopping rules
  and the draft distribution stay the engine's.

Greedy requests take the draft's argmax. Sampled requests (temperature > 0) draw
from the draft distribution q = softmax(logits / T) and q is handed to vLLM's
rejection sampler, which accepts a draft x with probability min(1, p(x) / q(x))
and otherwise resamples from max(0, p - q): the output distribution stays p.
"""

from __future__ import annotations

import numpy as np
import torch
from vllm.forward_context import set_forward_context

from vllm_layerskip.core import categorical
from vllm_layerskip.core.attention_metadata import build_attention_metadata
from vllm_layerskip.core.draft_batch import (
    DraftRequests,
    DraftResult,
    empty_probs,
    query_positions,
    write_one_hot,
)
from vllm_layerskip.core.draft_head import DraftHead
from vllm_layerskip.core.model_adapter import DecoderStack
from vllm_layerskip.core.skip_mask import SkipMask


class DraftPath:
    """How one draft step runs the model for the requests still drafting. The
    engine's default is a skip mask (MaskedPath); a method that drafts some
    other way (early exits) implements `forward` in its own folder."""

    # Whether a copied draft may open the chain: its tokens' K/V must be written
    # in every layer a later draft token reads.
    continues_copies = True

    def start(self, num_requests: int) -> None:
        """A new draft chain for `num_requests` requests (DraftRequests order)."""

    def forward(self, engine: "DraftEngine", runner, active: np.ndarray, rows: np.ndarray,
                input_ids: np.ndarray, positions: np.ndarray, step: int
                ) -> tuple[torch.Tensor, np.ndarray | None]:
        """[B, V] float32 logits over the draft head's columns for one token of
        each active request (`active`: indices into DraftRequests), and the
        layer each token exited at ([B], 0: no token, the request stops), or
        None where every token ran the whole path."""
        raise NotImplementedError


class MaskedPath(DraftPath):
    """The kept sub-layers of a skip mask, every token the same."""

    def __init__(self, mask: SkipMask):
        self.mask = mask

    def forward(self, engine, runner, active, rows, input_ids, positions, step):
        return engine.forward(runner, rows, input_ids, positions, self.mask, step), None


class DraftEngine:
    def __init__(self, vllm_config, num_speculative_tokens: int):
        self.vllm_config = vllm_config
        self.num_speculative_tokens = num_speculative_tokens
        self.stack: DecoderStack | None = None
        self.head: DraftHead | None = None

    def load_model(self, target_model: torch.nn.Module,
                   draft_token_ids: torch.Tensor | None = None) -> None:
        """`draft_token_ids`: the pruned draft vocabulary ([V_sub] ids), or None for
        the full LM head (draft_head.py)."""
        self.stack = DecoderStack.from_model(target_model)
        self.head = DraftHead(self.stack, draft_token_ids)

    @property
    def num_layers(self) -> int:
        assert self.stack is not None, "load_model() has not been called"
        return self.stack.num_layers

    # ---- which requests draft -------------------------------------------------

    def select_requests(self, runner, sampled_token_ids: list[list[int]]) -> DraftRequests:
        batch = runner.input_batch
        # A request drafts once it has a freshly sampled token: rows still in a
        # chunked prefill (or whose sample was discarded) have none this step.
        rows = [i for i, ids in enumerate(sampled_token_ids[: batch.num_reqs]) if ids]
        # Per row in Python, arrays once at the end: numpy's fancy indexing took
        # 74 us a step here at batch 1 (SmolLM2, 2 cores; caches cold after the
        # forward pass), this ~4x less; batches are at most a few hundred rows.
        num_tokens, token_ids, temperatures = (
            batch.num_tokens_no_spec, batch.token_ids_cpu, batch.temperature_cpu)
        last_position = [int(num_tokens[r]) - 1 for r in rows]
        # Draft step j writes KV at p + j and predicts p + j + 1, which must stay
        # below max_model_len.
        most, k = runner.max_model_len - 1, self.num_speculative_tokens
        return DraftRequests(
            np.array(rows, dtype=np.int64),
            np.array([int(token_ids[r, p]) for r, p in zip(rows, last_position)], dtype=np.int64),
            np.array(last_position, dtype=np.int64),
            np.array([min(max(most - p, 0), k) for p in last_position], dtype=np.int64),
            np.array([float(temperatures[r]) for r in rows], dtype=np.float32))

    # ---- the draft loop -------------------------------------------------------

    @torch.inference_mode()
    def draft(
        self,
        runner,
        requests: DraftRequests,
        mask: SkipMask | None = None,
        confidence_threshold: float = 0.0,
        path: DraftPath | None = None,  # None: MaskedPath(mask)
    ) -> DraftResult:
        assert self.stack is not None, "load_model() has not been called"
        path = MaskedPath(mask) if path is None else path
        num_reqs = runner.input_batch.num_reqs
        k = self.num_speculative_tokens
        drafts: list[list[int]] = [[] for _ in range(num_reqs)]
        top1s: list[list[float]] = [[] for _ in range(num_reqs)]
        exits: list[list[int]] = [[] for _ in range(num_reqs)]
        path.start(len(requests.rows))
        sampled_rows = requests.temperature > 0
        probs = None
        # Only when a sampled request may draft: with the cost model's k = 0 this
        # would zero num_reqs x K x vocab floats every step for nothing.
        if (sampled_rows & (requests.budget > 0)).any():
            probs = empty_probs(runner, k)

        # Continuing a copied draft: its tokens open the request's draft (q one-hot
        # there, as for any copied draft) and the first pass feeds them all.
        copied = [np.zeros(0, dtype=np.int64)] * len(requests.rows)
        if requests.prefix is not None:
            if not path.continues_copies:
                raise ValueError(f"{type(path).__name__} drafts cannot continue a copied "
                                 "draft: a copied token's KV would be missing in layers it "
                                 "does not run")
            copied = [np.asarray(c, dtype=np.int64) for c in requests.prefix]
            for idx, c in enumerate(copied):
                if not len(c):
                    continue
                row = int(requests.rows[idx])
                drafts[row] = c.tolist()
                top1s[row] = [1.0] * len(c)
                if probs is not None and sampled_rows[idx]:
                    write_one_hot(probs, row, c)
        num_copied = np.array([len(c) for c in copied], dtype=np.int64)

        active = np.flatnonzero(requests.budget > num_copied)  # indices into `requests`
        tokens = requests.last_token.copy()
        steps = rows_run = 0
        reports_exits = False  # the path says where tokens exited (early exit)
        for step in range(k):
            if active.size == 0:
                break
            # Step j of a request with m copied tokens feeds position p + m + j.
            positions = requests.last_position[active] + num_copied[active] + step
            if step == 0 and num_copied[active].any():
                logits = self.forward_continuing(
                    runner, requests.rows[active], tokens[active],
                    requests.last_position[active], [copied[i] for i in active], path.mask,
                )
                exit_layer = None
                rows_run += int(num_copied[active].sum())  # the copied tokens it also ran
            else:
                logits, exit_layer = path.forward(self, runner, active, requests.rows[active],
                                                  tokens[active], positions, step)
                reports_exits = reports_exits or exit_layer is not None
            columns, top1, q = self._choose(
                logits, requests.temperature[active], requests.rows[active], runner
            )
            new_tokens = self.head.to_token_ids(torch.from_numpy(columns)).numpy()
            steps += 1
            rows_run += active.size
            keep = []
            for n, idx in enumerate(active):
                row = int(requests.rows[idx])
                if exit_layer is not None:
                    if exit_layer[n] == 0:  # the path made no token: the draft stops
                        continue
                    exits[row].append(int(exit_layer[n]))
                drafts[row].append(int(new_tokens[n]))
                top1s[row].append(float(top1[n]))
                if q is not None and sampled_rows[idx]:
                    self.head.scatter(q[n], probs[row, num_copied[idx] + step])
                tokens[idx] = new_tokens[n]
                done = (
                    len(drafts[row]) >= requests.budget[idx]
                    or top1[n] < confidence_threshold
                )
                if not done:
                    keep.append(idx)
            active = np.array(keep, dtype=np.int64)
        return DraftResult(drafts, probs, steps, top1s, exits if reports_exits else [], rows_run)

    def forward(
        self,
        runner,
        rows: np.ndarray,  # [B] input-batch rows
        input_ids: np.ndarray,  # [B]
        positions: np.ndarray,  # [B]
        mask: SkipMask,
        draft_index: int = 0,
        write_kv: bool | tuple[bool, ...] = True,  # all layers, or [num_layers]
    ) -> torch.Tensor:  # [B, V] float32 logits over the draft head's columns
        """One decode-shaped pass (one token per request) through the kept layers.

        A layer whose `write_kv` is False writes nothing to the KV cache: its
        attention still reads the cache at the given positions, which suits
        re-scoring tokens whose KV the target already computed.
        """
        device = runner.device
        attn_metadata, slot_mapping = self.decode_metadata(
            runner, rows, positions, draft_index, write_kv
        )
        ids_t = torch.from_numpy(input_ids).to(device=device, dtype=torch.int64)
        pos_t = torch.from_numpy(positions).to(device=device, dtype=torch.int64)
        with set_forward_context(
            attn_metadata,
            self.vllm_config,
            num_tokens=len(rows),
            slot_mapping=slot_mapping,
        ):
            hidden = self.stack.forward_masked(ids_t, pos_t, mask.run_attn, mask.run_mlp)
            return self.head.logits(hidden)

    def forward_queries(
        self,
        runner,
        rows: np.ndarray,  # [B] input-batch rows
        query_lens: np.ndarray,  # [B] tokens of each request's causal query
        input_ids: np.ndarray,  # [sum(query_lens)] query by query
        positions: np.ndarray,  # [sum(query_lens)]
        mask: SkipMask,
        write_kv: bool,
        last_only: bool = False,
    ) -> torch.Tensor:  # [sum(query_lens) or B, V] float32 logits
        """One pass of multi-token causal queries through the kept layers (with
        `write_kv` False it writes no KV: its attention reads the cache, e.g.
        at positions the target already wrote). `last_only`: the logits at each
        query's last token only."""
        device = runner.device
        attn_metadata, slot_mapping = self.attention_metadata(
            runner, rows, query_lens, positions, write_kv=write_kv
        )
        ids_t = torch.from_numpy(input_ids.astype(np.int64)).to(device)
        pos_t = torch.from_numpy(positions.astype(np.int64)).to(device)
        with set_forward_context(
            attn_metadata, self.vllm_config, num_tokens=len(positions), slot_mapping=slot_mapping
        ):
            hidden = self.stack.forward_masked(ids_t, pos_t, mask.run_attn, mask.run_mlp)
            if last_only:
                hidden = hidden[torch.from_numpy(np.cumsum(query_lens) - 1).to(device)]
            return self.head.logits(hidden)

    def forward_continuing(
        self,
        runner,
        rows: np.ndarray,  # [B] input-batch rows
        last_tokens: np.ndarray,  # [B] the token just sampled
        last_positions: np.ndarray,  # [B] its position p
        copied: list[np.ndarray],  # [B] copied draft tokens after it (may be empty)
        mask: SkipMask,
    ) -> torch.Tensor:  # [B, V] float32 logits at each request's last token
        """The first draft pass of requests that continue a copied draft: each
        feeds its sampled token and its copied tokens (positions p .. p + m) in
        one causal query, writing their K/V where a one-token draft step would
        have, and predicts from the last of them. Requests without copied tokens
        are one-token queries in the same pass."""
        query_lens = np.array([1 + len(c) for c in copied], dtype=np.int64)
        positions = query_positions(last_positions, query_lens)
        input_ids = np.concatenate([np.concatenate([[t], c]) for t, c in zip(last_tokens, copied)])
        return self.forward_queries(runner, rows, query_lens, input_ids, positions, mask,
                                    write_kv=True, last_only=True)

    def decode_metadata(self, runner, rows, positions, draft_index, write_kv):
        """Per-layer attention metadata and KV slots for one token per request."""
        return self.attention_metadata(
            runner, rows, np.ones(len(rows), dtype=np.int64), positions, write_kv, draft_index
        )

    def attention_metadata(self, runner, rows, query_lens, positions, write_kv, draft_index=None):
        if isinstance(write_kv, bool):
            write_kv = (write_kv,) * self.num_layers
        return build_attention_metadata(runner, rows, query_lens, positions, write_kv, draft_index)

    @staticmethod
    def _choose(logits, temperature, rows, runner):
        """Pick each row's draft token: argmax if greedy, else a draw from q."""
        greedy_probs = torch.softmax(logits, dim=-1)
        top1, argmax = greedy_probs.max(dim=-1)
        if not (temperature > 0).any():
            return argmax.cpu().numpy(), top1.cpu().numpy(), None
        temp = torch.from_numpy(np.where(temperature > 0, temperature, 1.0)).to(logits.device)
        q = torch.softmax(logits / temp.unsqueeze(1), dim=-1)
        # Two uniforms a row, not one per vocabulary entry (categorical.py: at
        # 8 requests and 65,536 ids 0.55 ms a draft token instead of 13.3 ms).
        drawn = categorical.draw(q, categorical.uniforms(rows, runner.input_batch.generators,
                                                         q.device))
        is_sampled = torch.from_numpy(temperature > 0).to(logits.device)
        tokens = torch.where(is_sampled, drawn, argmax)
        top1 = torch.where(is_sampled, q.max(dim=-1).values, top1)
        return tokens.cpu().numpy(), top1.cpu().numpy(), q
