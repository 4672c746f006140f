"""Reads of a run's monitor series (`RunSample`): its latest reading, and the series
downsampled in the database to at most n points by equal time buckets."""

import datetime
from dataclasses import dataclass

from django.db.models import Avg, Count, F, FloatField, Func, IntegerField, Max, Min, QuerySet, Value
from django.db.models.functions import Cast, Floor, Least
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from portal.formats import digits_localize, number_localize
from runs.models import Run, RunSample

FIELDS = ["global_epoch", "samples_per_second", "alive_peers", "client_peers", "samples_accumulated", "loss"]


def series_latest(*, run: Run) -> RunSample | None:
    return run.samples.order_by("-at", "-id").first()


class EpochSeconds(Func):
    """Seconds since 1970 of a datetime column, on the two databases the portal runs on."""

    output_field = FloatField()

    # SQLite 3.40 has no sub-second unixepoch(); julianday() is off by tens of microseconds, enough
    # to move a reading across a bucket boundary. Whole seconds plus the milliseconds of %f are exact.
    # (%%%% becomes %% in the template and % once Django turns %s placeholders into ?.)
    SQLITE = ("(CAST(strftime('%%%%s', {0}) AS REAL)"
              " + CAST(strftime('%%%%f', {0}) AS REAL) - CAST(strftime('%%%%S', {0}) AS REAL))")

    def as_sqlite(self, compiler, connection, **extra):
        return self.as_sql(compiler, connection, template=self.SQLITE.format("%(expressions)s"), **extra)

    def as_postgresql(self, compiler, connection, **extra):
        return self.as_sql(compiler, connection, template="EXTRACT(EPOCH FROM %(expressions)s)::double precision", **extra)


def _columns(rows) -> dict[str, list]:
    columns = {"at": [], **{field: [] for field in FIELDS}}
    for row in rows:
        columns["at"].append(row["at"].timestamp())
        for field in FIELDS:
            columns[field].append(row[field])
    return columns


def series_points(*, run: Run, since: datetime.datetime | None = None, max_points: int) -> dict:
    """The series from `since` as columns (`at` in Unix seconds), at most `max_points` long.

    A longer series is cut into `max_points` equal time buckets between its first and last reading;
    each bucket gives one point: its last time, its highest epoch and the means of the rest
    (loss ignores readings without one)."""
    samples: QuerySet[RunSample] = run.samples.all()
    if since is not None:
        samples = samples.filter(at__gte=since)
    span = samples.aggregate(count=Count("id"), first=Min("at"), last=Max("at"))
    if span["count"] <= max_points:
        rows = samples.order_by("at", "id").values("at", *FIELDS)
        return {"bucket_seconds": None, **_columns(rows)}
    first = span["first"].timestamp()
    width = max((span["last"].timestamp() - first) / max_points, 1e-6)
    # The last reading would open bucket `max_points`; Least keeps it in the last one.
    bucket = Least(
        Cast(Floor((EpochSeconds(F("at")) - Value(first)) / Value(width)), IntegerField()),
        Value(max_points - 1),
    )
    # Aggregates may not take the name of a model field: they carry a trailing "_" until _columns.
    rows = (
        samples.annotate(bucket=bucket)
        .values("bucket")
        .annotate(
            at_=Max("at"),
            global_epoch_=Max("global_epoch"),
            samples_per_second_=Avg("samples_per_second"),
            alive_peers_=Avg("alive_peers"),
            client_peers_=Avg("client_peers"),
            samples_accumulated_=Avg("samples_accumulated"),
            loss_=Avg("loss"),
        )
        .order_by("bucket")
    )
    return {"bucket_seconds": width, **_columns({key.rstrip("_"): value for key, value in row.items()} for row in rows)}



@dataclass(frozen=True)
class Chart:
    """One chart of a series field: its caption, and how its latest figure reads as text (charts.js
    writes the live figures the same way, from the same unit and digits)."""

    field: str
    caption: str
    unit: str
    digits: int

    def latest_text(self, sample: RunSample | None) -> str:
        if sample is None:
            return _("No readings yet.")
        value = getattr(sample, self.field)
        figure = number_localize(value, self.digits) + (f" {self.unit}" if self.unit and value is not None else "")
        time = digits_localize(f"{sample.at.astimezone(datetime.UTC):%H:%M:%S}") + " UTC"
        return _("Latest: %(figure)s at %(time)s") % {"figure": figure, "time": time}


CHARTS = {
    "samples_per_second": Chart("samples_per_second", gettext_lazy("Collaboration throughput (samples/s, all peers)"),
                                gettext_lazy("samples/s"), 1),
    "loss": Chart("loss", gettext_lazy("Training loss"), "", 3),
    "alive_peers": Chart("alive_peers", gettext_lazy("Peers alive"), gettext_lazy("alive"), 0),
    "global_epoch": Chart("global_epoch", gettext_lazy("Global epoch"), "", 0),
}
