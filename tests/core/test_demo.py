"""``specroute demo`` end to end, shortened: it calibrates, routes, compares, draws, and
leaves no server running."""

from __future__ import annotations

import json
import re
from pathlib import Path

import aiohttp

from tests.profiler.test_bench import run


async def test_demo_runs_the_loop_and_cleans_up(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    code, stdout, stderr = await run(
        "demo", "--time-scale", "0.05", "--peak", "8", "--phase-seconds", "1", "--out", str(out)
    )
    assert code == 0, stderr
    assert "crossover" in stdout and "always-spec" in stdout and "always-base" in stdout
    assert "all servers and routers stopped" in stdout
    profile = json.loads((out / "profile.json").read_text())
    assert profile["schema"] == "specroute.profile/v1"
    results = json.loads((out / "compare" / "compare.json").read_text())
    assert list(results["policies"]) == ["crossover", "always-spec", "always-base"]
    assert (out / "demo.png").read_bytes()[:4] == b"\x89PNG"
    offline = json.loads((out / "offline.json").read_text())
    assert offline["mode"] == "offline" and "crossover" in offline["gap"]
    assert "offline replay of the same ramp" in stdout
    urls = set(re.findall(r"http://127\.0\.0\.1:\d+", stdout))
    assert len(urls) == 2
    async with aiohttp.ClientSession() as s:
        for url in urls:
            try:
                async with s.get(f"{url}/health") as r:
                    raise AssertionError(f"{url} still answers {r.status}")
            except aiohttp.ClientConnectionError:
                pass
