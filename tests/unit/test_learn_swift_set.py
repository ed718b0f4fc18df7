"""`vllm-layerskip learn-swift-set`: the parser takes the options the shipped
SWIFT states were learned with and refuses a bad value by name; nothing here
starts an engine."""

from __future__ import annotations

import argparse

import pytest

from vllm_layerskip.methods.swift.learn_offline import add_arguments, learning_spec, run_learn_swift_set
from vllm_layerskip.methods.swift.options import SwiftOptions
from vllm_layerskip.tools import cli


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vllm-layerskip learn-swift-set")
    add_arguments(parser)
    return parser.parse_args(argv)


def test_the_parser_takes_every_option():
    args = parse(["--model", "m", "--out", "s.json", "--skip-ratio", "0.4", "--k", "8",
                  "--batch", "2", "--rounds", "3", "--max-tokens", "64", "--patience", "100",
                  "--max-steps", "300", "--max-score-tokens", "256", "--confirm-duels", "0",
                  "--bo-interval", "25", "--dtype", "float32", "--resume", "old.json",
                  "--prompts", "q.jsonl", "--skip-per-category", "5"])
    assert (args.skip_ratio, args.k, args.confirm_duels, args.bo_interval, args.resume,
            args.skip_per_category) == (0.4, 8, 0, 25, "old.json", 5)
    defaults = parse(["--out", "s.json"])
    assert (defaults.model, defaults.prompts, defaults.bo_interval, defaults.k) == (None, None, 2, 3)
    # What the engine gets is a config swift itself accepts.
    spec = learning_spec(defaults)
    assert spec.pop("method") == "swift"
    SwiftOptions(**{k: v for k, v in spec.items() if k != "num_speculative_tokens"})


@pytest.mark.parametrize("argv, message", [
    (["--bo-interval", "0"], "argument --bo-interval: 0 is below 1"),
    (["--skip-ratio", "1.5"], "argument --skip-ratio: 1.5 is not in (0, 1)"),
    (["--k", "two"], "argument --k: 'two' is not a whole number"),
    (["--confirm-duels", "-1"], "argument --confirm-duels: -1 is below 0"),
])
def test_the_subcommand_refuses_a_bad_value_by_its_flag(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["learn-swift-set", "--out", "s.json", *argv])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "vllm-layerskip learn-swift-set" in err and message in err


def test_the_subcommand_is_registered_and_needs_an_out_file(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["learn-swift-set", "--help"])
    assert stop.value.code == 0
    assert "--resume STATE" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["learn-swift-set"])
    assert "the following arguments are required: --out" in capsys.readouterr().err


def test_an_existing_out_file_or_a_missing_resume_file_stops_before_any_engine(tmp_path):
    taken = tmp_path / "state.json"
    taken.write_text("{}")
    with pytest.raises(SystemExit, match="state.json exists: swift would start from it"):
        run_learn_swift_set(parse(["--out", str(taken)]))
    with pytest.raises(SystemExit, match="--resume .*gone.json: no such file"):
        run_learn_swift_set(parse(["--out", str(tmp_path / "new.json"),
                                   "--resume", str(tmp_path / "gone.json")]))
    assert not (tmp_path / "new.json").exists()
