"""The run page and the health page draw their charts from the monitor's series in a real browser,
and a live snapshot adds a point to each chart of the run page."""

import datetime

import pytest
from playwright.sync_api import expect

from accounts.services import token_create
from runs.models import Checkpoint, RunSample, TrainingSession
from tests.browser.steps import log_in, send_report, watch_console
from tests.factories import RunFactory

pytestmark = [pytest.mark.browser]

READINGS = 40


def run_with_readings(organizer, volunteer):
    # A coordinator that served the run once and has been silent since: the health page warns.
    run = RunFactory(slug="charted", name="Charted run", organizers=[organizer], coordinator_peer_id="QmCoordinator",
                     coordinator_heartbeat_at=None)
    now = datetime.datetime.now(datetime.UTC)
    first = now - datetime.timedelta(minutes=READINGS)
    RunSample.objects.bulk_create(
        RunSample(run=run, at=first + datetime.timedelta(minutes=i), global_epoch=i // 4, samples_per_second=20.0 + i,
                  alive_peers=2 + i % 3, loss=8.0 - i * 0.1)
        for i in range(READINGS)
    )
    token, secret = token_create(user=volunteer, name="laptop")
    session = TrainingSession.objects.create(
        run=run, user=volunteer, token=token, peer_public_key="ssh-rsa AAAA", agent_version="0.1.0",
        access_expires_at=now, started_at=first + datetime.timedelta(minutes=5),
    )
    Checkpoint.objects.create(run=run, epoch=5, file="checkpoints/c.zip", created_at=first + datetime.timedelta(minutes=21))
    return run, session, secret


def test_the_run_page_draws_the_series_and_a_live_snapshot_adds_a_point(browser, asgi_server, organizer, volunteer, screenshot):
    run, session, secret = run_with_readings(organizer, volunteer)
    page = browser.new_page(base_url=asgi_server, viewport={"width": 1280, "height": 900})
    problems = watch_console(page)
    page.goto("/runs/charted/")
    charts = page.locator("#run-charts")
    expect(charts).to_have_attribute("data-drawn", "true")
    expect(charts.locator("figure.chart canvas")).to_have_count(3)
    # The first snapshot comes when the socket opens; after it every chart holds the readings and one live point.
    expect(charts).to_have_attribute("data-snapshots", "1")
    for field in ("samples_per_second", "loss", "alive_peers"):
        expect(charts.locator(f"figure[data-field={field}]")).to_have_attribute("data-points", str(READINGS + 1))
    drawn = page.evaluate("document.getElementById('run-charts').runCharts.map(chart => chart.data[1].slice(0, -1))")
    assert drawn[0] == [20.0 + i for i in range(READINGS)]
    assert drawn[1] == pytest.approx([8.0 - i * 0.1 for i in range(READINGS)])
    assert drawn[2] == [2 + i % 3 for i in range(READINGS)]
    expect(page.locator("#chart-loss-caption")).to_have_text("Training loss")

    assert send_report(asgi_server, secret, session.pk, 1, 96) == {"type": "ack", "seq": 1}
    expect(charts).to_have_attribute("data-snapshots", "2")
    expect(charts.locator("figure[data-field=samples_per_second]")).to_have_attribute("data-points", str(READINGS + 2))
    expect(page.locator("#chart-samples_per_second-latest")).to_have_text(_latest("16.0 samples/s"))
    expect(page.locator("#chart-loss-latest")).to_have_text(_latest("5.250"))
    expect(page.locator("#chart-alive_peers-latest")).to_have_text(_latest("1 alive"))
    screenshot(page, "run-page-charts")
    assert problems == []
    page.close()


def _latest(figure: str):
    import re

    return re.compile(rf"^Latest: {re.escape(figure)} at \d\d:\d\d:\d\d UTC$")


def test_without_javascript_the_run_page_shows_the_latest_figures(browser, asgi_server, organizer, volunteer):
    run_with_readings(organizer, volunteer)
    context = browser.new_context(base_url=asgi_server, java_script_enabled=False)
    page = context.new_page()
    page.goto("/runs/charted/")
    expect(page.locator("#chart-samples_per_second-latest")).to_have_text(_latest(f"{20.0 + READINGS - 1:.1f} samples/s"))
    expect(page.locator("#chart-loss-latest")).to_have_text(_latest(f"{8.0 - (READINGS - 1) * 0.1:.3f}"))
    expect(page.locator("#run-charts canvas")).to_have_count(0)
    context.close()


def test_the_health_page_draws_four_charts_with_the_timeline_on_the_loss(browser, asgi_server, organizer, volunteer, screenshot):
    run_with_readings(organizer, volunteer)
    page = browser.new_page(base_url=asgi_server, viewport={"width": 1280, "height": 900})
    problems = watch_console(page)
    log_in(page, organizer.username)
    page.goto("/runs/charted/health/")
    charts = page.locator("#run-charts")
    expect(charts).to_have_attribute("data-drawn", "true")
    expect(charts.locator("figure.chart canvas")).to_have_count(4)
    expect(page.locator("#coordinator-warning")).to_contain_text("No coordinator has reported")
    expect(page.locator("#health-epoch")).to_have_text(str((READINGS - 1) // 4))
    expect(page.locator("#timeline")).to_contain_text("checkpoint of epoch 5")
    expect(page.locator("#timeline")).to_contain_text("a peer joined")
    markers = page.evaluate("JSON.parse(document.getElementById('run-markers').textContent).map(marker => marker.kind)")
    assert markers == ["join", "checkpoint"]
    screenshot(page, "run-health")
    assert problems == []
    page.close()


def test_the_contribution_chart_draws_a_volunteers_days_from_its_url(browser, asgi_server):
    """`contributionChart(element, url)` for the volunteer profile page, whose contributions endpoint
    another branch builds: here the browser answers that one URL with rows of its documented shape."""
    days = [{"day": f"2026-11-0{day}", "samples": 1000 * day, "credit": 10.5 * day} for day in range(1, 8)]
    page = browser.new_page(base_url=asgi_server)
    problems = watch_console(page)
    page.route("**/api/v1/volunteers/7/contributions", lambda route: route.fulfill(json=days))
    page.goto("/static/vendor/README.md")  # any page of the portal's origin to host the chart
    page.set_content(
        '<div id="contributions" data-contribution-url="/api/v1/volunteers/7/contributions" style="width: 640px"></div>'
        f'<script src="{asgi_server}/jsi18n/"></script>'  # charts.js takes its words from Django's JavaScript catalog
        f'<script src="{asgi_server}/static/vendor/uplot/uPlot.iife.min.js"></script>'
        f'<script src="{asgi_server}/static/js/charts.js"></script>'
    )
    expect(page.locator("#contributions canvas")).to_have_count(1)
    expect(page.locator("#contributions figcaption")).to_have_text("Samples and credit per day")
    expect(page.locator("#contributions .chart-latest")).to_have_text(
        "28,000 samples and 294 credit over 7 days, the last on 2026-11-07."
    )
    assert problems == []
    page.close()


def test_the_contribution_chart_names_its_axes_and_series_in_the_pages_language(browser, asgi_server):
    """A newcomer on a Bengali page read "samples" and "credit" in English on the chart's axes and legend."""
    days = [{"day": "2026-11-01", "samples": 1000, "credit": 10.5}]
    page = browser.new_page(base_url=asgi_server, locale="bn")
    page.route("**/api/v1/volunteers/7/contributions", lambda route: route.fulfill(json=days))
    page.goto("/static/vendor/README.md")
    page.set_content(
        '<html lang="bn"><body><div id="contributions" data-contribution-url="/api/v1/volunteers/7/contributions"'
        ' style="width: 640px"></div>'
        f'<script src="{asgi_server}/jsi18n/"></script>'
        f'<script src="{asgi_server}/static/vendor/uplot/uPlot.iife.min.js"></script>'
        f'<script src="{asgi_server}/static/js/charts.js"></script></body></html>'
    )
    expect(page.locator("#contributions canvas")).to_have_count(1)
    legend = page.locator("#contributions .u-legend")
    expect(legend).to_contain_text("নমুনা")
    expect(legend).to_contain_text("ক্রেডিট")
    axes = page.locator("#contributions .u-label").all_inner_texts()
    assert axes == ["নমুনা", "ক্রেডিট"], axes
    page.close()


def test_a_volunteer_with_no_contributions_sees_words_not_an_empty_plot(browser, asgi_server):
    """The empty plot's time axis read 12/31/69 to 1/1/70: where uPlot's time scale starts."""
    page = browser.new_page(base_url=asgi_server)
    problems = watch_console(page)
    page.route("**/api/v1/volunteers/7/contributions", lambda route: route.fulfill(json=[]))
    page.goto("/static/vendor/README.md")
    page.set_content(
        '<div id="contributions" data-contribution-url="/api/v1/volunteers/7/contributions" style="width: 640px"></div>'
        f'<script src="{asgi_server}/jsi18n/"></script>'
        f'<script src="{asgi_server}/static/vendor/uplot/uPlot.iife.min.js"></script>'
        f'<script src="{asgi_server}/static/js/charts.js"></script>'
    )
    expect(page.locator("#contributions .chart-latest")).to_have_text("No contributions yet.")
    expect(page.locator("#contributions figcaption")).to_have_text("Samples and credit per day")
    expect(page.locator("#contributions canvas")).to_have_count(0)
    assert problems == []
    page.close()
