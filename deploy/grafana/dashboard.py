"""The specroute dashboard, written as Grafana JSON to stdout.

    python deploy/grafana/dashboard.py > deploy/grafana/specroute.json

Built with grafana-foundation-sdk (the project's `dev` extra). Every query reads a metric
that the router or SGLang exports, or a recording rule of deploy/prometheus/rules.yml, and
tests/deploy/test_grafana.py checks both that and that the committed JSON is this script's output.
The SGLang servers' series carry a `pool` label (spec or base): deploy/prometheus's scrape
config sets it, and deploy/README.md shows the relabelling that sets it on Kubernetes.
"""

from __future__ import annotations

import json
import sys

from grafana_foundation_sdk.builders import common as common_builder
from grafana_foundation_sdk.builders import dashboard as dashboard_builder
from grafana_foundation_sdk.builders import prometheus as prometheus_builder
from grafana_foundation_sdk.builders import stat, statetimeline, timeseries
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    Panel,
    Threshold,
    ThresholdsMode,
    ValueMap,
    ValueMappingResult,
)

UID = "specroute"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"
WIDTH = 12  # half of Grafana's 24 columns: two panels a row
HEIGHT = 8

Panels = list[Builder[Panel]]


def query(expr: str, legend: str) -> prometheus_builder.Dataquery:
    return prometheus_builder.Dataquery().expr(expr).legend_format(legend).range()


def quantiles(histogram: str, by: str) -> list[prometheus_builder.Dataquery]:
    """The median and the 99th percentile of a histogram, one series each per `by`."""
    return [
        query(
            f"histogram_quantile({q}, sum by ({by}, le) (rate({histogram}_bucket[{RATE}])))",
            f"{{{{{by}}}}} p{round(q * 100)}",
        )
        for q in (0.5, 0.99)
    ]


def graph(
    title: str, description: str, unit: str, queries: list[prometheus_builder.Dataquery]
) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .height(HEIGHT)
        .span(WIDTH)
        .fill_opacity(10)
        .legend(
            common_builder.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .tooltip(common_builder.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI))
    )
    for q in queries:
        panel.with_target(q)
    return panel


def load() -> Panels:
    concurrency = graph(
        "Live concurrency against the crossover",
        "The load the policy routes by, as each router replica counts it, and the crossover "
        "from its profile: below it requests go to the speculative pool, above it to the "
        "plain one. A profile with bands (a mixture of experts can pay only at medium load) "
        "draws each band's edges: between a band's from and to, speculative.",
        "short",
        [
            query("specroute_live_concurrency", "live concurrency {{instance}}"),
            query("max(specroute_crossover)", "crossover"),
            query("max by (band, edge) (specroute_band_edge)", "band {{band}} {{edge}}"),
        ],
    )
    share = graph(
        "Requests by pool",
        "The share of routing decisions that chose each pool.",
        "percentunit",
        [
            query(
                f"sum by (pool) (rate(specroute_route_decisions_total[{RATE}]))"
                f" / scalar(sum(rate(specroute_route_decisions_total[{RATE}])))",
                "{{pool}}",
            )
        ],
    ).stacking(common_builder.StackingConfig().mode(common.StackingMode.NORMAL))
    spec_share = (
        stat.Panel()
        .title("Speculative share, 5 min")
        .description("specroute:spec_share:rate5m, the recording rule the alerts read.")
        .datasource(DATASOURCE)
        .unit("percentunit")
        .height(HEIGHT)
        .span(6)
        .with_target(query("specroute:spec_share:rate5m", "spec share"))
    )
    inflight = graph(
        "In flight and queued",
        "Requests in flight through the routers by pool, and requests queued at each backend "
        "as it reports them: a queue on every backend means more load than the deployment "
        "serves.",
        "short",
        [
            query("sum by (pool) (specroute_inflight)", "in flight {{pool}}"),
            query("max by (backend) (specroute_backend_queued)", "queued {{backend}}"),
        ],
    ).span(18)
    context = graph(
        "Context in flight by pool",
        "The mean context of the requests in flight on each pool: their estimated KV tokens "
        "(prompt bytes times the profile's tokens per byte, plus half the output limit) over "
        "their number, summed over the router replicas. Every step reads this cache, so "
        "where speculation stops paying moves with it: context-crossover reads the crossover "
        "at the mix where a request would run, and the crossover panel shows the last one. "
        "Beside it, the contexts the profile was measured at: traffic far outside them "
        "routes by a crossover measured for other requests (calibrate with --input-len).",
        "short",
        [
            query(
                "sum by (pool) (specroute_kv_tokens_inflight)"
                " / sum by (pool) (specroute_inflight > 0)",
                "mean context {{pool}}",
            ),
            query(
                "max by (bucket) (specroute_profile_context_tokens)", "profile's, bucket {{bucket}}"
            ),
        ],
    ).span(24)
    return [concurrency, share, spec_share, inflight, context]


def latency() -> Panels:
    ttft = graph(
        "Time to first token by pool",
        "From the request to the first byte of the backend's answer, measured in the router.",
        "s",
        quantiles("specroute_ttft_seconds", "pool"),
    )
    tpot = graph(
        "Time per output token by pool",
        "SGLang's inter-token latency, by the pool label of its scrape job.",
        "s",
        quantiles("sglang:inter_token_latency_seconds", "pool"),
    )
    accept = graph(
        "Accept length, live against the profile's",
        "Tokens per verify step on each speculative backend over the router's last polling "
        "window and SGLang's own over 5 min, against the accept length the profile was "
        "measured at. Far from it, the crossover has moved: measure again.",
        "short",
        [
            query("specroute_backend_accept_length", "live {{backend}}"),
            query("sglang:spec_accept_length:rate5m", "SGLang {{instance}}"),
            query("specroute:profile_accept_length", "profile"),
        ],
    )
    depth = graph(
        "Draft depth of each speculative server",
        "The draft depth each speculative server runs at now (SGLang's spec_num_steps, as "
        "the router last read it). Fixed unless the server adapts it itself "
        "(--speculative-adaptive), which moves it with its batch; 0 drafts nothing. An "
        "accept length is read at the depth it was made at.",
        "short",
        [query("specroute_backend_spec_depth", "{{backend}}")],
    )
    duration = graph(
        "Request duration by pool",
        "From the request to the end of the answer, measured in the router.",
        "s",
        quantiles("specroute_request_duration_seconds", "pool"),
    )
    return [ttft, tpot, accept, depth, duration]


def online() -> Panels:
    return [*_online_fit(), *_online_evidence(), *_online_peers()]


def _online_fit() -> Panels:
    """The live crossover and the curves it is read from."""
    crossover = graph(
        "Live crossover against the profile's",
        "The crossover learned from the requests each router replica served (online "
        "calibration), with the ends of its interval, beside the profile's and its interval, "
        "per context bucket. When the two intervals stop meeting, the profile has drifted "
        "(SpecrouteProfileDrift); with --online adopt the router routes by the live one "
        "once it is sure (adopted: 1).",
        "short",
        [
            query("max by (bucket, edge) (specroute_online_crossover)", "live {{bucket}} {{edge}}"),
            query(
                "max by (bucket, edge) (specroute_online_profile_crossover)",
                "profile {{bucket}} {{edge}}",
            ),
            query("max(specroute_online_adopted)", "adopted"),
            query("max by (bucket) (specroute_profile_drift)", "drift {{bucket}}"),
        ],
    )
    tpot = graph(
        "Live time per output token by pool and level",
        "The median time per output token of the served requests in the forgetting window, "
        "at each level of load they joined: the two live curves the crossover is read from. "
        "Where a pool has few samples (the plain one at low load under a crossover policy), "
        "the fit takes the profile's value.",
        "s",
        [
            query(
                "max by (bucket, pool, level) (specroute_online_tpot_seconds)",
                "{{pool}} at {{level}} ({{bucket}})",
            )
        ],
    )
    samples = graph(
        "Live samples by pool and level",
        "Served requests in the forgetting window per pool and level of load: how much "
        "evidence each point of the live curves has (--online-min-samples to enter the fit).",
        "short",
        [query("sum by (pool, level) (specroute_online_samples)", "{{pool}} at {{level}}")],
    )
    return [crossover, tpot, samples]


def _online_evidence() -> Panels:
    """What exploration adds to the evidence, and what the fit leaves out of it."""
    explored = graph(
        "Exploration share by pool",
        "The share of routing decisions that exploration sent to the pool the policy did not "
        "choose, in turns near the crossover (--online-explore-share; 0.02 by default), so that "
        "the live curves see both pools at the levels that decide it.",
        "percentunit",
        [
            query(
                f"sum by (pool) (rate(specroute_online_explored_total[{RATE}]))"
                f" / scalar(sum(rate(specroute_route_decisions_total[{RATE}])))",
                "explored to {{pool}}",
            )
        ],
    )
    drafter = graph(
        "Samples left out as another drafter's",
        "Samples in the forgetting window that the last fit left out because their accept "
        "length is further than --online-accept-tolerance from the speculative servers' now "
        "(taught by another drafter: after a drafter swap or a drop in acceptance), beside the "
        "accept length the fit stands at. They count again if acceptance comes back.",
        "short",
        [
            query("sum by (reason) (specroute_online_samples_left_out)", "left out: {{reason}}"),
            query("max(specroute_online_fit_accept_length)", "accept length of the fit"),
        ],
    )
    return [explored, drafter]


def _online_peers() -> Panels:
    """What the router replicas take from each other."""
    peer_samples = graph(
        "Peer samples taken per second by peer",
        "Online samples each router replica's leader takes from its peers before each fit "
        "(--online-peers), per peer: with every replica answering, each fits from the traffic "
        "of all of them. A peer found by name (dns+http://) that is the replica itself takes "
        "none, as it should.",
        "short",
        [
            query(
                f"sum by (peer) (rate(specroute_online_peer_samples_total[{RATE}]))",
                "from {{peer}}",
            )
        ],
    )
    peer_errors = graph(
        "Peer errors per second by reason",
        "Pulls of a peer's online samples that took nothing, rows dropped as invalid "
        "(bad_row) and names of peers that did not resolve (resolve, the last peers kept), by "
        "reason: refused, the replicas' admin keys differ; unreachable or timeout, the peer "
        "is down or its URL is wrong (SpecrouteOnlinePeerFailing).",
        "short",
        [
            query(
                f"sum by (reason) (rate(specroute_online_peer_errors_total[{RATE}]))",
                "{{reason}}",
            )
        ],
    )
    return [peer_samples, peer_errors]


def health() -> Panels:
    healthy = (
        statetimeline.Panel()
        .title("Backend health")
        .description(
            "1 when the router may send the backend traffic (the worst of the router "
            "replicas); 0 while its breaker is open or it is ejected."
        )
        .datasource(DATASOURCE)
        .height(HEIGHT)
        .span(WIDTH)
        .mappings(
            [
                ValueMap(
                    {
                        "0": ValueMappingResult(text="out", color="red"),
                        "1": ValueMappingResult(text="serving", color="green"),
                    }
                )
            ]
        )
        .thresholds(
            dashboard_builder.ThresholdsConfig()
            .mode(ThresholdsMode.ABSOLUTE)
            .steps([Threshold(None, "red"), Threshold(1, "green")])
        )
        .with_target(query("min by (backend) (specroute_backend_healthy)", "{{backend}}"))
    )
    errors = graph(
        "Upstream errors and ejections",
        "Failures charged to each backend, by kind, and the times a backend was ejected; the "
        "router's own failures (out of descriptors, internal errors) by kind.",
        "reqps",
        [
            query(
                f"sum by (backend, kind) (rate(specroute_upstream_errors_total[{RATE}]))",
                "{{backend}} {{kind}}",
            ),
            query(
                f"sum by (backend) (rate(specroute_backend_ejections_total[{RATE}]))",
                "ejected {{backend}}",
            ),
            query(
                f"sum by (kind) (rate(specroute_router_errors_total[{RATE}]))",
                "router {{kind}}",
            ),
        ],
    )
    cpu = graph(
        "Router CPU",
        "Cores used by each router, all its workers, against how many it has: each worker "
        "saturates at one core.",
        "short",
        [
            query(
                f"sum by (instance) (rate(specroute_router_cpu_seconds_total[{RATE}]))",
                "{{instance}} used",
            ),
            query("sum by (instance) (specroute_router_workers)", "{{instance}} workers"),
        ],
    ).span(24)
    return [healthy, errors, cpu]


def build() -> dashboard_builder.Dashboard:
    board = (
        dashboard_builder.Dashboard("specroute")
        .uid(UID)
        .description("Routing between a speculative and a plain SGLang pool by live load.")
        .tags(["specroute", "sglang"])
        .time("now-1h", "now")
        .refresh("10s")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .with_variable(
            dashboard_builder.DatasourceVariable("datasource")
            .label("Prometheus")
            .type("prometheus")
        )
    )
    sections = (
        ("Routing", load()),
        ("Latency and acceptance", latency()),
        ("Online calibration", online()),
        ("Health", health()),
    )
    for title, panels in sections:
        board.with_row(dashboard_builder.Row(title))
        for panel in panels:
            board.with_panel(panel)
    return board


def main() -> int:
    json.dump(build().build(), sys.stdout, cls=JSONEncoder, indent=2, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
