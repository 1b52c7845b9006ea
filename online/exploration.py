"""Exploration: a stated share of requests sent to the pool the policy did not choose, in
turns, near the crossover routed by, so that the live curves get samples of both pools at
the levels that decide it.

A level of a pool's curve is that pool's server holding that many requests (alone on its
GPUs, in the shared topology). Under a crossover the speculative server is never seen above
the crossover nor the plain one below it, and one request sent across now and then only
shows the other server at a load of one (on shared GPUs, beside the other pool's steps,
which the fit leaves out). So exploration moves a stretch of traffic at once: a **turn**
sends the next ``TURN`` times the level's requests that the crossover decides on a GPU group
(shared; the pair of least-loaded servers, partitioned) to the other pool. The pool it
leaves drains, and the other comes to hold the level's requests, alone, for about two of
their lifetimes.

Where: a turn starts when the level the other pool would come to hold (the group's load,
both pools, in the shared topology; the chosen server's and the other's together in the
partitioned one; the request itself included) lies within a factor ``span`` of the
crossover (``crossover / span`` to ``crossover * span``; at any level for a crossover of 0:
no profile, or one that says speculation pays nowhere, is tested wherever the traffic is),
or of any edge of bands (the last fit's estimate, else those routed by), at the level
nearest it, on the side where the policy does not send that pool, where it has fewer live
samples than a level needs to count (``--online-min-samples``); at any level in the span
where no edge lacks any (a refresh); elsewhere only once the credit would pay for a turn
at the top of the span, so that a cheap refresh (a band's start with its evidence) does
not spend the credit a dearer turn that is wanted (past the band's top) waits for. A span
of 4 reaches a crossover off by a factor of 4 either way at once; each crossover adopted
re-centres it, so a profile further off, or none (a crossover of 0), is corrected a step
at a time.

Bounded and stated:

- the share is of every request this worker decides (a credit of ``share`` a request, one
  spent by each request explored; a turn starts once the credit pays for all of it): at
  most ``share`` of them from the start, however many workers share it out; the credit
  kept is at most ``KEPT`` turns at the top of the span, earned where no turn could start
  (a load outside the span), spent when the load comes within it;
- backed off where turns teach nothing: on shared GPUs a sample taken beside the other
  pool's requests is left out (``online.samples.beside_other``), so a turn during which
  the pool it left never once held none of the group's requests (traffic whose requests
  outlive a turn, or a turn cut short by a burst past the span) may have bought no sample
  at all. Each such turn, whole or cut short, doubles the credit its GPU group's next one
  needs (up to ``BACKOFF`` times), and the credit it waited for beyond its own is spent,
  not kept; a turn that drained the pool it left resets it. A turn cut short because the
  load fell below the span of the edge it explores (a ramp stepping down; with bands whose
  spans do not meet, a load between them is below the higher edge's, not past the lower's)
  ended before it could show either, and leaves the backoff as it is. Each group backs off
  on its own: the traffic on another group may drain;
- never to an ejected server, nor to one whose reported running requests have reached its
  ``max_running_requests``, nor at a level past ``crossover * span`` (a turn ends there):
  it never overloads a server to learn;
- only on a decision a crossover or bands made (``below_crossover``, ``above_crossover``,
  ``inside_band``, ``outside_band``, and ``context-crossover``'s ``*_band_at_context``),
  around each edge of the bands (a crossover is one edge; a mixture-of-experts model's band
  has one where speculation starts paying too, where the pools' sides are the other way
  round), in every context bucket: failover, retries, probes and the other policies'
  choices are left alone.

On the request path: a credit added and compared, a turn looked up; the rest only when one
starts. What the last fit saw (each pool's live samples per level) is read once per fit,
never fitted here. It generalises ``acceptance-crossover``'s ``probe_share``, which sends
requests to the speculative pool at any load while a low live accept length keeps it idle;
both may apply, and their shares add.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from specroute.crossing import Band
from specroute.online.estimator import Online
from specroute.online.fit import LiveCrossing
from specroute.policies.decision import Decision
from specroute.policies.policy import Policy
from specroute.policies.view import POOLS, BackendView, Pool, View

EXPLORE = "explore"  # the decision's reason
# decisions it may turn: a crossover's, a profile's bands' (a calibrated profile writes its
# one band as bands), and context-crossover's bands at a context, explored around each edge
_CROSSOVER = frozenset(
    {
        "below_crossover",
        "above_crossover",
        "inside_band",
        "outside_band",
        "inside_band_at_context",
        "outside_band_at_context",
    }
)
Edge = tuple[float, str]  # a load where speculation stops paying ("down") or starts ("up")
# a turn's requests per request of the level it explores: about one lifetime of the level's
# requests while the pool it leaves drains, two with the other pool alone, and one whose
# requests the pool left takes again as they end
TURN = 4
# a turn starts at a level only this near the one wanted, in doublings: a sample counts at
# its mean load while it decoded, which drifts from the load a turn starts at
CENTRE = 0.35
KEPT = 4  # the most credit kept: this many turns at the top of the span
CEILING = 512.0  # the top of the span of a crossover of 0, for the credit it keeps
BACKOFF = 16  # the most times its own credit a turn waits for after turns that never drained


@dataclass
class Turn:
    """A stretch of a group's traffic sent to ``to``: ``left`` requests more, around the
    edge at ``edge`` requests."""

    to: Pool
    left: int
    level: float
    edge: float
    drained: bool  # the pool it left held none of the group's requests at one of its decisions


class Exploration:
    def __init__(self, online: Online, share: float, span: float) -> None:
        """``share``: of the requests decided, the most explored (0 < share <= 1);
        ``span``: how far from the crossover, as a factor of load, it explores (> 1)."""
        self.online, self.share, self.span = online, share, span
        self.explored: dict[Pool, int] = {"spec": 0, "base": 0}
        self.turns: dict[Pool, int] = {"spec": 0, "base": 0}  # turns started, by pool
        self._decided = 0  # decisions seen: each earns ``share`` of one explored request
        self._spent = 0.0  # of what they earned: requests explored, and what was past the cap
        self._open: dict[str, Turn] = {}  # by GPU group (shared), or "" for the pair
        self._read: float | None = None  # the fit whose samples ``_short`` holds
        self._levels: tuple[float, ...] = ()
        self._short: dict[Pool, tuple[bool, ...]] = {}  # per level: fewer live samples than count
        self._estimate: list[Edge] = []  # the last fit's edges (a bound's level), every context
        # per GPU group (shared), the times its own credit its next turn waits for (``BACKOFF``):
        # 1 where absent
        self.backoff: dict[str, int] = {}

    def after(
        self, decision: Decision, view: View, routed: float | tuple[Band, ...] | None
    ) -> Decision:
        """The policy's ``decision``, or the other pool's server with reason ``explore``;
        ``routed``: the policy's own crossover, or its bands (``policy_bands``). Explored
        around the last fit's live estimate, sure or not (a bound's level for a bound: where
        the evidence is wanted), or else what is routed by: each edge of its bands, in every
        context."""
        self._decided += 1
        self._learn()
        if decision.reason not in _CROSSOVER:
            return decision
        edges = self._edges(view, routed)
        if not edges:
            return decision
        top = max(at for at, _ in edges)
        longest = TURN * min(top * self.span if top > 0 else math.inf, CEILING)
        owed = self.share * self._decided - self._spent  # a product: no sum's rounding drift
        if owed > KEPT * longest:
            self._spent, owed = self._spent + owed - KEPT * longest, KEPT * longest
        if owed < TURN and not self._open:
            return decision  # no turn open, and none paid for: the common case, cheaply
        key = self._key(view, decision)
        turn = self._open.get(key)
        if turn is None:
            other: Pool = "base" if decision.pool == "spec" else "spec"
            target, level = self._seat(view, other, decision.backend, key)
            edge = self._near(level, edges)
            if target is None or edge is None or _full(target, view):
                return decision
            need = math.ceil(TURN * level)
            preferred = self._preferred(other, level, edge, edges)
            backoff = self.backoff.get(key, 1)
            if owed < need * backoff or (owed < longest and not preferred):
                return decision
            self._spent += need * (backoff - 1)  # waited for past its own: not kept
            # partitioned GPUs: nothing beside a sample, nothing to drain
            turn = self._open[key] = Turn(
                other, need, level, edge[0], drained=not self.online.shared
            )
            self.turns[other] += 1
        if decision.pool == turn.to:
            return decision  # the policy's own choice: nothing to turn
        target, level = self._seat(view, turn.to, decision.backend, key)
        if target is None or _full(target, view):
            self._end(key)  # the server cannot take more
            return decision
        if self._near(level, edges) is None:
            # the load left every span: rose past its edge's, or fell below it
            self._end(key, fell=level < turn.edge / self.span)
            return decision
        if owed < 1:
            return decision  # another group's turn spent the credit: this one waits
        self._spent += 1
        self.explored[turn.to] += 1
        turn.left -= 1
        turn.drained = turn.drained or not view.group_load(key, decision.pool)
        if turn.left <= 0:
            self._end(key)
        return Decision(turn.to, target.name, EXPLORE)

    def _end(self, key: str, fell: bool = False) -> None:
        """Ends ``key``'s turn, whole or cut short: the group's next waits for twice the
        credit unless the pool it left drained, or the load ``fell`` below the span first
        (no evidence either way: the backoff stays as it is)."""
        turn = self._open.pop(key)
        if turn.drained:
            self.backoff.pop(key, None)
        elif not fell:
            self.backoff[key] = min(2 * self.backoff.get(key, 1), BACKOFF)

    def _edges(self, view: View, routed: float | tuple[Band, ...] | None) -> list[Edge]:
        """Where to explore: the last fit's estimate; else the live bands routed by; else
        the policy's crossover or bands (a crossover of 0: no profile, or one where
        speculation pays nowhere)."""
        if self._estimate:
            found = self._estimate
        elif any(bands is not None for bands in view.live_bands):
            found = [edge for bands in view.live_bands if bands is not None for edge in _of(bands)]
        elif isinstance(routed, tuple):
            found = _of(routed)
        else:
            found = [] if routed is None else [(routed, "down")]
        return [(at, way) for at, way in found if 0 <= at < math.inf]

    def _near(self, level: float, edges: list[Edge]) -> Edge | None:
        """The edge nearest ``level`` (in log load) whose span holds it, if any: within a
        factor ``span`` of it, at any level for an edge at 0."""
        inside = [e for e in edges if e[0] == 0 or e[0] / self.span <= level <= e[0] * self.span]
        if not inside:
            return None
        return min(inside, key=lambda e: abs(math.log(level / e[0])) if e[0] > 0 else math.inf)

    def _key(self, view: View, decision: Decision) -> str:
        """The turn a decision belongs to: its server's GPU group's, or the pair's."""
        if not self.online.shared:
            return ""
        return next((b.group for b in view.backends if b.name == decision.backend), "")

    def _seat(
        self, view: View, pool: Pool, chosen: str | None, group: str
    ) -> tuple[BackendView | None, int]:
        """The server of ``pool`` the request would run on instead, and the level that pool
        comes to hold in a turn, the request included, counted as the online samples count
        it: the load of ``group`` (both pools; the turn's key) in the shared topology; in the
        partitioned one, the chosen server's and that server's together."""
        source = view.source
        if not self.online.shared:
            target = view.least_loaded(pool)
            if target is None:
                return None, 0
            mine = next((b.load(source) for b in view.backends if b.name == chosen), 0)
            return target, mine + target.load(source) + 1
        return view.least_loaded(pool, group), view.group_load(group) + 1

    def _preferred(self, pool: Pool, level: float, edge: Edge, edges: list[Edge]) -> bool:
        """Whether ``level`` is one ``pool`` needs samples at (``_wanted``) around ``edge``,
        within a ``CENTRE`` of it; when it needs none and the other pool does, or another
        of ``edges`` needs some (a band's top, past the start's evidence), not, so that the
        credit goes where the evidence is missing; when no edge needs any, any level in the
        span, so that every one keeps being refreshed and the window follows drift."""
        if not self._short or edge[0] <= 0:
            return True  # no fit yet, or no crossover: every level is as unknown as the next
        wanted = self._wanted(pool, edge)
        if not wanted:
            return not any(self._wanted(p, e) for e in edges if e[0] > 0 for p in POOLS)
        return any(abs(math.log2(level / lvl)) <= CENTRE for lvl in wanted)

    def _wanted(self, pool: Pool, edge: Edge) -> list[float]:
        """The levels in ``edge``'s span where ``pool`` is short of the samples a level needs
        to count, among those the edge needs: the level on each side of it (a crossing
        between them needs both pools at both), and the next one out on the side where the
        policy does not send ``pool`` (past a ``down`` edge for the speculative pool, short
        of it for the plain one; the other way round at an ``up`` edge) unless a live bound
        says the crossing is not there, so that the evidence grows outwards a level at a
        time."""
        at, way = edge
        levels, short = self._levels, self._short[pool]
        found = self.online.fits[0].crossing if len(self.online.fits) == 1 else None
        bound = None if found is None or found.at is not None or found.edges else found.bound
        under = [lvl for lvl in levels if lvl <= at]
        over = [lvl for lvl in levels if lvl >= at]
        need = under[-1:] + over[:1]
        outward_spec, outward_base = over[1:2], under[-2:-1]  # past a fall, short of it
        if way == "up":
            outward_spec, outward_base = outward_base, outward_spec
        if pool == "spec" and bound != "below":
            need += outward_spec
        if pool == "base" and bound != "above":
            need += outward_base
        low, high = at / self.span, at * self.span
        return [
            lvl for i, lvl in enumerate(levels) if short[i] and lvl in need and low <= lvl <= high
        ]

    def _learn(self) -> None:
        """What the last fit saw: each pool's live samples per level (all contexts)."""
        online = self.online
        if self._read == online.fitted_at:
            return
        self._read = online.fitted_at
        fits = online.fits
        self._estimate = [
            edge for f in fits if f.crossing is not None for edge in _estimated(f.crossing)
        ]
        if not fits:
            self._levels, self._short = (), {}
            return
        need = online.sureness.min_samples
        self._levels = tuple(level.level for level in fits[0].curves["spec"])
        self._short = {
            pool: tuple(
                sum(f.curves[pool][i].samples for f in fits) < need
                for i in range(len(self._levels))
            )
            for pool in fits[0].curves
        }

    def describe(self) -> dict[str, Any]:
        """For ``/router/status``."""
        return {
            "share": self.share,
            "span": self.span,
            "explored": dict(self.explored),
            "turns": dict(self.turns),
            "backoff": dict(self.backoff),  # the groups backed off (absent: 1)
            "open_turns": [asdict(t) | {"group": k} for k, t in self._open.items()],
        }


def policy_bands(policy: Policy) -> float | tuple[Band, ...] | None:
    """What a policy routes by, for ``Exploration.after``: its bands when it has them (a
    profile's), else its crossover (None: none)."""
    bands = getattr(policy, "bands", None)
    return bands if isinstance(bands, tuple) else policy.crossover()


def _estimated(found: LiveCrossing) -> list[Edge]:
    """A fit's edges: its bands' turns, and the last level when the last band still pays
    there (a bound: where the evidence ends, and is wanted next); a crossover's; a bound's
    level."""
    if found.edges:
        turns = [(e.at, e.direction) for e in found.edges]
        paying = found.bands
        if paying and paying[-1][1] == found.levels[-1]:
            turns.append((found.levels[-1], "down"))
        return turns
    at = found.at or found.limit
    return [] if at is None else [(at, "down")]


def _of(bands: tuple[Band, ...]) -> list[Edge]:
    """The edges of bands routed by: each start an ``up``, each closed top a ``down``
    (speculation nowhere: an edge at 0, any level)."""
    if not bands:
        return [(0.0, "down")]
    edges = [(start, "up") for start, _ in bands if start is not None]
    return edges + [(end, "down") for _, end in bands if end is not None]


def _full(target: BackendView, view: View) -> bool:
    """Whether ``target``'s reported running requests have reached its cap."""
    cap = target.max_running_requests
    return cap is not None and target.load(view.source) >= cap
