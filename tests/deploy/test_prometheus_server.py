"""deploy/prometheus/ run by a real Prometheus server against a node as deployed: a router in
front of a speculative and a plain emulated SGLang server, all three scraped through the
shipped files with only the target addresses changed and the intervals shortened to 1 s.

While streamed chat completions cross both pools, every target must be up, every recording
rule in rules.yml must give a finite value, and every rule, alerts included, must evaluate
without error. promtool (tests/deploy/test_deploy.py) reads the files; this is what the server does
with them. Skips, saying why, when the ``prometheus`` binary is absent.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import re
import shutil
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import openai
import pytest

from specroute.loadgen.spawn import free_port
from tests.processes import emulator_pair, specroute

PROMETHEUS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
RULE_FILES = ("rules.yml", "alerts.yml")
# the address prometheus.yml ships for each job, as deploy/sglang/node.env's ports
SHIPPED = {
    "specroute": "127.0.0.1:8000",
    "sglang-spec": "127.0.0.1:30001",
    "sglang-base": "127.0.0.1:30002",
}
INTERVAL = "1s"
DEADLINE = 30.0  # seconds for Prometheus to show what each check waits for
# below the load of one round of streams: the first requests of a round go to the
# speculative pool, the rest to the plain one
CROSSOVER = 2
STREAMS = 6
EMULATOR = ("--time-scale", "0.05")

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None,
    reason="the prometheus server is not installed (Debian: apt-get install prometheus)",
)

T = TypeVar("T")


def deployed_config(addresses: dict[str, str]) -> str:
    """prometheus.yml with each job's shipped address replaced by ``addresses[job]`` and
    both intervals set to ``INTERVAL``; anything else left as shipped."""
    text = (PROMETHEUS / "prometheus.yml").read_text()
    for job, shipped in SHIPPED.items():
        text, n = re.subn(rf'"{re.escape(shipped)}"', f'"{addresses[job]}"', text)
        assert n == 1, f"prometheus.yml names {shipped} (job {job}) {n} times, not once"
    text, n = re.subn(
        r"^(\s*(?:scrape|evaluation)_interval:)\s*\S+", rf"\g<1> {INTERVAL}", text, flags=re.M
    )
    assert n == 2, "prometheus.yml sets scrape_interval and evaluation_interval once each"
    return text


def rule_names(kind: str) -> list[str]:
    """Each ``record`` or ``alert`` name in the rule files, in order."""
    pattern = re.compile(rf"^\s*-\s+{kind}:\s*(\S+)\s*$", re.M)
    return [m for name in RULE_FILES for m in pattern.findall((PROMETHEUS / name).read_text())]


@asynccontextmanager
async def prometheus_server(config: str, where: Path) -> AsyncIterator[str]:
    """Prometheus on a free loopback port with ``config`` beside copies of the rule files,
    its storage in ``where``; yields its URL once ready, and stops it at the end."""
    for name in RULE_FILES:
        shutil.copy(PROMETHEUS / name, where / name)
    (where / "prometheus.yml").write_text(config)
    url = f"http://127.0.0.1:{free_port()}"
    log = where / "prometheus.log"
    with log.open("wb") as output:
        process = await asyncio.create_subprocess_exec(
            "prometheus",
            f"--config.file={where / 'prometheus.yml'}",
            f"--storage.tsdb.path={where / 'data'}",
            f"--web.listen-address={url.removeprefix('http://')}",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=output,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            async with aiohttp.ClientSession() as session:

                async def ready() -> bool | None:
                    if process.returncode is not None:
                        raise AssertionError(f"prometheus exited: {log.read_text()[-3000:]}")
                    with suppress(aiohttp.ClientError):
                        async with session.get(f"{url}/-/ready") as answer:
                            return answer.status == 200 or None
                    return None

                await until(ready, "prometheus to be ready")
            yield url
        finally:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(process.wait(), 10)
                except TimeoutError:
                    process.kill()
            await process.wait()


async def until(check: Callable[[], Awaitable[T | None]], what: str) -> T:
    """``check()``'s first answer other than None, tried every 0.25 s for ``DEADLINE``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE
    while loop.time() < deadline:
        found = await check()
        if found is not None:
            return found
        await asyncio.sleep(0.25)
    raise TimeoutError(f"waited {DEADLINE:g} s for {what}")


async def api(session: aiohttp.ClientSession, url: str, path: str, **params: str) -> Any:
    async with session.get(f"{url}/api/v1/{path}", params=params) as answer:
        body = await answer.json()
    assert body["status"] == "success", f"{path} {params}: {body}"
    return body["data"]


async def traffic(router: str) -> None:
    """Rounds of ``STREAMS`` concurrent streamed chat completions until cancelled."""
    client = openai.AsyncOpenAI(base_url=f"{router}/v1", api_key="unused", max_retries=0)

    async def one(i: int) -> None:
        stream = await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": f"Request {i}: tell me about Prometheus."}],
            max_tokens=16,
            stream=True,
        )
        async for _ in stream:
            pass

    async with client:
        for round_ in itertools.count():
            await asyncio.gather(*(one(round_ * STREAMS + i) for i in range(STREAMS)))


async def test_prometheus_scrapes_the_node_and_evaluates_every_rule(tmp_path: Path) -> None:
    profile = tmp_path / "profile.json"  # the profile gauges the recording rules read
    profile.write_text(
        json.dumps(
            {
                "schema": "specroute.profile/v1",
                "created": "2026-11-30T00:00:00+00:00",
                "crossover": {"value": CROSSOVER, "ci": [CROSSOVER - 1, CROSSOVER + 1]},
                "acceptance": {"mean_accept_length": 3.0},
            }
        )
    )
    async with (
        emulator_pair(*EMULATOR) as (spec, base),
        specroute("serve", "--spec", spec, "--base", base, "--profile", str(profile)) as (
            router,
            _,
        ),
    ):
        urls = {"specroute": router, "sglang-spec": spec, "sglang-base": base}
        addresses = {job: url.removeprefix("http://") for job, url in urls.items()}
        async with (
            prometheus_server(deployed_config(addresses), tmp_path) as server,
            aiohttp.ClientSession() as session,
        ):
            sending = asyncio.create_task(traffic(router))
            try:
                await check(session, server, urls)
            finally:
                sending.cancel()
                with suppress(asyncio.CancelledError):
                    await sending


async def check(session: aiohttp.ClientSession, server: str, urls: dict[str, str]) -> None:
    async def targets_up() -> list[dict[str, Any]] | None:
        active: list[dict[str, Any]] = (await api(session, server, "targets"))["activeTargets"]
        up = len(active) == len(SHIPPED) and all(t["health"] == "up" for t in active)
        return active if up else None

    try:
        active = await until(targets_up, "every target to be up")
    except TimeoutError:
        raise AssertionError(await api(session, server, "targets")) from None
    scraped = {t["labels"]["job"]: t["scrapeUrl"] for t in active}
    assert scraped == {job: f"{url}/metrics" for job, url in urls.items()}

    async def both_pools() -> set[str] | None:
        by_pool = "sum by (pool) (specroute_route_decisions_total)"
        result = (await api(session, server, "query", query=by_pool))["result"]
        pools = {r["metric"].get("pool") for r in result if float(r["value"][1]) > 0}
        return pools if {"spec", "base"} <= pools else None

    await until(both_pools, "routing decisions to both pools")

    recorded = rule_names("record")
    assert recorded, "rules.yml records nothing"
    empty: dict[str, Any] = {}

    async def every_rule_has_a_value() -> bool | None:
        empty.clear()
        for name in recorded:
            result = (await api(session, server, "query", query=name))["result"]
            if not any(math.isfinite(float(r["value"][1])) for r in result):
                empty[name] = result
        return not empty or None

    try:
        await until(every_rule_has_a_value, "a finite value from each recording rule")
    except TimeoutError:
        raise AssertionError(f"recording rules without a finite value: {empty}") from None

    expected = {("recording", n) for n in recorded} | {("alerting", n) for n in rule_names("alert")}
    loaded: list[dict[str, Any]] = []

    async def every_rule_evaluated() -> bool | None:
        groups = (await api(session, server, "rules"))["groups"]
        loaded[:] = [rule for group in groups for rule in group["rules"]]
        return all(rule["health"] != "unknown" for rule in loaded) or None

    await until(every_rule_evaluated, "every rule to be evaluated")
    assert {(rule["type"], rule["name"]) for rule in loaded} == expected
    failing = {rule["name"]: rule.get("lastError") for rule in loaded if rule["health"] != "ok"}
    assert not failing, f"rules that do not evaluate: {failing}"
