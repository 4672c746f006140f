"""What the browser tests do on the way to what they check: log in through the form, report over
`WS /ws/agent/` of a live server as an agent does, and check a page for sideways scrolling and for
axe-core's serious and critical violations and for what the Content-Security-Policy refused."""

import datetime
import json
import re
from pathlib import Path

from django.core import mail
from playwright.sync_api import expect
from websockets.sync.client import connect

from tests.factories import PASSWORD

AXE = Path(__file__).resolve().parent / "vendor" / "axe-core" / "axe.min.js"
# The violations of serious and critical impact axe finds on the page, with up to three elements each.
AXE_RUN = """async () => {
  const result = await axe.run(document, { resultTypes: ["violations"] });
  return result.violations.filter((v) => v.impact === "serious" || v.impact === "critical")
    .map((v) => `${v.id} (${v.impact}): ${v.nodes.slice(0, 3).map((n) => n.target.join(" ")).join(" | ")}`);
}"""
# Installed in every page by the browser fixture (tests/browser/conftest.py), before the page's own scripts.
CSP_WATCH = """window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) => window.__cspViolations.push(
  `${e.effectiveDirective} refused ${e.blockedURI || "an inline one"} (${e.sourceFile || "the page"}:${e.lineNumber})`));"""
PHONE = {"width": 360, "height": 780}
OVERFLOW = "document.documentElement.scrollWidth - document.documentElement.clientWidth"


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


def open_mailed_link(page, kind: str = "accounts/signup/confirm") -> None:
    """Open the link of kind ``kind`` in the last e-mail the portal sent, as its reader would."""
    page.goto(re.search(rf"https?://[^/\s]+(/{kind}/[^\s\"<>]+/)", mail.outbox[-1].body).group(1))


def csp_violations(page) -> list[str]:
    """What the Content-Security-Policy refused on the page since it loaded."""
    violations = page.evaluate("window.__cspViolations")
    assert violations is not None, "the page was not opened through the browser fixture, which watches the policy"
    return violations


def axe_findings(page) -> list[str]:
    """axe-core's serious and critical violations on the page. axe is evaluated, not added as a script
    tag: the portal's policy refuses inline scripts, which is what such a tag is."""
    page.evaluate(AXE.read_text())
    return page.evaluate(AXE_RUN)


def page_problems(page, label: str) -> list[str]:
    """What is wrong with the loaded page: sideways scrolling, anything its Content-Security-Policy refused,
    and axe-core's serious or critical findings."""
    problems = []
    if (overflow := page.evaluate(OVERFLOW)) > 0:
        problems.append(f"{label}: scrolls {overflow} px sideways")
    problems += [f"{label}: the policy's {violation}" for violation in csp_violations(page)]
    return problems + [f"{label}: {finding}" for finding in axe_findings(page)]
def watch_console(page) -> list[str]:
    """Errors and warnings the page logs; the portal has no favicon, which is not the charts' concern."""
    problems = []

    def console(message) -> None:
        if message.type in ("error", "warning") and not message.location.get("url", "").endswith("/favicon.ico"):
            problems.append(f"{message.text} ({message.location.get('url')})")

    page.on("console", console)
    page.on("pageerror", lambda error: problems.append(str(error)))
    return problems
