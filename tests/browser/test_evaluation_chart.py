"""The run page's held-out evaluation chart in a real browser: accuracy and perplexity per checkpoint
against epochs or tokens seen, the random-init baseline beside them, and the same figures as a table."""

import pytest
from playwright.sync_api import expect

from runs.models import Evaluation
from tests.browser.steps import watch_console
from tests.factories import RunFactory

pytestmark = [pytest.mark.browser]

EPOCHS = [2, 4, 6, 8]


def evaluated_run(organizer):
    run = RunFactory(slug="evaluated", name="Evaluated run", organizers=[organizer])
    Evaluation.objects.create(run=run, epoch=None, kind="random_init", mlm_accuracy=0.0004, perplexity=4100.0,
                              sop_accuracy=0.5, examples=300)
    for n, epoch in enumerate(EPOCHS, start=1):
        Evaluation.objects.create(run=run, epoch=epoch, samples=epoch * 64, tokens_seen=epoch * 64 * 128,
                                  mlm_accuracy=0.1 * n, perplexity=400.0 / n, sop_accuracy=0.5 + 0.05 * n, examples=300)
    Evaluation.objects.create(run=run, epoch=10, samples=640)  # claimed, being evaluated
    return run


def test_the_run_page_charts_held_out_scores_against_epochs_and_tokens_seen(browser, asgi_server, organizer, screenshot):
    evaluated_run(organizer)
    page = browser.new_page(base_url=asgi_server, viewport={"width": 1280, "height": 900})
    problems = watch_console(page)
    page.goto("/runs/evaluated/")
    section = page.locator("#run-evaluations")
    expect(section).to_have_attribute("data-drawn", "true")
    expect(section).to_have_attribute("data-points", str(len(EPOCHS)))
    expect(section.locator("#evaluation-chart canvas")).to_have_count(1)
    drawn = page.evaluate("document.getElementById('run-evaluations').evaluationPlot.data")
    assert drawn[0] == EPOCHS
    assert drawn[1] == pytest.approx([10.0, 20.0, 30.0, 40.0])
    assert drawn[2] == pytest.approx([0.04] * len(EPOCHS)), "the baseline's accuracy as a flat line"
    assert drawn[3] == pytest.approx([400.0, 200.0, 400 / 3, 100.0])
    expect(section.locator("#evaluation-chart-summary")).to_contain_text("epoch 8")
    expect(section.locator("#evaluation-chart-summary")).to_contain_text("40.0%")
    # The accuracy axis runs in percent past the highest point, and each tick says so; the legend names the
    # lines without the "--" a live legend shows until hovered.
    assert page.evaluate("document.getElementById('run-evaluations').evaluationPlot.scales.y.max") == pytest.approx(50.0)
    ticks = page.evaluate("(() => { const plot = document.getElementById('run-evaluations').evaluationPlot;"
                          " return plot.axes[1].values(plot, [0, 2.5]); })()")
    assert ticks == ["0.0%", "2.5%"]
    expect(section.locator(".u-legend")).to_contain_text("masked-LM accuracy")
    expect(section.locator(".u-legend")).not_to_contain_text("--")

    section.locator("#evaluation-axis").select_option("tokens_seen")
    expect(section).to_have_attribute("data-axis", "tokens_seen")
    drawn = page.evaluate("document.getElementById('run-evaluations').evaluationPlot.data")
    assert drawn[0] == [epoch * 64 * 128 for epoch in EPOCHS]

    rows = section.locator("#evaluation-table tbody tr")
    expect(rows).to_have_count(len(EPOCHS) + 2)
    expect(rows.first.locator("th")).to_have_text("random init")
    expect(section.locator("tr[data-epoch='8'] td").nth(1)).to_have_text("40.0%")
    expect(section.locator("tr[data-epoch='10']")).to_contain_text("being evaluated")
    section.scroll_into_view_if_needed()
    screenshot(page, "run-page-evaluations")
    assert problems == []
    page.close()


def test_without_javascript_the_table_holds_the_figures(browser, asgi_server, organizer):
    evaluated_run(organizer)
    context = browser.new_context(base_url=asgi_server, java_script_enabled=False)
    page = context.new_page()
    page.goto("/runs/evaluated/")
    expect(page.locator("#run-evaluations canvas")).to_have_count(0)
    expect(page.locator("tr[data-kind='random_init'] td").nth(1)).to_have_text("0.0%")
    expect(page.locator("tr[data-epoch='2'] td").nth(2)).to_have_text("400.0")
    context.close()
