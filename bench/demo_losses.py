"""Demo losses: the share of a demo's checked commitments that earned nothing, and why (docs/benchmarks.md 18).

Reads a demo's SQLite database (``var/portal.sqlite3`` of the clone that ran ``manage.py demo``): the
commitments received in a window, by outcome, and for each epoch some session lost, how far apart the
first two sessions' own claims were (the first step's parameters sketch of each). Two agents about 2e-4
apart computed at one state the validator did not hold; 1e-3 or more apart, at parameters of their own.

Run ``python -m bench.demo_losses --help`` from the repository root.
"""

from __future__ import annotations

import argparse
import collections
import json
import sqlite3

from peer_agent.spotcheck import fingerprint_distance

LOST = ("diverged", "unchecked", "failed")


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.demo_losses", description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default="var/portal.sqlite3", help="the demo's database")
    parser.add_argument("--since", default="1970-01-01", help="received at or after (UTC, e.g. '2026-12-04 09:25:00')")
    parser.add_argument("--until", default="9999-12-31", help="received before (UTC)")
    parser.add_argument("--epochs", action="store_true", help="list each epoch some session lost")
    return parser.parse_args()


def main() -> None:
    args = _parse()
    rows = sqlite3.connect(args.db).execute(
        "SELECT session_id, epoch, outcome, steps FROM runs_stepcommitment WHERE received_at >= ? AND received_at < ?"
        " ORDER BY epoch, session_id", (args.since, args.until)).fetchall()
    outcomes = collections.Counter(outcome for _, _, outcome, _ in rows)
    checked = sum(count for outcome, count in outcomes.items() if outcome != "pending")
    lost = sum(outcomes[outcome] for outcome in LOST)
    print(f"{len(rows)} commitments {dict(outcomes)}; lost {lost} of {checked} checked "
          f"({100 * lost / max(checked, 1):.1f}%)")
    epochs: dict[int, dict[int, tuple[str, str | None]]] = collections.defaultdict(dict)
    for session, epoch, outcome, steps in rows:
        claims = [step[3] for step in json.loads(steps) if len(step) > 3]
        epochs[epoch][session] = (outcome, claims[0] if claims else None)
    apart = []  # for each lost epoch with two sessions' claims: how far apart they were
    for epoch, sessions in sorted(epochs.items()):
        if not any(outcome in LOST for outcome, _ in sessions.values()):
            continue
        claims = [claim for _, claim in sessions.values() if claim is not None]
        distance = fingerprint_distance(claims[0], claims[1]) if len(claims) >= 2 else None
        apart.append(distance)
        if args.epochs:
            shown = "" if distance is None else f"; the sessions' claims {distance:.4f} apart"
            print(f"epoch {epoch}: {({session: outcome for session, (outcome, _) in sessions.items()})}{shown}")
    measured = [distance for distance in apart if distance is not None]
    together = sum(distance < 1e-3 for distance in measured)
    print(f"{len(apart)} epochs lost by some session; of the {len(measured)} with two sessions' claims, "
          f"{together} had them together (< 1e-3: a state not held), {len(measured) - together} apart")


if __name__ == "__main__":
    main()
