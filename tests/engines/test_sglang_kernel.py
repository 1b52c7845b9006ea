"""The project's ``sgl_kernel`` stand-in (``engines/sgl_kernel_cpu``), op by op: the cases
in ``tests/sglang_cpu/kernel_cases.py`` run in the SGLang environment, where the package
is installed, as one process; each case is reported here as a test of its own.

Part of the SGLang real-engine stage (``pytest -m sglang``), skipped with the reason when
``make sglang-env`` has not been run.
"""

from __future__ import annotations

import ast
import json
import subprocess
from functools import cache
from pathlib import Path

import pytest

from specroute.engines.sglang_cpu import missing, python

CASES = Path(__file__).resolve().parents[1] / "sglang_cpu" / "kernel_cases.py"
WHY_NOT = missing()
pytestmark = [
    pytest.mark.sglang,
    pytest.mark.skipif(WHY_NOT is not None, reason=f"real-engine stage: {WHY_NOT}"),
]


def case_names() -> list[str]:
    """Read from the source, which this environment cannot import (it has no torch)."""
    tree = ast.parse(CASES.read_text())
    return [
        n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("case_")
    ]


@cache
def outcomes() -> dict[str, str]:
    ran = subprocess.run(
        [str(python()), str(CASES)], capture_output=True, text=True, timeout=300, check=False
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    found: dict[str, str] = json.loads(ran.stdout.strip().splitlines()[-1])
    return found


@pytest.mark.parametrize("case", case_names())
def test_op(case: str) -> None:
    outcome = outcomes().get(case, "not run")
    assert outcome == "ok", outcome
