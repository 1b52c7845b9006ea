"""The import directions are a contract (pyproject.toml's ``[tool.importlinter]``) that
``make lint`` checks: the package as installed keeps it, and one back-import breaks it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
PACKAGES = tuple(  # each folder that installs as specroute.<folder>
    folder
    for name, folder in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ].items()
    if name != "specroute"
)
LINTER = Path(sys.executable).parent / "lint-imports"


def _installed(at: Path) -> Path:
    """The package laid out as it installs: specroute/ with each folder inside it."""
    package = at / "specroute"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "specroute", package, ignore=ignore)
    for name in PACKAGES:
        shutil.copytree(ROOT / name, package / name, ignore=ignore)
    return package


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINTER), "--no-cache", "--no-logo", str(ROOT / "pyproject.toml")],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    if not LINTER.exists():
        pytest.fail(f"import-linter is a dev dependency and is missing: no {LINTER}")
    _installed(tmp_path)
    return tmp_path


def test_the_package_keeps_its_import_contracts(tree: Path) -> None:
    done = _lint(tree)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(
    ("module", "back_import", "broken"),
    [
        ("router/proxy/handler.py", "specroute.bench.compare", "command line > benchmarks"),
        ("loadgen/record.py", "specroute.profiler.stats", "command line > benchmarks"),
        ("emulator/engine.py", "specroute.policies.view", "the emulator stands alone"),
        ("policies/view.py", "specroute.router.proxy.request", "command line > benchmarks"),
        ("router/state.py", "specroute.router.proxy.handler", "the router's parts"),
        ("router/proxy/choice.py", "specroute.router.state", "the request path and the tasks"),
        ("router/tasks/monitor.py", "specroute.router.state", "the request path and the tasks"),
        ("router/protocol/errors.py", "specroute.router.metrics", "the router's parts"),
    ],
)
def test_a_back_import_breaks_the_contract(
    tree: Path, module: str, back_import: str, broken: str
) -> None:
    path = tree / "specroute" / module
    path.write_text(path.read_text() + f"\nimport {back_import}  # noqa\n")
    done = _lint(tree)
    assert done.returncode != 0
    assert broken in done.stdout and "BROKEN" in done.stdout


def test_every_part_of_the_package_has_its_layer() -> None:
    """A module the layers do not name is bound by none of them."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in config["contracts"] if c["type"] == "layers")["layers"]
    named = {m.strip() for layer in layers for m in layer.split("|")}
    parts = {f"specroute.{p.stem}" for p in (ROOT / "specroute").glob("*.py")} - {
        "specroute.__init__"
    }
    parts |= {f"specroute.{name}" for name in PACKAGES}
    assert parts == named


def test_every_part_of_the_router_has_its_layer() -> None:
    """Inside the router too: each of its subpackages and modules is in a layer."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in config["contracts"] if c.get("containers") == ["specroute.router"])
    named = {m.strip() for layer in layers["layers"] for m in layer.split("|")}
    router = ROOT / "router"
    parts = {p.stem for p in router.glob("*.py")} - {"__init__"}
    parts |= {p.name for p in router.iterdir() if (p / "__init__.py").exists()}
    assert parts == named
