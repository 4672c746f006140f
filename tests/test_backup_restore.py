"""docs/deploy.md's backup and restore, run as written on a scratch PostgreSQL database of a portal
with a run, its data file, a backbone peer's identity and credit: after a loss (the database
emptied, the files deleted) the restore brings every one of them back, and credit_check agrees."""

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.parse
from pathlib import Path

import psycopg
import pytest
from django.conf import settings

ROOT = Path(__file__).resolve().parents[1]
SECTION = (ROOT / "docs" / "deploy.md").read_text().split("## Backup and restore")[1].split("\n## ")[0]
BACKUP, RESTORE = [block.strip().splitlines() for block in re.findall(r"```sh\n(.*?)```", SECTION, re.S)]

SEED = """
from accounts.services import token_create
from runs.credit.rollup import credit_rollup
from runs.setup.services import data_file_add
from tests.factories import RunFactory, UserFactory, report, session_for
organizer, volunteer = UserFactory(username="olga", organizer=True), UserFactory(username="vik")
run = RunFactory(slug="bengali-albert", organizers=[organizer])
data_file_add(run=run, actor=organizer, name="bn.txt", content="আমি বাংলায় গান গাই\\n".encode())
session = session_for(run, volunteer)
for samples in (64, 128, 32):
    report(session, samples)
credit_rollup()
"""
STATE = """
import json
from runs.credit.boards import leaderboard_rows
from runs.models import Run
run = Run.objects.filter(slug="bengali-albert").first()
print(json.dumps(None if run is None else {
    "events": run.sessions.get().events.count(), "data": run.data_files.get().file.read().decode(),
    "board": [(row["name"], row["samples"], round(row["credit"], 6))
              for row in leaderboard_rows(run=run, by="user", window="all", limit=10, offset=0)]}))
"""


@pytest.fixture
def scratch_database():
    """A database of its own on the suite's PostgreSQL server, dropped afterwards."""
    if settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        pytest.skip("pg_dump needs PostgreSQL: CI runs this with DATABASE_URL=postgres://…")
    name = f"portal_backup_{os.getpid()}"
    server = urllib.parse.urlsplit(settings.DATABASE_URL)
    with psycopg.connect(server._replace(path="/postgres").geturl(), autocommit=True) as connection:
        connection.execute(f"DROP DATABASE IF EXISTS {name}")
        connection.execute(f"CREATE DATABASE {name}")
    yield server._replace(path=f"/{name}").geturl()
    with psycopg.connect(server._replace(path="/postgres").geturl(), autocommit=True) as connection:
        connection.execute(f"DROP DATABASE {name} WITH (FORCE)")


def test_the_documented_backup_and_restore_bring_back_the_database_files_and_identities(scratch_database, tmp_path):
    data = tmp_path / "data"
    env = {name: value for name, value in os.environ.items() if name != "REDIS_URL"}
    env.update(DATABASE_URL=scratch_database, PORTAL_DATA=str(data), MEDIA_ROOT=str(data / "media"),
               COORDINATOR_STATE_DIR=str(data / "coordinator"), PORTAL_VAR_DIR=str(tmp_path / "var"),
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")  # `python` is this virtualenv's

    def run(command: str) -> str:
        done = subprocess.run(command, shell=True, cwd=tmp_path, env={**env, "PYTHONPATH": str(ROOT)},
                              capture_output=True, text=True)
        assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        return done.stdout

    def manage(*args: str) -> str:
        return run(" ".join([sys.executable, str(ROOT / "manage.py"), *args]))

    manage("migrate", "--verbosity", "0")
    manage("shell", "-c", _quoted(SEED))
    (data / "coordinator").mkdir(parents=True)
    (data / "coordinator" / "dlp-run.identity").write_bytes(b"the backbone peer's private key")
    before = json.loads(manage("shell", "-c", _quoted(STATE)).splitlines()[-1])
    assert before["events"] == 3 and before["board"][0][1] == 224

    for command in BACKUP:
        run(command.replace("python manage.py", f"python {ROOT / 'manage.py'}"))
    # The loss: every table emptied, every file gone.
    manage("flush", "--noinput")
    shutil.rmtree(data)
    data.mkdir()
    assert json.loads(manage("shell", "-c", _quoted(STATE)).splitlines()[-1]) is None

    for command in RESTORE:
        run(command.replace("python manage.py", f"python {ROOT / 'manage.py'}"))
    assert json.loads(manage("shell", "-c", _quoted(STATE)).splitlines()[-1]) == before
    assert (data / "coordinator" / "dlp-run.identity").read_bytes() == b"the backbone peer's private key"


def _quoted(code: str) -> str:
    return "'" + code.replace("'", "'\"'\"'") + "'"
