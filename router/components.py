"""The components the settings configure, built where the app is composed: each from the
part of the settings it reads."""

from __future__ import annotations

from specroute.online.estimator import ROW_PER_LEVEL, Online, Sureness
from specroute.online.exploration import Exploration
from specroute.online.samples import Samples
from specroute.policies.placement import Placement, placement
from specroute.router.backends.health import Ejection
from specroute.router.settings.health import HealthSettings
from specroute.router.settings.online import OnlineSettings
from specroute.router.settings.routing import RoutingSettings
from specroute.router.settings.upstream import UpstreamSettings
from specroute.router.upstream.pool import Limits


def ejection(health: HealthSettings) -> Ejection:
    return Ejection(
        after_failures=health.eject_after_failures,
        seconds=health.eject_seconds,
        max_seconds=health.eject_max_seconds,
        readmit_after_successes=health.readmit_after_successes,
    )


def placer(routing: RoutingSettings) -> Placement:
    """The placement within a pool."""
    return placement(
        routing.placement,
        prefix_bytes=routing.affinity_prefix_bytes,
        balance_abs=routing.affinity_balance_abs,
        balance_rel=routing.affinity_balance_rel,
    )


def upstream_limits(upstream: UpstreamSettings) -> tuple[Limits, Limits]:
    """For a stream and for a whole answer. A stream may run for hours as long as it
    keeps talking; a non-streamed answer comes whole at its end, so it gets a deadline
    instead of an idle limit."""
    stream = Limits(connect=upstream.connect_timeout, silence=upstream.idle_timeout, total=None)
    whole = Limits(connect=upstream.connect_timeout, silence=None, total=upstream.request_timeout)
    return stream, whole


def samples(settings: OnlineSettings) -> Samples:
    """The online samples' buffer, sized by the forgetting window."""
    return Samples(
        settings.kept(), settings.window_seconds, settings.window_samples * ROW_PER_LEVEL
    )


def sureness(settings: OnlineSettings) -> Sureness:
    return Sureness(settings.min_samples, settings.max_ratio)


def exploration(settings: OnlineSettings, online: Online) -> Exploration | None:
    """Exploration as the settings give it; None when off (online off, or no share)."""
    if not settings.explores():
        return None
    return Exploration(online, settings.explore_share, settings.explore_span)
