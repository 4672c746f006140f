"""Reading ``/metrics`` as Prometheus does, for the tests of what the portal counts."""

from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

TOKEN = "metrics-test-token"


class Scrape:
    """One answer of ``/metrics``: ``scrape.value("dedloc_reports_refused_total", code="bad_json")``."""

    def __init__(self, text: str) -> None:
        self.samples = {(sample.name, frozenset(sample.labels.items())): sample.value
                        for family in text_string_to_metric_families(text) for sample in family.samples}

    def value(self, name: str, **labels: str) -> float:
        """The sample's value; 0 for a series not exposed yet (a counter no event has touched)."""
        return self.samples.get((name, frozenset(labels.items())), 0.0)

    def increase(self, earlier: "Scrape", name: str, **labels: str) -> float:
        """How much the series grew since ``earlier`` (counters only grow)."""
        return self.value(name, **labels) - earlier.value(name, **labels)

    def total(self, name: str) -> float:
        """The series of ``name`` added up, whatever their labels."""
        return sum(value for (series, _), value in self.samples.items() if series == name)

    def has(self, name: str, **labels: str) -> bool:
        return (name, frozenset(labels.items())) in self.samples


def scrape(settings) -> Scrape:
    """``GET /metrics`` with the scrape token (set on ``settings`` here), which must answer 200."""
    settings.METRICS_TOKEN = TOKEN
    response = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200, response.content
    return Scrape(response.content.decode())
