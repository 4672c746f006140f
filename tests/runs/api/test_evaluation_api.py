"""`GET /api/v1/runs/{slug}/evaluations`, the run page's table and the stats dump: who sees a run's
held-out scores, and what they read. The scores come only from the portal's own evaluation; no
client can send one (there is no route that takes them)."""

import gzip
import json

import pytest
from django.urls import reverse

from runs.credit import exports
from runs.models import Evaluation, Run, RunMembership
from tests.factories import RunFactory


def evaluated(run: Run) -> Run:
    Evaluation.objects.create(run=run, epoch=None, kind="random_init", mlm_accuracy=0.001, perplexity=3900.0,
                              sop_accuracy=0.49, examples=120)
    Evaluation.objects.create(run=run, epoch=None, kind="unigram", mlm_accuracy=0.0635, perplexity=129.0, examples=120)
    Evaluation.objects.create(run=run, epoch=5, samples=320, tokens_seen=320 * 128, mlm_accuracy=0.31, perplexity=42.0,
                              sop_accuracy=0.7, examples=120, masked_tokens=1400, cpu_seconds=3.5, wall_seconds=2.0)
    Evaluation.objects.create(run=run, epoch=10, samples=640, error="the checkpoint is not a zip file")
    Evaluation.objects.create(run=run, epoch=15, samples=960)
    return run


@pytest.fixture
def hidden(db, organizer, volunteer):
    run = evaluated(RunFactory(slug="hidden-run", visibility=Run.Visibility.INVITE, audience=Run.Audience.MEMBERS,
                               organizers=[organizer]))
    RunMembership.objects.create(run=run, user=volunteer)
    return run


def test_the_api_lists_the_baselines_then_each_checkpoint_with_its_status(client_for, volunteer, hidden):
    response = client_for(volunteer).get("/api/v1/runs/hidden-run/evaluations")
    assert response.status_code == 200
    rows = response.json()
    assert [(row["epoch"], row["kind"], row["baseline"], row["status"]) for row in rows] == [
        (None, "random_init", True, "done"), (None, "unigram", True, "done"), (5, "checkpoint", False, "done"),
        (10, "checkpoint", False, "failed"), (15, "checkpoint", False, "pending")]
    assert rows[1]["sop_accuracy"] is None, "word frequencies tell no sentence order"
    assert rows[2]["mlm_accuracy"] == 0.31 and rows[2]["tokens_seen"] == 320 * 128 and rows[2]["perplexity"] == 42.0
    assert rows[3]["error"] == "the checkpoint is not a zip file" and rows[3]["mlm_accuracy"] is None


@pytest.mark.parametrize("persona", ["anonymous", "outsider"])
def test_an_outsider_gets_the_same_404_as_for_a_run_that_does_not_exist(client_for, outsider, hidden, persona):
    client = client_for(outsider if persona == "outsider" else None)
    response = client.get("/api/v1/runs/hidden-run/evaluations")
    missing = client.get("/api/v1/runs/no-such-run/evaluations")
    assert response.status_code == missing.status_code == 404
    assert response.json()["error"]["code"] == missing.json()["error"]["code"] == "run_not_found"
    assert "0.31" not in response.content.decode()
    page = client.get("/runs/hidden-run/")
    assert page.status_code == 404


@pytest.mark.parametrize("slug", ["a" * 65, "bad slug", "dots..", "%00"])
def test_a_malformed_slug_is_a_4xx_with_a_reason(client, db, slug):
    response = client.get(f"/api/v1/runs/{slug}/evaluations")
    assert 400 <= response.status_code < 500
    assert response.json()["error"]["detail"]


def test_no_route_accepts_scores_from_a_client(client_for, organizer, hidden):
    """The cheater: an organizer (or anyone) posting better figures for their run."""
    forged = {"epoch": 5, "mlm_accuracy": 0.99}
    for method in ("post", "put", "patch"):
        response = getattr(client_for(organizer), method)("/api/v1/runs/hidden-run/evaluations", forged,
                                                          content_type="application/json")
        assert response.status_code == 405
    assert Evaluation.objects.get(run=hidden, epoch=5).mlm_accuracy == 0.31


def test_the_run_page_shows_the_scores_as_a_table_with_each_status(client_for, organizer, hidden):
    page = client_for(organizer).get(reverse("run-detail", args=["hidden-run"])).content.decode()
    assert 'id="evaluation-table"' in page and "random init" in page
    assert "31.0%" in page and "42.0" in page
    assert "evaluation failed" in page and "being evaluated" in page
    assert 'data-evaluations-url="/api/v1/runs/hidden-run/evaluations"' in page


def test_the_stats_dump_carries_public_runs_evaluations_only(db, organizer, hidden):
    evaluated(RunFactory(slug="open-run", organizers=[organizer]))
    folder = exports.stats_dump()
    rows = json.loads(gzip.decompress((folder / "evaluations.json.gz").read_bytes()))
    assert [(row["run"], row["epoch"], row["kind"], row["mlm_accuracy"]) for row in rows] == [
        ("open-run", None, "random_init", 0.001), ("open-run", None, "unigram", 0.0635),
        ("open-run", 5, "checkpoint", 0.31)], "done evaluations of listed runs, baselines first"
    assert b"open-run" in gzip.decompress((folder / "evaluations.csv.gz").read_bytes())
