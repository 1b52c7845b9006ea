"""Every setting of the router is a flag of ``specroute serve``, made from the settings
model (``specroute.settings_flags``) whose table is the model's as it stands, named by the
setting's flat spelling and grouped by its part; a flag, a variable and a file's key or
table reach the same setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from docsgen.cli_reference import commands
from docsgen.settings_flags import generated
from specroute.cli import parser
from specroute.router.settings import RouterSettings
from specroute.router.settings.spelling import spellings
from specroute.serve_command import given_settings
from specroute.settings_flags import FLAGS

BACKENDS = ["serve", "--spec", "http://127.0.0.1:1", "--base", "http://127.0.0.1:2"]


def test_the_table_is_the_settings_model_s() -> None:
    assert generated() == FLAGS, "run `python -m docsgen.settings_flags`"


def test_every_setting_is_a_flag_in_its_part_s_group() -> None:
    serve = dict(commands(parser()))["specroute serve"]
    flags = {a.dest for a in serve._actions}
    assert set(spellings(RouterSettings)) - flags == set()
    groups = {g.title: {a.dest for a in g._group_actions} for g in serve._action_groups}
    assert {"health_interval", "health_timeout", "stale_after"} <= groups[
        "the backends' health and load"
    ]
    assert {"online", "online_peers"} <= groups["online calibration"]


def test_a_made_flag_reaches_the_settings() -> None:
    flags = ["--health-interval", "0.5", "--max-headers", "64", "--online", "adopt"]
    flags += ["--max-upstream-head-bytes", "4096", "--queue-at-capacity"]
    settings = RouterSettings(**given_settings(parser().parse_args([*BACKENDS, *flags])))
    assert (settings.health.interval, settings.http.max_headers) == (0.5, 64)
    assert (settings.online.mode, settings.upstream.max_head_bytes) == ("adopt", 4096)
    assert settings.admission.queue_at_capacity
    default = RouterSettings(**given_settings(parser().parse_args(BACKENDS)))
    assert (default.health.interval, default.http.max_headers) == (2.0, 128)
    assert not default.admission.queue_at_capacity


def test_a_file_gives_a_setting_by_its_part_s_table_or_its_flat_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``[health] interval = 3`` and ``health_interval = 3`` are one setting; a flag over
    the variable over the file, whichever spelling each used."""
    given = {"spec": ["http://a:1"], "base": ["http://b:1"]}
    nested = tmp_path / "nested.toml"
    nested.write_text('[health]\ninterval = 3\n[online]\nmode = "adopt"\nexplore_share = 0.1\n')
    flat = tmp_path / "flat.toml"
    flat.write_text('health_interval = 3\nonline = "adopt"\nonline_explore_share = 0.1\n')
    for path in (nested, flat):
        settings = RouterSettings(**given, config=str(path))
        assert (settings.health.interval, settings.online.mode) == (3, "adopt")
        assert settings.online.explore_share == 0.1
    monkeypatch.setenv("SPECROUTE_HEALTH_INTERVAL", "4")
    assert RouterSettings(**given, config=str(nested)).health.interval == 4
    assert RouterSettings(**given, config=str(nested), health_interval=5).health.interval == 5
    assert RouterSettings(**given, health={"interval": 6}).health.interval == 6


def test_a_refusal_names_the_flat_spelling_a_flag_takes(tmp_path: Path) -> None:
    """A bad value given in a part's table is named as the flag and the variable name it,
    and a key no part knows is named in its table."""
    given = {"spec": ["http://a:1"], "base": ["http://b:1"]}
    path = tmp_path / "bad.toml"
    path.write_text("[online]\naccept_tolerance = -1\n")
    with pytest.raises(ValueError, match="online_accept_tolerance"):
        RouterSettings(**given, config=str(path))
    path.write_text("[health]\nintervl = 1\n")
    with pytest.raises(ValueError, match=r"health\.intervl"):
        RouterSettings(**given, config=str(path))
