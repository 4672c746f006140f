"""deploy/prometheus/alerts.yml passes promtool's check and its own unit tests, and the alerts and
deploy/grafana/dashboard.json query only metrics the portal defines, in PromQL that parses."""

import json
import re
import subprocess
from pathlib import Path

import yaml
from prometheus_client.metrics import MetricWrapperBase

from portal import metrics
from runs.swarm.gauges import ROLLUP_LAG, RUN_GAUGES

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboard.json"
SAMPLE_SUFFIXES = {"counter": ["_total"], "gauge": [""], "histogram": ["_bucket", "_count", "_sum"]}
# What Grafana puts in place of its variables before it sends a query.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$run": ".*"}


def defined_series() -> dict[str, str]:
    """Every series name /metrics can expose -> the metric it belongs to."""
    names = {name: name for name in [*RUN_GAUGES, ROLLUP_LAG[0]]}
    for metric in vars(metrics).values():
        if isinstance(metric, MetricWrapperBase):
            for family in metric.describe():
                names.update({family.name + suffix: family.name for suffix in SAMPLE_SUFFIXES[family.type]})
    return names


def alert_rules() -> list[dict]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def dashboard_queries() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel.get("targets", [])]


def promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_the_alerting_rules_pass_promtool_and_fire_on_the_trouble_they_name():
    checked = promtool("check", "rules", str(ALERTS))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", str(ALERTS.with_name("alerts.test.yml")))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    alerts = {rule["alert"] for rule in alert_rules()}
    assert {"DedlocCoordinatorSilent", "DedlocCreditRollupLagging", "DedlocNoAlivePeers", "DedlocReportRefusalSpike",
            "DedlocCheckpointFailures"} <= alerts


def test_the_alerts_and_the_dashboard_query_only_metrics_the_portal_defines():
    defined = defined_series()
    queries = [rule["expr"] for rule in alert_rules()] + dashboard_queries()
    used = {name for query in queries for name in re.findall(r"\bdedloc_[a-z0-9_]+", query)}
    assert used and used <= set(defined), f"not defined by the portal: {sorted(used - set(defined))}"
    on_the_dashboard = {defined[name] for query in dashboard_queries() for name in re.findall(r"\bdedloc_[a-z0-9_]+", query)}
    assert on_the_dashboard == set(defined.values()), f"not on the dashboard: {sorted(set(defined.values()) - on_the_dashboard)}"


def test_the_dashboard_is_a_grafana_dashboard_whose_queries_parse(tmp_path):
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["title"] and dashboard["uid"] and isinstance(dashboard["schemaVersion"], int)
    assert {variable["name"] for variable in dashboard["templating"]["list"]} == {"datasource", "run"}
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in dashboard["panels"]:
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"]) and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"], panel["title"]
    # promtool parses PromQL only in rule files: each query becomes a recording rule of a scratch file.
    rules = []
    for number, query in enumerate(dashboard_queries()):
        for variable, value in GRAFANA_VARIABLES.items():
            query = query.replace(variable, value)
        rules.append({"record": f"dashboard:query_{number}", "expr": query})
    scratch = tmp_path / "dashboard_queries.yml"
    scratch.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = promtool("check", "rules", str(scratch))
    assert checked.returncode == 0, checked.stdout + checked.stderr
