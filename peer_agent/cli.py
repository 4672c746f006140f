"""``peer-agent``: log in to a portal, check this machine, join a run and train, see what you contributed.

The commands are dispatched from :func:`main`; ``join`` lives in :mod:`peer_agent.join`, and the exit
statuses are listed in :mod:`peer_agent.exit_status`.
"""

from __future__ import annotations

import argparse
import getpass
import logging
import os
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from peer_agent import __version__
from peer_agent.aggregate import aggregate_command
from peer_agent.device import device_info, device_resolve
from peer_agent.display import logging_setup
from peer_agent.exit_status import EXIT_FAILED, EXIT_OK, EXIT_STOPPED, EXIT_USAGE
from peer_agent.i18n import _, ngettext
from peer_agent.join import exit_at_once, join_command
from peer_agent.portal import PortalClient, PortalError, PortalRefused
from peer_agent.protocol import RunConfig
from peer_agent.settings import SettingsError, add_arguments, credentials_store, settings_from_args
from peer_agent.spool import spool_files, spool_read

logger = logging.getLogger("peer_agent")


def build_parser() -> argparse.ArgumentParser:
    """The ``peer-agent`` argument parser with its five subcommands."""
    parser = argparse.ArgumentParser(
        prog="peer-agent", description=_("Train a language model together with other volunteers (DeDLOC)."),
        epilog=_("Every option can also be set as PEER_AGENT_<NAME> in the environment (e.g. PEER_AGENT_TOKEN) "
                 "or as <name> in the --config file. Files live in $PEER_AGENT_HOME (default ~/.config/peer-agent)."))
    parser.add_argument("--version", action="version", version=f"peer-agent {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", type=Path, metavar="FILE",
                        help=_("TOML file with settings, e.g. the join page's agent.toml."))
    common.add_argument("-v", "--verbose", action="store_true", help=_("Show debug messages, hivemind's included."))
    common.add_argument("--log-format", choices=["text", "json"], default=os.environ.get("PEER_AGENT_LOG_FORMAT", "text"),
                        help=_("json: one JSON object a line on stderr, with the run and session, and no live progress line."))
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    login = commands.add_parser("login", parents=[common], help=_("Store your agent token for a portal."),
                                description=_("Check an agent token with the portal and store it (mode 0600)."))
    add_arguments(login, only=("portal",))
    login.add_argument("--token", metavar="TOKEN", help=_("Agent token; asked for without echo if not given."))

    join = commands.add_parser("join", parents=[common], help=_("Join a run and train until stopped."),
                               description=_("Join a run, train with the swarm and report your contribution. "
                                             "Ctrl-C stops cleanly."))
    add_arguments(join, positional_run=True)
    join.add_argument("--stop-with-parent", type=int, metavar="PID",
                      help=_("Stop, as Ctrl-C does, once process PID, which started the agent, is gone (a notebook's kernel)."))

    aggregate = commands.add_parser(
        "aggregate", parents=[common], help=_("Help a run average, without training (organizers only)."),
        description=_("Join a run as an aggregator: a server with a good link takes a share of every averaging "
                      "round for the volunteers on thin links. It trains nothing and earns no credit. Ctrl-C stops it."))
    add_arguments(aggregate, positional_run=True, only=("portal", "run", "token", "threads", "client_mode", "bandwidth_mbps",
                                                        "max_runtime", "host", "announce", "cache_dir"))

    check = commands.add_parser("check", parents=[common], help=_("Show the device, precision, bandwidth and client mode."),
                                description=_("What `join` would use on this machine, without joining."))
    add_arguments(check, positional_run=True, only=("portal", "run", "token", "device", "client_mode", "host",
                                                    "announce", "bandwidth_mbps", "backbone"))

    status = commands.add_parser("status", parents=[common], help=_("Show your contribution recorded on this machine."),
                                 description=_("Sessions, samples reported, acknowledged by the portal and still pending."))
    add_arguments(status, only=("spool_dir",))
    return parser


def run() -> None:
    """The ``peer-agent`` command (console script and ``python -m peer_agent``): :func:`main`, then an
    exit that waits for nothing more (peer_agent.join.exit_at_once): what the agent keeps is on disk by then."""
    exit_at_once(main())


def main(argv: list[str] | None = None) -> int:
    """The ``peer-agent`` command's work; its exit status."""
    args = build_parser().parse_args(argv)
    # No live progress line in JSON mode: every line on stderr is a log record then.
    console = Console(stderr=True, force_terminal=False if args.log_format == "json" else None)
    logging_setup(console, verbose=args.verbose, log_format=args.log_format)
    command = {"login": login_command, "join": join_command, "aggregate": aggregate_command, "check": check_command,
               "status": status_command}
    try:
        return command[args.command](args, console)
    except SettingsError as exc:
        logger.error("%s", exc)
        return EXIT_USAGE
    except PortalRefused as exc:
        logger.error(_("The portal refused: %s"), exc.detail)
        return EXIT_USAGE if exc.status in (400, 401, 403, 404) else EXIT_STOPPED
    except PortalError as exc:
        logger.error("%s", exc)
        return EXIT_FAILED
    except KeyboardInterrupt:
        logger.warning(_("Interrupted"))
        return 130
    except Exception as exc:
        logger.error(_("peer-agent failed: %s"), exc, exc_info=args.verbose)
        if not args.verbose:
            logger.error(_("Run the command again with --verbose for details"))
        return EXIT_FAILED


def login_command(args: argparse.Namespace, console: Console) -> int:
    portal_url = settings_from_args(args).portal
    if portal_url is None:
        raise SettingsError(_("no portal given: pass --portal URL (the address of the portal's home page)"))
    token = args.token or os.environ.get("PEER_AGENT_TOKEN") or getpass.getpass(_("Agent token (not shown): ")).strip()
    if not token:
        raise SettingsError(_("no token given: create one on your profile or a run's join page"))
    with PortalClient(portal_url, token, attempts=3) as portal:
        me = portal.me()
    path = credentials_store(portal_url, token)
    limited = _(", limited to run “{run}”").format(run=me["token_run"]) if me.get("token_run") else ""
    print(_("Logged in to {portal} as {username} (token “{token}”{limited}, expires {expires}). Stored in {path}.").format(
        portal=portal_url, username=me["username"], token=me.get("token_name", "?"), limited=limited,
        expires=me.get("token_expires_at", "?"), path=path))
    return EXIT_OK


def status_command(args: argparse.Namespace, console: Console) -> int:
    settings = settings_from_args(args)
    spool_dir = settings.resolved_spool_dir()
    files = spool_files(spool_dir) if spool_dir.exists() else []
    if not files:
        print(_("No training sessions recorded in {folder} yet.").format(folder=spool_dir))
        return EXIT_OK
    table = Table(title=_("Your contribution recorded in {folder}").format(folder=spool_dir))
    for column in ("session", "run", "started", "reports", "samples", "acknowledged", "pending", "dropped"):
        table.add_column(column, justify="left" if column in ("run", "started") else "right")
    totals = [0, 0, 0, 0]
    for path in files:
        _header, s = spool_read(path)
        pending = f"{len(s.pending)} ({s.pending_samples} samples)"
        table.add_row(str(s.session_id), s.run or "?", (s.created_at or "?").replace("T", " "), str(s.last_seq),
                      str(s.reported_samples), str(s.acked_samples), pending, str(s.dropped_samples))
        for i, value in enumerate((s.reported_samples, s.acked_samples, s.pending_samples, len(s.pending))):
            totals[i] += value
    Console(width=140).print(table)
    sessions = ngettext("{reported} samples reported in {count} session", "{reported} samples reported in {count} sessions",
                        len(files)).format(reported=totals[0], count=len(files))
    print(_("Total: {sessions}, {acknowledged} acknowledged by the portal, {pending} in {reports} reports waiting to be "
            "sent (they go out when you next run `peer-agent join`).").format(
        sessions=sessions, acknowledged=totals[1], pending=totals[2], reports=totals[3]))
    return EXIT_OK


def check_command(args: argparse.Namespace, console: Console) -> int:
    # the ML stack loads only when a command trains: `peer-agent --help`, `login`, `stats` never pay for it
    from peer_agent.bandwidth import client_mode_choose, declared_bandwidth, measure_probe
    from peer_agent.model import averaged_bytes, precision_choose, precision_describe
    from peer_agent.reachability import reachability_probe

    settings = settings_from_args(args)
    config, measurement = RunConfig(), None
    if settings.portal and settings.run:
        with PortalClient(settings.portal, settings.token, attempts=2) as portal:
            config = RunConfig.model_validate(portal.run_summary(settings.run)["config"])
            if settings.token:
                with tempfile.TemporaryDirectory() as scratch:
                    url = f"{settings.portal}/api/v1/runs/{settings.run}/tokenizer.json"
                    try:
                        measurement = measure_probe(
                            portal, lambda: portal.download(url, Path(scratch) / "tokenizer.json", authorize=True))
                    except PortalError as exc:
                        print(_("Bandwidth not measured: {reason}").format(reason=exc))
    device = device_resolve(settings.device)
    precision = precision_choose(device, config.training.precision)
    info = device_info(device, precision)
    reach = None
    if settings.backbone:
        print(_("Asking the backbone peer to dial this machine back (directly, then through its relay)..."), flush=True)
        reach = reachability_probe([settings.backbone], host_maddrs=[settings.host],
                                   announce_maddrs=[settings.announce] if settings.announce else None)
    vector_bytes = averaged_bytes(config) if reach is not None and reach.path == "relayed" else None
    client_mode, why = client_mode_choose(settings.client_mode, config.averaging.client_mode, reach, vector_bytes)
    bandwidth, source = declared_bandwidth(settings.bandwidth_mbps, measurement, config.averaging.min_bandwidth_mbps)
    memory = f", {info.memory_gb:.1f} GB" if info.memory_gb else ""
    print(f"Device:       {info.kind} ({info.name}{memory})")
    print(f"Precision:    {precision_describe(precision)}")
    print(f"Bandwidth:    {measurement.describe() if measurement else 'not measured (give a portal, run and token)'}")
    print(f"Declared:     {bandwidth:.1f} Mbit/s, {source}")
    unchecked = _("not checked (pass --backbone MADDR, a backbone peer of the run, for a dial-back)")
    print(f"Reachability: {reach.describe() if reach else unchecked}")
    print(f"Client mode:  {'on' if client_mode else 'off'} ({why})")
    return EXIT_OK


if __name__ == "__main__":
    run()
