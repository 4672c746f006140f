"""docker-compose.yml and the Dockerfile name only what exists: every portal service's command is a
program the image has, with options that program takes; every environment variable is one the
portal reads; the health check asks a probe the portal answers, on the port the web server listens on.
(Docker itself is not on CI's machines: this is what can be checked without building the image.)"""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from celery.bin.celery import celery as celery_cli
from django.core.management import get_commands, load_command_class

from portal.health import PROBES

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
PORTAL_SERVICES = {name: service for name, service in COMPOSE["services"].items() if service.get("build") == "."}
# Variables read by settings.py through portal/env.py (env_str("NAME", …) and the like), and any `NAME_FILE`.
SETTINGS_READ = set(re.findall(r'env_\w+\(\s*"([A-Z0-9_]+)"', (ROOT / "portal" / "settings.py").read_text()))


def commands(service: dict) -> list[list[str]]:
    """The programs a service runs: its command, or each step of a `sh -c "a && b && exec c"`."""
    words = shlex.split(service["command"])
    if words[:2] == ["sh", "-c"]:
        return [shlex.split(step.strip().removeprefix("exec ")) for step in words[2].split("&&")]
    return [words]


def options(words: list[str]) -> set[str]:
    return {word.split("=")[0] for word in words if word.startswith("-")}


def test_compose_runs_the_web_worker_evaluator_validator_beat_and_coordinator_from_the_image():
    assert set(PORTAL_SERVICES) == {"web", "worker", "evaluator", "validator", "beat", "coordinator"}


@pytest.mark.parametrize("name", sorted(PORTAL_SERVICES))
def test_every_command_is_a_program_of_the_image_with_options_it_takes(name):
    for words in commands(PORTAL_SERVICES[name]):
        if words[:2] == ["python", "manage.py"]:
            assert words[2] in get_commands(), f"{name}: no manage.py command {words[2]!r}"
            parser = load_command_class(get_commands()[words[2]], words[2]).create_parser("manage.py", words[2])
            known = {flag for action in parser._actions for flag in action.option_strings}
        elif words[0] == "celery":
            assert words[1:3] == ["-A", "portal"], words
            subcommand = celery_cli.commands[words[3]]
            known = {flag for param in subcommand.params for flag in param.opts}
            words = words[4:]
        elif words[0] == "uvicorn":
            assert words[1] == "portal.asgi:application", words
            known = set(re.findall(r"--[a-z-]+", subprocess.run([sys.executable, "-m", "uvicorn", "--help"],
                                                                 capture_output=True, text=True, check=True).stdout))
        else:
            pytest.fail(f"{name}: {words[0]!r} is not a program the portal's image runs")
        assert options(words) <= known, f"{name}: {' '.join(words)}: unknown {options(words) - known}"


def test_every_environment_variable_is_a_setting_the_portal_reads():
    for name, service in PORTAL_SERVICES.items():
        for variable in service["environment"]:
            assert variable.removesuffix("_FILE") in SETTINGS_READ, f"{name}: portal/settings.py never reads {variable}"


def test_the_health_check_asks_a_probe_of_the_portal_on_the_port_the_web_server_listens_on():
    web = PORTAL_SERVICES["web"]
    (url,) = re.findall(r"https?://[^'\" ]+", " ".join(web["healthcheck"]["test"]))
    port, path = re.fullmatch(r"http://127\.0\.0\.1:(\d+)(/\w+)", url).groups()
    assert path in PROBES
    uvicorn = commands(web)[-1]
    assert uvicorn[uvicorn.index("--port") + 1] == port and f"127.0.0.1:{port}:{port}" in web["ports"][0]


def test_the_image_installs_the_pinned_requirements_on_the_python_the_project_needs():
    dockerfile = (ROOT / "Dockerfile").read_text()
    python = re.search(r"^FROM python:(\d+\.\d+)", dockerfile, re.M).group(1)
    assert re.search(rf'requires-python = ">={re.escape(python)}"', (ROOT / "pyproject.toml").read_text())
    assert "pip install --no-cache-dir -r requirements.txt" in dockerfile
