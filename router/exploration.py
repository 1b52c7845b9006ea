"""Exploration: a stated share of requests sent to the pool the policy did not choose, near
the crossover routed by, so that the live curves get samples where they decide it.

Under a crossover policy the speculative server is never seen above the crossover nor the
plain one below it, so there the fit takes the profile's curve: a profile whose crossover
is too low is never corrected, since nothing shows that speculation still pays above it.
Exploration sends, after the policy's choice, one request in ``1 / share`` to the other pool
when the load the request would join there lies within a factor ``span`` of the crossover
(``crossover / span`` to ``crossover * span``), preferring the levels of load where that
pool has fewer live samples than a level needs to count (``--online-min-samples``).

Bounded and stated:

- the share is of every request this worker decides (a credit of ``share`` a request, one
  spent by each request explored): over any stretch at most ``share`` of them, however many
  workers share it out;
- never to an ejected server, one whose reported running requests have reached its
  ``max_running_requests``, nor at a load past ``crossover * span``: it never overloads a
  server to learn;
- only on a decision a crossover or a profile's bands made (``below_crossover``,
  ``above_crossover``, ``inside_band``, ``outside_band``), around the crossover (the first
  band's top): failover, retries, probes and the other policies' choices are left alone.

On the request path: a credit added and compared; the rest only when it is owed. What the
last fit saw (each pool's live samples per level) is read once per fit, never fitted here.
It generalises ``acceptance-crossover``'s ``probe_share``, which sends requests to the
speculative pool at any load while a low live accept length keeps it idle; both may apply,
and their shares add.
"""

from __future__ import annotations

import math
from typing import Any

from specroute.policies.decision import Decision
from specroute.policies.view import BackendView, Pool, View
from specroute.router.online import Online
from specroute.router.online_fit import nearest

EXPLORE = "explore"  # the decision's reason
# decisions it may turn: a crossover's, and a profile's bands' (a calibrated profile writes
# its one band as bands), explored around the crossover (the first band's top)
_CROSSOVER = frozenset({"below_crossover", "above_crossover", "inside_band", "outside_band"})
_OWED = 2.0  # the most credit kept: one exploration waiting for a preferred level, one more


class Exploration:
    def __init__(self, online: Online, share: float, span: float) -> None:
        """``share``: of the requests decided, the most explored (0 < share <= 1);
        ``span``: how far from the crossover, as a factor of load, it explores (> 1)."""
        self.online, self.share, self.span = online, share, span
        self.explored: dict[Pool, int] = {"spec": 0, "base": 0}
        self._decided = 0  # decisions seen: each earns ``share`` of one exploration
        self._spent = 0.0  # of what they earned: explorations, and what was owed past _OWED
        self._read: float | None = None  # the fit whose samples ``_short`` holds
        self._levels: tuple[float, ...] = ()
        self._short: dict[Pool, tuple[bool, ...]] = {}  # per level: fewer live samples than count

    def after(self, decision: Decision, view: View, crossover: float | None) -> Decision:
        """The policy's ``decision``, or the other pool's server with reason ``explore``;
        ``crossover``: the policy's own (the live one in ``view`` goes first, as routing's)."""
        self._decided += 1
        owed = self.share * self._decided - self._spent  # a product: no sum's rounding drift
        if owed > _OWED:
            self._spent, owed = self._spent + owed - _OWED, _OWED
        if owed < 1 or decision.reason not in _CROSSOVER:
            return decision
        threshold = crossover if view.live_crossover is None else view.live_crossover
        if threshold is None or not 0 < threshold < math.inf:
            return decision
        other: Pool = "base" if decision.pool == "spec" else "spec"
        target, load = self._seat(view, other, decision.backend)
        if target is None or not threshold / self.span <= load <= threshold * self.span:
            return decision
        cap = target.max_running_requests
        if cap is not None and target.load(view.source) >= cap:
            return decision
        if owed < _OWED and not self._preferred(other, load, threshold):
            return decision
        self._spent += 1
        self.explored[other] += 1
        return Decision(other, target.name, EXPLORE)

    def _seat(self, view: View, pool: Pool, chosen: str | None) -> tuple[BackendView | None, int]:
        """The server of ``pool`` the request would run on instead, and the load it would
        join there, itself included, counted as the online samples count it: the group's
        (both pools) in the shared topology, the server's own in the partitioned one."""
        if not self.online.shared:
            target = view.least_loaded(pool)
            return target, 0 if target is None else target.load(view.source) + 1
        group = next((b.group for b in view.backends if b.name == chosen), "")
        target = view.least_loaded(pool, group)
        return target, view.group_load(group) + 1

    def _preferred(self, pool: Pool, load: int, threshold: float) -> bool:
        """Whether ``load`` is at a level ``pool`` most needs samples at: one short of the
        samples a level needs to count live, or any level near the crossover when none
        there is short (then every one keeps being refreshed, so the window follows drift)."""
        self._learn()
        short, levels = self._short.get(pool), self._levels
        if not short:
            return True  # no fit yet: every level is as unknown as the next
        low, high = threshold / self.span, threshold * self.span
        if not any(s for level, s in zip(levels, short, strict=True) if low <= level <= high):
            return True
        return short[nearest(levels, load)]

    def _learn(self) -> None:
        """What the last fit saw: each pool's live samples per level (all contexts)."""
        online = self.online
        if self._read == online.fitted_at:
            return
        self._read = online.fitted_at
        fits = online.fits
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
        return {"share": self.share, "span": self.span, "explored": dict(self.explored)}
