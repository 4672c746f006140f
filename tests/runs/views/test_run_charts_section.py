"""The run page's charts section: captions and the latest figures as text for readers without
JavaScript."""

import datetime

import pytest

from runs.models import RunSample
from tests.factories import RunFactory

AT = datetime.datetime(2026, 11, 1, 9, 15, 30, tzinfo=datetime.UTC)


@pytest.fixture
def run(organizer):
    run = RunFactory(slug="the-run", organizers=[organizer])
    earlier = AT - datetime.timedelta(minutes=1)
    RunSample.objects.create(run=run, at=earlier, global_epoch=6, samples_per_second=1.0, alive_peers=1)
    RunSample.objects.create(run=run, at=AT, global_epoch=7, samples_per_second=123.456, alive_peers=4, loss=3.14159)
    return run


def test_each_chart_has_a_caption_and_its_latest_figure_as_text(client_for, run):
    html = client_for(None).get("/runs/the-run/").content.decode()
    assert 'data-series-url="/api/v1/runs/the-run/series?max_points=500"' in html
    assert "Collaboration throughput (samples/s, all peers)</figcaption>" in html
    assert ">Latest: 123.5 samples/s at 09:15:30 UTC</p>" in html
    assert ">Latest: 3.142 at 09:15:30 UTC</p>" in html
    assert ">Latest: 4 alive at 09:15:30 UTC</p>" in html
    assert 'aria-labelledby="chart-loss-caption chart-loss-latest"' in html
    assert '<a href="/runs/the-run/health/">Run health</a>' in html


def test_a_run_without_readings_says_so(client_for, organizer):
    RunFactory(slug="quiet", organizers=[organizer])
    html = client_for(None).get("/runs/quiet/").content.decode()
    assert "No readings from the coordinator's monitor yet." in html
    assert html.count(">No readings yet.</p>") == 3
