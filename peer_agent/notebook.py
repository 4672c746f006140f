"""Joining a run from a Jupyter notebook (the join page's ``.ipynb``): ``peer-agent join`` runs in a child
process and one panel, redrawn in place, shows what it reports.

A child process, not the kernel itself: hivemind forks its DHT and averagers from the process that trains,
and the agent stops cleanly on signals, which a kernel keeps for its own interrupt. The child writes JSON
lines (``--log-format json``), progress among them every second (``--progress-every``); it stops when the
kernel is interrupted (the panel's process sends it SIGTERM, what a cloud's preemption notice sends too) and
when the kernel dies without notice (``--stop-with-parent``). The token goes to the child in its
environment: it is asked for with ``getpass`` and never printed, so it stays out of the notebook's outputs.
"""

from __future__ import annotations

import getpass
import html
import json
import os
import signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field

from peer_agent.display import ProgressSnapshot, progress_line
from peer_agent.i18n import _
from peer_agent.join import STOP_WITHIN_S

REDRAW_EVERY_S = 1.0
LINES_SHOWN = 6
# Once hivemind is imported, as in every agent, a warning's level name is "WARN": hivemind renames it.
PROBLEM_LEVELS = ("WARN", "WARNING", "ERROR", "CRITICAL")


@dataclass
class Panel:
    """What the notebook shows of the agent: its last progress, its last warning or error (a refusal, in the
    portal's words) and its last log lines."""

    run: str
    portal: str
    progress: ProgressSnapshot | None = None
    problem: str | None = None
    state: str = field(default_factory=lambda: _("starting: fetching the run, measuring bandwidth, joining the swarm"))
    lines: deque = field(default_factory=lambda: deque(maxlen=LINES_SHOWN))

    def read(self, line: str) -> None:
        """Take one line of the agent's output: a JSON log record, or anything else (shown as it is)."""
        line = line.rstrip("\n")
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            if line.strip():
                self.lines.append(line)
            return
        if isinstance(record.get("progress"), dict):
            try:
                self.progress = ProgressSnapshot(**record["progress"])
            except TypeError:  # an agent of another version: show the line instead
                self.lines.append(str(record.get("message", "")))
            self.state = _("training")
            return
        message = str(record.get("message", ""))
        if isinstance(record.get("download"), dict):  # redrawn in place, not a line per second
            self.state = message
            return
        if record.get("level") in PROBLEM_LEVELS:
            self.problem = message
        self.lines.append(message)

    def rows(self) -> list[tuple[str, str]]:
        rows = [(_("Run"), f"{self.run} ({self.portal}/runs/{self.run}/)"), (_("State"), self.state)]
        snap = self.progress
        if snap is not None:
            swarm = "?" if snap.collaboration_samples_per_second is None else f"{snap.collaboration_samples_per_second:.1f}"
            rows += [
                (_("Epoch"), f"{snap.global_epoch} ({snap.samples_accumulated}/{snap.target_batch_size})"),
                (_("Your samples"), _("{samples} this session, {acked} acknowledged by the portal (credit is "
                                      "confirmed once an epoch's checks pass)").format(samples=snap.session_samples,
                                                                                   acked=snap.acked_samples)),
                (_("Speed"), _("you {you:.1f} samples/s, the swarm {swarm} samples/s with {peers} peers").format(
                    you=snap.local_samples_per_second, swarm=swarm, peers=snap.num_peers)),
            ]
            if snap.confirmed_samples is not None:
                rows.append((_("Credit"), _("{confirmed} samples confirmed and {pending} waiting for their epochs' "
                                            "checks, on this machine in this run").format(
                    confirmed=snap.confirmed_samples, pending=snap.pending_samples)))
            if snap.loss is not None:
                rows.append((_("Loss"), f"{snap.loss:.3f}"))
        if self.problem:
            rows.append((_("Last problem"), self.problem))
        return rows

    def html(self) -> str:
        body = "".join(f"<tr><th style='text-align:left;padding-right:1em'>{html.escape(name)}</th>"
                       f"<td style='text-align:left'>{html.escape(value)}</td></tr>" for name, value in self.rows())
        log = html.escape("\n".join(self.lines))
        return f"<table>{body}</table><pre style='font-size:smaller;white-space:pre-wrap'>{log}</pre>"

    def text(self) -> str:
        return progress_line(self.progress) if self.progress else self.state


class _Screen:
    """The panel drawn in place in a Jupyter kernel's output, or one line a redraw on a plain console."""

    def __init__(self) -> None:
        self._handle = None
        try:
            # IPython exists only inside a kernel: the agent does not depend on it
            from IPython import get_ipython
            from IPython.display import HTML, display
        except ImportError:
            return
        if get_ipython() is not None and hasattr(get_ipython(), "kernel"):
            self._html, self._handle = HTML, display(HTML(""), display_id=True)

    def draw(self, panel: Panel) -> None:
        if self._handle is not None:
            self._handle.update(self._html(panel.html()))
        else:
            print(panel.text(), flush=True)


def join(run: str, *, portal: str, token: str | None = None, options: tuple[str, ...] = ()) -> int:
    """Train for ``run`` on ``portal`` until the kernel is interrupted (or the run stops); the agent's exit
    status. ``token`` defaults to PEER_AGENT_TOKEN, else it is asked for without echo. ``options`` are more
    ``peer-agent join`` flags, e.g. ``("--max-runtime", "2h")``."""
    token = token or os.environ.get("PEER_AGENT_TOKEN") or getpass.getpass(_("Agent token (not shown): ")).strip()
    command = [sys.executable, "-m", "peer_agent", "join", "--portal", portal, run, "--log-format", "json",
               "--progress-every", "1", "--stop-with-parent", str(os.getpid()), *options]
    panel, screen = Panel(run=run, portal=portal), _Screen()
    # Its own session: the kernel's interrupt is ours to pass on once, as SIGTERM; a second SIGINT from
    # the process group would make the agent quit at once, without its last reports.
    agent = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             env={**os.environ, "PEER_AGENT_TOKEN": token}, text=True, bufsize=1,
                             start_new_session=True)
    drawn_at = 0.0
    try:
        for line in agent.stdout:
            panel.read(line)
            if time.monotonic() - drawn_at >= REDRAW_EVERY_S:
                screen.draw(panel)
                drawn_at = time.monotonic()
    except KeyboardInterrupt:
        panel.state = _("stopping: sending the last reports and leaving the swarm")
        screen.draw(panel)
        agent.send_signal(signal.SIGTERM)
        for line in agent.stdout:
            panel.read(line)
    finally:
        try:
            agent.wait(timeout=STOP_WITHIN_S + 5)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()
    panel.state = _("stopped (exit status {code})").format(code=agent.returncode)
    screen.draw(panel)
    return agent.returncode
