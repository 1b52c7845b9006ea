"""deploy/ checked by the real tools: SGLang's own argument parser, systemd and promtool.

Every launch line that ``deploy/sglang/launch.sh --print`` renders, for each env file in
``deploy/sglang/``, each topology and both servers, is parsed by SGLang 0.5.23's
``ServerArgs`` in ``.venv-deploy`` (``make deploy-env`` builds it; no model is loaded), and
the pair must differ only in speculation. The systemd units are read by
``systemd-analyze verify``, the Prometheus files by ``promtool check``, and every metric a
rule reads must be one the router or the emulated SGLang server exports. Each check skips,
saying why, when its tool is absent.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from specroute import prometheus
from specroute.emulator.memory import default_fraction, shared_fractions
from tests.exported_metrics import RULE_FILES, exported, metric_names, recorded, rules, scrape
from tests.sglang_launch import LAUNCH, Launch, parse, render

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
ENV_FILES = sorted((DEPLOY / "sglang").glob("*.env"))
UNITS = sorted((DEPLOY / "systemd").glob("*.service"))
PROMETHEUS = DEPLOY / "prometheus"
TOPOLOGIES = ("partitioned", "shared", "node")
ROLES = ("spec", "base")
# the KV cache needs room beside the weights: a share that the weights fill past this
# fraction serves too few tokens to be worth starting
WEIGHTS_SHARE_MAX = 0.9


def env_values(env_file: Path) -> dict[str, str]:
    """The file as systemd's EnvironmentFile= reads it (the files use no escapes)."""
    values = {}
    for line in env_file.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip().strip('"')
    return values


LAUNCHES = [render(e, t, r) for e in ENV_FILES for t in TOPOLOGIES for r in ROLES]


def test_there_is_something_to_check() -> None:
    assert {e.name for e in ENV_FILES} >= {"node.env", "llama3.1-8b.env"}
    assert {u.name for u in UNITS} == {
        "sglang-spec.service",
        "sglang-base.service",
        "specroute.service",
    }


@pytest.fixture(scope="module")
def parsed() -> dict[str, dict[str, Any]]:
    return parse({launch.name: launch.argv for launch in LAUNCHES})


@pytest.mark.parametrize("launch", LAUNCHES, ids=lambda launch: launch.name)
def test_sglang_parses_the_launch_line(parsed: dict[str, dict[str, Any]], launch: Launch) -> None:
    result = parsed[launch.name]
    assert "error" not in result, f"{launch.name}: {result.get('error')}\n{shlex.join(launch.argv)}"
    args = result["args"]
    assert args["enable_metrics"]
    assert args["tp_size"] == len(launch.gpus), "one tensor-parallel rank per visible GPU"
    if launch.role == "spec":
        assert args["speculative_algorithm"] == "EAGLE3"
        assert args["speculative_draft_model_path"]
        # SGLang derives the numbers it is not given: set all three or none
        steps, topk, tokens = (
            args[k]
            for k in (
                "speculative_num_steps",
                "speculative_eagle_topk",
                "speculative_num_draft_tokens",
            )
        )
        assert None not in (steps, topk, tokens)
        assert tokens <= steps * topk + 1, "more draft tokens than the tree holds"
    else:
        assert args["speculative_algorithm"] is None


@pytest.mark.parametrize(("env", "topology"), [(e.name, t) for e in ENV_FILES for t in TOPOLOGIES])
def test_the_two_servers_differ_only_in_speculation(
    parsed: dict[str, dict[str, Any]], env: str, topology: str
) -> None:
    spec, base = (parsed[f"{env}/{topology}/{role}"].get("args") for role in ROLES)
    assert spec and base, "a launch line did not parse"
    # an EAGLE server left unset caps itself at 48 running requests, and a batch past the
    # CUDA-graph limit runs eagerly: either would put a queue or a slowdown in the crossover
    for same in (
        "model_path",
        "max_running_requests",
        "cuda_graph_max_bs_decode",
        "tp_size",
    ):
        assert spec[same] == base[same], same
    assert spec["max_running_requests"] <= spec["cuda_graph_max_bs_decode"]
    assert spec["port"] != base["port"] and spec["nccl_port"] != base["nccl_port"]
    if topology == "shared":
        # started one after the other, each holds the same memory and keeps the reserve
        # SGLang keeps for one server: the fractions the emulator and the bench give them
        values = env_values(DEPLOY / "sglang" / env)
        one = default_fraction(
            float(values["GPU_MEMORY_GB"]), spec["tp_size"], spec["cuda_graph_max_bs_decode"]
        )
        fractions = (spec["mem_fraction_static"], base["mem_fraction_static"])
        assert fractions == shared_fractions(one)
    else:
        assert spec["mem_fraction_static"] == base["mem_fraction_static"]


@pytest.mark.parametrize("env_file", ENV_FILES, ids=lambda p: p.name)
def test_each_topology_places_the_servers(env_file: Path) -> None:
    spec, base = (render(env_file, "partitioned", role) for role in ROLES)
    assert set(spec.gpus).isdisjoint(base.gpus) and len(spec.gpus) == len(base.gpus) == 4
    for topology in ("shared", "node"):
        spec, base = (render(env_file, topology, role) for role in ROLES)
        assert spec.gpus == base.gpus == tuple(range(8))


@pytest.mark.parametrize("env_file", ENV_FILES, ids=lambda p: p.name)
def test_the_default_topology_holds_the_weights(env_file: Path) -> None:
    values = env_values(env_file)
    gpu_gb, weights_gb = float(values["GPU_MEMORY_GB"]), float(values["MODEL_WEIGHTS_GB"])
    share_gb = {
        "partitioned": 4 * gpu_gb,
        "shared": 8 * gpu_gb * float(values["SPEC_MEM_FRACTION_STATIC"]),
        "node": 8 * gpu_gb,
    }[values["TOPOLOGY"]]
    assert weights_gb <= WEIGHTS_SHARE_MAX * share_gb, (
        f"{env_file.name}: {weights_gb:.0f} GB of weights in a {share_gb:.0f} GB share "
        f"({values['TOPOLOGY']})"
    )


def test_launch_refuses_an_unknown_topology() -> None:
    run = subprocess.run(
        ["bash", str(LAUNCH), "spec", "--env", str(ENV_FILES[0]), "--topology", "ring", "--print"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode == 2 and "TOPOLOGY" in run.stderr


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed"
)
def test_systemd_units_verify(tmp_path: Path) -> None:
    # verify insists that ExecStart= exists: point the installed paths at this checkout
    installed = {
        "/usr/local/lib/specroute/sglang/launch.sh": str(LAUNCH),
        "/usr/local/bin/specroute": str(Path(sys.executable).with_name("specroute")),
    }
    for unit in UNITS:
        text = unit.read_text()
        for path, here in installed.items():
            text = text.replace(path, here)
        (tmp_path / unit.name).write_text(text)
    run = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *sorted(str(p) for p in tmp_path.iterdir())],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0 and not run.stderr.strip(), run.stderr


needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool is not installed (Debian: apt-get install prometheus)",
)


@needs_promtool
@pytest.mark.parametrize(
    "argv",
    [
        ["check", "config", "prometheus.yml"],
        ["check", "rules", *(p.name for p in RULE_FILES)],
        ["test", "rules", "alerts_test.yml"],
    ],
    ids=["config", "rules", "alerts-fire-as-written"],
)
def test_promtool_accepts(argv: list[str]) -> None:
    run = subprocess.run(
        ["promtool", *argv], cwd=PROMETHEUS, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stdout + run.stderr


PROFILE_GAUGES = (
    "specroute_profile_accept_length",
    "specroute_profile_created_timestamp_seconds",
    "specroute_profile_context_tokens",
)


async def test_rules_read_only_exported_metrics(tmp_path: Path) -> None:
    pages = await scrape(tmp_path)
    shown = prometheus.sums(pages[0], PROFILE_GAUGES)
    assert shown["specroute_profile_accept_length"] == 3.0
    assert shown["specroute_profile_context_tokens"] == 512 + 128 / 2
    created = datetime(2026, 11, 30, tzinfo=UTC).timestamp()
    assert shown["specroute_profile_created_timestamp_seconds"] == pytest.approx(created, abs=1)
    every = [rule for path in RULE_FILES for rule in rules(path)]
    written = sum(
        len(re.findall(r"^\s+- (?:record|alert):", p.read_text(), re.M)) for p in RULE_FILES
    )
    assert len(every) == written and all("expr" in rule for rule in every)
    known = set().union(*map(exported, pages)) | {"up"} | recorded()
    for rule in every:
        missing = metric_names(rule["expr"]) - known
        assert not missing, f"{rule.get('alert') or rule.get('record')} reads {sorted(missing)}"
