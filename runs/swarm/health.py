"""Reads for a run's health page: the swarm now, the pace of its epochs, the coordinator's heartbeat,
flagged credit and the timeline of joins, leaves, lifecycle changes, bans and checkpoints."""

import datetime
from dataclasses import dataclass

from django.db.models import Count
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.translation import gettext as _

from portal.formats import number_localize
from runs.models import Backbone, Checkpoint, Run, RunEvent, RunSample, SessionEpoch, TrainingSession
from runs.swarm.series import series_latest

EPOCH_RATE_WINDOW = datetime.timedelta(hours=1)
MARKERS_PER_KIND = 200

LIFECYCLE = [RunEvent.Kind.ACTIVATED, RunEvent.Kind.PAUSED, RunEvent.Kind.RESUMED, RunEvent.Kind.FINISHED]
MODERATION = [RunEvent.Kind.BANNED, RunEvent.Kind.UNBANNED]


@dataclass(frozen=True)
class Marker:
    """One moment drawn as a vertical line over the loss curve and listed in the timeline table."""

    at: datetime.datetime
    kind: str
    label: str

    def as_json(self) -> dict:
        return {"at": self.at.timestamp(), "kind": self.kind, "label": self.label}


def epochs_per_hour(*, run: Run, until: datetime.datetime) -> float | None:
    """Global epochs per hour over the hour of readings before `until`; None with under a minute of them."""
    window = RunSample.objects.filter(run=run, at__gt=until - EPOCH_RATE_WINDOW, at__lte=until)
    first = window.order_by("at", "id").first()
    last = window.order_by("-at", "-id").first()
    if first is None or (last.at - first.at) < datetime.timedelta(minutes=1):
        return None
    return (last.global_epoch - first.global_epoch) / ((last.at - first.at).total_seconds() / 3600)


def heartbeat_stale(*, run: Run, now: datetime.datetime) -> bool:
    return not run.coordinator_alive(now)


@dataclass(frozen=True)
class BackboneState:
    """One backbone peer as the health page shows it."""

    peer: Backbone
    alive: bool
    holds_duties: bool


def backbone_states(*, run: Run, now: datetime.datetime) -> list[BackboneState]:
    """Each backbone peer its coordinators reported, live or silent, and which one holds the run's duties."""
    holder = run.coordinator_peer_id if run.duties_until and run.duties_until > now else None
    return [BackboneState(peer=peer, alive=peer.alive(now), holds_duties=peer.peer_id == holder)
            for peer in Backbone.objects.filter(run=run)]


def flagged_count(*, run: Run) -> dict:
    """Session epochs waiting for an organizer's decision, and the sessions they belong to."""
    flagged = SessionEpoch.objects.filter(session__run=run, status=SessionEpoch.Status.FLAGGED)
    return flagged.aggregate(epochs=Count("id"), sessions=Count("session", distinct=True))


def flags_url(*, run: Run) -> str | None:
    """The organizers' view of flagged epochs, where that view exists in this build."""
    try:
        return reverse("run-flags", args=[run.slug])
    except NoReverseMatch:
        return None


def timeline_markers(*, run: Run, moderation: bool) -> list[Marker]:
    """Joins and leaves (never who), lifecycle changes, checkpoints; bans only for organizers. The labels
    are in the reader's language: call it while answering their request."""
    markers = []
    sessions = TrainingSession.objects.filter(run=run)
    for started_at in sessions.order_by("-started_at").values_list("started_at", flat=True)[:MARKERS_PER_KIND]:
        markers.append(Marker(started_at, "join", _("a peer joined")))
    for ended_at in sessions.exclude(ended_at=None).order_by("-ended_at").values_list("ended_at", flat=True)[:MARKERS_PER_KIND]:
        markers.append(Marker(ended_at, "leave", _("a peer left")))
    kinds = LIFECYCLE + (MODERATION if moderation else [])
    for event in run.events.filter(kind__in=kinds)[:MARKERS_PER_KIND]:
        label = event.get_kind_display() + (f" {event.detail}" if event.kind in MODERATION else "")
        markers.append(Marker(event.at, event.kind, label))
    for checkpoint in Checkpoint.objects.filter(run=run)[:MARKERS_PER_KIND]:
        label = _("checkpoint of epoch %(epoch)s") % {"epoch": number_localize(checkpoint.epoch)}
        markers.append(Marker(checkpoint.created_at, "checkpoint", label))
    return sorted(markers, key=lambda marker: marker.at)


def run_health(*, run: Run, organizer: bool, now: datetime.datetime | None = None) -> dict:
    """The health page's figures; moderation details (flags, bans) only for the run's organizers."""
    now = now or timezone.now()
    latest = series_latest(run=run)
    health = {
        "latest": latest,
        "epochs_per_hour": epochs_per_hour(run=run, until=latest.at) if latest else None,
        "heartbeat_stale": heartbeat_stale(run=run, now=now),
        "backbones": backbone_states(run=run, now=now),
        "markers": timeline_markers(run=run, moderation=organizer),
    }
    if organizer:
        health.update(flagged=flagged_count(run=run), flags_url=flags_url(run=run))
    return health
