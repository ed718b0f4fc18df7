"""`vllm serve` as a real process on loopback with method layer_skip (and swift): the OpenAI
client gets a chat completion and a streamed completion, the Prometheus endpoint
shows the spec-decode counters, and a bad config stops the server at start-up
with the plugin's message."""

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

VLLM = os.path.join(os.path.dirname(sys.executable), "vllm")
SPEC = {"method": "layer_skip", "num_speculative_tokens": 4, "sublayer_skip_ratio": 0.2}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_command(model, port, spec, *extra):
    return [VLLM, "serve", model, "--host", "127.0.0.1", "--port", str(port),
            "--dtype", "float32", "--enforce-eager", "--max-model-len", "1024",
            "--seed", "0", "--speculative-config", json.dumps(spec), *extra]


def get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode()


def launch_server(model, spec, log, status_file=None, extra=()):
    """Starts `vllm serve` and returns at once: (process, base URL). With
    `status_file`, the proposer writes its status there after every step."""
    port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    if status_file:
        env["VLLM_LAYERSKIP_STATUS_FILE"] = str(status_file)
    proc = subprocess.Popen(serve_command(model, port, spec, *extra), stdout=log,
                            stderr=subprocess.STDOUT, env=env)
    return proc, f"http://127.0.0.1:{port}"


def wait_healthy(proc, base, log, deadline):
    while time.time() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            pytest.fail(f"vllm serve exited with {proc.returncode}:\n{log.read()[-4000:]}")
        try:
            if get(base + "/health")[0] == 200:
                return
        except (urllib.error.URLError, ConnectionError, OSError):
            time.sleep(1)
    proc.kill()
    pytest.fail("vllm serve did not become healthy within 300 s")


def stop_server(proc):
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


SWIFT_SPEC = {"method": "swift", "num_speculative_tokens": 4, "context_window": 4,
              "adaptive_draft_length": False, "max_optimizer_share": 1.0}
BAD_SPEC = {"method": "layer_skip", "num_speculative_tokens": 4, "skip_layers": [31]}
# A KV cache of 12 blocks of 128 tokens: a burst of 64 requests needs several times
# that at once, so the scheduler preempts and recomputes requests while they draft.
SMALL_KV = ("--num-gpu-blocks-override", "12")


@pytest.fixture(scope="module")
def servers(smollm2_path, tmp_path_factory):
    """The layer_skip server, the swift server and a server whose config is bad,
    all started at once: a start-up is mostly one process importing vLLM and
    torch, so on 2 cores three of them overlap (the module took 176 s with one
    start-up after the other, 2026-11-26)."""
    folder = tmp_path_factory.mktemp("serve")
    specs = {"layer_skip": SPEC, "swift": SWIFT_SPEC, "small_kv": SPEC, "bad_config": BAD_SPEC}
    logs = {name: open(folder / f"{name}.log", "w+") for name in specs}
    status = {name: folder / f"{name}.status.json" for name in ("layer_skip", "small_kv")}
    started = {name: launch_server(smollm2_path, spec, logs[name], status.get(name),
                                   SMALL_KV if name == "small_kv" else ())
               for name, spec in specs.items()}
    healthy = ("layer_skip", "swift", "small_kv")
    try:
        deadline = time.time() + 300
        for name in healthy:
            wait_healthy(*started[name], logs[name], deadline)
        yield {"model": smollm2_path, "bad_config": started["bad_config"][0], "logs": logs,
               "status_file": status,
               **{name: started[name][1] for name in healthy}}
    finally:
        for proc, _ in started.values():
            stop_server(proc)
        for log in logs.values():
            log.close()


@pytest.fixture(scope="module")
def server(servers):
    return servers["layer_skip"], servers["model"]


def client(base):
    from openai import OpenAI

    return OpenAI(base_url=base + "/v1", api_key="unused")


def test_chat_completion(server):
    base, model = server
    reply = client(base).chat.completions.create(
        model=model, temperature=0, max_tokens=32,
        messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert "Paris" in reply.choices[0].message.content
    assert reply.usage.completion_tokens > 0


def test_streamed_completion_equals_unstreamed(server):
    base, model = server
    c = client(base)
    prompt = "def fibonacci(n):\n"
    whole = c.completions.create(model=model, prompt=prompt, temperature=0, max_tokens=48)
    chunks = c.completions.create(model=model, prompt=prompt, temperature=0, max_tokens=48,
                                  stream=True)
    streamed = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert len(streamed) > 20
    assert streamed == whole.choices[0].text


def metric(text, name):
    values = [float(v) for v in re.findall(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.M)]
    assert values, f"{name} not in /metrics"
    return sum(values)


def test_prometheus_spec_decode_counters(server):
    base, model = server
    client(base).completions.create(model=model, prompt="Once upon a time", temperature=0,
                                    max_tokens=32)
    _, text = get(base + "/metrics")
    drafts = metric(text, "vllm:spec_decode_num_drafts_total")
    draft_tokens = metric(text, "vllm:spec_decode_num_draft_tokens_total")
    accepted = metric(text, "vllm:spec_decode_num_accepted_tokens_total")
    assert drafts > 0 and draft_tokens > 0 and accepted > 0
    assert draft_tokens <= SPEC["num_speculative_tokens"] * drafts
    assert accepted <= draft_tokens


def test_malformed_request_gets_4xx(server):
    base, _ = server
    req = urllib.request.Request(base + "/v1/completions", data=b'{"prompt": 5, "max_tokens": "many"}',
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert 400 <= e.value.code < 500
    assert get(base + "/health")[0] == 200


def test_bad_config_stops_serve_at_startup(servers):
    assert servers["bad_config"].wait(timeout=180) != 0
    log = servers["logs"]["bad_config"]
    log.seek(0)
    output = log.read()
    assert "'skip_layers' has layer indices [31] outside the model, which has 30 decoder layers" in output


def test_swift_server_serves_concurrent_streams(servers):
    """The swift server, its optimizer busy while 6 streamed requests run at
    once: every text equals the layer_skip server's (both are plain decoding's,
    float32 greedy), and the log shows the optimizer at work."""
    from concurrent.futures import ThreadPoolExecutor

    model = servers["model"]
    prompts = [f"Once upon a time there was a {w} who" for w in
               ("cat", "robot", "river", "lighthouse", "dragon", "teacher")]

    def complete(p):
        return client(servers["layer_skip"]).completions.create(
            model=model, prompt=p, temperature=0, max_tokens=40).choices[0].text

    def stream(p):
        chunks = client(servers["swift"]).completions.create(
            model=model, prompt=p, temperature=0, max_tokens=40, stream=True)
        return "".join(ch.choices[0].text for ch in chunks if ch.choices)

    with ThreadPoolExecutor(len(prompts)) as pool:
        expected = list(pool.map(complete, prompts))
        got = list(pool.map(stream, prompts))
    _, text = get(servers["swift"] + "/metrics")
    log = servers["logs"]["swift"]
    log.seek(0)
    server_log = log.read()  # before shutdown, which logs its own errors
    assert got == expected and all(len(t) > 60 for t in got), got
    assert metric(text, "vllm:spec_decode_num_drafts_total") > 0
    assert "vllm-layerskip swift: accumulating, r=0.45" in server_log
    assert "Traceback" not in server_log


def test_cancelled_and_malformed_requests_leave_the_others_exact(servers):
    """Faults while the server is busy: 12 streamed requests at once, 4 of them
    closed by the client after two chunks (aborted while drafts run), and 3
    malformed requests among them. Every other request completes with the text
    the swift server gives it (both are plain decoding's, float32 greedy), the
    malformed ones get a 4xx, the server stays healthy, and the proposer keeps
    no state of the aborted requests (its status at the step of one more
    request, alone: one request in the batch, none tracked outside it)."""
    from concurrent.futures import ThreadPoolExecutor

    model = servers["model"]
    prompts = [f"Write a short story about a {w}." for w in
               ("cat", "robot", "river", "lighthouse", "dragon", "teacher", "comet", "baker",
                "violin", "glacier", "spider", "train")]
    cancelled = {1, 4, 7, 10}
    messages = [{"role": "user", "content": "Hi"}]
    malformed = [b'{"model": "m", "messages": [{"role": ',
                 json.dumps({"model": model, "messages": messages, "max_tokens": -1}).encode(),
                 json.dumps({"model": "no-such-model", "messages": messages}).encode()]

    def stream(base, i):
        chunks = client(base).chat.completions.create(
            model=model, temperature=0, max_tokens=48, stream=True,
            messages=[{"role": "user", "content": prompts[i]}])
        text, finish = [], None
        for n, chunk in enumerate(chunks):
            if base == servers["layer_skip"] and i in cancelled and n == 2:
                chunks.close()  # the client goes away mid-stream
                return None
            if chunk.choices:
                text.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
        assert finish in ("stop", "length"), (i, finish)
        return "".join(text)

    def post_malformed(body):
        req = urllib.request.Request(servers["layer_skip"] + "/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(req, timeout=60)
        except urllib.error.HTTPError as e:
            return e.code
        return 200

    with ThreadPoolExecutor(len(prompts) + len(malformed)) as pool:
        answers = [pool.submit(stream, servers["layer_skip"], i) for i in range(len(prompts))]
        codes = [pool.submit(post_malformed, body) for body in malformed]
        got = [a.result() for a in answers]
        codes = [c.result() for c in codes]
        expected = list(pool.map(lambda i: stream(servers["swift"], i),
                                 [i for i in range(len(prompts)) if i not in cancelled]))
    survivors = [t for i, t in enumerate(got) if i not in cancelled]
    assert all(got[i] is None for i in cancelled)
    assert survivors == expected and all(len(t) > 40 for t in survivors), survivors
    assert all(400 <= c < 500 for c in codes), codes
    assert get(servers["layer_skip"] + "/health")[0] == 200

    assert_no_state_left(servers, "layer_skip")


def assert_no_state_left(servers, name):
    """The proposer of server `name` holds no state of earlier requests: its
    status at the step of one more request, alone, shows one request in the
    batch and none tracked outside it; and its log has no traceback."""
    before = time.time()
    client(servers[name]).chat.completions.create(
        model=servers["model"], temperature=0, max_tokens=16,
        messages=[{"role": "user", "content": "Name three colours."}])
    status = json.loads(servers["status_file"][name].read_text())
    assert status["written_at"] >= before
    requests = status["requests"]
    assert requests["in_batch"] == 1 and requests["tracked"] <= 1, requests
    assert not requests["tracked_outside_batch"], requests
    log = servers["logs"][name]
    log.seek(0)
    assert "Traceback" not in log.read()


def test_burst_against_a_small_kv_cache_preempts_and_stays_exact(servers):
    """64 requests at once against a server whose KV cache holds a fraction of
    them: vLLM preempts and recomputes requests while the proposer drafts for
    the others. Every request completes with the text the full-cache server
    gives it (float32 greedy: plain decoding's), the server counts preemptions
    and stays healthy, and the proposer keeps no state of the preempted or
    finished requests."""
    from concurrent.futures import ThreadPoolExecutor

    model = servers["model"]
    subjects = ("cat", "robot", "river", "lighthouse", "dragon", "teacher", "comet", "baker")
    prompts = [f"Request {n}: tell me one fact about a {subjects[n % 8]}." for n in range(64)]

    def complete(base, prompt):
        # ~70 prompt tokens and 96 more: each request outgrows its first 128-token
        # block while it decodes (a request that fits one block is never preempted).
        reply = client(base).chat.completions.create(
            model=model, temperature=0, max_tokens=96, extra_body={"ignore_eos": True},
            messages=[{"role": "user", "content": prompt}])
        return reply.choices[0].message.content, reply.choices[0].finish_reason

    with ThreadPoolExecutor(len(prompts)) as pool:
        got = list(pool.map(lambda p: complete(servers["small_kv"], p), prompts))
        expected = list(pool.map(lambda p: complete(servers["layer_skip"], p), prompts))
    assert got == expected and all(finish == "length" for _, finish in got)
    _, text = get(servers["small_kv"] + "/metrics")
    assert metric(text, "vllm:num_preemptions_total") > 0, "the cache was large enough"
    assert metric(text, "vllm:spec_decode_num_drafts_total") > 0
    assert get(servers["small_kv"] + "/health")[0] == 200

    assert_no_state_left(servers, "small_kv")
