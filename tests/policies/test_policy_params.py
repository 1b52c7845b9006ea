"""Each policy's parameters, declared once in its dataclass: the one parser of KEY=VALUE
text (``--policy-param`` and ``NAME:KEY=VALUE`` alike), the values typed by the dataclass,
the help generated from it, the table in flags, environment and TOML file with the
deprecated flat settings beside it, and the parameters reaching a live router."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import aiohttp
import pytest
from pydantic import ValidationError

from specroute.cli import main, parser
from specroute.policies import params
from specroute.policies.decision import PolicyError
from specroute.policies.registry import REGISTRY, checked, help_text, parse_spec
from specroute.router.settings import RouterSettings
from specroute.serve_command import given_settings
from tests.emulator.test_emulator_api import client
from tests.emulators import running_emulator
from tests.routers import running_router

BACKENDS: dict[str, Any] = {"spec": ["http://127.0.0.1:1"], "base": ["http://127.0.0.1:2"]}
SERVE = ["serve", "--spec", "http://127.0.0.1:1", "--base", "http://127.0.0.1:2"]

# 1. Text and values, typed by the policy's dataclass


@pytest.mark.parametrize(
    ("policy", "raw", "typed"),
    [
        pytest.param("crossover", {"crossover": "12"}, {"crossover": 12.0}, id="text to a number"),
        pytest.param(
            "crossover", {"crossover": 40}, {"crossover": 40.0}, id="TOML integer to a number"
        ),
        pytest.param("crossover", {"crossover": "1e9"}, {"crossover": 1e9}, id="exponent"),
        pytest.param(
            "crossover", {"topology": "partitioned"}, {"topology": "partitioned"}, id="a choice"
        ),
        pytest.param("crossover", {}, {}, id="nothing given: the defaults stay the policy's"),
        pytest.param(
            "acceptance-crossover",
            {"accept_max_age": "30", "probe_share": 0.25, "hysteresis": "2"},
            {"accept_max_age": 30.0, "probe_share": 0.25, "hysteresis": 2.0},
            id="several at once",
        ),
        pytest.param(
            "expected-latency", {"context": "off"}, {"context": "off"}, id="expected-latency"
        ),
    ],
)
def test_good_values_are_typed_by_the_dataclass(
    policy: str, raw: dict[str, Any], typed: dict[str, Any]
) -> None:
    found = checked(policy, raw)
    assert found == typed
    assert all(type(found[k]) is type(typed[k]) for k in typed)


@pytest.mark.parametrize(
    ("policy", "raw", "said"),
    [
        pytest.param(
            "crossover",
            {"foo": "1"},
            "policy 'crossover': unknown parameter 'foo' (known: crossover, hysteresis, topology)",
            id="unknown key",
        ),
        pytest.param(
            "crossover",
            {"foo": 1, "bar": 2},
            "policy 'crossover': unknown parameters 'bar', 'foo' (known:",
            id="unknown keys",
        ),
        pytest.param(
            "always-spec",
            {"crossover": 4},
            "policy 'always-spec': unknown parameter 'crossover' (it takes none)",
            id="a policy without parameters",
        ),
        pytest.param(
            "expected-latency",
            {"hysteresis": 1},
            "policy 'expected-latency': unknown parameter 'hysteresis'",
            id="another policy's key",
        ),
        pytest.param(
            "crossover",
            {"topology": "mesh"},
            "policy 'crossover': topology='mesh': expected shared|partitioned",
            id="bad choice",
        ),
        pytest.param(
            "crossover",
            {"crossover": "many"},
            "policy 'crossover': crossover='many': expected NUMBER",
            id="bad number",
        ),
        pytest.param(
            "crossover",
            {"crossover": True},
            "policy 'crossover': crossover=True: expected NUMBER",
            id="wrong type: a boolean",
        ),
        pytest.param(
            "crossover",
            {"crossover": [4]},
            "policy 'crossover': crossover=[4]: expected NUMBER",
            id="wrong type: a list",
        ),
        pytest.param(
            "context-crossover",
            {"topology": 3},
            "topology=3: expected shared|partitioned",
            id="wrong type: a number for a choice",
        ),
        pytest.param(
            "crossover",
            {"hysteresis": "-1"},
            "policy 'crossover': hysteresis must be >= 0, got -1.0",
            id="the dataclass's own check",
        ),
        pytest.param(
            "acceptance-crossover",
            {"probe_share": 2},
            "probe_share must be in [0, 1]",
            id="a range",
        ),
        pytest.param(
            "acceptance-crossover",
            {"topology": "mesh"},
            "topology='mesh'",
            id="acceptance's topology is a choice too",
        ),
        pytest.param("fastest", {}, "unknown policy 'fastest'", id="unknown policy"),
    ],
)
def test_bad_values_name_the_policy_and_key(policy: str, raw: dict[str, Any], said: str) -> None:
    with pytest.raises(PolicyError) as refused:
        checked(policy, raw)
    assert said in str(refused.value)


@pytest.mark.parametrize(
    ("text", "found"),
    [
        pytest.param("crossover", ("crossover", {}), id="a name alone"),
        pytest.param(
            "crossover:crossover=12", ("crossover", {"crossover": "12"}), id="one parameter"
        ),
        pytest.param(
            " crossover:topology=partitioned:crossover=12",
            ("crossover", {"topology": "partitioned", "crossover": "12"}),
            id="several, in order",
        ),
        pytest.param(
            "crossover:crossover=4:crossover=4",
            ("crossover", {"crossover": "4"}),
            id="the same twice",
        ),
    ],
)
def test_the_spec_form_reads_name_and_parameters(text: str, found: tuple[str, Any]) -> None:
    assert parse_spec(text) == found


@pytest.mark.parametrize(
    ("text", "said"),
    [
        pytest.param(
            "crossover:21", "policy 'crossover': parameters are KEY=VALUE, got '21'", id="no key"
        ),
        pytest.param(
            "crossover:crossover=", "parameters are KEY=VALUE, got 'crossover='", id="no value"
        ),
        pytest.param("crossover:=3", "parameters are KEY=VALUE, got '=3'", id="empty key"),
        pytest.param(
            "crossover:crossover=1:crossover=2",
            "policy 'crossover': crossover is given twice ('1' and '2')",
            id="two values",
        ),
        pytest.param(
            "crossover:bands=3", "policy 'crossover': unknown parameter 'bands'", id="unknown key"
        ),
        pytest.param(
            "crossover:topology=ring",
            "topology='ring': expected shared|partitioned",
            id="bad value",
        ),
        pytest.param("nope:crossover=3", "unknown policy 'nope'", id="unknown policy"),
        pytest.param("nope:3", "unknown policy 'nope'", id="unknown policy, then no key"),
    ],
)
def test_the_spec_form_refuses_by_name(text: str, said: str) -> None:
    with pytest.raises(PolicyError) as refused:
        parse_spec(text)
    assert said in str(refused.value)


def test_one_parser_reads_both_forms() -> None:
    """``--policy-param`` items and a spec's items are the same text, read the same way."""
    name, spec = parse_spec("crossover:crossover=12:topology=partitioned")
    flags = given_settings(
        parser().parse_args(
            [*SERVE, "--policy-param", "crossover=12", "--policy-param", "topology=partitioned"]
        )
    )["given_params"]
    assert spec == flags == params.pairs(["crossover=12", "topology=partitioned"], name)


# 2. Declared once: a new parameter needs nothing outside its dataclass


@dataclass(frozen=True)
class NewParams:
    window: int = field(default=8, metadata={"help": "requests remembered"})
    mode: Literal["fast", "slow"] = "fast"
    ceiling: float | None = None

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")


def test_a_new_dataclass_is_parsed_and_listed_without_another_edit() -> None:
    assert params.checked("new", NewParams, {"window": "3", "mode": "slow"}) == {
        "window": 3,
        "mode": "slow",
    }
    bad: list[tuple[dict[str, Any], str]] = [
        ({"window": "2.5"}, "window='2.5': expected INTEGER"),
        ({"window": 0}, "window must be >= 1, got 0"),
        ({"mode": "medium"}, "mode='medium': expected fast|slow"),
        ({"size": 1}, "unknown parameter 'size' (known: ceiling, mode, window)"),
    ]
    for raw, said in bad:
        with pytest.raises(PolicyError, match="policy 'new': ") as refused:
            params.checked("new", NewParams, raw)
        assert said in str(refused.value)
    lines = " ".join(" ".join(params.help_lines(NewParams)).split())
    assert "window=INTEGER requests remembered (default: 8)" in lines
    assert "mode=fast|slow (default: fast)" in lines and "ceiling=NUMBER (default: none)" in lines


def test_the_help_lists_every_policy_parameter_with_kind_and_default() -> None:
    text = " ".join(help_text().split())  # wrapped in columns
    for name, found in REGISTRY.items():
        assert f"{name}:" in text
        for key in sorted(found.keys()):
            assert f"{key}=" in text, (name, key)
    assert "topology=shared|partitioned" in text and "(default: partitioned)" in text
    assert "accept_max_age=NUMBER" in text and "(default: 60.0)" in text
    assert "always-spec: none" in text


# 3. In the settings: flags, environment and file, with the deprecated flat settings


@pytest.mark.parametrize(
    ("given", "params_in_force", "deprecated"),
    [
        pytest.param(
            {"given_params": {"crossover": "40"}}, {"crossover": 40.0}, [], id="the table"
        ),
        pytest.param(
            {"crossover": 40}, {"crossover": 40.0}, ["crossover"], id="a deprecated alias"
        ),
        pytest.param(
            {"crossover": 40, "given_params": {"crossover": "40"}},
            {"crossover": 40.0},
            ["crossover"],
            id="both, agreeing",
        ),
        pytest.param(
            {"hysteresis": 2, "given_params": {"crossover": 4}},
            {"crossover": 4.0, "hysteresis": 2.0},
            ["hysteresis"],
            id="both, different keys",
        ),
        pytest.param(
            {"policy": "always-spec", "hysteresis": 2},
            {},
            [],
            id="an alias the policy does not take is ignored (one config serves every policy)",
        ),
    ],
)
def test_the_settings_resolve_the_table_and_the_aliases(
    given: dict[str, Any], params_in_force: dict[str, Any], deprecated: list[str]
) -> None:
    settings = RouterSettings(**BACKENDS, **given)
    assert settings.policy_params() == params_in_force
    assert settings.deprecated() == deprecated


@pytest.mark.parametrize(
    ("given", "said"),
    [
        pytest.param(
            {"crossover": 12, "given_params": {"crossover": "40"}},
            "policy 'crossover': crossover is given twice with different values, 12.0 as the deprecated setting crossover and 40.0 as a policy parameter",
            id="conflict with an alias",
        ),
        pytest.param(
            {"topology": "shared", "given_params": {"topology": "partitioned"}},
            "topology is given twice with different values",
            id="conflict with an alias, a choice",
        ),
        pytest.param(
            {"policy": "always-spec", "given_params": {"hysteresis": 2}},
            "policy 'always-spec': unknown parameter 'hysteresis' (it takes none)",
            id="the table is strict",
        ),
        pytest.param(
            {"topology": "mesh"}, "topology='mesh'", id="an alias's value, checked by the dataclass"
        ),
        pytest.param({"policy": "nope"}, "unknown policy 'nope'", id="unknown policy"),
    ],
)
def test_the_settings_refuse_by_name(given: dict[str, Any], said: str) -> None:
    with pytest.raises(ValidationError) as refused:
        RouterSettings(**BACKENDS, **given)
    assert said in str(refused.value)


def toml(path: Path, text: str) -> Path:
    path.write_text(f'spec = ["http://127.0.0.1:1"]\nbase = ["http://127.0.0.1:2"]\n{text}')
    return path


TABLE = '[policy]\nname = "crossover"\n[policy.params]\ncrossover = 12\ntopology = "partitioned"\n'


@pytest.mark.parametrize(
    ("file", "env", "flags", "params_in_force"),
    [
        pytest.param(TABLE, {}, {}, {"crossover": 12.0, "topology": "partitioned"}, id="file"),
        pytest.param(
            TABLE,
            {"SPECROUTE_POLICY_PARAMS": '{"crossover": 20}'},
            {},
            {"crossover": 20.0, "topology": "partitioned"},
            id="environment over file, key by key",
        ),
        pytest.param(
            TABLE,
            {"SPECROUTE_POLICY_PARAMS": '{"crossover": 20}'},
            {"given_params": {"crossover": "30"}},
            {"crossover": 30.0, "topology": "partitioned"},
            id="flag over environment",
        ),
        pytest.param(
            TABLE,
            {},
            {"crossover": 8},
            {"crossover": 8.0, "topology": "partitioned"},
            id="an alias flag over the file's table",
        ),
        pytest.param(
            TABLE,
            {"SPECROUTE_CROSSOVER": "21"},
            {},
            {"crossover": 21.0, "topology": "partitioned"},
            id="an alias in the environment over the file's table",
        ),
        pytest.param(
            "crossover = 4\nhysteresis = 1\n",
            {},
            {"given_params": {"crossover": "30"}},
            {"crossover": 30.0, "hysteresis": 1.0},
            id="a flag over the file's alias",
        ),
        pytest.param(
            "crossover = 4\n",
            {"SPECROUTE_CROSSOVER": "5"},
            {},
            {"crossover": 5.0},
            id="aliases keep their own precedence",
        ),
        pytest.param(
            'policy.name = "expected-latency"\n[policy.params]\ncontext = "off"\n',
            {},
            {},
            {"context": "off"},
            id="a dotted name with the table",
        ),
        pytest.param(
            "", {"SPECROUTE_POLICY": "always-spec"}, {}, {}, id="the policy by name as before"
        ),
    ],
)
def test_flag_over_environment_over_file(
    file: str,
    env: dict[str, str],
    flags: dict[str, Any],
    params_in_force: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = RouterSettings(config=toml(tmp_path / "router.toml", file), **flags)
    assert settings.policy_params() == params_in_force


@pytest.mark.parametrize(
    ("file", "env", "said"),
    [
        pytest.param(
            "",
            {"SPECROUTE_POLICY_PARAMS": "crossover=4"},
            "SPECROUTE_POLICY_PARAMS is not JSON: give an object",
            id="not JSON",
        ),
        pytest.param(
            f"crossover = 21\n{TABLE}",
            {},
            "crossover is given twice with different values, 21.0 as",
            id="both spellings in the file",
        ),
        pytest.param(
            "",
            {"SPECROUTE_CROSSOVER": "21", "SPECROUTE_POLICY_PARAMS": '{"crossover": 20}'},
            "crossover is given twice",
            id="both spellings in the environment",
        ),
        pytest.param(
            'policy = "crossover"\n[policy.params]\ncrossover = 4\n',
            {},
            "router.toml: Cannot overwrite a value",
            id="a name and a table",
        ),
        pytest.param(
            '[policy]\nnme = "crossover"\n',
            {},
            "[policy] takes name and params, got nme",
            id="a typo in the table",
        ),
        pytest.param(
            '[policy.params]\ncrossover = "x"\n',
            {},
            "policy 'crossover': crossover='x': expected NUMBER",
            id="a bad value in the file",
        ),
    ],
)
def test_a_bad_file_or_environment_is_refused(
    file: str, env: dict[str, str], said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    given: dict[str, Any] = {"config": toml(tmp_path / "router.toml", file)}
    with pytest.raises(ValueError, match=re.escape(said)):
        RouterSettings(**given)


# 4. The command line


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        pytest.param(
            ["--policy-param", "foo=1"],
            "policy 'crossover': unknown parameter 'foo' (known: crossover, hysteresis, topology)",
            id="unknown key",
        ),
        pytest.param(
            ["--policy-param", "crossover"],
            "--policy-param: parameters are KEY=VALUE, got 'crossover'",
            id="no value",
        ),
        pytest.param(
            ["--policy-param", "crossover=x"],
            "policy 'crossover': crossover='x': expected NUMBER",
            id="bad value",
        ),
        pytest.param(
            ["--policy", "expected-latency", "--policy-param", "context=on"],
            "policy 'expected-latency': context='on': expected auto|off",
            id="another policy's",
        ),
        pytest.param(
            ["--policy-param", "crossover=4", "--crossover", "5"],
            "crossover is given twice with different values, 5.0 as the deprecated setting",
            id="conflict with an alias",
        ),
        pytest.param(
            ["--topology", "ring"], "policy 'crossover': topology='ring'", id="an alias's bad value"
        ),
    ],
)
def test_bad_parameters_are_said_in_one_line_with_status_2(
    flags: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*SERVE, *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specroute serve: ") and said in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_serve_help_lists_the_parameters_and_says_the_aliases_are_deprecated(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--policy-param KEY=VALUE" in text and "SPECROUTE_POLICY_PARAMS" in text
    assert "[policy.params]" in text and help_text().split()[0] in text
    for flag in ("--crossover", "--topology", "--hysteresis", "--accept-max-age", "--probe-share"):
        assert f"{flag} " in text
        key = flag[2:].replace("-", "_")
        assert f"deprecated: use --policy-param {key}=VALUE" in text, flag
    assert "--context auto|off deprecated: use --policy-param context=VALUE" in text


# 5. Live: the parameters reach a router, and its status shows them


@pytest.mark.parametrize(
    "flags",
    [
        pytest.param(
            ["--policy-param", "crossover=0", "--policy-param", "hysteresis=1.5"],
            id="--policy-param",
        ),
        pytest.param(["--crossover", "0", "--hysteresis", "1.5"], id="the deprecated aliases"),
    ],
)
async def test_the_parameters_reach_a_live_router(flags: list[str]) -> None:
    """A crossover of 0 sends even the first request to the plain pool (without one, and
    without a profile, the policy would not start)."""
    async with (
        running_emulator("--mode", "spec", "--time-scale", "0.05") as spec,
        running_emulator("--mode", "base", "--time-scale", "0.05") as base,
    ):
        argv = ["serve", "--spec", spec, "--base", base, *flags]
        async with running_router(**given_settings(parser().parse_args(argv))) as (url, state):
            raw = await client(url).chat.completions.with_raw_response.create(
                model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
            assert raw.headers["x-specroute-backend"].startswith("base:")
            async with aiohttp.ClientSession() as s, s.get(f"{url}/router/status") as r:
                policy = (await r.json())["policy"]
    assert policy["name"] == "crossover"
    assert policy["parameters"] == {"crossover": 0.0, "topology": "shared", "hysteresis": 1.5}
    assert [d["reason"] for d in state.decisions.recent] == ["above_crossover"]
