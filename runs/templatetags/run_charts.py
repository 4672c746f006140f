"""`{% run_charts run %}`: the run page's charts section, with the latest figures as text for
readers without JavaScript or sight of the canvas; `{% chart_figure %}` draws one chart's frame."""

from django import template

from runs.evaluation.selectors import evaluation_table
from runs.swarm.series import CHARTS, series_latest

register = template.Library()


def charts_context(*, fields: list[str], latest) -> list[dict]:
    return [{"chart": CHARTS[field], "latest_text": CHARTS[field].latest_text(latest)} for field in fields]


@register.inclusion_tag("runs/includes/charts.html")
def run_charts(run):
    latest = series_latest(run=run)
    return {
        "run": run,
        "latest": latest,
        "charts": charts_context(fields=["samples_per_second", "loss", "alive_peers"], latest=latest),
    }


@register.inclusion_tag("runs/includes/chart_figure.html")
def chart_figure(field: str, latest, markers: bool = False):
    return {**charts_context(fields=[field], latest=latest)[0], "markers": markers}


@register.inclusion_tag("runs/includes/evaluations.html")
def run_evaluations(run):
    """The held-out evaluations' chart (drawn by charts.js from the API) and the same figures as a table."""
    rows = evaluation_table(run=run)
    return {"run": run, "rows": rows,
            "drawable": any(row["status"] == "done" and not row["evaluation"].baseline for row in rows)}
