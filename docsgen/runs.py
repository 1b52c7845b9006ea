"""Every committed run behind the results pages: the JSON a command wrote, the command, the
day it ran and, where it has one, the figure drawn from it. One dict, filled here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "results" / "data"
FIGURES = ROOT / "docs" / "figures"

MACHINE = "this project's 2-core machine, shared with other work"


@dataclass(frozen=True)
class Run:
    command: str
    date: str  # the day the command ran (UTC)
    figure: str | None = None  # under docs/figures/, drawn by ``python -m docsgen.figures``
    plot: str | None = None  # the project's plot that draws it: a key of figures.PLOTS
    note: str = ""  # how the run differs from the command a user would type, if it does

    def data(self, name: str) -> Path:
        return DATA / f"{name}.json"


_SDPA = "--hardware llama3.1-8b-h200-sdpa --accept-length 2.0 --max-running-requests 256"
_SDPA_SERVERS = (
    f"two `specroute emulate --mode spec|base {_SDPA} --time-scale 0.1 --stream-interval 16` "
    "servers; router.toml names them and the profile `context-predicted.json`"
)
_KIMI_SERVERS = (
    "two `specroute emulate --mode spec|base --hardware kimi-k2.5-8x-pcie --accept-length A "
    "--max-running-requests 256 --time-scale 0.1 --stream-interval 16` servers; router.toml "
    "names them and the profile `kimi-A-predicted.json`"
)
_ALTERNATING = (
    "--trace alternating.json --settle 1 --output-len 256 --no-ignore-eos --policies "
    "context-crossover,crossover,crossover:crossover=1.74,always-spec,always-base"
)
_WITHIN = (
    "--trace mixed-within.json --settle 1 --output-len 256 --no-ignore-eos --policies "
    "context-crossover:topology=partitioned,expected-latency:context=off,"
    "crossover:topology=partitioned:crossover=4,...,crossover:topology=partitioned,"
    "always-spec,always-base"
)
_RAMP = (
    "--trace ramp --peak 128 --phase-seconds 3 --settle 1.5 --input-len 128 --output-len 256 "
    "--no-ignore-eos --policies crossover,always-spec,always-base"
)

# the head-to-head of deployments: each model in each topology it is deployed in (``where``:
# "" one GPU group, "partitioned-" two, "node-" a node each), under each traffic ("": the
# Azure trace as it came, with one utilisation also live; "-ramp", "-day")
_LIMITS = " --max-running-requests 256 --cuda-graph-max-bs 256"
_LIVE = " --live 0.5 --time-scale 0.2"  # one utilisation live, in one topology a model
_DEPLOYED = [
    *((m, _LIMITS, "") for m in ("llama3.1-8b-h100", "llama3.1-8b-h200", "qwen3-30b-a3b-h200")),
    *(
        (m, _LIMITS + " --topology partitioned", "partitioned-")
        for m in ("llama3.1-8b-h100", "llama3.1-8b-h200", "qwen3-30b-a3b-h200")
    ),
    (
        "kimi-k2.5-8x-pcie",
        " --accept-length 2.1 --max-running-requests 256 --cuda-graph-max-bs 128 --topology "
        "partitioned --slo ttft=2,tpot=200ms",
        "node-",
    ),
]
_TRAFFIC = {"": "", "-ramp": " --traffic ramp", "-day": " --traffic day"}

RUNS: dict[str, Run] = {
    "llama-crossover": Run(
        "specroute emulate --hardware llama3.1-8b-h200 --noise default "
        "--max-running-requests 256 --input-len 512 --output-len 128 --calibrate "
        "--profile llama-crossover.json --plot llama-crossover.png",
        "2026-12-01",
        "llama-crossover.png",
        "profile",
    ),
    "kimi-bands": Run(
        "specroute emulate --hardware kimi-k2.5-8x-pcie --accept-length 2.1 "
        "--max-running-requests 512 --noise default --input-len 512 --output-len 128 "
        "--calibrate --profile kimi-bands.json --report bands.md --plot kimi-bands.png",
        "2026-12-01",
        "kimi-bands.png",
        "profile",
    ),
    "coverage": Run(
        "specroute bench coverage --calibrations 50 --grid-every 2 --out coverage.json "
        "--plot coverage.png",
        "2026-12-01",
        "coverage.png",
        "coverage",
    ),
    "context-calibrated": Run(
        f"specroute emulate {_SDPA} --noise default --input-len 512,2048,8192 "
        "--output-len 128 --seed 0 --calibrate --profile context-calibrated.json "
        "--plot context-crossover.png",
        "2026-12-01",
        "context-crossover.png",
        "profile",
    ),
    "context-predicted": Run(
        f"specroute emulate {_SDPA} --predict 1,2,4,8,16,32,64 --input-len 512,8192 "
        "--output-len 128 --profile context-predicted.json",
        "2026-12-01",
    ),
    "context-alternating-live": Run(
        f"specroute bench compare --router-config router.toml {_ALTERNATING} "
        "--out alternating/ --plot context-head-to-head.png",
        "2026-12-04",
        "context-head-to-head.png",
        "compare",
        note=_SDPA_SERVERS,
    ),
    "context-alternating-offline": Run(
        f"specroute bench compare --router-config router.toml {_ALTERNATING} --offline "
        f"{_SDPA} --time-scale 0.1 --out alternating-offline/",
        "2026-12-01",
    ),
    "context-within-live": Run(
        f"specroute bench compare --router-config router.toml {_WITHIN} "
        "--out within/ --plot context-separate-gpus.png",
        "2026-12-04",
        "context-separate-gpus.png",
        "compare",
        note=_SDPA_SERVERS,
    ),
    "context-within-offline": Run(
        f"specroute bench compare --router-config router.toml {_WITHIN} --offline {_SDPA} "
        "--time-scale 0.1 --out within-offline/",
        "2026-12-01",
    ),
    **{
        f"kimi-{a}-{mode}": Run(
            f"specroute bench compare --router-config router.toml {_RAMP}"
            + (
                f" --offline --hardware kimi-k2.5-8x-pcie --accept-length {a} "
                "--max-running-requests 256 --time-scale 0.1"
                if mode == "offline"
                else ""
            )
            + f" --out kimi-{a}-{mode}/",
            "2026-12-04" if mode == "live" else "2026-12-01",
            f"kimi-{a}-live.png" if mode == "live" else None,
            "compare" if mode == "live" else None,
            note=_KIMI_SERVERS.replace("A", a) if mode == "live" else "",
        )
        for a in ("2.1", "3.0")
        for mode in ("live", "offline")
    },
    **{
        f"kimi-{a}-predicted": Run(
            f"specroute emulate --hardware kimi-k2.5-8x-pcie --accept-length {a} "
            "--max-running-requests 256 --predict 1,2,4,8,16,32,64,128 --input-len 128 "
            f"--output-len 128 --profile kimi-{a}-predicted.json",
            "2026-12-01",
        )
        for a in ("2.1", "3.0")
    },
    **{
        f"predict-{model}-{a}": Run(
            f"specroute emulate --hardware {hardware} --accept-length {a} "
            "--max-running-requests 256 --predict 1,2,4,8,16,24,32,48,64,96,128,192,256 "
            f"--json > predict-{model}-{a}.json",
            "2026-12-01",
        )
        for model, hardware, accepts in (
            ("kimi", "kimi-k2.5-8x-pcie", ("2.1", "3.0")),
            ("qwen", "qwen3-30b-a3b-h200", ("1.6", "2.1", "3.0")),
        )
        for a in accepts
    },
    **{
        f"predict-{name}": Run(
            f"specroute emulate --hardware {hardware}{accept} --max-running-requests 256 "
            "--predict 1,2,4,8,16,32,64,128,256 --input-len 512,2048,8192 "
            f"--output-len {out} --json > predict-{name}.json",
            "2026-12-01",
        )
        for name, hardware, accept, out in (
            ("sdpa-2.0", "llama3.1-8b-h200-sdpa", " --accept-length 2.0", 128),
            ("sdpa-default", "llama3.1-8b-h200-sdpa", "", 128),
            ("folded-2.0", "llama3.1-8b-h200-folded", " --accept-length 2.0", 256),
        )
    },
    "day-predicted": Run(
        "specroute emulate --hardware kimi-k2.5-8x-pcie-fitted --max-running-requests 256 "
        "--predict 1,2,4,6,8,12,16 --input-len 128 --output-len 128 --profile day-predicted.json",
        "2026-12-01",
    ),
    "day-offline": Run(
        "specroute bench compare --offline --profile day-predicted.json --trace poisson-day "
        "--peak 16 --phase-seconds 3 --time-scale 0.1 --hardware kimi-k2.5-8x-pcie-fitted "
        "--max-running-requests 256 --input-len 128 --output-len 128 "
        "--policies crossover,expected-latency --out day/",
        "2026-12-01",
    ),
    "demo-live": Run(
        "specroute demo --out demo/",
        "2026-12-04",
        note="the demo writes it as demo/compare/compare.json",
    ),
    "demo-offline": Run(
        "specroute demo --out demo/",
        "2026-12-04",
        note="the demo writes it as demo/offline.json",
    ),
    "chaos": Run("specroute bench chaos --requests 5000 --seed 0 --out chaos.json", "2026-12-01"),
    "convergence-llama3.1-8b-h200": Run(
        "specroute bench convergence --hardware llama3.1-8b-h200 --accept-length 1.6 "
        "--max-running-requests 256 --no-online-at-prefill "
        "--out convergence-llama3.1-8b-h200.json",
        "2026-12-07",
    ),
    "convergence-llama3.1-8b-h200-live": Run(
        "specroute bench convergence --hardware llama3.1-8b-h200 --accept-length 1.6 "
        "--max-running-requests 256 --traffic azure --live 0.1 "
        "--out convergence-llama3.1-8b-h200-live.json",
        "2026-12-07",
        note="on the 16-core machine, beside the run below; every live run kept its time "
        "(lag at most 1.1%); made before a turn cut short by a fall below its span left the "
        "backoff as it is (not made again since; offline, this trace's runs are the same)",
    ),
    "convergence-llama3.1-8b-h200-live-as-measured": Run(
        "specroute bench convergence --hardware llama3.1-8b-h200 --accept-length 1.6 "
        "--max-running-requests 256 --no-online-at-prefill --traffic azure --live 0.1 "
        "--out convergence-llama3.1-8b-h200-live-as-measured.json",
        "2026-12-07",
        note="on the 16-core machine, beside the run above; every live run kept its time "
        "(lag at most 1.3%); made before a turn cut short by a fall below its span left the "
        "backoff as it is (not made again since; offline, this trace's runs are the same)",
    ),
    "convergence-llama3.1-8b-h200-ramp-live": Run(
        "specroute bench convergence --hardware llama3.1-8b-h200 --accept-length 1.6 "
        "--max-running-requests 256 --no-online-at-prefill --traffic ramp --ramps 2 --live 0.5 "
        "--out convergence-llama3.1-8b-h200-ramp-live.json",
        "2026-12-06",
        note="made before exploration's turns backed off (not made again since)",
    ),
    "convergence-llama3.1-8b-h200-at-prefill-ramp-live": Run(
        "specroute bench convergence --hardware llama3.1-8b-h200 --accept-length 1.6 "
        "--max-running-requests 256 --traffic ramp --ramps 2 --live 0.5 "
        "--out convergence-llama3.1-8b-h200-at-prefill-ramp-live.json",
        "2026-12-07",
        note="on a 2-core machine, the three starts one after the other; every live run kept "
        "its time (lag 0.0%, a request's time elsewhere 0.8 to 4.2%)",
    ),
    "convergence-llama3.1-8b-h200-ramp-live-4x-high": Run(
        "specroute bench convergence --hardware llama3.1-8b-h200 --accept-length 1.6 "
        "--max-running-requests 256 --no-online-at-prefill --traffic ramp --starts '4x high' "
        "--ramps 2 --live 0.5 "
        "--out convergence-llama3.1-8b-h200-ramp-live-4x-high.json",
        "2026-12-06",
        note="the same start, run alone, ten minutes before the run above; made before "
        "exploration's turns backed off (not made again since)",
    ),
    "convergence-llama3.1-8b-h200-fixed": Run(
        "specroute bench convergence --hardware llama3.1-8b-h200 --accept-length 1.6 "
        "--max-running-requests 256 --starts '' --fixed 0,4,8,16,20,32,64,1e9 "
        "--out convergence-llama3.1-8b-h200-fixed.json",
        "2026-12-06",
    ),
    "convergence-llama3.1-8b-h200-at-prefill": Run(
        "specroute bench convergence --hardware llama3.1-8b-h200 --accept-length 1.6 "
        "--max-running-requests 256 --online-at-prefill "
        "--out convergence-llama3.1-8b-h200-at-prefill.json",
        "2026-12-07",
    ),
    "convergence-llama3.1-8b-h200-draws": Run(
        "specroute bench convergence --hardware llama3.1-8b-h200 --accept-length 1.6 "
        "--max-running-requests 256 --no-online-at-prefill --traffic ramp --draws 8 "
        "--out convergence-llama3.1-8b-h200-draws.json",
        "2026-12-07",
    ),
    "convergence-llama3.1-8b-h200-at-prefill-draws": Run(
        "specroute bench convergence --hardware llama3.1-8b-h200 --accept-length 1.6 "
        "--max-running-requests 256 --online-at-prefill --traffic ramp --draws 8 "
        "--out convergence-llama3.1-8b-h200-at-prefill-draws.json",
        "2026-12-07",
    ),
    "convergence-llama3.1-8b-h200-azure-draws": Run(
        "specroute bench convergence --hardware llama3.1-8b-h200 --accept-length 1.6 "
        "--max-running-requests 256 --no-online-at-prefill --traffic azure --draws 4 "
        "--out convergence-llama3.1-8b-h200-azure-draws.json",
        "2026-12-07",
    ),
    "convergence-llama3.1-8b-h200-at-prefill-azure-draws": Run(
        "specroute bench convergence --hardware llama3.1-8b-h200 --accept-length 1.6 "
        "--max-running-requests 256 --online-at-prefill --traffic azure --draws 4 "
        "--out convergence-llama3.1-8b-h200-at-prefill-azure-draws.json",
        "2026-12-07",
    ),
    "convergence-qwen3-30b-a3b-h200-at-prefill": Run(
        "specroute bench convergence --hardware qwen3-30b-a3b-h200 --accept-length 1.6 "
        "--max-running-requests 256 --online-at-prefill "
        "--out convergence-qwen3-30b-a3b-h200-at-prefill.json",
        "2026-12-07",
    ),
    "convergence-qwen3-30b-a3b-h200": Run(
        "specroute bench convergence --hardware qwen3-30b-a3b-h200 --accept-length 1.6 "
        "--max-running-requests 256 --no-online-at-prefill "
        "--out convergence-qwen3-30b-a3b-h200.json",
        "2026-12-07",
    ),
    "convergence-llama3.1-8b-h200-sdpa-contexts": Run(
        "specroute bench convergence --hardware llama3.1-8b-h200-sdpa --accept-length 2.0 "
        "--max-running-requests 256 --prompts 512,2048 --starts '4x high,4x low' "
        "--traffic ramp --no-online-at-prefill "
        "--out convergence-llama3.1-8b-h200-sdpa-contexts.json",
        "2026-12-07",
    ),
    "soak": Run(
        "specroute bench soak --requests 100000 --out soak.json",
        "2026-12-02",
        note="on the 16-core machine, unpinned",
    ),
    "capacity": Run(
        "specroute bench capacity --hardware llama3.1-8b-h100 --mode spec --levels 64,256,1024 "
        "--seconds-per-level 10 --out capacity.json",
        "2026-12-01",
    ),
    "replicas": Run("specroute bench replicas --out replicas.json", "2026-12-04"),
    "affinity": Run("specroute bench affinity --out affinity.json", "2026-12-05"),
    "overhead": Run(
        "specroute bench overhead --out overhead.json --plot overhead.png",
        "2026-12-05",
        "overhead.png",
        "overhead",
    ),
    "overhead-split-c1": Run(
        "specroute bench overhead --levels 16,64,256,512 --workers 1 --repeats 4 --modes "
        "stream,whole --warmup 0.75 --seconds 1.5 --chunks 16 --gap-ms 20 --gateways smg "
        "--baseline before --router-cores 1 --out overhead-split-c1.json",
        "2026-12-06",
        note="on a machine of 16 cores with an H100; `before` holds the code before the "
        "router's split (`pip install --target before --no-deps` of its wheel), the "
        "installed specroute the code after it",
    ),
    "overhead-split-c4": Run(
        "specroute bench overhead --levels 16,64,256,512 --workers 1 --repeats 4 --modes "
        "stream,whole --warmup 0.75 --seconds 1.5 --chunks 16 --gap-ms 20 --gateways smg "
        "--baseline before --router-cores 4 --out overhead-split-c4.json",
        "2026-12-06",
        note="on a machine of 16 cores with an H100; `before` holds the code before the "
        "router's split (`pip install --target before --no-deps` of its wheel), the "
        "installed specroute the code after it",
    ),
    "overhead-split-c1-focus": Run(
        "specroute bench overhead --levels 16,512 --workers 1 --repeats 7 --modes "
        "stream,whole --warmup 0.75 --seconds 1.5 --chunks 16 --gap-ms 20 --gateways smg "
        "--baseline before --router-cores 1 --out overhead-split-c1-focus.json",
        "2026-12-06",
        note="on a machine of 16 cores with an H100, another than the run above's; `before` "
        "as there, the installed specroute the code after the split and the speculation "
        "details asked of SGLang",
    ),
    "overhead-split-c1-stream16": Run(
        "specroute bench overhead --levels 16 --workers 1 --repeats 6 --modes stream --warmup 1 "
        "--seconds 10 --chunks 16 --gap-ms 20 --gateways none --baseline before --router-cores 1 "
        "--out overhead-split-c1-stream16.json",
        "2026-12-06",
        note="on a machine of 16 cores with an H100; `before` as above, the installed "
        "specroute today's code; the two runs below on the same machine one after the other",
    ),
    "overhead-split-c1-whole512": Run(
        "specroute bench overhead --levels 512 --workers 1 --repeats 6 --modes whole --warmup 1 "
        "--seconds 3 --chunks 16 --gap-ms 20 --gateways none --baseline before --router-cores 1 "
        "--out overhead-split-c1-whole512.json",
        "2026-12-06",
        note="on the machine of the run above, just after it; `before` as above, the "
        "installed specroute today's code",
    ),
    "overhead-split-end-c1-stream16": Run(
        "specroute bench overhead --levels 16 --workers 1 --repeats 6 --modes stream --warmup 1 "
        "--seconds 10 --chunks 16 --gap-ms 20 --gateways none --baseline before --router-cores 1 "
        "--out overhead-split-end-c1-stream16.json",
        "2026-12-06",
        note="on the machine of the two runs above, just after them; `before` as above, the "
        "installed specroute the code at the split's end, before the features that came "
        "after it",
    ),
    "overhead-calls": Run(
        "specroute bench calls --baseline before --out overhead-calls.json",
        "2026-12-06",
        note="`before` holds the code before the router's split, the installed specroute "
        "the code after it",
    ),
    "overhead-calls-since": Run(
        "specroute bench calls --baseline split --out overhead-calls-since.json",
        "2026-12-06",
        note="`split` holds the code at the split's end, before the features that came "
        "after it; the installed specroute the code of `overhead-calls`",
    ),
    "overhead-calls-whole-timing": Run(
        "specroute bench calls --baseline before --out overhead-calls-whole-timing.json",
        "2026-12-07",
        note="`before` holds the code before whole answers were read for their meta_info; "
        "the installed specroute the code after it",
    ),
    "overhead-whole-timing-c1": Run(
        "specroute bench overhead --levels 16,64,256,512 --workers 1 --repeats 4 --modes whole "
        "--warmup 0.75 --seconds 1.5 --chunks 16 --gap-ms 20 --gateways none --baseline before "
        "--router-cores 1 --out overhead-whole-timing-c1.json",
        "2026-12-07",
        note="on a machine of 16 cores with an H100; `before` holds the code before whole "
        "answers were read for their meta_info, the installed specroute the code after it",
    ),
    "overhead-whole-timing-c4": Run(
        "specroute bench overhead --levels 16,64,256,512 --workers 1 --repeats 4 --modes whole "
        "--warmup 0.75 --seconds 1.5 --chunks 16 --gap-ms 20 --gateways none --baseline before "
        "--router-cores 4 --out overhead-whole-timing-c4.json",
        "2026-12-07",
        note="on a machine of 16 cores with an H100; `before` holds the code before whole "
        "answers were read for their meta_info, the installed specroute the code after it"
        ", just after the run above",
    ),
    "overhead-split-before-c1": Run(
        "specroute bench overhead --levels 16,64,256,512 --workers 1 --repeats 2 --modes "
        "stream,whole --warmup 0.75 --seconds 1.5 --chunks 16 --gap-ms 20 --gateways smg "
        "--router-cores 1 --out overhead-split-before-c1.json",
        "2026-12-06",
        note="on the code before the router's split into parts; the four runs on one "
        "machine of 16 cores with an H100, one after the other",
    ),
    "overhead-split-after-c1": Run(
        "specroute bench overhead --levels 16,64,256,512 --workers 1 --repeats 2 --modes "
        "stream,whole --warmup 0.75 --seconds 1.5 --chunks 16 --gap-ms 20 --gateways smg "
        "--router-cores 1 --out overhead-split-after-c1.json",
        "2026-12-06",
        note="on the split's last commit; the four runs on one machine of 16 cores with an "
        "H100, one after the other",
    ),
    "overhead-split-before-c4": Run(
        "specroute bench overhead --levels 16,64,256,512 --workers 1 --repeats 2 --modes "
        "stream,whole --warmup 0.75 --seconds 1.5 --chunks 16 --gap-ms 20 --gateways smg "
        "--router-cores 4 --out overhead-split-before-c4.json",
        "2026-12-06",
        note="on the code before the router's split into parts; the four runs on one "
        "machine of 16 cores with an H100, one after the other",
    ),
    "overhead-split-after-c4": Run(
        "specroute bench overhead --levels 16,64,256,512 --workers 1 --repeats 2 --modes "
        "stream,whole --warmup 0.75 --seconds 1.5 --chunks 16 --gap-ms 20 --gateways smg "
        "--router-cores 4 --out overhead-split-after-c4.json",
        "2026-12-06",
        note="on the split's last commit; the four runs on one machine of 16 cores with an "
        "H100, one after the other",
    ),
    "overhead-workers": Run(
        "specroute bench overhead --workers 1,2,4 --bare-workers 1,2,4 --repeats 2 "
        "--out overhead-workers.json",
        "2026-12-02",
    ),
    "overhead-lean": Run(
        "specroute bench overhead --levels 16,64,256,512 --workers 1,2 --lean --repeats 2 "
        "--out overhead-lean.json",
        "2026-12-03",
    ),
    "overhead-shares": Run(
        "specroute bench overhead --levels 8,16,32,64,128,256,512 --workers 1,2 "
        "--bare-workers 1,2 --repeats 2 --modes stream,whole --warmup 0.75 --seconds 1.5 "
        "--chunks 16 --gap-ms 20 --gateways none --router-cores 4 --out overhead-shares.json",
        "2026-12-05",
        "overhead-shares.png",
        "overhead-shares",
        note="on a machine of 16 cores with an H100, where the reference's has an H200",
    ),
    "overhead-tail": Run(
        "specroute bench overhead --levels 256,512 --workers 1,2,4 --out overhead-tail.json",
        "2026-12-04",
    ),
    "overhead-front": Run(
        "specroute bench overhead --workers 1,2 --aiohttp-front --repeats 2 "
        "--out overhead-front.json",
        "2026-12-04",
    ),
    "online-drift": Run(
        "specroute bench compare --offline --router-config router.toml --profile "
        "online-profile.json --hardware kimi-k2.5-8x-pcie-fitted --max-running-requests 256 "
        "--accept-schedule 0:3.0,160:1.6 --trace drift.json --policies "
        "crossover,always-spec,always-base --input-len 128 --output-len 128 --out drift/ "
        "--online-plot online-drift.png",
        "2026-12-02",
        "online-drift.png",
        "online",
        note='router.toml: online = "adopt", online_window_samples = 24, '
        "online_min_samples = 12; online-profile.json: `specroute emulate --hardware "
        "kimi-k2.5-8x-pcie-fitted --max-running-requests 256 --accept-length 3.0 --predict "
        "1,2,4,6,8,12,16 --input-len 128 --output-len 128 --profile online-profile.json`; "
        "drift.json: phases of 40 s at 2, 4, 8 and 4 clients, twice",
    ),
    **{
        f"deployments-{where}{model}{traffic}": Run(
            f"specroute bench deployments --hardware {model}{flags}{_TRAFFIC[traffic]}"
            f"{_LIVE if not traffic and where != 'partitioned-' else ''} "
            f"--out deployments-{where}{model}{traffic}.json",
            "2026-12-05",
            figure=None if traffic else f"deployments-{where}{model}.png",
            plot=None if traffic else "deployments",
        )
        for model, flags, where in _DEPLOYED
        for traffic in _TRAFFIC
    },
}
