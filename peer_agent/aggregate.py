"""``peer-agent aggregate``: join a run as an aggregator and help average until stopped.

An organizer runs it on a server with a good link (no GPU needed): the portal admits the join only
from the run's organizers, and the access token it signs names the role. The aggregator measures its
bandwidth as ``join`` does, declares it to the swarm, and joins each gradient and parameter round as
hivemind's auxiliary (``peer_agent.aggregator``). It sends no reports: it has no samples to claim, and
the portal would refuse them. Ctrl-C, SIGTERM and ``--max-runtime`` stop it; so do a pause or the end
of the run, or a refresh the portal refuses.
"""

from __future__ import annotations

import argparse
import functools
import logging
import math
import multiprocessing
import time

from rich.console import Console

from peer_agent import __version__
from peer_agent.device import device_info, device_resolve
from peer_agent.exit_status import EXIT_OK, EXIT_STOPPED, EXIT_USAGE
from peer_agent.i18n import _
from peer_agent.join import RUN_POLL_S, StopRequest, _join_when_active, join_request_signed
from peer_agent.portal import PAUSE_CODES, SESSION_OVER_CODES, AccessRefresher, PortalClient, PortalError, RunWatcher, StopReason
from peer_agent.settings import settings_from_args

logger = logging.getLogger(__name__)

STEP_PERIOD_S = 0.1  # how often the aggregator looks whether a round is due, or its group formed


def aggregate_command(args: argparse.Namespace, console: Console) -> int:
    settings = settings_from_args(args)
    settings.require("portal", "run", "token")
    if settings.client_mode == "on":
        logger.error(_("An aggregator must accept connections from the run's peers: it cannot run with --client-mode on"))
        return EXIT_USAGE
    # the ML stack loads only when a command trains: `peer-agent --help`, `login`, `stats` never pay for it
    from hivemind.utils.crypto import RSAPrivateKey
    from hivemind.utils.logging import use_hivemind_log_handler

    from peer_agent.aggregator import Aggregator
    from peer_agent.authorizer import PortalAuthorizer, rsa_public_key_parse
    from peer_agent.bandwidth import declared_bandwidth, measure_probe
    from peer_agent.tokenizer import tokenizer_load
    from peer_agent.training import TrainerSetup

    use_hivemind_log_handler("nowhere")
    logging.getLogger("hivemind").setLevel(logging.INFO if args.verbose else logging.WARNING)
    stop = StopRequest(notice="Leaving the swarm after the current round")
    stop.install()
    deadline = time.monotonic() + settings.max_runtime if settings.max_runtime else math.inf
    with PortalClient(settings.portal, settings.token) as portal:
        key = RSAPrivateKey()
        device = device_resolve("cpu")
        request = functools.partial(join_request_signed, key, run=settings.run, agent_version=__version__,
                                    device=device_info(device, "fp32"), role="aggregator")
        joined = _join_when_active(settings, portal, request, stop, deadline, patient=False)
        if joined is None:
            return EXIT_OK
        logger.info(_("Joined run “%s” as aggregator session %d"), settings.run, joined.session_id)
        files = settings.resolved_cache_dir() / joined.run_id
        tokenizer = portal.download(joined.tokenizer_url, files / "tokenizer.json", authorize=True)
        try:
            measurement = measure_probe(portal, lambda: tokenizer)
        except PortalError as exc:
            logger.warning(_("Could not time transfers to the portal: %s"), exc)
            measurement = None
    bandwidth, source = declared_bandwidth(settings.bandwidth_mbps, measurement, joined.config.averaging.min_bandwidth_mbps)
    logger.info(_("Declaring %.1f Mbit/s: %s"), bandwidth, source)

    refusals = multiprocessing.SimpleQueue()
    refresher = AccessRefresher(settings.portal, settings.token, joined.session_id,
                                joined.hivemind_access.model_dump(mode="json"), refusals)
    authorizer = PortalAuthorizer(key, rsa_public_key_parse(joined.authority_public_key), refresher)
    setup = TrainerSetup(config=joined.config, run_id=joined.run_id, initial_peers=joined.initial_peers,
                         bandwidth=bandwidth, authorizer=authorizer, private_key=key, host_maddrs=[settings.host],
                         announce_maddrs=[settings.announce] if settings.announce else None, threads=settings.threads)
    loaded = tokenizer_load(files / "tokenizer.json")
    with Aggregator(setup, vocab_size=len(loaded), pad_token_id=loaded.pad_token_id) as aggregator:
        stop.install()  # hivemind's averagers set SIGINT to "ignore" in this process when they start
        watcher = RunWatcher(settings.portal, settings.run, RUN_POLL_S)
        try:
            reason = _aggregate_loop(aggregator, stop, deadline, watcher, refusals)
        finally:
            watcher.close()
    logger.info(_("Stopping: %s"), reason.detail)
    return EXIT_OK if reason.code in ("stopped_by_you", "max_runtime") else EXIT_STOPPED


def _aggregate_loop(aggregator, stop: StopRequest, deadline: float, watcher: RunWatcher, refusals) -> StopReason:
    while True:
        if stop.event.is_set():
            return StopReason("stopped_by_you", "stopped by you")
        if time.monotonic() >= deadline:
            return StopReason("max_runtime", "reached --max-runtime")
        while not refusals.empty():
            code, detail = refusals.get()
            if code in PAUSE_CODES or code in SESSION_OVER_CODES:
                return StopReason(code, detail)
        if watcher.reason is not None:
            return watcher.reason
        group = aggregator.step()
        if group:
            logger.info(_("Averaged gradients in a group of %d peers at the collaboration's epoch %d"),
                        group, aggregator.local_epoch)
        elif group is not None:
            logger.warning(_("The gradient round of epoch %d went on without this aggregator"), aggregator.local_epoch)
        stop.event.wait(STEP_PERIOD_S)
