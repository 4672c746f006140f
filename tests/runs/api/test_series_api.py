"""`GET /api/v1/runs/{slug}/series`: the monitor's readings as columns, downsampled by time buckets."""

import datetime

import pytest

from runs.models import Run, RunSample
from tests.factories import RunFactory

T0 = datetime.datetime(2026, 11, 1, 12, 0, tzinfo=datetime.UTC)


def add_readings(run: Run, count: int, *, step_s: float = 10.0, loss: bool = True) -> None:
    RunSample.objects.bulk_create(
        RunSample(run=run, at=T0 + datetime.timedelta(seconds=i * step_s), global_epoch=i // 10,
                  samples_per_second=float(i), alive_peers=2 + i % 2, samples_accumulated=i * 4,
                  loss=(10.0 - i / 100) if loss and i % 2 == 0 else None)
        for i in range(count)
    )


@pytest.fixture
def run(organizer):
    return RunFactory(slug="the-run", organizers=[organizer])


def series(client, slug: str = "the-run", **params):
    return client.get(f"/api/v1/runs/{slug}/series", params)


def test_a_short_series_comes_back_reading_by_reading(client_for, run):
    add_readings(run, 5)
    body = series(client_for(None)).json()
    assert body["bucket_seconds"] is None
    assert body["at"] == [(T0 + datetime.timedelta(seconds=10 * i)).timestamp() for i in range(5)]
    assert body["samples_per_second"] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert body["alive_peers"] == [2, 3, 2, 3, 2]
    assert body["loss"] == [10.0, None, 9.98, None, 9.96]


def test_a_long_series_is_averaged_into_at_most_max_points_equal_time_buckets(client_for, run):
    add_readings(run, 101)  # 0 … 1000 s; 10 buckets of 100 s; the last reading joins the last bucket
    body = series(client_for(None), max_points=10).json()
    assert body["bucket_seconds"] == pytest.approx(100.0)
    assert len(body["at"]) == 10
    # Bucket k holds readings 10k … 10k+9 (and the last bucket also reading 100).
    assert body["samples_per_second"][:9] == [pytest.approx(10 * k + 4.5) for k in range(9)]
    assert body["samples_per_second"][9] == pytest.approx(sum(range(90, 101)) / 11)
    assert body["global_epoch"] == [*range(9), 10]
    assert body["alive_peers"][0] == pytest.approx(2.5)
    even_losses = [10.0 - i / 100 for i in range(0, 10, 2)]
    assert body["loss"][0] == pytest.approx(sum(even_losses) / 5), "readings without loss are left out"
    assert body["at"][0] == (T0 + datetime.timedelta(seconds=90)).timestamp(), "a bucket's point is at its last reading"
    assert body["at"][-1] == (T0 + datetime.timedelta(seconds=1000)).timestamp()


def test_since_cuts_the_series_and_a_naive_time_means_utc(client_for, run):
    add_readings(run, 10)
    since = (T0 + datetime.timedelta(seconds=70)).replace(tzinfo=None).isoformat()
    body = series(client_for(None), since=since).json()
    assert body["samples_per_second"] == [7.0, 8.0, 9.0]
    body = series(client_for(None), since=(T0 + datetime.timedelta(hours=1)).isoformat()).json()
    assert body["at"] == []


def test_the_series_of_one_run_holds_no_readings_of_another(client_for, run):
    add_readings(RunFactory(slug="other"), 3)
    assert series(client_for(None)).json()["at"] == []


@pytest.mark.parametrize(("params", "field"), [
    ({"max_points": 1}, "max_points"),
    ({"max_points": 2001}, "max_points"),
    ({"max_points": "many"}, "max_points"),
    ({"since": "yesterday"}, "since"),
    ({"since": "2026-13-01"}, "since"),
    ({"since": "9999-12-31T23:59:59-14:00"}, "since"),  # past the year 9999 in UTC
    ({"since": "0001-01-01T00:00:00+01:00"}, "since"),
])
def test_bad_parameters_get_a_400_that_names_the_parameter(client_for, run, params, field):
    response = series(client_for(None), **params)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_request"
    assert response.json()["error"]["detail"].startswith(field)


def test_an_unknown_or_draft_run_is_404(client_for, run, outsider):
    assert series(client_for(None), slug="nope").status_code == 404
    RunFactory(slug="draft", status=Run.Status.DRAFT)
    assert series(client_for(outsider), slug="draft").status_code == 404


@pytest.mark.parametrize("visibility", [Run.Visibility.INVITE, Run.Visibility.ALLOWLIST])
def test_an_invite_only_runs_series_is_as_visible_as_its_page(client_for, run, outsider, visibility):
    """Invitations gate joining, not watching: one rule (`run_may_view`) for the page and its figures."""
    run.visibility = visibility
    run.save()
    add_readings(run, 3)
    for who in (None, outsider):
        assert client_for(who).get("/runs/the-run/").status_code == 200
        assert len(series(client_for(who)).json()["at"]) == 3
