"""No function of the project (tests aside) longer than 80 lines: a longer one is cut at
its seams before it lands."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[2]
PARTS = [
    "specroute",
    "router",
    "policies",
    "emulator",
    "loadgen",
    "profiler",
    "bench",
    "engines",
    "deploy",
    "docsgen",
]
LONGEST = 80


def test_no_function_is_longer_than_80_lines() -> None:
    long = []
    for part in PARTS:
        for path in sorted((ROOT / part).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    if lines > LONGEST:
                        long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} {lines}")
    assert not long, "\n".join(long)
