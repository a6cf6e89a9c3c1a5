"""KFServing-style canary rollouts as a pure state machine.

Revisions are named ``<isvc>-predictor-<hash of the pod-shaping spec>``. State lives in the
status (``latestRolledoutRevision``, ``previousRolledoutRevision``) exactly as KServe keeps it:

- no rolled-out revision yet (first create): the latest gets 100% at once;
- spec unchanged (latest == rolled out): 100% to it;
- spec changed, ``canaryTrafficPercent: P`` (0..99): the rolled-out revision keeps 100-P% (tag
  ``prev``), the latest gets P% (tag ``latest``) -- but only once it is Ready, 0% before;
  P = 0 pins all traffic on the previous revision (rollback);
- spec changed without P (or P = 100): traffic stays on the rolled-out revision until the
  latest is Ready, then the latest gets 100%, becomes ``latestRolledoutRevision`` and the old
  one ``previousRolledoutRevision`` (its Deployment is retired).

A rolled-out revision whose Deployment is gone cannot be rebuilt (its spec is no longer
known), so it is dropped and the latest takes the traffic.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass

STABLE, CANARY, ROLLING_OUT, ROLLED_BACK = "Stable", "Canary", "RollingOut", "RolledBack"


@dataclass(frozen=True)
class TrafficTarget:
    revision: str
    percent: int
    tag: str  # "latest" | "prev"
    latest: bool


@dataclass(frozen=True)
class RolloutPlan:
    latest: str
    stable: str | None  # the revision holding the 100-P share while a rollout is in progress
    traffic: tuple[TrafficTarget, ...]
    latest_rolledout: str
    previous_rolledout: str | None
    phase: str
    requested_percent: int | None

    @property
    def keep(self) -> frozenset[str]:
        """Revisions whose Deployments stay; every other revision Deployment is retired."""
        return frozenset(r for r in (self.latest, self.stable) if r)

    @property
    def hpa_target(self) -> str:
        """The HPA scales the revision that serves the bulk of the traffic."""
        return self.stable or self.latest

    @property
    def single(self) -> str | None:
        """The revision with 100% of the traffic, when there is exactly one."""
        serving = [t for t in self.traffic if t.percent > 0]
        return serving[0].revision if len(serving) == 1 else None

    def percent(self, revision: str) -> int:
        return sum(t.percent for t in self.traffic if t.revision == revision)


def plan(
    *,
    latest: str,
    canary_percent: int | None,
    latest_rolledout: str | None,
    previous_rolledout: str | None,
    ready: Set[str],
    existing: Set[str],
) -> RolloutPlan:
    """The traffic plan for ``latest`` given the stored state and observed revisions."""
    rolled = latest_rolledout if latest_rolledout in existing or latest_rolledout == latest else None
    if rolled is None or rolled == latest:
        previous = previous_rolledout if rolled == latest else latest_rolledout
        return _single(latest, previous, canary_percent)
    promote = canary_percent is None or canary_percent >= 100
    if promote:
        if latest in ready:
            return _single(latest, rolled, canary_percent)
        share, phase = 0, ROLLING_OUT
    else:
        assert canary_percent is not None
        share = canary_percent if latest in ready else 0
        phase = ROLLED_BACK if canary_percent == 0 else CANARY
    return RolloutPlan(
        latest=latest,
        stable=rolled,
        traffic=(
            TrafficTarget(rolled, 100 - share, "prev", False),
            TrafficTarget(latest, share, "latest", True),
        ),
        latest_rolledout=rolled,
        previous_rolledout=previous_rolledout,
        phase=phase,
        requested_percent=canary_percent,
    )


def _single(latest: str, previous: str | None, requested: int | None) -> RolloutPlan:
    return RolloutPlan(
        latest=latest,
        stable=None,
        traffic=(TrafficTarget(latest, 100, "latest", True),),
        latest_rolledout=latest,
        previous_rolledout=previous if previous != latest else None,
        phase=STABLE,
        requested_percent=requested,
    )


def canary_replicas(percent: int, stable_replicas: int, min_replicas: int, *, exact_weights: bool) -> int:
    """Fixed replica count of the latest revision during a canary.

    With route weights (Gateway API) the canary only needs capacity for its share; without
    them the share of requests IS the share of ready pods behind one Service, so the count is
    chosen to make latest / (latest + stable) as close to P% as whole pods allow (>= 1 pod).
    """
    if percent <= 0:
        return 1  # kept warm for the `latest` tag and a quick re-promotion
    if exact_weights:
        return max(1, -(-min_replicas * percent // 100))
    return max(1, round(stable_replicas * percent / (100 - percent)))
