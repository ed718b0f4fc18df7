"""Aborted and finished requests leave no state in the proposer.

One engine (tiny Llama, layer_skip), driven step by step: eight requests draft
together, three are aborted mid-generation, two finish early; afterwards a
single new request runs alone. The proposer's per-request bookkeeping held all
eight at some step, and holds only the lone request at the end; the status
file (VLLM_LAYERSKIP_STATUS_FILE) shows what the worker reports.
"""

import json

from conftest import make_llm
from vllm import SamplingParams

from vllm_layerskip.core.measure import proposer_stats, shutdown

SPEC = {"method": "layer_skip", "num_speculative_tokens": 3, "adaptive_draft_length": False,
        "skip_attn": [2], "skip_mlp": [1]}


def run_until_done(engine) -> dict[str, str]:
    finished = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out.outputs[0].finish_reason
    return finished


def test_aborted_requests_leave_no_proposer_state(tiny_model_dir, tmp_path, monkeypatch):
    status_file = tmp_path / "status.json"
    monkeypatch.setenv("VLLM_LAYERSKIP_STATUS_FILE", str(status_file))  # the engine core inherits it
    llm = make_llm(tiny_model_dir("llama", num_layers=4, out_proj_std=0.03),
                   speculative_config=SPEC, max_model_len=256)
    try:
        engine = llm.llm_engine
        for i in range(8):
            params = SamplingParams(temperature=0 if i % 2 else 0.8, seed=i, ignore_eos=True,
                                    max_tokens=6 if i in (3, 4) else 60)
            engine.add_request(f"r{i}", f"Request {i}: the numbers are {i} {i + 1}", params)
        for _ in range(4):
            engine.step()
        during = proposer_stats(llm)["requests"]
        engine.abort_request(["r0", "r1", "r2"])
        finished = run_until_done(engine)
        engine.add_request("last", "One more request", SamplingParams(temperature=0, max_tokens=20,
                                                                     ignore_eos=True))
        run_until_done(engine)
        after = proposer_stats(llm)
        from_file = json.loads(status_file.read_text())
    finally:
        shutdown(llm)
    assert finished == {f"r{i}": "length" for i in range(3, 8)}  # the aborted ones never finish
    assert during["max_tracked"] == 8 and during["tracked_outside_batch"] == 0, during
    assert after["requests"] == {"in_batch": 1, "tracked": 1, "tracked_outside_batch": 0,
                                 "max_tracked": 8}
    assert from_file["method"] == "layer_skip"
    assert from_file["requests"] == after["requests"]
    assert from_file["num_proposals"] == after["num_proposals"]
