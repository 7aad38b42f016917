"""Where a fleet replica's decision latency goes, from its JSON log (`bench fleet`'s
``replica-N.log``): ``python -m bench.fleet_spans LOG...``.

A decision runs from the close of round k (its last reading learned, or its timeout) to the
publication of round k + 1. The replica's own events split it, from their timestamps (the log's
wall clock, microseconds):

- ``to_proposed``: ``round.closed`` of round k → ``round.proposed`` of round k + 1: back on the
  loop, then the timers, the budget and the proposal (policy, vetting, reservation; before
  branch fleet18c also the regret estimate, and two hops to worker threads, not one);
- ``to_published``: → ``round.published``, the log line of the publication mark (a worker
  thread): the publication (before fleet18c, a stopped-state read in a worker thread first),
  then the wait for that thread;
- ``to_marked``: the two together, close → mark: the decision latency as it was measured
  before fleet18c;
- ``decision``: the logged ``decision_latency_s``; from fleet18c it ends when the publication
  was handed to the broker, before the mark's thread (and the regret estimate after it).
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

SPANS = ("to_proposed", "to_published", "to_marked", "decision")


def _unix(event: dict) -> float:
    return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()


def spans(lines: Iterable[str]) -> dict[str, list[float]]:
    """Span name -> seconds, one per decision (a first publication with a latency)."""
    closed: dict[tuple[str, int], float] = {}
    proposed: dict[tuple[str, int], float] = {}
    out: dict[str, list[float]] = {name: [] for name in SPANS}
    for line in lines:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue  # not an event (two processes' lines run together, or a traceback)
        if not isinstance(event, dict):
            continue
        name, kind = event.get("experiment"), event.get("event")
        if kind == "round.closed":
            closed[(name, event["round"])] = _unix(event)
        elif kind == "round.proposed":
            proposed[(name, event["round"])] = _unix(event)
        elif kind == "round.published" and event.get("decision_latency_s") is not None:
            number = event["round"]
            before, chosen = closed.get((name, number - 1)), proposed.get((name, number))
            if before is None or chosen is None:
                continue  # the previous round closed by a timeout, or before this log began
            latency, published = event["decision_latency_s"], _unix(event)
            out["decision"].append(latency)
            out["to_published"].append(published - chosen)
            out["to_proposed"].append(chosen - before)
            out["to_marked"].append(published - before)
    return out


def quantiles(values: list[float]) -> tuple[float, float, float]:
    """(p50, p95, mean) of `values` (nan when empty)."""
    if not values:
        return (float("nan"),) * 3
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return statistics.median(ordered), p95, statistics.fmean(ordered)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m bench.fleet_spans REPLICA_LOG...", file=sys.stderr)
        return 2
    for path in map(Path, argv):
        found = spans(path.read_text().splitlines())
        print(f"{path} ({len(found['decision'])} decisions): p50 / p95 / mean, s")
        for name in SPANS:
            p50, p95, mean = quantiles(found[name])
            print(f"  {name:13s} {p50:7.3f} {p95:7.3f} {mean:7.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
