"""The API keeps to its OpenAPI schema, as an outside client checks it: Schemathesis' own command,
with every check it has (`--checks all`: undocumented statuses, schema-valid requests refused,
schema-violating ones accepted, response shapes, auth that is really enforced…), against the portal
served by uvicorn, seeded with a public run, a volunteer's agent token and a training session."""

import subprocess
import sys

from accounts.services import token_create
from tests.security.world import world_run, world_session

EXAMPLES_PER_OPERATION = 15  # 16 operations, every phase: about 15 s here
SEED = 17  # a fixed seed: the same cases on every run, so that a failure reproduces


def test_schemathesis_finds_no_failure_with_every_check_against_a_running_portal(asgi_server, organizer, volunteer,
                                                                               tmp_path):
    run = world_run("open-run", "public", organizer)
    token, secret = token_create(user=volunteer, name="vik's laptop")
    world_session(run, volunteer, token)
    result = subprocess.run(
        [sys.executable, "-m", "schemathesis.cli", "run", f"{asgi_server}/api/v1/openapi.json", "--checks", "all",
         "--max-examples", str(EXAMPLES_PER_OPERATION), "--seed", str(SEED), "--workers", "1", "--no-color",
         "--generation-database", "none", "--header", f"Authorization: Bearer {secret}"],
        capture_output=True, text=True, timeout=240, cwd=tmp_path,  # its cache folder goes there
    )
    assert result.returncode == 0, result.stdout[-12000:] + result.stderr[-2000:]
    assert "19 selected / 19 total" in result.stdout, result.stdout[-3000:]
