"""The web and Celery processes load no ML stack: what import-linter checks in the source
(pyproject.toml), checked here in real processes, dynamic imports included (docs/design.md)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "hivemind", "transformers", "scipy")

WEB = """
import django
django.setup()
import portal.asgi
from django.urls import get_resolver
get_resolver().url_patterns
"""
WORKER = """
import django
django.setup()
from portal.celery import app
app.loader.import_default_modules()
"""
COORDINATOR = """
import django
django.setup()
import runs.swarm.coordinator
"""


def modules_loaded(code: str, tmp_path: Path) -> set[str]:
    probe = code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "portal.settings", "PORTAL_VAR_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=120, check=True)
    return set(json.loads(result.stdout.splitlines()[-1]))


@pytest.mark.parametrize("process", ["web", "worker"])
def test_the_web_and_the_worker_load_no_ml_stack(process, tmp_path):
    modules = modules_loaded(WEB if process == "web" else WORKER, tmp_path)
    assert "runs.api.routes" in modules or process == "worker"
    assert "runs.tasks" in modules or process == "web"
    assert not [name for name in HEAVY if name in modules]
    assert not [name for name in modules if name.startswith("peer_agent.") and name != "peer_agent.protocol"]


def test_the_probe_sees_the_ml_stack_where_it_is_loaded(tmp_path):
    """The coordinator does load hivemind and torch: the probe above would see them."""
    modules = modules_loaded(COORDINATOR, tmp_path)
    assert {"torch", "hivemind"} <= modules
