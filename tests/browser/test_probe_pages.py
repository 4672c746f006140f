"""An organizer uploads a downstream probe in the browser, sees a refused upload's reason, and the
run page shows the probe's score beside its random-init baseline."""

import pytest
from playwright.sync_api import expect

from runs.models import ProbeScore
from runs.setup.labelled import entity_sets
from tests.browser.steps import log_in
from tests.factories import RunFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_an_organizer_uploads_a_probe_and_the_run_page_shows_it_beside_the_baseline(
    browser, live_server, organizer, tmp_path, screenshot
):
    run = RunFactory(slug="probed", organizers=[organizer])
    train, test = entity_sets(n_train=30, n_test=10)
    (tmp_path / "train.conll").write_text(train, encoding="utf-8")
    (tmp_path / "test.conll").write_text(test, encoding="utf-8")
    (tmp_path / "latin1.conll").write_bytes("Jos\xe9 B-PER\n".encode("latin-1"))
    page = browser.new_page(base_url=live_server.url)
    log_in(page, organizer.username)
    page.goto("/runs/probed/")
    page.get_by_role("link", name="Downstream probes").click()

    page.fill("#id_name", "names")
    page.select_option("#id_task", "tokens")
    page.set_input_files("#id_train", str(tmp_path / "latin1.conll"))
    page.set_input_files("#id_test", str(tmp_path / "test.conll"))
    page.get_by_role("button", name="Upload probe").click()
    expect(page.locator("#train-errors")).to_contain_text("not UTF-8")
    screenshot(page, "probe-upload-error")

    page.set_input_files("#id_train", str(tmp_path / "train.conll"))
    page.set_input_files("#id_test", str(tmp_path / "test.conll"))
    page.get_by_role("button", name="Upload probe").click()
    expect(page.locator("#probes")).to_contain_text("names")
    expect(page.locator("#probes")).to_contain_text("B-LOC, B-PER, O")

    probe = run.probes.get()
    ProbeScore.objects.create(probe=probe, baseline=True, score=0.381)
    ProbeScore.objects.create(probe=probe, epoch=12, score=0.592)
    page.goto("/runs/probed/")
    row = page.locator("#probe-table tr[data-probe='names']")
    expect(row.locator(".probe-score")).to_have_text("0.592")
    expect(row.locator(".probe-baseline")).to_have_text("0.381")
    expect(row).to_contain_text("+0.211")
    screenshot(page, "run-page-probes")
    page.close()
