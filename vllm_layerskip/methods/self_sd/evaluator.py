"""The engine Self-SD's offline search (`vllm-layerskip search`, offline_search.py)
scores skip sets with: one `layer_skip` engine, built once, whose skip set is
swapped on every worker through collective_rpc; each evaluation generates the
calibration (or validation) prompts with a fixed draft length and measures
tokens per second, M, alpha and the draft-step cost c."""

from __future__ import annotations

import os
import time

from vllm_layerskip.core.skip_mask import sublayer_params


def _set_mask(worker, run_attn, run_mlp):
    from vllm_layerskip.core.skip_mask import SkipMask

    worker.model_runner.drafter.set_mask(SkipMask(tuple(run_attn), tuple(run_mlp)))


def _draft_head_rows(worker):
    head = worker.model_runner.drafter.engine.head
    return head.token_ids.numel() if head.pruned else None


def _drafter_status(worker):
    return worker.model_runner.drafter.status()


class Evaluator:
    """Generates the calibration set with a given skip set and scores it."""

    def __init__(self, model: str, prompts: list[str], k: int, max_tokens: int,
                 dtype: str, max_model_len: int, validation_prompts: list[str] = ()):
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # collective_rpc sends functions
        from vllm import LLM, SamplingParams

        from vllm_layerskip.core.measure import chat_prompts

        # The skip set alone: no drafts copied from the context.
        spec = {"method": "layer_skip", "num_speculative_tokens": k,
                "adaptive_draft_length": False, "sublayer_skip_ratio": 0.0, "prompt_lookup_max": 0}
        self.llm = LLM(model=model, speculative_config=spec, dtype=dtype, enforce_eager=True,
                       max_model_len=max_model_len, disable_log_stats=False, seed=0)
        self.prompts = chat_prompts(self.llm, prompts)
        self.validation_prompts = chat_prompts(self.llm, validation_prompts) if validation_prompts else []
        self.params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        model_config = self.llm.llm_engine.model_config
        self.num_layers = model_config.hf_text_config.num_hidden_layers
        self.sublayer_params = sublayer_params(model_config.hf_text_config)
        # Read by every draft token whatever the set: the (draft) LM head.
        head_rows = self.llm.collective_rpc(_draft_head_rows)[0] or model_config.get_vocab_size()
        self.fixed_weights = head_rows * model_config.hf_text_config.hidden_size
        self.llm.generate(self.prompts[:1], SamplingParams(temperature=0, max_tokens=4),
                          use_tqdm=False)  # warm-up

    def evaluate(self, mask, validation: bool = False) -> dict:
        from vllm_layerskip.core.measure import spec_decode_counters

        prompts = self.validation_prompts if validation else self.prompts
        self.llm.collective_rpc(_set_mask, args=(mask.run_attn, mask.run_mlp))
        counters0 = spec_decode_counters(self.llm)
        stats0 = self.llm.collective_rpc(_drafter_status)[0]
        start = time.perf_counter()
        outs = self.llm.generate(prompts, self.params, use_tqdm=False)
        seconds = time.perf_counter() - start
        counters = spec_decode_counters(self.llm) - counters0
        stats = self.llm.collective_rpc(_drafter_status)[0]
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        draft_s = stats["draft_seconds"] - stats0["draft_seconds"]
        draft_steps = stats["num_forward_steps"] - stats0["num_forward_steps"]
        proposals = stats["num_proposals"] - stats0["num_proposals"]
        # c: one draft step against the rest of an engine step (verify, sampling,
        # scheduling), both measured in this run.
        rest_per_step = (seconds - draft_s) / max(proposals, 1)
        c = (draft_s / max(draft_steps, 1)) / rest_per_step if rest_per_step > 0 else float("inf")
        m = counters.mean_acceptance_length if counters.drafts else 1.0
        alpha = counters.acceptance_rate if counters.draft_tokens else 0.0
        expected = m * alpha / ((m - 1) * c + alpha) if alpha > 0 else 0.0
        attn, mlp = self.sublayer_params
        kept = self.fixed_weights + attn * sum(mask.run_attn) + mlp * sum(mask.run_mlp)
        return {"tokens_per_second": tokens / seconds, "M": m, "alpha": alpha, "c": c,
                "expected_speedup": expected, "seconds": seconds, "kept_weights": kept}

    def close(self) -> None:
        from vllm_layerskip.core.measure import shutdown

        shutdown(self.llm)
