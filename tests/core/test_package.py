"""The distribution as a user installs it: one top-level package, its data inside it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PARTS = ("bench", "emulator", "online", "policies", "profiler", "router")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built from a copy of the sources, so that no build folder of the checkout's (where
    setuptools keeps files that were since deleted) leaks into it."""
    out, sources = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("src") / "src"
    shutil.copytree(REPO, sources, ignore=shutil.ignore_patterns(".*", "build", "*.egg-info"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(out),
            str(sources),
        ],
        check=True,
        capture_output=True,
    )
    (found,) = out.glob("specroute-*.whl")
    return found


def test_the_wheel_holds_one_top_level_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {
        "specroute",
        wheel.name.split("-py")[0] + ".dist-info",
    }
    for part in PARTS:
        assert f"specroute/{part}/__init__.py" in names
    for init in sorted(REPO.glob("*/**/__init__.py")):  # every subpackage of every part
        folder = init.relative_to(REPO).parent
        if folder.parts[0] in (*PARTS, "loadgen"):
            assert f"specroute/{folder.as_posix()}/__init__.py" in names, folder
    assert "specroute/emulator/hardware_models/kimi-k2.5-8x-pcie.json" in names
    assert "specroute/loadgen/traces/azure-llm-2023-conv.csv.gz" in names
    assert "specroute/loadgen/traces/README.md" in names  # the trace's attribution, beside it
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)


def test_installed_alone_it_serves_its_data_and_no_bare_parts(wheel: Path, tmp_path: Path) -> None:
    """Unpacked on an otherwise empty path (no site-packages, no checkout): the hardware
    models are found through the package, and ``import router`` finds nothing."""
    zipfile.ZipFile(wheel).extractall(tmp_path)
    script = (  # -S: no site-packages, so neither the editable install nor its import hook
        "import sys\n"
        "from specroute.emulator.hardware import available_models, load_hardware\n"
        "print(','.join(available_models())); load_hardware('kimi-k2.5-8x-pcie')\n"
        "from specroute.loadgen.request_trace import azure_conversations\n"
        "assert len(azure_conversations().requests) == 19366\n"
        "import importlib.util\n"
        "print(','.join(p for p in sys.argv[1:] if importlib.util.find_spec(p) is not None))\n"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-c", script, *PARTS],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    shipped, bare = done.stdout.splitlines()
    assert "kimi-k2.5-8x-pcie" in shipped.split(",")
    assert bare == ""


def test_the_license_file_is_the_declared_one() -> None:
    declared = (REPO / "pyproject.toml").read_text()
    assert 'license = "Apache-2.0"' in declared
    assert "Apache License" in (REPO / "LICENSE").read_text()[:200]
