"""A real SGLang on this machine's CPUs: SGLang 0.5.23's CPU engine serving a locally
made model, one plain server and one with speculative decoding (NGRAM, or EAGLE-3 with a
draft made locally).

    python -m specroute.engines.sglang_cpu setup            # .venv-sglang-cpu and the models
    python -m specroute.engines.sglang_cpu serve --spec-port 30001 --base-port 30002

``setup`` makes the engine's own environment (``make sglang-env`` runs it), never the
project's: SGLang pins torch, transformers and openai to versions of its own. Everything
is pinned in ``tests/sglang_cpu/requirements.txt`` and installed with ``--no-deps``, since
SGLang's own list brings its CUDA kernel package (``sglang-kernel``, whose import fails
without a GPU driver) and no CPU build of it exists on PyPI. In its place goes the
project's own ``sgl_kernel`` (``engines/sgl_kernel_cpu``): the ops these servers call,
in PyTorch. Then it makes the models (``engines/vllm_cpu_model.py`` and
``engines/sglang_cpu_draft.py``, run in that environment): nothing is downloaded.

The two servers are the same but for the speculative flags: the same attention backend
(``intel_amx``, whose ops the stand-in provides), dtype, KV cache size, running-request
cap, context length and seed; the radix cache is off on both, so a request repeated to
compare answers is computed again rather than read back from the cache.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import venv
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from specroute.engines.process_group import group, until_stopped
from specroute.event_loop import run
from specroute.loadgen.spawn import Spawned, wait_ready

Kind = Literal["spec", "base"]
Algorithm = Literal["NGRAM", "EAGLE3"]
Layout = Literal["shared", "pinned"]

REPO = Path(__file__).resolve().parent.parent
ENV = REPO / ".venv-sglang-cpu"  # .venv-sglang holds SGLang's protocol models only
STATE = REPO / ".sglang-cpu"  # the models, and SGLang's caches (its HOME)
MODEL = STATE / "model"
DRAFT = STATE / "eagle3"
SET_UP = ENV / ".installed"  # written once setup has finished
REQUIREMENTS = REPO / "tests" / "sglang_cpu" / "requirements.txt"
KERNEL = Path(__file__).resolve().parent / "sgl_kernel_cpu"
MODEL_SCRIPT = Path(__file__).resolve().parent / "vllm_cpu_model.py"
DRAFT_SCRIPT = Path(__file__).resolve().parent / "sglang_cpu_draft.py"
SERVED_NAME = "specroute-cpu"

# 40 M parameters: the attention runs in PyTorch, a request at a time, so a small model
# keeps a step short enough for the stage's time; big enough that a step's cost is the
# weights' (speculation's case) at batch 1.
HIDDEN, LAYERS, INTERMEDIATE = 512, 6, 2048
DRAFT_TOKENS = 4  # NGRAM: the tree's nodes a step verifies; EAGLE-3: steps + 1
_STARTUP_SECONDS = 300.0  # 25-85 s seen; a crashed scheduler takes 60 s to exit


@dataclass(frozen=True)
class EngineSettings:
    """What both servers share."""

    model: Path = MODEL
    algorithm: Algorithm = "NGRAM"
    draft: Path = DRAFT
    max_running_requests: int = 32
    context_length: int = 2048
    max_total_tokens: int = 16384
    seed: int = 0
    # every linear layer's row as if alone (engines/sgl_kernel_cpu/sgl_kernel/invariant.py):
    # greedy tokens equal bit for bit, at the cost of sharing weight reads across a batch
    batch_invariant: bool = True
    # PyTorch's threads per server: one, as two servers and their clients share two
    # cores, and OpenMP threads that wait by spinning slow everything when cores are few
    threads: int = 1
    extra: tuple[str, ...] = field(default=())


# Cores for the (speculative, plain) servers: None leaves them to the operating system.
LAYOUTS: dict[Layout, tuple[int | None, int | None]] = {
    "shared": (None, None),  # both on both cores: measure one at a time (calibration does)
    "pinned": (0, 1),  # a core each, to run both at once
}


def python() -> Path:
    return ENV / "bin" / "python"


def missing(algorithm: Algorithm = "NGRAM") -> str | None:
    """Why the engine cannot start here, or None when it can."""
    if not python().exists():
        return f"no SGLang environment at {ENV.name} (make sglang-env)"
    if not SET_UP.exists():
        return f"the SGLang environment at {ENV.name} did not finish setting up (make sglang-env)"
    if not (MODEL / "config.json").exists():
        return f"no model at {MODEL.relative_to(REPO)} (make sglang-env)"
    if algorithm == "EAGLE3" and not (DRAFT / "config.json").exists():
        return f"no EAGLE-3 draft at {DRAFT.relative_to(REPO)} (make sglang-env)"
    return None


def speculative_flags(settings: EngineSettings) -> list[str]:
    if settings.algorithm == "NGRAM":
        return [
            "--speculative-algorithm",
            "NGRAM",
            "--speculative-num-draft-tokens",
            str(DRAFT_TOKENS),
        ]
    return [
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        str(settings.draft),
        "--speculative-num-steps",
        str(DRAFT_TOKENS - 1),
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        str(DRAFT_TOKENS),
    ]


def command(kind: Kind, port: int, settings: EngineSettings, core: int | None) -> list[str]:
    args = [
        str(python()),
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(settings.model),
        "--served-model-name",
        SERVED_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--device",
        "cpu",
        "--attention-backend",
        "intel_amx",
        "--dtype",
        "bfloat16",
        "--enable-metrics",
        # The overlap of CPU scheduling with the forward pass is on for a plain server
        # and off for a speculative one unless told: off on both, so it cannot be what
        # tells them apart.
        "--disable-overlap-schedule",
        "--disable-radix-cache",
        "--max-total-tokens",
        str(settings.max_total_tokens),
        "--max-running-requests",
        str(settings.max_running_requests),
        "--context-length",
        str(settings.context_length),
        "--random-seed",
        str(settings.seed),
        "--sleep-on-idle",  # else an idle scheduler spins a core
        # /v1/loads is a snapshot the scheduler publishes every N decode steps (15 unless
        # told): every step, so that the load the router reads there is current
        "--load-snapshot-publish-interval",
        "1",
        "--skip-server-warmup",
    ]
    if kind == "spec":
        args += speculative_flags(settings)
    args += settings.extra
    return args if core is None else ["taskset", "-c", str(core), *args]


def environment(core: int | None, settings: EngineSettings) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("VIRTUAL_ENV", None)
    env.update(
        SGLANG_USE_CPU_ENGINE="1",
        HF_HUB_OFFLINE="1",
        HOME=str(STATE / "home"),  # SGLang and its libraries write caches under HOME
        SGLANG_JIT_CACHE_DIR=str(STATE / "jit"),
        OMP_NUM_THREADS=str(settings.threads),
        SPECROUTE_BATCH_INVARIANT="1" if settings.batch_invariant else "0",
    )
    return env


@dataclass(frozen=True)
class Engine(Spawned):
    kind: Kind = "base"


@asynccontextmanager
async def engine(
    kind: Kind, port: int, settings: EngineSettings | None = None, core: int | None = None
) -> AsyncIterator[Engine]:
    """One server until the block ends, yielded once ``/health`` answers. Started in a
    process group of its own (the HTTP server spawns a scheduler and a detokenizer) and
    stopped as a group."""
    async with _started(kind, port, settings or EngineSettings(), core) as server:
        await _wait_ready(server)
        yield server


@asynccontextmanager
async def engine_pair(
    spec_port: int,
    base_port: int,
    settings: EngineSettings | None = None,
    layout: Layout = "shared",
) -> AsyncIterator[tuple[Engine, Engine]]:
    """Both servers, started at once; yields (speculative, plain) once both answer."""
    settings = settings or EngineSettings()
    spec_core, base_core = LAYOUTS[layout]
    async with (
        _started("spec", spec_port, settings, spec_core) as spec,
        _started("base", base_port, settings, base_core) as base,
    ):
        await asyncio.gather(_wait_ready(spec), _wait_ready(base))
        yield spec, base


@asynccontextmanager
async def _started(
    kind: Kind, port: int, settings: EngineSettings, core: int | None
) -> AsyncIterator[Engine]:
    (STATE / "home").mkdir(parents=True, exist_ok=True)
    argv, env = command(kind, port, settings, core), environment(core, settings)
    async with group(argv, env, STATE) as (process, output):
        yield Engine(f"http://127.0.0.1:{port}", process, output, kind)


async def _wait_ready(server: Engine) -> None:
    await wait_ready(server, "/health", f"SGLang ({server.kind})", _STARTUP_SECONDS, 0.5)


# SGLang's CPU engine binds its threads through libnuma, and compiles NGRAM's C++ corpus
# at its first start (into SGLANG_JIT_CACHE_DIR)
DEBIAN = ("libnuma-dev", "numactl", "g++")


def debian_packages() -> None:
    """Debian's packages the engine needs, installed if absent (as root, through apt)."""
    if shutil.which("numactl") and shutil.which("g++") and Path("/usr/include/numa.h").exists():
        return
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        sys.exit(f"SGLang's CPU engine needs Debian's {' and '.join(DEBIAN)}: install them")
    env = os.environ | {"DEBIAN_FRONTEND": "noninteractive"}
    for step in (["update", "-qq"], ["install", "-y", "-qq", *DEBIAN]):
        subprocess.run(["apt-get", *step], check=True, stdout=subprocess.DEVNULL, env=env)


def setup(model: Path, hidden: int, layers: int, intermediate: int) -> None:
    debian_packages()
    if not python().exists():
        venv.create(ENV, with_pip=True)
    pip = [str(python()), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, "--no-deps", "-r", str(REQUIREMENTS)], check=True)
    # Not editable: the environment keeps the ops it was set up with; built from a copy, so
    # that setuptools leaves nothing in the checkout.
    with tempfile.TemporaryDirectory() as build:
        source = shutil.copytree(KERNEL, Path(build) / KERNEL.name)
        subprocess.run(
            [*pip, "--no-deps", "--no-build-isolation", "--force-reinstall", str(source)],
            check=True,
        )
    make_models(model, hidden, layers, intermediate)
    SET_UP.touch()


def make_models(model: Path, hidden: int, layers: int, intermediate: int) -> None:
    sizes = ["--hidden", str(hidden), "--layers", str(layers), "--intermediate", str(intermediate)]
    subprocess.run(
        [
            str(python()),
            str(MODEL_SCRIPT),
            "--out",
            str(model),
            "--text",
            str(REPO / "LICENSE"),  # a text that stays put, as the vLLM stage's
            *sizes,
        ],
        check=True,
    )
    draft = model.parent / DRAFT.name
    subprocess.run(
        [str(python()), str(DRAFT_SCRIPT), "--target", str(model), "--out", str(draft)],
        check=True,
    )


async def serve(spec_port: int, base_port: int, settings: EngineSettings, layout: Layout) -> None:
    async with engine_pair(spec_port, base_port, settings, layout) as (spec, base):
        await until_stopped("SGLang", spec, base)


def _size_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, default=MODEL, help="the model's folder")
    parser.add_argument("--hidden", type=int, default=HIDDEN)
    parser.add_argument("--layers", type=int, default=LAYERS)
    parser.add_argument("--intermediate", type=int, default=INTERMEDIATE)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m specroute.engines.sglang_cpu", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("setup", help="install the engine in .venv-sglang-cpu, make the models")
    _size_flags(make)
    models = sub.add_parser("model", help="make the models only")
    _size_flags(models)
    srv = sub.add_parser("serve", help="a speculative and a plain server until Ctrl-C")
    srv.add_argument("--model", type=Path, default=MODEL)
    srv.add_argument("--spec-port", type=int, default=30001)
    srv.add_argument("--base-port", type=int, default=30002)
    srv.add_argument("--algorithm", choices=["NGRAM", "EAGLE3"], default="NGRAM")
    srv.add_argument("--max-running-requests", type=int, default=32)
    srv.add_argument(
        "--no-batch-invariant",
        dest="batch_invariant",
        action="store_false",
        help="batched linear layers as PyTorch computes them: faster batches, but greedy "
        "tokens may then differ from the plain server's at near ties",
    )
    srv.add_argument("--threads", type=int, default=1, help="PyTorch threads per server")
    srv.add_argument(
        "--layout",
        choices=list(LAYOUTS),
        default="shared",
        help="shared: both servers on every core, measure one at a time (default); "
        "pinned: a core each, to run both at once",
    )
    args = parser.parse_args(argv)
    if args.command == "setup":
        setup(args.model, args.hidden, args.layers, args.intermediate)
    elif args.command == "model":
        make_models(args.model, args.hidden, args.layers, args.intermediate)
    else:
        settings = EngineSettings(
            model=args.model.resolve(),
            algorithm=args.algorithm,
            max_running_requests=args.max_running_requests,
            batch_invariant=args.batch_invariant,
            threads=args.threads,
        )
        run(serve(args.spec_port, args.base_port, settings, args.layout))


if __name__ == "__main__":
    main()
