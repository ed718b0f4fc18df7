"""SWIFT's optimizer state machine on a fake engine (no vLLM engine): phases,
termination rules, the r-lowering and re-optimization triggers, failures in the
optimizer thread and the scoring pass, and the state file."""

import json
import time

import numpy as np
import pytest

from vllm_layerskip.core.draft_batch import DraftRequests
from vllm_layerskip.core.faults import ENV_VAR
from vllm_layerskip.core.errors import LayerSkipConfigError
from vllm_layerskip.core.identity import ModelIdentity
from vllm_layerskip.methods.swift.options import SwiftOptions
from vllm_layerskip.methods.swift.acceptance import MIN_ACCEPTANCE_TOKENS
from vllm_layerskip.core.optimizer_budget import IDLE_SLOWDOWN
from vllm_layerskip.methods.swift.optimizer import SwiftOptimizer
from vllm_layerskip.core.skip_set_optimizer import SubLayerSpace
from vllm_layerskip.methods.swift.state_file import load_state

NUM_LAYERS = 8  # 12 candidate sub-layers
IDENTITY = ModelIdentity("tiny", "LlamaForCausalLM", NUM_LAYERS, 64, 1000)
PROMPT_LEN = 10


class FakeRunner:
    """One request whose generated text grows by one token per step."""

    def __init__(self):
        self.input_batch = type("Batch", (), {})()
        self.input_batch.num_prompt_tokens = np.array([PROMPT_LEN])
        self.input_batch.req_ids = ["r0"]
        self.input_batch.token_ids_cpu = np.arange(1000, dtype=np.int64)[None, :] % 97
        self.position = PROMPT_LEN - 1  # the first step samples position PROMPT_LEN

    def requests(self) -> DraftRequests:
        self.position += 1
        p = np.array([self.position])
        return DraftRequests(np.array([0]), p % 97, p, np.array([4]), np.array([0.0]))


class FakeEngine:
    """Matchness of a set = the fraction of its sub-layers that are 'harmless'."""

    def __init__(self, harmless=(), constant=None):
        self.harmless = set(harmless)
        self.constant = constant
        self.space = SubLayerSpace(NUM_LAYERS)
        self.calls = 0

    def score(self, runner, windows, mask):
        self.calls += 1
        coords = [c for c in range(self.space.dim) if self.space.mask((c,)) != self.space.mask(())
                  and not _runs(mask, self.space.sublayer(c))]
        m = self.constant if self.constant is not None else (
            len(self.harmless & set(coords)) / max(len(coords), 1))
        n = windows.num_tokens
        return np.arange(n) < round(m * n)


def _runs(mask, sublayer):
    kind, layer = sublayer
    return (mask.run_attn if kind == "attn" else mask.run_mlp)[layer]


def drive(search, engine, runner, steps, learning=True):
    for _ in range(steps):
        search.step(runner, engine, runner.requests(), learning)
        deadline = time.monotonic() + 10
        # Let the optimizer thread catch up, so tests are deterministic.
        # (No candidate is asked for while a challenger waits for confirmation.)
        while (search.phase == "optimizing" and search.worker.error is None
               and search.best_set.challenger is None
               and not search.worker.has_result and time.monotonic() < deadline):
            time.sleep(0.0005)


def options(**kw):
    base = dict(skip_ratio=0.5, context_window=8, bo_interval=1000, patience=50,
                max_optimization_steps=400, target_matchness=0.95, seed=1,
                max_optimizer_share=1.0)
    return SwiftOptions(**{**base, **kw})


def test_accumulates_context_then_optimizes_and_reaches_target():
    space = SubLayerSpace(NUM_LAYERS)
    harmless = space.random(np.random.default_rng(7), 6)
    search = SwiftOptimizer(options(target_matchness=0.8, patience=400), NUM_LAYERS, IDENTITY)
    engine, runner = FakeEngine(harmless), FakeRunner()
    initial = search.best
    drive(search, engine, runner, 7)  # 7 generated tokens < context window 8
    assert search.phase == "accumulating" and engine.calls == 0
    drive(search, engine, runner, 300)
    assert search.phase == "accelerating", search.summary()
    assert search.stop_reason == "target matchness reached"
    assert search.best_matchness > 0.8 > len(set(initial) & set(harmless)) / 6
    assert len(search.best) == 6 and search.mask == space.mask(search.best)
    # No more scoring once accelerating.
    calls = engine.calls
    drive(search, engine, runner, 20)
    assert engine.calls == calls


def test_optimizing_slows_down_while_self_drafts_are_off_and_resumes_its_rate():
    search = SwiftOptimizer(options(target_matchness=1.0, patience=25), NUM_LAYERS, IDENTITY)
    engine, runner = FakeEngine(SubLayerSpace(NUM_LAYERS).random(np.random.default_rng(7), 6)), FakeRunner()
    drive(search, engine, runner, 12)
    assert search.phase == "optimizing" and engine.calls > 0
    calls, scored = engine.calls, search.total_opt_steps
    # The cost model turned self-drafts off: one optimization step in IDLE_SLOWDOWN.
    drive(search, engine, runner, 48, learning=False)
    assert 0 < search.total_opt_steps - scored <= 48 // IDLE_SLOWDOWN
    assert search.summary()["waited_steps"] == 48 - 48 // IDLE_SLOWDOWN
    assert search.phase == "optimizing"
    drive(search, engine, runner, 300)  # self-drafts pay again
    assert engine.calls > calls and search.phase == "accelerating", search.summary()


class LoggingEngine(FakeEngine):
    """FakeEngine that records (mask, first position, length) of every pass,
    and, with `lucky_until`, scores every set but the starting one 0.75 on
    windows that start before that position and 0.25 after: a set that wins
    its first duel by the text it met, not by being better."""

    def __init__(self, lucky_until=None, starting=None, **kw):
        super().__init__(**kw)
        self.lucky_until, self.starting, self.log = lucky_until, starting, []

    def score(self, runner, windows, mask):
        self.log.append((mask, int(windows.starts[0]), int(windows.lengths[0])))
        if self.lucky_until is None:
            return super().score(runner, windows, mask)
        self.calls += 1
        m = 0.5 if mask == self.starting else 0.75 if windows.starts[0] < self.lucky_until else 0.25
        return np.arange(windows.num_tokens) < round(m * windows.num_tokens)


@pytest.mark.parametrize("confirm_duels", [0, 2])
def test_a_set_that_wins_one_window_by_luck_is_not_kept(confirm_duels):
    search = SwiftOptimizer(options(patience=10, confirm_duels=confirm_duels), NUM_LAYERS, IDENTITY)
    starting = search.mask
    # The first candidate duels on the window that starts at position 9.
    engine = LoggingEngine(lucky_until=12, starting=starting)
    drive(search, engine, FakeRunner(), 60)
    s = search.summary()
    if confirm_duels == 0:  # the paper's rule keeps it
        assert s["improvements"] == 1 and search.mask != starting
        return
    assert s["improvements"] == 0 and search.mask == starting, s
    assert s["challengers"] == 1 and s["challengers_rejected"] == 1
    assert search.phase == "accelerating" and search.best_matchness == 0.5
    # Its confirming duel scored none of the positions of its first one.
    (first, start, length), *rest = [e for e in engine.log if e[0] != starting]
    assert rest[0][1] >= start + length


def test_one_easy_window_does_not_turn_later_candidates_away():
    """The starting set scores 0.9 on the first window and 0.5 after; every
    other set 0.6. Gating candidates by the best set's score on its last window
    would turn all of them away after the first duel; its mean, re-scored at
    least every RESCORE_BEST_EVERY candidates, lets a better set through."""
    search = SwiftOptimizer(options(patience=100), NUM_LAYERS, IDENTITY)
    starting = search.mask

    class EasyFirstWindow(LoggingEngine):
        def score(self, runner, windows, mask):
            self.calls += 1
            m = (0.9 if windows.starts[0] < 12 else 0.5) if mask == starting else 0.6
            return np.arange(windows.num_tokens) < round(m * windows.num_tokens)

    drive(search, EasyFirstWindow(), FakeRunner(), 60)
    assert search.best_set.improvements == 1 and search.mask != starting, search.summary()
    assert search.best_matchness == pytest.approx(0.625)  # 5 of 8 tokens, 3 duels


def test_a_better_set_is_kept_after_winning_fresh_windows():
    space = SubLayerSpace(NUM_LAYERS)
    harmless = space.random(np.random.default_rng(7), 6)
    search = SwiftOptimizer(options(target_matchness=0.8, patience=400), NUM_LAYERS, IDENTITY)
    engine, runner = LoggingEngine(harmless=harmless), FakeRunner()
    drive(search, engine, runner, 400)
    assert search.phase == "accelerating", search.summary()
    assert search.best_set.improvements >= 1
    assert len(search.mask_log) == search.best_set.improvements
    step, coords = search.mask_log[0]
    # Its first duels (later ones: as the incumbent), in order, none overlapping.
    duels = [(start, length) for mask, start, length in engine.log if mask == space.mask(coords)]
    duels = duels[: 1 + search.options.confirm_duels]
    for (a, n), (b, _) in zip(duels, duels[1:]):
        assert b >= a + n, duels
    # It drafted from the step after its last duel on: that window's last
    # target was the token of position start + length, sampled at that step.
    last_start, last_length = duels[-1]
    assert step == last_start + last_length - (PROMPT_LEN - 1), (step, duels)
    # Its recorded matchness is its mean over the duels: here one value.
    assert search.best_matchness > 0.8


def test_patience_and_step_limit_end_optimization():
    search = SwiftOptimizer(options(patience=5), NUM_LAYERS, IDENTITY)
    drive(search, FakeEngine(constant=0.5), FakeRunner(), 40)
    assert search.phase == "accelerating" and search.stop_reason == "patience ran out"
    # First candidate "improves" over the unmeasured initial score at most once.
    assert search.total_opt_steps <= 7

    search = SwiftOptimizer(options(patience=100, max_optimization_steps=12), NUM_LAYERS, IDENTITY)
    drive(search, FakeEngine(harmless=range(12)), FakeRunner(), 60)
    assert search.stop_reason in ("step limit reached", "target matchness reached")


def test_bayesian_suggestions_every_beta_steps():
    search = SwiftOptimizer(options(bo_interval=4, patience=400, max_optimization_steps=20),
                         NUM_LAYERS, IDENTITY)
    drive(search, FakeEngine(constant=0.3), FakeRunner(), 40)
    s = search.summary()
    assert s["optimization_steps"] == 20
    assert s["bayes_suggestions"] == 5 and s["random_suggestions"] >= 15


def test_low_acceptance_lowers_the_skip_ratio():
    search = SwiftOptimizer(options(patience=5, skip_ratio_step=0.25), NUM_LAYERS, IDENTITY)
    engine, runner = FakeEngine(constant=0.5), FakeRunner()
    drive(search, engine, runner, 8)
    assert search.phase == "optimizing"
    search.observe_acceptance(MIN_ACCEPTANCE_TOKENS, 10)  # acceptance 0.16 < 0.7
    drive(search, engine, runner, 30)
    assert search.ratio == pytest.approx(0.25) and search.count == 3
    assert search.ratio_changes == 1 and search.phase in ("optimizing", "accelerating")
    assert len(search.best) == 3


def test_acceptance_drop_resumes_optimization():
    search = SwiftOptimizer(options(patience=3), NUM_LAYERS, IDENTITY)
    engine, runner = FakeEngine(constant=0.5), FakeRunner()
    drive(search, engine, runner, 30)
    assert search.phase == "accelerating"
    search.observe_acceptance(MIN_ACCEPTANCE_TOKENS, 50)  # baseline 0.78
    search.observe_acceptance(MIN_ACCEPTANCE_TOKENS, 45)  # 0.70: fine
    assert search.phase == "accelerating"
    search.observe_acceptance(MIN_ACCEPTANCE_TOKENS, 20)  # 0.31 < 0.6 * 0.78
    assert search.phase == "optimizing" and search.reoptimizations == 1
    best, scored = search.best, search.total_opt_steps
    drive(search, engine, runner, 1)
    assert search.best == best  # every candidate scores 0.5: none beats the kept set
    drive(search, engine, runner, 5)
    assert search.total_opt_steps > scored  # candidates are scored again


@pytest.mark.parametrize("point", ["swift.optimizer@3", "swift.score"])
def test_failures_keep_the_last_good_set(monkeypatch, point):
    monkeypatch.setenv(ENV_VAR, point)
    search = SwiftOptimizer(options(patience=400), NUM_LAYERS, IDENTITY)
    engine, runner = FakeEngine(constant=0.5), FakeRunner()
    drive(search, engine, runner, 60)
    assert search.phase == "stopped", search.summary()
    assert "fault injected" in search.error
    mask = search.mask
    drive(search, engine, runner, 10)  # still drafting, with the same set
    assert search.mask == mask and search.mask.num_skipped == search.count


def test_state_file_round_trip_and_refusals(tmp_path):
    path = tmp_path / "swift.json"
    search = SwiftOptimizer(options(patience=5, state_file=str(path)), NUM_LAYERS, IDENTITY)
    drive(search, FakeEngine(constant=0.5), FakeRunner(), 30)
    assert search.phase == "accelerating"
    deadline = time.monotonic() + 10
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    state = load_state(path, IDENTITY)
    assert state.optimization_finished and len(state.history) >= 5

    warm = SwiftOptimizer(options(state_file=str(path)), NUM_LAYERS, IDENTITY)
    assert warm.phase == "accelerating" and warm.best == search.best
    assert warm.stop_reason == "loaded from state_file"

    other = ModelIdentity("other", "LlamaForCausalLM", NUM_LAYERS, 64, 1000)
    with pytest.raises(LayerSkipConfigError, match=r"was made for another model \(model: file 'tiny' vs running 'other' \(no weight fingerprint"):
        options(state_file=str(path)).validate_for_model(other)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(LayerSkipConfigError, match="is not valid JSON.*Delete the file"):
        options(state_file=str(bad)).validate_for_model(IDENTITY)
    bad.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(LayerSkipConfigError, match="is not a SWIFT state file"):
        options(state_file=str(bad)).validate_for_model(IDENTITY)
    data = json.loads(path.read_text())
    data["best"]["skip_attn"] = [0, 99]
    bad.write_text(json.dumps(data))
    with pytest.raises(LayerSkipConfigError, match=r"layer indices \[0, 99\] outside 1..6"):
        options(state_file=str(bad)).validate_for_model(IDENTITY)
    del data["best"]
    bad.write_text(json.dumps(data))
    with pytest.raises(LayerSkipConfigError, match="is corrupt: missing or malformed field"):
        options(state_file=str(bad)).validate_for_model(IDENTITY)


def test_learn_swift_set_resumes_a_finished_state_by_optimizing_again(tmp_path):
    """`vllm-layerskip learn-swift-set --resume`: a state that ended by patience
    loads as accelerating; its copy must start an optimization phase from its
    best set and history, and the original must stay as it was."""
    from vllm_layerskip.methods.swift.learn_offline import copy_state_to_resume

    path = tmp_path / "finished.json"
    search = SwiftOptimizer(options(patience=5, state_file=str(path)), NUM_LAYERS, IDENTITY)
    drive(search, FakeEngine(constant=0.5), FakeRunner(), 30)
    deadline = time.monotonic() + 10
    while not (path.exists() and load_state(path, IDENTITY).optimization_finished):
        assert time.monotonic() < deadline, "the finished state was never written"
        time.sleep(0.01)
    original = path.read_text()

    resumed = tmp_path / "resumed.json"
    copy_state_to_resume(str(path), str(resumed))
    assert path.read_text() == original
    state = load_state(resumed, IDENTITY)
    assert not state.optimization_finished
    assert len(state.history) == len(load_state(path, IDENTITY).history)

    warm = SwiftOptimizer(options(patience=5, state_file=str(resumed)), NUM_LAYERS, IDENTITY)
    assert warm.phase == "accumulating" and warm.best == search.best
    engine = FakeEngine(constant=0.5)
    drive(warm, engine, FakeRunner(), 12)
    assert engine.calls > 0 and warm.total_opt_steps > 0

    for text in ("{not json", "[1, 2]"):
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        with pytest.raises(SystemExit, match=r"--resume .*bad.json: not a SWIFT state file .*"
                                             r"give the state file an earlier learn-swift-set run wrote"):
            copy_state_to_resume(str(bad), str(tmp_path / "out.json"))
        assert not (tmp_path / "out.json").exists()


SHARE = 0.1
STEP_S = SCORE_S = 0.1  # fake engine step and scoring pass times


class _FakeClockRun:
    """A SwiftOptimizer whose engine steps and scoring passes take STEP_S and
    SCORE_S on a fake clock, with max_optimizer_share SHARE."""

    def __init__(self, monkeypatch, context_window=128):
        from vllm_layerskip.methods.swift import optimizer as swift_module

        self.clock = 0.0
        monkeypatch.setattr(swift_module.time, "perf_counter", lambda: self.clock)
        run = self

        class SlowEngine(FakeEngine):
            def score(self, runner, windows, mask):
                run.clock += SCORE_S
                return super().score(runner, windows, mask)

        self.search = SwiftOptimizer(options(context_window=context_window,
                                             max_score_tokens=context_window,
                                          patience=1000, max_optimizer_share=SHARE),
                                  NUM_LAYERS, IDENTITY)
        self.engine, self.runner = SlowEngine(constant=0.5), FakeRunner()

    def steps(self, n):
        for _ in range(n):
            self.clock += STEP_S
            drive(self.search, self.engine, self.runner, 1)


def test_optimizer_share_cap_allows_no_burst_of_saved_up_time(monkeypatch):
    """A long accumulation phase (127 steps, 12.7 s) must not leave the optimizer
    a budget it can spend on every step afterwards: at most SHARE * CREDIT_WINDOW_S of
    saved-up time, then about `share` of the steps."""
    from vllm_layerskip.core.optimizer_budget import CREDIT_WINDOW_S

    run, steps = _FakeClockRun(monkeypatch), 40
    run.steps(127)
    assert run.search.phase == "accumulating" and run.engine.calls == 0
    run.steps(steps)
    assert run.search.phase == "optimizing"
    allowed = SHARE * (CREDIT_WINDOW_S + steps * STEP_S) / SCORE_S + 1
    assert 1 <= run.engine.calls <= allowed, (run.engine.calls, allowed)
    assert run.search.budget_skips > 0


def test_the_first_scoring_pass_waits_for_a_full_budget(monkeypatch):
    """A short request must not pay a scoring pass at once: the first waits
    until the share has earned what two engine steps take (0.2 s at a 0.1
    share: 2 s of steps here), although text to score is there after 8 steps."""
    run = _FakeClockRun(monkeypatch, context_window=8)
    run.steps(18)
    assert run.search.phase == "optimizing" and run.engine.calls == 0
    assert run.search.budget_skips > 0
    run.steps(4)
    assert run.engine.calls > 0


def test_optimizer_thread_cpu_time_counts_against_the_share(monkeypatch):
    """As above, but every job of the optimizer thread costs 0.05 s of its CPU
    time (fake thread clock). That time is taken from decoding as much as a
    scoring pass is, so a candidate now costs ~0.2 s of the budget instead of
    0.1 s: fewer scoring passes fit (measured: 7, against 10 without the charge)."""
    from vllm_layerskip.core.optimizer_budget import CREDIT_WINDOW_S
    from vllm_layerskip.methods.swift import optimizer as swift_module

    thread_clock = [0.0]

    def fake_thread_time():
        thread_clock[0] += 0.025  # two reads per job: 0.05 s per job
        return thread_clock[0]

    monkeypatch.setattr(swift_module.time, "thread_time", fake_thread_time)
    run, steps = _FakeClockRun(monkeypatch), 40
    run.steps(127 + steps)
    assert run.search.phase == "optimizing"
    budget = SHARE * (CREDIT_WINDOW_S + steps * STEP_S)  # 0.9 s
    # 0.2 s per candidate; +3: the incumbent's re-scoring, one overdrawing pass,
    # and the thread's last jobs, charged a step later. Without the charge: 10.
    calls = run.engine.calls
    assert 1 <= calls <= budget / (SCORE_S + 2 * 0.05) + 3, calls
    assert run.search.summary()["worker_cpu_seconds"] >= 0.05 * calls


def test_a_set_scored_again_is_registered_without_printing(capsys):
    """SWIFT re-scores its best set every few candidates: each repeat must reach
    the Gaussian process (its scores averaged there) without the package's red
    line on stdout for every exact repeat, which flooded the server log."""
    from vllm_layerskip.core.skip_set_optimizer import BayesianSetOptimizer

    space = SubLayerSpace(NUM_LAYERS)
    bo = BayesianSetOptimizer(space, seed=0)
    best, other = space.evenly_spread(6), space.random(np.random.default_rng(3), 6)
    for coords, score in [(best, 0.6), (other, 0.3), (best, 0.7), (best, 0.65)]:
        bo.register(coords, score)
    assert bo.num_observations == 4 and len(bo.optimizer.space) == 4
    assert capsys.readouterr().out == ""
    points = bo.optimizer.space.params
    assert np.abs(points[2] - points[0]).max() == pytest.approx(1e-6)  # beside it, not on it
    assert len(bo.suggest(6)) == 6


def test_the_shipped_state_warm_starts_its_model_and_is_never_written():
    """"state_file": "shipped": the state learned offline for Qwen2.5-Coder-1.5B
    (methods/swift/shipped/; SmolLM2's beside it), found by the model's identity; SWIFT starts from
    its set and does not write to the package."""
    from vllm_layerskip.methods.swift.state_file import STATE

    files = {path.name: path for path in STATE.shipped_files()}
    assert sorted(files) == ["Qwen2.5-Coder-1.5B-Instruct.json", "SmolLM2-135M-Instruct.json"]
    path = files["Qwen2.5-Coder-1.5B-Instruct.json"]
    qwen = STATE.identity_in(path)
    served_elsewhere = ModelIdentity("/srv/models/qwen-coder", qwen.architecture, qwen.num_layers,
                                     qwen.hidden_size, qwen.vocab_size, qwen.fingerprint)
    state = load_state("shipped", served_elsewhere)
    assert (state.best_attn, state.best_mlp) == (
        [4, 5, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17], [3, 7, 8, 9, 10, 11, 13, 14, 16, 17])
    assert state.optimization_finished and len(state.history) > 900
    options(skip_ratio=0.45, state_file="shipped").validate_for_model(served_elsewhere)

    before = path.read_bytes()
    search = SwiftOptimizer(options(skip_ratio=0.45, state_file="shipped"), qwen.num_layers,
                         served_elsewhere)
    assert search.phase == "accelerating" and search.stop_reason == "loaded from state_file"
    assert search.space.layer_sets(search.best) == {"skip_attn": state.best_attn,
                                                   "skip_mlp": state.best_mlp}
    assert not search.state_writer.enabled
    search._maybe_save(force=True)
    assert path.read_bytes() == before

    with pytest.raises(LayerSkipConfigError, match=(
            r"No shipped SWIFT state file for model 'tiny' \(shipped for: "
            r"Qwen2.5-Coder-1.5B-Instruct, SmolLM2-135M-Instruct\)\. Leave 'state_file' out, "
            r"or give it a path")):
        options(state_file="shipped").validate_for_model(IDENTITY)
