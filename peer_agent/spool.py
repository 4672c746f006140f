"""The on-disk spool: every progress report of a session, kept until the portal acknowledges it.

The spool is one append-only JSON-lines file per session, ``session-<id>.jsonl``: a header line
(``{"type": "session", "session_id", "report_url", "run", "created_at"}``), then the report frames
exactly as sent, ``{"type": "ack", "seq"}`` and ``{"type": "dropped", "seq", "code", "detail"}``
lines, and after compaction a ``{"type": "summary", ...}`` line that replaces the settled history.
A torn last line (a crash mid-write) is cut off on open. A ``.lock`` file held with ``flock``
marks a spool its agent is still using, so a second agent on the same machine leaves it alone.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from peer_agent.protocol import Report

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; one agent per agent home there
    fcntl = None

logger = logging.getLogger(__name__)


class SpoolBusy(Exception):
    """Another running agent holds this session's spool."""


@dataclass
class SpoolSummary:
    """What one session's spool says about the contribution (for ``peer-agent status``)."""

    session_id: int
    run: str | None = None
    created_at: str | None = None
    last_seq: int = 0
    acked_reports: int = 0
    acked_samples: int = 0
    dropped_reports: int = 0
    dropped_samples: int = 0
    pending: dict[int, Report] = field(default_factory=dict, repr=False)

    @property
    def pending_samples(self) -> int:
        return sum(report.samples for report in self.pending.values())

    @property
    def reported_samples(self) -> int:
        return self.acked_samples + self.dropped_samples + self.pending_samples

    def _apply(self, line: str) -> None:
        entry = json.loads(line)
        kind = entry.get("type")
        if kind == "report":
            report = Report.model_validate_json(line)
            self.pending[report.seq] = report
            self.last_seq = max(self.last_seq, report.seq)
        elif kind in ("ack", "dropped") and entry.get("seq") in self.pending:
            report = self.pending.pop(entry["seq"])
            if kind == "ack":
                self.acked_reports, self.acked_samples = self.acked_reports + 1, self.acked_samples + report.samples
            else:
                self.dropped_reports, self.dropped_samples = self.dropped_reports + 1, self.dropped_samples + report.samples
        elif kind == "summary":
            for name in ("last_seq", "acked_reports", "acked_samples", "dropped_reports", "dropped_samples"):
                setattr(self, name, int(entry[name]))
        elif kind == "session":
            self.run, self.created_at = entry.get("run"), entry.get("created_at")


def spool_files(directory: Path) -> list[Path]:
    """Session spool files in ``directory``, oldest session first."""
    files = [path for path in Path(directory).glob("session-*.jsonl") if path.stem.removeprefix("session-").isdigit()]
    return sorted(files, key=lambda path: int(path.stem.removeprefix("session-")))


def spool_previous_session(directory: Path, *, run: str) -> int | None:
    """The newest session of ``run`` whose spool in ``directory`` no running agent holds: the session this
    environment's previous start held, which a new start replaces (``JoinRequest.replaces_session``). A
    spool still locked belongs to another agent running beside this one, whose session goes on."""
    for path in reversed(spool_files(directory) if Path(directory).exists() else []):
        header, summary = spool_read(path)
        if header.get("run") != run:
            continue
        try:
            Spool.open(directory, summary.session_id).close()
        except SpoolBusy:
            continue
        return summary.session_id
    return None


def spool_read(path: Path) -> tuple[dict[str, Any], SpoolSummary]:
    """Read a spool without locking or changing it: its header and its summary."""
    text = path.read_text(encoding="utf-8")
    complete, _, _torn = text.rpartition("\n")
    header: dict[str, Any] = {}
    summary = SpoolSummary(session_id=int(path.stem.removeprefix("session-")))
    for number, line in enumerate(complete.splitlines(), 1):
        try:
            if number == 1:
                header = json.loads(line)
            summary._apply(line)
        except (ValueError, KeyError, TypeError) as exc:
            logger.warning("Skipping unreadable line %d of %s: %s", number, path, exc)
    return header, summary


class Spool:
    """The durable queue of one session's reports; thread-safe. Open with :meth:`open`."""

    compact_after_lines = 2000

    def __init__(self, path: Path, header: dict[str, Any], summary: SpoolSummary, lock_file: Any, lines: int):
        self.path, self.header, self._summary, self._lock_file, self._lines = path, header, summary, lock_file, lines
        self._changed = threading.Condition()
        self._file = open(path, "a", encoding="utf-8")

    @classmethod
    def open(cls, directory: Path, session_id: int, *, report_url: str | None = None, run: str | None = None) -> Spool:
        """Open (or create, given ``report_url``) the spool of ``session_id``; SpoolBusy if another agent has it."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = directory / f"session-{session_id}.jsonl"
        lock_file = open(directory / f"session-{session_id}.lock", "a")
        if fcntl is not None:
            try:
                fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock_file.close()
                raise SpoolBusy(f"session {session_id}'s spool is in use by another agent") from None
        if not path.exists():
            if report_url is None:
                lock_file.close()
                raise FileNotFoundError(path)
            header = {"type": "session", "session_id": session_id, "report_url": report_url, "run": run,
                      "created_at": datetime.now(UTC).isoformat(timespec="seconds")}
            _write_atomically(path, [json.dumps(header)])
        _cut_torn_tail(path)
        header, summary = spool_read(path)
        spool = cls(path, header, summary, lock_file, lines=0)
        spool._compact()
        return spool

    @property
    def session_id(self) -> int:
        return self._summary.session_id

    @property
    def report_url(self) -> str:
        return self.header["report_url"]

    @property
    def next_seq(self) -> int:
        with self._changed:
            return self._summary.last_seq + 1

    def add(self, report: Report) -> None:
        """Append ``report`` durably (fsync); its ``seq`` must be :attr:`next_seq`."""
        with self._changed:
            if report.session_id != self.session_id or report.seq != self._summary.last_seq + 1:
                raise ValueError(f"report {report.session_id}/{report.seq} does not continue session "
                                 f"{self.session_id} at seq {self._summary.last_seq + 1}")
            line = report.model_dump_json()
            self._append(line, sync=True)
            self._summary._apply(line)

    def pending(self) -> list[Report]:
        """Every report not yet acknowledged or dropped, in ``seq`` order."""
        with self._changed:
            return [self._summary.pending[seq] for seq in sorted(self._summary.pending)]

    def acked(self, seq: int) -> bool:
        """Record the portal's acknowledgement of ``seq``; False if it was not pending."""
        return self._settle({"type": "ack", "seq": seq})

    def dropped(self, seq: int, code: str, detail: str) -> bool:
        """Give up on report ``seq``: the portal refused it for good."""
        return self._settle({"type": "dropped", "seq": seq, "code": code, "detail": detail})

    def summary(self) -> SpoolSummary:
        with self._changed:
            copy = SpoolSummary(**{**self._summary.__dict__, "pending": dict(self._summary.pending)})
        return copy

    def wait_drained(self, timeout: float | None) -> bool:
        """Wait until nothing is pending; False if ``timeout`` passed first."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._summary.pending, timeout)

    def close(self) -> None:
        with self._changed:
            self._file.close()
            self._lock_file.close()  # releases the flock

    def _settle(self, entry: dict[str, Any]) -> bool:
        with self._changed:
            if entry["seq"] not in self._summary.pending:
                return False
            line = json.dumps(entry)
            # Acks are not fsynced: losing one to a crash only makes the portal see a duplicate it ignores.
            self._append(line, sync=False)
            self._summary._apply(line)
            if self._lines >= self.compact_after_lines:
                self._compact()
            self._changed.notify_all()
            return True

    def _append(self, line: str, *, sync: bool) -> None:
        self._file.write(line + "\n")
        self._file.flush()
        if sync:
            os.fsync(self._file.fileno())
        self._lines += 1

    def _compact(self) -> None:
        """Rewrite the file as header + summary + pending reports."""
        s = self._summary
        totals = {"type": "summary", "last_seq": s.last_seq, "acked_reports": s.acked_reports,
                  "acked_samples": s.acked_samples, "dropped_reports": s.dropped_reports, "dropped_samples": s.dropped_samples}
        lines = [json.dumps(self.header), json.dumps(totals)]
        lines += [s.pending[seq].model_dump_json() for seq in sorted(s.pending)]
        self._file.close()
        _write_atomically(self.path, lines)
        self._file = open(self.path, "a", encoding="utf-8")
        self._lines = 0


def _write_atomically(path: Path, lines: list[str]) -> None:
    partial = path.with_suffix(".tmp")
    with open(partial, "w", encoding="utf-8") as file:
        file.write("".join(line + "\n" for line in lines))
        file.flush()
        os.fsync(file.fileno())
    os.replace(partial, path)
    if hasattr(os, "O_DIRECTORY"):
        descriptor = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def _cut_torn_tail(path: Path) -> None:
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        logger.warning("Cutting off a half-written line at the end of %s (the agent stopped mid-write)", path)
        with open(path, "r+b") as file:
            file.truncate(data.rfind(b"\n") + 1)
