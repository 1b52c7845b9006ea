"""Every setting of the router is a flag of ``specroute serve``: those not declared by hand
are made from the settings model (``specroute.settings_flags``), and its table is the
model's as it stands."""

from __future__ import annotations

from docsgen.settings_flags import declared, generated, serve_parser
from specroute.cli import parser
from specroute.router.settings import RouterSettings
from specroute.serve_command import given_settings
from specroute.settings_flags import FLAGS

BACKENDS = ["serve", "--spec", "http://127.0.0.1:1", "--base", "http://127.0.0.1:2"]


def test_the_table_is_the_settings_model_s() -> None:
    assert generated(declared()) == FLAGS, "run `python -m docsgen.settings_flags`"


def test_every_setting_is_a_flag() -> None:
    flags = {a.dest for a in serve_parser()._actions}
    assert set(RouterSettings.model_fields) - flags == set()


def test_a_made_flag_reaches_the_settings() -> None:
    flags = ["--health-interval", "0.5", "--max-headers", "64"]
    settings = RouterSettings(**given_settings(parser().parse_args([*BACKENDS, *flags])))
    assert (settings.health_interval, settings.max_headers) == (0.5, 64)
    default = RouterSettings(**given_settings(parser().parse_args(BACKENDS)))
    assert (default.health_interval, default.max_headers) == (2.0, 128)
