"""The figures of a rehearsal (bench/rehearsal.py), read after the run from the portal's database and from the
logs its processes wrote: the agents' (one JSON object a line, hivemind's round-by-round messages among them,
``--log-format json --verbose``), the coordinators' (the portal's plain format) and the validator workers'."""

from __future__ import annotations

import datetime
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

# The portal's plain log format (portal/settings.py, LOGGING): "2026-12-07 17:40:01,123 INFO runs.swarm...: ..."
PLAIN_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+) (\w+) (\S+): (.*)$")
# What the coordinator's holder and validator say, to tell why commitments were or were not checked.
HOLDER_LINES = {
    "held alone": "holding the state of epoch",
    "served unlike": "served a state of epoch",
    "kept fetched": "fetched the state of epoch",
    "kept unlike": "served a kept state",
    "hold failed": "could not hold the swarm's state",
    "sources unread": "could not read which peers share the state",
    "checks failed": "spot checks failed this cycle",
    "past the swarm": "past the swarm's",
}


@dataclass
class AgentLog:
    """What one agent's log says: its rounds and its downloads of the swarm's state."""

    # epoch -> seconds from "Beginning optimizer step" to "Transitioning", of the steps whose gradients it averaged
    # with another peer (a peer alone steps at once)
    rounds: dict[int, float] = field(default_factory=dict)
    alone: int = 0  # optimizer steps with no other peer to average with
    epochs_entered: dict[int, float] = field(default_factory=dict)  # epoch -> when the agent entered it (POSIX time)
    averaged: Counter = field(default_factory=Counter)  # group size -> gradient rounds averaged in one
    failed_rounds: int = 0
    state_downloads: list[tuple[float, int]] = field(default_factory=list)  # (seconds, bytes) of each download
    # seconds from the end of a download to the parameters of the epoch the swarm moved to meanwhile (catch_up)
    catch_ups: list[float] = field(default_factory=list)
    joined_at: float | None = None  # when it began loading the collaboration's state


def records(path: Path):
    """The JSON records of an agent's log, with their time as POSIX seconds (``at``); other lines are skipped."""
    if not path.exists():
        return
    for line in path.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        stamp = record.get("timestamp")
        if stamp:
            record["at"] = datetime.datetime.fromisoformat(stamp).timestamp()
            yield record


def agent_log(path: Path) -> AgentLog:
    log, began, group, download_started, downloaded = AgentLog(), {}, 0, None, None
    for record in records(path):
        message, at = str(record.get("message", "")), record["at"]
        if (match := re.match(r"Beginning optimizer step #(\d+)", message)):
            began[int(match.group(1))], group = at, 0
        elif (match := re.match(r"Transitioning to epoch (\d+)", message)):
            epoch = int(match.group(1))
            log.epochs_entered.setdefault(epoch, at)
            if epoch - 1 in began and group > 1:
                log.rounds[epoch - 1] = at - began[epoch - 1]
            elif epoch - 1 in began:
                log.alone += 1
            began.pop(epoch - 1, None)
        elif (match := re.match(r"Averaged gradients with (\d+) peers", message)):
            group = int(match.group(1))
            log.averaged[group] += 1
        elif message.startswith("Averaging gradients failed"):
            log.failed_rounds += 1
        elif message.startswith("Loading the collaboration's state from peers") or message.startswith("Out of step"):
            download_started = at
            log.joined_at = log.joined_at or at
        elif message.startswith("The swarm moved to epoch") and downloaded is not None:
            log.catch_ups.append(at - downloaded)
        download = record.get("download")
        if isinstance(download, dict) and download_started is not None and download.get("total") \
                and download.get("done") == download.get("total"):
            log.state_downloads.append((at - download_started, int(download["done"])))
            download_started, downloaded = None, at
    return log


def plain_lines(path: Path):
    """(POSIX time, level, logger, message) of each line of a portal process's log in the plain format."""
    if not path.exists():
        return
    for line in path.read_text(errors="replace").splitlines():
        match = PLAIN_LINE.match(line)
        if match:
            stamp, level, logger, message = match.groups()
            at = datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
            yield at, level, logger, message


def checkpoint_saves(paths: list[Path]) -> list[float]:
    """Seconds from "checkpoint due" (the state's download starts) to "saved checkpoint" in the coordinators' logs."""
    saves = []
    for path in paths:
        due = None
        for at, _, _, message in plain_lines(path):
            if "checkpoint due at epoch" in message:
                due = at
            elif "saved checkpoint of epoch" in message and due is not None:
                saves.append(at - due)
                due = None
    return saves


def holder_counts(paths: list[Path]) -> Counter:
    counts: Counter = Counter()
    for path in paths:
        for _, level, _, message in plain_lines(path):
            for name, text in HOLDER_LINES.items():
                if text in message:
                    counts[name] += 1
            if level in ("ERROR", "CRITICAL"):
                counts["errors"] += 1
    return counts




def commitments_by_phase(run, phases: list[tuple[float, float, int]]) -> list[dict]:
    """Each validator phase's commitments (by arrival): due, queued for a worker, recorded, and the lag from
    arrival to record, from arrival to queueing (the holder's part) and from queueing to record (the worker's)."""
    from runs.models import StepCommitment  # Django is set up by the bench before it reads figures

    rows = list(StepCommitment.objects.filter(session__run=run).values_list("received_at", "queued_at", "checked_at",
                                                                            "outcome"))
    out = []
    for start, end, workers in phases:
        mine = [row for row in rows if start <= row[0].timestamp() < end]
        recorded = [row for row in mine if row[2] is not None and row[3] != StepCommitment.Outcome.UNCHECKED]
        lag = [(checked - received).total_seconds() for received, _, checked, _ in recorded]
        waited = [(queued - received).total_seconds() for received, queued, _, _ in mine if queued is not None]
        worked = [(checked - queued).total_seconds() for _, queued, checked, _ in recorded if queued is not None]
        out.append(dict(workers=workers, due=len(mine), queued=len(waited), recorded=len(recorded),
                        outcomes=dict(Counter(outcome for *_, outcome in mine)), lag=lag, waited=waited, worked=worked))
    return out


def credit_by_agent(run, users) -> list[dict]:
    """Each agent's reported samples, confirmed samples, epochs by status and commitments by outcome."""
    # Django is set up by the bench before it reads figures
    from django.db.models import Sum

    from runs.models import ContributionEvent, SessionEpoch, StepCommitment, epoch_confirmed_samples

    out = []
    for user in users:
        epochs = list(SessionEpoch.objects.filter(session__run=run, session__user=user).values_list(
            "status", "reported_samples", "announced_samples"))
        reported = ContributionEvent.objects.filter(session__run=run, session__user=user).aggregate(
            total=Sum("samples"))["total"] or 0
        out.append(dict(user=user.username, reported=reported, confirmed=sum(
            epoch_confirmed_samples(status=status, reported=samples, announced=announced)
            for status, samples, announced in epochs), epochs=dict(Counter(status for status, _, _ in epochs)),
            commitments=dict(Counter(StepCommitment.objects.filter(session__run=run, session__user=user)
                                     .values_list("outcome", flat=True)))))
    return out
