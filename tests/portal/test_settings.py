"""Settings come from the environment; bad values stop start-up; production passes check --deploy."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = {
    "DEBUG": "false",
    "SECRET_KEY": "a-real-production-secret-8f2b9c1d7e6a5f4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d",
    "ALLOWED_HOSTS": "portal.example.org",
    "SECURE_SSL_REDIRECT": "true",
    "SECURE_HSTS_SECONDS": "31536000",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS": "true",
    "SECURE_HSTS_PRELOAD": "true",
}


def manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {key: value for key, value in os.environ.items() if key not in PRODUCTION}
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env={**clean, **env}, capture_output=True, text=True, timeout=120
    )


def test_production_settings_pass_check_deploy_with_no_issues(tmp_path):
    result = manage("check", "--deploy", "--fail-level", "WARNING", PORTAL_VAR_DIR=str(tmp_path), **PRODUCTION)
    assert result.returncode == 0, result.stderr
    assert "no issues" in result.stdout


def test_production_refuses_to_start_without_a_secret_key(tmp_path):
    env = {**PRODUCTION, "PORTAL_VAR_DIR": str(tmp_path)}
    del env["SECRET_KEY"]
    result = manage("check", **env)
    assert result.returncode != 0
    assert "SECRET_KEY must be set" in result.stderr


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("DEBUG", "maybe", "DEBUG='maybe' is not a boolean"),
        ("EMAIL_PORT", "twenty-five", "EMAIL_PORT='twenty-five' is not an integer"),
        ("DATABASE_URL", "mysql://db/portal", "DATABASE_URL='mysql://db/portal'"),
        ("REDIS_URL", "http://localhost:6379", "REDIS_URL='http://localhost:6379' must start with redis://"),
        ("METRICS_ALLOWED_NETWORKS", "10.0.0.0/33", "METRICS_ALLOWED_NETWORKS: '10.0.0.0/33' is not an address"),
    ],
)
def test_a_bad_value_stops_start_up_naming_the_variable(tmp_path, name, value, message):
    result = manage("check", PORTAL_VAR_DIR=str(tmp_path), **{name: value})
    assert result.returncode != 0
    assert message in result.stderr
    assert "ImproperlyConfigured" in result.stderr


def test_a_secret_can_be_read_from_a_file(tmp_path):
    secret_file = tmp_path / "secret"
    secret_file.write_text("from-a-mounted-file-3f9a7c1e2b8d4f6a0c5e9b7d1f3a5c7e9b1d3f5a7c9e\n")
    code = "from django.conf import settings; print(settings.SECRET_KEY)"
    result = subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {code}"],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "portal.settings", "SECRET_KEY_FILE": str(secret_file),
             "PORTAL_VAR_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.stdout.strip() == "from-a-mounted-file-3f9a7c1e2b8d4f6a0c5e9b7d1f3a5c7e9b1d3f5a7c9e", result.stderr


def test_the_web_process_without_collected_static_files_refuses_to_start_naming_the_command(tmp_path):
    """With DEBUG off every page links the hashed names of collectstatic's manifest: without it the
    portal would answer every page 500, so the web server stops at start-up and says what to run."""
    env = {**PRODUCTION, "PORTAL_VAR_DIR": str(tmp_path), "STATIC_ROOT": str(tmp_path / "static"),
           "ALLOWED_HOSTS": "testserver", "SECURE_SSL_REDIRECT": "false"}
    login_page = ("import portal.asgi; from django.test import Client; "
                  "page = Client().get('/accounts/login/'); print(page.status_code, page.content.decode())")
    refused = manage("shell", "--verbosity", "0", "-c", login_page, **env)
    assert refused.returncode != 0
    assert "staticfiles.json is missing" in refused.stderr
    assert "run `python manage.py collectstatic --noinput` before starting the web server" in refused.stderr

    assert manage("collectstatic", "--noinput", **env).returncode == 0
    served = manage("shell", "--verbosity", "0", "-c", login_page, **env)
    assert served.returncode == 0, served.stderr
    status, page = served.stdout.split(" ", 1)
    assert status == "200" and re.search(r"/static/css/portal\.[0-9a-f]{12}\.css", page)
