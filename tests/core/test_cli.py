"""The command line as a user meets it: help, version, one handler per command, clear errors."""

from __future__ import annotations

import argparse
from importlib.metadata import version

import pytest

from specroute.cli import main, parser
from specroute.policies.registry import REGISTRY
from specroute.router.settings import RouterSettings


def _commands(p: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every runnable command path, e.g. ("bench", "sweep")."""
    found: list[tuple[str, ...]] = []
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found += _commands(child, (*prefix, name)) or [(*prefix, name)]
    return found


def test_version_answers(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"specroute {version('specroute')}"


def test_help_speaks_to_users(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "speculative decoding" in text and "typical use" in text
    assert "no logic" not in text and "``" not in text
    for command in ("serve", "calibrate", "profile", "bench", "emulate", "demo"):
        assert f"    {command}" in text


def test_every_command_has_its_handler() -> None:
    commands = _commands(parser())
    assert ("bench", "sweep") in commands and ("serve",) in commands
    for path in commands:
        with pytest.raises(SystemExit):  # each names its own flags in its help
            parser().parse_args([*path, "--help"])
    args = parser().parse_args(["emulate", "--predict", "1,2"])
    assert callable(args.handler) and args.predict == [1, 2]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["emulate", "--hardware", "nope", "--mode", "spec"], "unknown hardware model 'nope'"),
        (["emulate"], "--mode spec|base is required"),
        (["profile", "/nonexistent-sweep", "-o", "p.json"], "is not a sweep folder"),
        (["emulate", "--predict", "1", "--out", "sweep"], "it needs --calibrate"),
        (["serve", "--spec", "http://a:1", "--base", "http://b:2", "--policy", "nope"], "nope"),
        (["serve", "--spec", "http://a:1", "--base", "http://b:2", "--workers", "0"], "workers"),
        (
            [
                "serve",
                "--spec",
                "http://a:1",
                "--base",
                "http://b:2",
                "--workers",
                "2",
                "--port",
                "0",
            ],
            "workers share one port",
        ),
    ],
)
def test_bad_input_is_said_in_one_line_with_status_2(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"specroute {argv[0]}: ") and said in err
    assert "Traceback" not in err


def test_bad_levels_stop_at_parse(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["emulate", "--predict", "1,x"])
    assert done.value.code == 2
    assert "expected integers like 1,2,4,8" in capsys.readouterr().err


def test_serve_help_names_every_policy(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = "".join(capsys.readouterr().out.split())  # argparse wraps it, at hyphens too
    assert all(name in text for name in REGISTRY), [n for n in REGISTRY if n not in text]


def test_a_check_of_settings_together_never_echoes_them(capsys: pytest.CaptureFixture[str]) -> None:
    """A setting refused on its own is named with its value; a check across settings says
    what it found, without the settings it read, keys among them."""
    assert main(["serve", "--spec", "http://a:1", "--api-key", "client-secret"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "specroute serve: give both pools' backends (--spec and --base) or a backends file\n"
    )


@pytest.mark.parametrize(
    ("timing", "warned"),
    [
        ({"SPECROUTE_POLL_INTERVAL": "6"}, True),  # stale_after's default, 2 s, is shorter
        ({"SPECROUTE_POLL_INTERVAL": "6", "SPECROUTE_STALE_AFTER": "18"}, False),
        ({"SPECROUTE_POLL_INTERVAL": "2", "SPECROUTE_STALE_AFTER": "2"}, False),
        ({}, False),  # the defaults: a poll every 0.5 s, believed for 2
    ],
    ids=["shorter", "three polls", "equal", "defaults"],
)
def test_serve_warns_once_when_a_reading_goes_stale_before_the_next_poll(
    timing: dict[str, str],
    warned: bool,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started: list[RouterSettings] = []

    def run(settings: RouterSettings) -> int:  # the router itself is not started
        started.append(settings)
        return 0

    monkeypatch.setattr("specroute.router.serve.run", run)
    for key in ("SPECROUTE_POLL_INTERVAL", "SPECROUTE_STALE_AFTER"):
        monkeypatch.delenv(key, raising=False)
    for key, value in timing.items():
        monkeypatch.setenv(key, value)
    assert main(["serve", "--spec", "http://a:1", "--base", "http://b:2"]) == 0
    assert len(started) == 1
    err = capsys.readouterr().err
    assert err.count("warning: stale_after") == (1 if warned else 0), err
    if warned:
        assert "stale_after (2 s) is shorter than poll_interval (6 s)" in err
        assert "set stale_after to at least 6" in err
