"""SGLang launch lines: rendered by ``deploy/sglang/launch.sh``, parsed by SGLang's own parser.

The parser runs in ``.venv-deploy`` (``make deploy-env``) through ``tests/deploy/server_args.py``;
``parse`` skips the calling test, saying why, when that environment is absent.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
LAUNCH = REPO / "deploy" / "sglang" / "launch.sh"
DEPLOY_PYTHON = REPO / ".venv-deploy" / "bin" / "python"
PARSER = REPO / "tests" / "deploy" / "server_args.py"
LAUNCHER = ["-m", "sglang.launch_server"]


@dataclass(frozen=True)
class Launch:
    env: str
    topology: str
    role: str
    gpus: tuple[int, ...]
    argv: list[str]

    @property
    def name(self) -> str:
        return f"{self.env}/{self.topology}/{self.role}"


def render(env_file: Path, topology: str, role: str) -> Launch:
    line = subprocess.run(
        ["bash", str(LAUNCH), role, "--env", str(env_file), "--topology", topology, "--print"],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    words = shlex.split(line)
    assignment, _python, *rest = words
    key, _, gpus = assignment.partition("=")
    assert key == "CUDA_VISIBLE_DEVICES"
    assert rest[:2] == LAUNCHER, line
    return Launch(env_file.name, topology, role, tuple(int(g) for g in gpus.split(",")), rest[2:])


def parse(cases: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    """Each named argv (what follows ``python -m sglang.launch_server``) as SGLang resolves
    it: ``{"args": {...}}``, or ``{"error": ...}`` when SGLang refuses it."""
    return in_deploy_env(PARSER, [{"name": name, "argv": argv} for name, argv in cases.items()])


def in_deploy_env(script: Path, cases: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``script``'s answer to ``cases`` (JSON on its standard input), run with SGLang in
    ``.venv-deploy``, by case name; the calling test skips, saying why, without it."""
    if not DEPLOY_PYTHON.exists():
        pytest.skip(f"{DEPLOY_PYTHON} is missing: run `make deploy-env` to build it")
    run = subprocess.run(
        [str(DEPLOY_PYTHON), str(script)],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    results: list[dict[str, Any]] = json.loads(run.stdout.strip().splitlines()[-1])
    return {result.pop("name"): result for result in results}
