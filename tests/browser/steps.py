"""What the browser tests do on the way to what they check: log in through the form, and report
over `WS /ws/agent/` of a live server as an agent does."""

import datetime
import json

from playwright.sync_api import expect
from websockets.sync.client import connect

from tests.factories import PASSWORD


def log_in(page, username: str) -> None:
    """Log ``username`` in through the login form (every test user's password is PASSWORD)."""
    page.goto("/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("button", name="Log out")).to_be_visible()


def send_report(server: str, secret: str, session_id: int, seq: int, samples: int, ago_s: float = 0) -> dict:
    """One report of epoch 4, sent ``ago_s`` seconds ago by its clock, over a connection of its own
    to ``server``'s agent socket; the portal's answer."""
    sent_at = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=ago_s)
    frame = {"type": "report", "session_id": session_id, "seq": seq, "samples": samples, "steps": 1, "local_epoch": 4,
             "loss": 5.25, "samples_per_second": 16.0, "sent_at": sent_at.isoformat()}
    with connect(server.replace("http", "ws") + "/ws/agent/", additional_headers={"Authorization": f"Bearer {secret}"}) as socket:
        socket.send(json.dumps(frame))
        return json.loads(socket.recv(timeout=10))


def watch_console(page) -> list[str]:
    """Errors and warnings the page logs; the portal has no favicon, which is not the charts' concern."""
    problems = []

    def console(message) -> None:
        if message.type in ("error", "warning") and not message.location.get("url", "").endswith("/favicon.ico"):
            problems.append(f"{message.text} ({message.location.get('url')})")

    page.on("console", console)
    page.on("pageerror", lambda error: problems.append(str(error)))
    return problems
