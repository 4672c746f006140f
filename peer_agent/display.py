"""The one-line progress display of ``peer-agent join``, and logging that prints above it."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass

from rich.console import Console
from rich.live import Live
from rich.logging import RichHandler
from rich.text import Text

from peer_agent.i18n import _

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProgressSnapshot:
    """What the volunteer sees while training."""

    local_samples_per_second: float
    global_epoch: int
    collaboration_samples_per_second: float | None
    session_samples: int  # samples this agent contributed in this session
    acked_samples: int  # of those, stored by the portal
    num_peers: int
    eta_next_epoch_s: float | None
    samples_accumulated: int = 0
    target_batch_size: int = 0
    loss: float | None = None
    # This machine's samples in the run as the portal judged them (peer_agent.portal.CreditWatcher); None
    # until the portal answered.
    confirmed_samples: int | None = None
    pending_samples: int | None = None


def _duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds) or seconds > 86400 * 365:
        return "?"
    seconds = int(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def progress_line(snap: ProgressSnapshot) -> str:
    """``epoch 12 │ you 35.2 samples/s │ swarm 410.0 samples/s, 9 peers │ …``"""
    swarm = "?" if snap.collaboration_samples_per_second is None else f"{snap.collaboration_samples_per_second:.1f}"
    batch = f" ({snap.samples_accumulated}/{snap.target_batch_size})" if snap.target_batch_size else ""
    loss = "" if snap.loss is None else f" │ loss {snap.loss:.3f}"
    credit = ("" if snap.confirmed_samples is None else
              f" │ this machine: {snap.confirmed_samples} confirmed, {snap.pending_samples} pending")
    return (f"epoch {snap.global_epoch} │ you {snap.local_samples_per_second:.1f} samples/s │ "
            f"swarm {swarm} samples/s, {snap.num_peers} peers │ your samples {snap.session_samples} "
            f"({snap.acked_samples} acknowledged){credit} │ next averaging in {_duration(snap.eta_next_epoch_s)}"
            f"{batch}{loss}")


# What every JSON log line names once known: the run and the training session (set when joined).
LOG_FIELDS: dict[str, object] = {"run": None, "session_id": None}


class _LogFields(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in LOG_FIELDS.items():
            setattr(record, name, value)
        return True


class _RequestOfAGoneProcess(logging.Filter):
    """Leaves out hivemind's error for a request to its DHT whose sender has exited: the request carries its
    reply channel, which the receiver fetches from the sender (``rebuild_connection``, multiprocessing). At every
    stop the averagers' processes exit with requests still in the DHT's pipe, and each volunteer's Ctrl-C
    ended in a screen of traceback ("[Errno 2] No such file or directory"). Nothing is lost: the sender
    wanted no answer any more. Kept with ``--verbose``."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, FileNotFoundError | ConnectionRefusedError):
            return True
        frame = error.__traceback__
        while frame is not None:
            if frame.tb_frame.f_code.co_name == "rebuild_connection":
                return False
            frame = frame.tb_next
        return True


DHT_LOGGER = "hivemind.dht.dht"


def logging_setup(console: Console, verbose: bool = False, log_format: str = "text") -> None:
    """Log through rich so messages print above the live progress line, or (``log_format="json"``, for
    a service's log collector) one JSON object a line on stderr; hivemind's chatter stays at WARNING."""
    if log_format == "json":
        # only with --log-format json
        from pythonjsonlogger.json import JsonFormatter

        handler = logging.StreamHandler(console.file)
        handler.setFormatter(JsonFormatter(["levelname", "name", "message", *LOG_FIELDS], timestamp=True,
                                           rename_fields={"levelname": "level", "name": "logger"}))
        handler.addFilter(_LogFields())
    else:
        handler = RichHandler(console=console, show_path=False, rich_tracebacks=verbose, markup=False)
        handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger()
    for previous in [h for h in root.handlers if getattr(h, "peer_agent", False)]:
        root.removeHandler(previous)
    handler.peer_agent = True  # ours, replaced when logging is set up again
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    for noisy in ("hivemind", "httpx", "httpcore", "websockets", "datasets", "fsspec", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.INFO if verbose else logging.WARNING)
    dht = logging.getLogger(DHT_LOGGER)  # its processes fork later, with this filter in place
    for previous in [f for f in dht.filters if isinstance(f, _RequestOfAGoneProcess)]:
        dht.removeFilter(previous)
    if not verbose:
        dht.addFilter(_RequestOfAGoneProcess())


class ProgressDisplay:
    """A live line on a terminal; elsewhere (a log file, a service, a notebook's agent) a log line every
    ``log_every_s``."""

    def __init__(self, console: Console, *, log_every_s: float = 60.0):
        self.console, self.log_every_s = console, log_every_s
        self._live: Live | None = None
        self._logged_at = float("-inf")

    def __enter__(self) -> ProgressDisplay:
        if self.console.is_terminal:
            self._live = Live(Text("starting…"), console=self.console, refresh_per_second=2, transient=True)
            self._live.__enter__()
        return self

    def __exit__(self, *exc_info) -> None:
        if self._live is not None:
            self._live.__exit__(*exc_info)
            self._live = None

    def update(self, snap: ProgressSnapshot) -> None:
        line = progress_line(snap)
        if self._live is not None:
            self._live.update(Text(line))
        elif time.monotonic() - self._logged_at >= self.log_every_s:
            self._logged_at = time.monotonic()
            # The fields too, for whoever reads JSON lines: a notebook's panel (peer_agent/notebook.py).
            logger.info("%s", line, extra={"progress": asdict(snap)})


def download_line(what: str, done: int, total: int | None) -> str:
    """A download's progress in one line: a bar and the share done when the size is known."""
    if not total:
        return _("{what}: {done:.1f} MB so far").format(what=what, done=done / 1e6)
    share = min(1.0, done / total)
    filled = round(BAR_WIDTH * share)
    return _("{what}: {bar} {percent:.0f}% ({done:.1f} of {total:.1f} MB)").format(
        what=what, bar="█" * filled + "░" * (BAR_WIDTH - filled), percent=100 * share, done=done / 1e6,
        total=total / 1e6)


BAR_WIDTH = 20


class DownloadProgress:
    """What a volunteer waiting on a download sees (``PortalClient.download``'s ``progress``): a line at most
    every ``every_s`` seconds and at the end, with a bar; in JSON logs the record carries the figures as
    ``download``, which the notebook's panel (peer_agent/notebook.py) shows in place."""

    def __init__(self, what: str, every_s: float = 1.0) -> None:
        self.what, self.every_s, self._shown = what, every_s, -math.inf

    def __call__(self, done: int, total: int | None) -> None:
        now = time.monotonic()
        if now - self._shown < self.every_s and (total is None or done < total):
            return
        self._shown = now
        logger.info(download_line(self.what, done, total),
                    extra={"download": {"what": self.what, "done": done, "total": total}})
