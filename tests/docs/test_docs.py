"""The docs site's generated pages: the references read from the code carry what the code
has, and every results block and figure has its committed JSON."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from docsgen.blocks import BLOCKS, render
from docsgen.cli_reference import cli_reference
from docsgen.compare_results import compare_table
from docsgen.figures import PLOTS
from docsgen.hooks import MARKER, fill
from docsgen.metrics_reference import metrics_reference
from docsgen.profile_reference import profile_reference
from docsgen.router_results import overhead_reference, overhead_shares
from docsgen.runs import FIGURES, RUNS
from docsgen.settings_reference import settings_reference
from specroute.bench.overhead_report import same_load

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_cli_reference_has_every_command_and_a_known_flag() -> None:
    text = cli_reference()
    for command in ("serve", "calibrate", "profile", "emulate", "demo", "bench compare"):
        assert f"## `specroute {command}`" in text
    assert "`--max-concurrency N`" in text  # calibrate's
    assert "`--policies POLICIES`" in text  # bench compare's
    assert "[setting `poll_interval`](settings.md#poll_interval)" in text  # serve's


def test_the_settings_reference_has_a_known_setting_with_its_env_and_default() -> None:
    text = settings_reference()
    row = next(line for line in text.splitlines() if 'id="eject_after_failures"' in line)
    assert "`SPECROUTE_EJECT_AFTER_FAILURES`" in row and "`int`" in row and "`3`" in row
    assert "`auto | off | None`" in text  # a Literal, as a user writes it


@pytest.mark.parametrize(
    ("which", "metric", "labels"),
    [
        ("router", "specroute_route_decisions_total", "`pool`, `reason`"),
        ("router", "specroute_band_edge", "`band`, `edge`"),  # a gauge read at each scrape
        ("emulator", "specroute_emulator_lag_ratio", ""),
    ],
)
def test_the_metrics_reference_has_a_known_metric_with_its_labels(
    which: str, metric: str, labels: str
) -> None:
    row = next(line for line in metrics_reference(which).splitlines() if f"`{metric}`" in line)
    assert f"| {labels} |" in row


def test_the_profile_reference_has_both_schemas_and_the_readers_rules() -> None:
    text = profile_reference()
    assert "`specroute.profile/v1`" in text and "`specroute.profile/v2`" in text
    assert "`{where}.value must be a positive number`" in text
    assert "`ContextAxis.tokens_per_byte`" in text


def test_a_marker_is_filled_and_an_unknown_one_fails() -> None:
    assert "specroute_requests_total" in fill("x <!-- docsgen: metrics router --> y")
    with pytest.raises(KeyError, match="no docs block"):
        render("no-such-block", [])


def test_a_marker_inside_a_note_is_filled_inside_it() -> None:
    page = '??? note "Every target"\n\n    <!-- docsgen: overhead -->\n\nAfter.\n'
    filled = fill(page, "results/router.md").splitlines()
    inside = filled[2 : filled.index("After.")]
    assert any("| `specroute-w1` |" in line for line in inside)
    assert all(line.startswith("    ") for line in inside if line.strip())


def test_the_overhead_reference_puts_every_target_side_by_side() -> None:
    text = BLOCKS["overhead-reference"]()
    document = json.loads((DOCS / "results" / "data" / "overhead.json").read_text())
    compared = [t for t in document["targets"] if t != "direct"]
    assert len(text.split("added first-chunk p50, ms: ")) == 3  # streamed, whole
    row = next(line for line in text.splitlines() if "router CPU per request, ms" in line)
    assert row.count(" / ") == (len(compared) - 1) * (1 + len(document["plan"]["levels"]))


def test_several_processes_are_set_against_one_at_the_same_load_a_process() -> None:
    """``bare-w4`` at 64 streams over ``bare`` at 16, ``specroute-w2`` at 512 over
    ``specroute-w1`` at 256: each ratio the two medians'; a level that does not divide by the
    count, or whose share was not measured, has none; the table shows both ratios."""
    document = json.loads((DOCS / "results" / "data" / "overhead-workers.json").read_text())
    cpu = {
        (r["mode"], r["level"], r["target"]): r["router_cpu_ms_per_request"]["median"]
        for r in document["summary"]
        if r["target"] != "direct"  # no router: no CPU of one
    }
    shares = {(p["mode"], p["level"], p["target"]): p for p in same_load(document["summary"])}
    four = shares["stream", 64, "bare-w4"]
    assert (four["against"], four["against_level"]) == ("bare", 16)
    assert four["ratio"] == pytest.approx(cpu["stream", 64, "bare-w4"] / cpu["stream", 16, "bare"])
    two = shares["whole", 512, "specroute-w2"]
    assert (two["against"], two["against_level"]) == ("specroute-w1", 256)
    assert ("stream", 1, "specroute-w4") not in shares  # 1 does not divide by 4
    assert ("stream", 64, "specroute-w2") not in shares  # 32 was not measured
    assert all(p["target"] not in ("bare", "specroute-w1", "direct") for p in shares.values())
    flagged = [r | {"target": "specroute-w2-online-off"} for r in document["summary"]]
    assert same_load(flagged) == []  # a target served with other flags is no count of one
    text = overhead_shares(document)
    assert f"{four['ratio']:.2f}x (at 16)" in text
    same = cpu["stream", 64, "bare-w4"] / cpu["stream", 64, "bare"]
    assert f"{same:.2f}x" in text
    assert overhead_shares({"summary": []}) == "Not measured in this run."


def test_a_live_comparison_shows_each_policys_lag_and_one_late_is_flagged() -> None:
    """The committed live run kept time, its lag in a column of its own; the same run with
    one policy's servers 8% late is said not to have, and one late in a phase only shows
    that phase's lag beside the run's; a run that read its share of a request's time
    elsewhere shows it; an offline run has neither column."""
    live = json.loads((DOCS / "results" / "data" / "demo-live.json").read_text())
    assert live["kept_time"] is True
    text = compare_table([("live", live)])
    assert "emulator lag" in text and "Not kept time" not in text
    late = json.loads(json.dumps(live))
    late["kept_time"] = False
    next(iter(late["policies"].values()))["emulator_lag"] = 0.08
    text = compare_table([("live", late)])
    assert "+8.0%" in text and "Not kept time" in text
    assert "time elsewhere" not in text  # a run made before it was read shows no column
    heavy = next(iter(late["policies"].values()))
    heavy["emulator_lag"] = 0.012
    heavy["phases"][-1]["emulator_lag"] = 0.2  # the whole run's 1.2% hid it
    assert "+1.2% (a phase +20.0%)" in compare_table([("live", late)])
    away = json.loads(json.dumps(live))
    for figures in away["policies"].values():
        figures["elsewhere"] = 0.012
    text = compare_table([("live", away)])
    assert "time elsewhere" in text and "1.2%" in text and "Not kept time" not in text
    offline = json.loads((DOCS / "results" / "data" / "demo-offline.json").read_text())
    assert "emulator lag" not in compare_table([("offline", offline)])
    assert "time elsewhere" not in compare_table([("offline", offline)])


def test_the_lean_floor_sits_with_the_pass_throughs_never_as_the_gateway() -> None:
    """With ``--lean`` the gateway compared against is still smg: each target's CPU over
    smg's, lean's and bare's among them, in the pass-throughs' place at the end."""
    document = json.loads((DOCS / "results" / "data" / "overhead.json").read_text())
    targets = ["direct", "bare", "lean", "specroute-w1", "smg"]
    rows = []
    for row in document["summary"]:
        if row["target"] in ("bare", "specroute-w1", "smg"):
            rows.append(row)
            if row["target"] == "bare":
                rows.append(row | {"target": "lean"})
    text = overhead_reference({**document, "targets": targets, "summary": rows})
    assert "CPU per request over smg's: specroute-w1 / bare / lean" in text
    assert "router CPU per request, ms: specroute-w1 / smg / bare / lean" in text


def test_every_marker_of_every_page_names_a_block() -> None:
    for page in DOCS.rglob("*.md"):
        for match in MARKER.finditer(page.read_text()):
            assert match["name"] in BLOCKS, (page, match["name"])


def test_every_run_has_its_json_and_every_figure_its_run() -> None:
    for name, run in RUNS.items():
        assert run.data(name).is_file(), name
    drawn = {run.figure for run in RUNS.values() if run.figure}
    assert {p.name for p in FIGURES.glob("*.png")} <= drawn
    pictures = {p.name for p in DOCS.glob("*.png")}
    assert not pictures, f"figures belong in docs/figures/, drawn from a run: {pictures}"
    for page in DOCS.rglob("*.md"):
        for figure in re.findall(r"figures/([\w.-]+\.png)", page.read_text()):
            assert figure in drawn, (page, figure)


def test_the_overhead_figures_are_drawn_from_their_runs(tmp_path: Path) -> None:
    """The reference's figure and the same-load one, drawn again from their committed JSON
    by the plots ``make figures`` uses."""
    for name in ("overhead", "overhead-shares"):
        run = RUNS[name]
        assert run.figure is not None and run.plot is not None
        out = tmp_path / run.figure
        PLOTS[run.plot](json.loads(run.data(name).read_text()), out)
        assert out.read_bytes()[:4] == b"\x89PNG", name


def test_the_policy_parameters_and_import_layers_are_read_from_the_code() -> None:
    params = render("policy-params", [])
    row = next(line for line in params.splitlines() if "| `crossover` | `topology` |" in line)
    assert "`shared|partitioned`" in row and "`shared`" in row
    layers = render("imports", [])
    assert "| 1 | `__main__` |" in layers and "`router`, `emulator`" in layers
    assert "no import circle" in layers
