"""How many concurrent streams one emulator process sustains in real time.

The emulator sleeps each engine step's modelled duration and then delivers the tokens.
That only stays faithful while the process keeps up: parsing requests, writing SSE chunks
and running the scheduler all cost CPU, and once a step's real wall time exceeds what the
hardware model asked for, the machine running the emulator -- not the modelled GPU --
sets the pace. Any result gathered beyond that point measures this laptop, not SGLang.

This benchmark finds that point. It starts ``specroute emulate`` at time scale 1 as a
subprocess, then for each concurrency level N keeps N streaming ``/v1/chat/completions``
requests in flight (a closed loop: each finished stream is replaced at once) for a fixed
time, and reads the emulator's own counters ``specroute_emulator_step_intended_seconds``
and ``specroute_emulator_step_actual_seconds`` over that window::

    lag = (actual delta) / (intended delta) - 1

A lag above 5% means the emulator is running slow. The result is the highest level that
stays within 5%, plus a linear interpolation of where the lag crosses it.

The load generator runs in this process, so it does not share the emulator's event loop;
it does share the machine's CPUs, though, and on a small machine (2 cores) the client's own
work is part of what is measured. Both processes' CPU use is reported for that reason.
Lag need not mean a saturated CPU: an event loop that wakes late after a burst of SSE writes
lags too, at low CPU use; the CPU columns tell the two apart.

    python -m bench.emulator_capacity --hardware llama3.1-8b-h100 --mode spec \\
        --levels 32,64,128,256,512,1024 --seconds-per-level 8
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import aiohttp

from specroute.bench.event_loop import run as run_loop

HOST = "127.0.0.1"
LAG_LIMIT = 0.05
MIN_MAX_RUNNING = 4096  # --max-running-requests: never the limit being measured
HEALTH_WAIT = 60.0  # seconds for the emulator to come up
SETTLE = 1.0  # seconds after the ramp before measuring
DRAIN_WAIT = 120.0  # seconds to drop a level's streams (a slow model's step is long)
INTENDED = "specroute_emulator_step_intended_seconds_total"
ACTUAL = "specroute_emulator_step_actual_seconds_total"
GEN_TOKENS = "sglang:generation_tokens_total"
LAG_GAUGE = "specroute_emulator_lag_ratio"
STEPS = "specroute_emulator_steps_total"
PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."


# -- arguments ------------------------------------------------------------------------
@dataclass(frozen=True)
class Options:
    hardware: str
    mode: str
    levels: list[int]
    seconds: float
    warmup: float
    max_tokens: int
    out: Path | None


def _levels(text: str) -> list[int]:
    try:
        levels = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like 16,32,64, got {text!r}") from None
    if not levels or levels[0] < 1:
        raise argparse.ArgumentTypeError(f"levels must be >= 1, got {text!r}")
    return levels


def parse_args(argv: Sequence[str] | None) -> Options:
    p = argparse.ArgumentParser(
        prog="python -m bench.emulator_capacity",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument("--hardware", default="kimi-k2.5-8x-pcie")
    p.add_argument("--mode", choices=["spec", "base"], default="spec")
    p.add_argument(
        "--levels",
        type=_levels,
        default=[16, 32, 64, 128, 256, 512],
        help="concurrent streams per level, comma-separated",
    )
    p.add_argument(
        "--seconds-per-level",
        type=float,
        default=8.0,
        dest="seconds",
        help="measured window per level (default: %(default)s)",
    )
    p.add_argument(
        "--warmup",
        type=float,
        default=20.0,
        help="at most this long per level for the ramp to pass before measuring",
    )
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument(
        "--out",
        default="out/emulator_capacity.json",
        help="JSON result: a .json file, or a directory; '' writes none",
    )
    a = p.parse_args(argv)
    if a.seconds <= 0 or a.warmup < 0 or a.max_tokens < 1:
        p.error("--seconds-per-level and --max-tokens must be positive, --warmup >= 0")
    return Options(
        a.hardware,
        a.mode,
        a.levels,
        a.seconds,
        a.warmup,
        a.max_tokens,
        _out_path(a.out, a.hardware, a.mode),
    )


def _out_path(out: str, hardware: str, mode: str) -> Path | None:
    if not out:
        return None
    path = Path(out)
    return path if path.suffix == ".json" else path / f"emulator_capacity-{hardware}-{mode}.json"


# -- the emulator subprocess ------------------------------------------------------------
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


def start_emulator(opts: Options, port: int, log: IO[bytes]) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "specroute", "emulate", "--mode", opts.mode,
           "--hardware", opts.hardware, "--host", HOST, "--port", str(port),
           "--time-scale", "1",
           "--max-running-requests", str(max(MIN_MAX_RUNNING, *opts.levels))]  # fmt: skip
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def stop_emulator(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


async def wait_healthy(
    session: aiohttp.ClientSession, base: str, proc: subprocess.Popen[bytes]
) -> None:
    deadline = time.monotonic() + HEALTH_WAIT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"emulator exited with status {proc.returncode}")
        with contextlib.suppress(aiohttp.ClientError):
            async with session.get(f"{base}/health") as resp:
                if resp.status == 200:
                    return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"emulator not healthy after {HEALTH_WAIT:.0f} s")


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process (Linux /proc); None where unavailable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- reading the emulator -----------------------------------------------------------------
@dataclass(frozen=True)
class Scrape:
    at: float
    intended: float
    actual: float
    tokens: float
    steps: float
    lag_gauge: float


def metric_sum(text: str, name: str) -> float:
    """Sum of every sample of ``name`` (over all label sets) in Prometheus text format."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def scrape(session: aiohttp.ClientSession, base: str) -> Scrape:
    async with session.get(f"{base}/metrics") as resp:
        text = await resp.text()
    return Scrape(
        time.monotonic(),
        metric_sum(text, INTENDED),
        metric_sum(text, ACTUAL),
        metric_sum(text, GEN_TOKENS),
        metric_sum(text, STEPS),
        metric_sum(text, LAG_GAUGE),
    )


async def loads(session: aiohttp.ClientSession, base: str) -> tuple[int, int]:
    """(running, waiting) requests right now."""
    async with session.get(f"{base}/v1/loads") as resp:
        load = (await resp.json())["loads"][0]
    return int(load["num_running_reqs"]), int(load["num_waiting_reqs"])


# -- the load -------------------------------------------------------------------------------
@dataclass
class Tally:
    started: int = 0  # responses whose headers arrived
    chunks: int = 0
    completed: int = 0
    errors: int = 0


async def stream_once(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], tally: Tally
) -> None:
    """One streaming request, read to the end; counts content chunks without parsing JSON."""
    async with session.post(url, json=body) as resp:
        if resp.status != 200:
            await resp.read()
            raise aiohttp.ClientResponseError(resp.request_info, (), status=resp.status)
        tally.started += 1
        async for line in resp.content:
            if (
                line.startswith(b"data: ")
                and b'"content":"' in line
                and b'"content":""' not in line
            ):
                tally.chunks += 1
    tally.completed += 1


async def worker(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], tally: Tally
) -> None:
    """Keep one stream in flight until cancelled."""
    while True:
        try:
            await stream_once(session, url, body, tally)
        except (TimeoutError, aiohttp.ClientError):
            tally.errors += 1
            await asyncio.sleep(0.1)


def request_body(opts: Options) -> dict[str, Any]:
    return {"model": "default", "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": opts.max_tokens, "ignore_eos": True, "stream": True}  # fmt: skip


# -- one level ------------------------------------------------------------------------------
@dataclass(frozen=True)
class LevelResult:
    level: int
    streams: float  # mean running requests the emulator reported in the window
    seconds: float
    tokens_per_s: float
    chunks_per_s: float
    completed: int
    errors: int
    steps: int
    step_ms: float | None  # mean intended (modelled) step time in the window
    intended_s: float
    actual_s: float
    lag: float | None  # actual / intended - 1 over the window
    lag_gauge: float  # the emulator's own recent-steps gauge at the end
    emulator_cpu: float | None  # CPU seconds per wall second
    client_cpu: float


async def warm_up(
    session: aiohttp.ClientSession, base: str, level: int, tally: Tally, limit: float
) -> None:
    """Let the ramp pass: every stream answered, none waiting, then ``SETTLE`` s more.

    Opening ``level`` connections at once costs the emulator CPU that a steady load does
    not; measuring through it would charge the ramp to the steady state. At most ``limit`` s.
    """
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if tally.started >= level and (await loads(session, base))[1] == 0:
            await asyncio.sleep(min(SETTLE, max(0.0, deadline - time.monotonic())))
            return
        await asyncio.sleep(0.2)


async def sample_streams(session: aiohttp.ClientSession, base: str, seconds: float) -> float:
    """Mean running requests, polled about once a second over ``seconds``."""
    end, samples = time.monotonic() + seconds, []
    while (left := end - time.monotonic()) > 0:
        samples.append((await loads(session, base))[0])
        await asyncio.sleep(min(1.0, left))
    return sum(samples) / len(samples) if samples else 0.0


async def measure(
    session: aiohttp.ClientSession, base: str, opts: Options, level: int, pid: int, tally: Tally
) -> LevelResult:
    cpu0, own0 = cpu_seconds(pid), time.process_time()
    before, t0 = await scrape(session, base), (tally.chunks, tally.completed, tally.errors)
    streams = await sample_streams(session, base, opts.seconds)
    after = await scrape(session, base)
    cpu1, own1 = cpu_seconds(pid), time.process_time()
    wall = after.at - before.at
    intended, actual = after.intended - before.intended, after.actual - before.actual
    steps = round(after.steps - before.steps)
    return LevelResult(
        level=level, streams=streams, seconds=wall,
        tokens_per_s=(after.tokens - before.tokens) / wall,
        chunks_per_s=(tally.chunks - t0[0]) / wall,
        completed=tally.completed - t0[1], errors=tally.errors - t0[2],
        steps=steps, step_ms=1000 * intended / steps if steps else None,
        intended_s=intended, actual_s=actual,
        lag=actual / intended - 1.0 if intended > 0 else None,
        lag_gauge=after.lag_gauge,
        emulator_cpu=None if cpu0 is None or cpu1 is None else (cpu1 - cpu0) / wall,
        client_cpu=(own1 - own0) / wall,
    )  # fmt: skip


async def drain(session: aiohttp.ClientSession, base: str) -> bool:
    """Wait for the emulator to forget the cancelled streams; False if it did not in time."""
    deadline = time.monotonic() + DRAIN_WAIT
    while time.monotonic() < deadline:
        if await loads(session, base) == (0, 0):
            return True
        await asyncio.sleep(0.2)
    return False


async def run_level(
    session: aiohttp.ClientSession, base: str, opts: Options, level: int, pid: int
) -> LevelResult:
    tally, url, body = Tally(), f"{base}/v1/chat/completions", request_body(opts)
    tasks = [asyncio.create_task(worker(session, url, body, tally)) for _ in range(level)]
    try:
        await warm_up(session, base, level, tally, opts.warmup)
        return await measure(session, base, opts, level, pid, tally)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if not await drain(session, base):
            busy = f"  warning: emulator still busy {DRAIN_WAIT:.0f} s after level {level}"
            print(busy, file=sys.stderr)


# -- the summary ----------------------------------------------------------------------------
def crossing(results: Sequence[LevelResult], limit: float = LAG_LIMIT) -> float | None:
    """Where lag first rises past ``limit``, interpolated linearly between two levels."""
    prev: LevelResult | None = None
    for r in results:
        if r.lag is not None and r.lag > limit:
            if prev is None or prev.lag is None:
                return None
            return prev.level + (limit - prev.lag) * (r.level - prev.level) / (r.lag - prev.lag)
        prev = r
    return None


def sustained(results: Sequence[LevelResult], limit: float = LAG_LIMIT) -> int | None:
    """The highest level before the first one whose lag exceeds ``limit``."""
    best = None
    for r in results:
        if r.lag is None or r.lag > limit:
            break
        best = r.level
    return best


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def _lag(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}%"


def progress_line(r: LevelResult) -> str:
    return (f"level {r.level:5d}: {r.streams:7.1f} streams, {r.tokens_per_s:8.0f} tok/s, "
            f"lag {_lag(r.lag):>7} over {r.steps} steps of {_ms(r.step_ms)} ms "
            f"(gauge {_lag(r.lag_gauge)}), emulator cpu {_pct(r.emulator_cpu)}, "
            f"client cpu {_pct(r.client_cpu)}, {r.completed} done, {r.errors} errors")  # fmt: skip


def table(results: Sequence[LevelResult]) -> str:
    rows = [f"{'level':>6} {'streams':>8} {'tok/s':>9} {'chunks/s':>9} {'step ms':>8} "
            f"{'lag':>8} {'emu cpu':>8} {'gen cpu':>8}"]  # fmt: skip
    for r in results:
        rows.append(f"{r.level:>6} {r.streams:>8.1f} {r.tokens_per_s:>9.0f} "
                    f"{r.chunks_per_s:>9.0f} {_ms(r.step_ms):>8} {_lag(r.lag):>8} "
                    f"{_pct(r.emulator_cpu):>8} {_pct(r.client_cpu):>8}")  # fmt: skip
    return "\n".join(rows)


def verdict(results: Sequence[LevelResult]) -> str:
    best, cross = sustained(results), crossing(results)
    limit = f"{100 * LAG_LIMIT:.0f}%"
    if best is None:
        if results[0].lag is None:
            return f"level {results[0].level}: no step finished; raise --seconds-per-level"
        return f"lag exceeds {limit} already at the lowest level ({results[0].level})"
    after = [r for r in results if r.level > best]
    if not after:
        return f"sustained: all levels up to {best} streams within {limit} lag (no crossing)"
    if after[0].lag is None:
        return (f"sustained: {best} streams within {limit} lag; level {after[0].level} finished "
                "no step in its window (raise --seconds-per-level)")  # fmt: skip
    return (f"sustained: {best} streams within {limit} lag; crossing estimated at "
            f"{cross:.0f} streams (linear)")  # fmt: skip


def machine_note() -> str:
    cpus = os.cpu_count() or 0
    return (
        f"machine: {cpus} CPUs shared by the emulator and this load generator "
        f"(separate processes, separate event loops"
        f"{'; on so few cores the client competes for CPU' if cpus <= 4 else ''})"
    )


def write_json(path: Path, opts: Options, results: Sequence[LevelResult]) -> None:
    data = {
        "benchmark": "emulator_capacity",
        "hardware": opts.hardware, "mode": opts.mode, "time_scale": 1.0,
        "max_tokens": opts.max_tokens, "seconds_per_level": opts.seconds,
        "lag_limit": LAG_LIMIT, "cpu_count": os.cpu_count(), "python": sys.version.split()[0],
        "results": [asdict(r) for r in results],
        "sustained_streams": sustained(results), "crossing_streams": crossing(results),
    }  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")


# -- main -------------------------------------------------------------------------------------
@dataclass
class Run:
    opts: Options
    results: list[LevelResult] = field(default_factory=list)


async def run_levels(run: Run, base: str, proc: subprocess.Popen[bytes]) -> None:
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await wait_healthy(session, base, proc)
        for level in run.opts.levels:
            result = await run_level(session, base, run.opts, level, proc.pid)
            run.results.append(result)
            print(progress_line(result), flush=True)


async def bench(run: Run) -> None:
    port = free_port()
    base = f"http://{HOST}:{port}"
    with tempfile.TemporaryFile() as log:
        proc = start_emulator(run.opts, port, log)
        try:
            await run_levels(run, base, proc)
        except RuntimeError:
            log.seek(0)
            sys.stderr.write(log.read()[-4000:].decode(errors="replace"))
            raise
        finally:
            stop_emulator(proc)


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(argv)
    print(f"emulator capacity: {opts.hardware}, {opts.mode}, time scale 1, "
          f"{opts.max_tokens} tokens per stream, {opts.seconds:g} s per level")  # fmt: skip
    print(machine_note(), flush=True)
    run = Run(opts)
    try:
        run_loop(bench(run))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
    if not run.results:
        return 1
    print()
    print(table(run.results))
    print(verdict(run.results))
    if opts.out is not None:
        write_json(opts.out, opts, run.results)
        print(f"wrote {opts.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
