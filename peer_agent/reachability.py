"""Volunteers behind NAT: circuit relays through the run's backbone peers, and reachability learned
by being dialed back.

**Relays.** The p2p daemon bundled with hivemind 1.1.12 (go-libp2p 0.32) serves as a circuit relay
(v2) whenever relaying is on (``use_relay``, hivemind's default), so every backbone peer relays;
``relay_hop_limit`` is a no-op in that daemon. An agent that nobody can dial starts its daemon with
auto-relay and the run's backbone peers as its static relays (:func:`relay_options`): it reserves a
slot on each and announces ``<backbone>/p2p-circuit/p2p/<agent>`` addresses, through which other
peers, NATed ones included, dial it and average with it. Two traps of that daemon are handled here:
given static relays, it still waits for four relay candidates or three minutes before reserving
any, unless relay discovery is off, which hivemind's ``P2P.create`` cannot say
(:func:`static_relays_enable`); and it keeps private addresses out of relayed ones, so a relay must
have a public address (``harness.netlab.PUBLIC_SUBNET`` in tests). Its AutoNAT service also enables
hole punching (DCUtR) on every peer, which may turn a relayed connection into a direct one where
both NATs allow it; nothing here depends on that. And its relays are *limited*
(:data:`RELAY_DATA_LIMIT_BYTES`): fine for the DHT and a small model's rounds, too small for a real
model's, so an agent whose rounds would not fit averages in client mode (``peer_agent.bandwidth``).

**Dial-back.** Whether an agent is reachable is not guessed from its address: the agent asks a
backbone peer (:data:`DIALBACK_HANDLER`) to dial it back, first at its direct addresses, then at its
relayed ones (:func:`reachability_probe`). The backbone dials with a fresh daemon of its own, so a
connection the agent opened does not count, and the peer id checked by the handshake is the
caller's. It dials only the caller: direct addresses must be at the IP the request came from, relayed
ones through this backbone, all ending in the caller's peer id (:func:`dialback_targets`); one dial
at a time, so that the service costs the backbone at most one daemon.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from dataclasses import dataclass

from pydantic import ValidationError

from peer_agent.i18n import _
from peer_agent.protocol import MAX_DIALBACK_MADDRS, DialBackAnswer, DialBackRequest

logger = logging.getLogger(__name__)

DIALBACK_HANDLER = "dedloc.dialback"
DIAL_TIMEOUT_S = 10.0
PROBE_STARTUP_S = 60.0
RELAY_WAIT_S = 20.0
# The p2p daemon exits when it reaches none of its initial peers within its own short dial timeout:
# on a loaded machine (a CI run beside a demo) a natted host's first dial through its router once
# missed it and the whole check answered "none". A peer that is really down fails every try.
PROBE_START_TRIES = 3
PROBE_RETRY_PAUSE_S = 2.0
CALL_TIMEOUT_S = DIAL_TIMEOUT_S + PROBE_STARTUP_S
# A backbone's answer can be lost on its way back: CI once saw a backbone log "reachable" 1 s after
# the request while the agent waited out CALL_TIMEOUT_S for it, and the check answered "none". An
# unanswered request is asked once more; a backbone that answers with an error is not.
ASK_TRIES = 2
ELSEWHERE = "not the IP address the request came from"
# What one relayed connection carries, each way, before the relay resets it: the p2p daemon of
# hivemind 1.1.12 serves relays with go-libp2p's default limits (128 KiB, 2 min), whatever its
# -relayDataLimit says (it starts a second, default relay service after the configured one). Measured
# in the NAT lab: a 100 kB message crossed, a 1 MB one was reset. Averaging through a relay is used
# only for a vector of at most a quarter of it, so that a few rounds cross before a reset.
RELAY_DATA_LIMIT_BYTES = 128 << 10
RELAYED_VECTOR_MAX_BYTES = RELAY_DATA_LIMIT_BYTES // 4


@dataclass(frozen=True)
class Reachability:
    """How other peers can reach this agent: ``"direct"``, ``"relayed"`` (through a backbone peer)
    or ``"none"`` (client mode), and why, for the volunteer."""

    path: str
    reason: str
    maddrs: tuple[str, ...] = ()

    @property
    def reachable(self) -> bool:
        return self.path != "none"

    def describe(self) -> str:
        """One line for the volunteer, in their language (the reason's details stay as the daemon said them)."""
        if self.path == "direct":
            return _("reachable directly ({reason})").format(reason=self.reason)
        if self.path == "relayed":
            return _("reachable through a backbone peer's relay ({reason})").format(reason=self.reason)
        return _("not reachable, neither directly nor through a relay ({reason})").format(reason=self.reason)


def static_relays_enable() -> None:
    """Make a p2p daemon given ``trusted_relays`` reserve slots on them at once: with relay discovery
    on (the daemon's default, which hivemind 1.1.12 cannot change) it waits for four candidates or
    three minutes first. Wraps hivemind's private ``P2P._make_process_args``; idempotent, and
    inherited by the DHT's forked process when called before the DHT starts."""
    # hivemind loads only when a daemon is dialled: the CLI imports this module at start (peer_agent/join.py)
    from hivemind.p2p import P2P

    original = P2P._make_process_args
    if getattr(original, "static_relays", False):
        return

    def process_args(*args, **kwargs):
        if kwargs.get("trustedRelays"):
            kwargs["relayDiscovery"] = False
        return original(*args, **kwargs)

    process_args.static_relays = True
    P2P._make_process_args = staticmethod(process_args)


def relay_options(initial_peers: list[str], *, relayed: bool) -> dict:
    """Keyword arguments for ``hivemind.DHT`` (and its ``P2P``): relaying on; and, for an agent only
    reachable through a relay, auto-relay with the run's backbone peers as its static relays. It
    declares itself private (its dial-back said so), so that the daemon does not wait for AutoNAT."""
    options = dict(use_relay=True)
    if relayed:
        static_relays_enable()
        options.update(use_auto_relay=True, trusted_relays=list(initial_peers), force_reachability="private")
    return options


# ---------------------------------------------------------------- the backbone's side

def _split(maddr: str) -> list[tuple[str, str]]:
    """``/ip4/1.2.3.4/tcp/5/p2p/X/p2p-circuit`` as (protocol, value) pairs; ``p2p-circuit`` has no value."""
    parts, pairs = maddr.strip("/").split("/"), []
    while parts:
        name = parts.pop(0)
        if name == "p2p-circuit":
            pairs.append((name, ""))
        elif parts and parts[0]:
            pairs.append((name, parts.pop(0)))
        else:
            raise ValueError(f"/{name} has no value")
    return pairs


def dialback_targets(maddrs: list[str], *, caller: str, backbone: str,
                     observed_ips: set[str]) -> tuple[list[str], list[str]]:
    """The addresses of ``maddrs`` the backbone may dial for ``caller``, each ending in
    ``/p2p/<caller>``, and the others with the reason. Direct: ``/ip4|ip6/<ip>/tcp/<port>`` at an IP
    of ``observed_ips`` (where the request came from); a port at another IP (the caller's own behind a
    NAT) is dialed at the observed IPs instead, as a forwarded port would be. Relayed: a direct address of this backbone
    (``/p2p/<backbone>``) followed by ``/p2p-circuit``."""
    targets, refused = [], []
    for maddr in maddrs[:MAX_DIALBACK_MADDRS]:
        try:
            pairs = _split(maddr)
        except ValueError as exc:
            refused.append(f"{maddr}: {exc}")
            continue
        if pairs and pairs[-1][0] == "p2p":
            if pairs[-1][1] != caller:
                refused.append(f"{maddr}: not the caller's peer id")
                continue
            pairs = pairs[:-1]
        circuit = [i for i, (name, _) in enumerate(pairs) if name == "p2p-circuit"]
        if circuit:
            relay = pairs[:circuit[0]]
            if circuit != [len(pairs) - 1] or not relay or relay[-1] != ("p2p", backbone):
                refused.append(f"{maddr}: a relayed address must go through this backbone peer")
                continue
            pairs = relay[:-1]
        problem = _direct_problem(pairs, None if circuit else observed_ips)
        if problem == ELSEWHERE:
            # Its own address behind a NAT: what a forwarded port would make of it, at the NAT's address.
            targets += [f"/{pairs[0][0]}/{ip}/tcp/{pairs[1][1]}/p2p/{caller}" for ip in sorted(observed_ips)
                        if pairs[0][0] == ("ip4" if ipaddress.ip_address(ip).version == 4 else "ip6")]
        if problem:
            refused.append(f"{maddr}: {problem}")
            continue
        targets.append(maddr if maddr.endswith(f"/p2p/{caller}") else f"{maddr.rstrip('/')}/p2p/{caller}")
    return list(dict.fromkeys(targets))[:MAX_DIALBACK_MADDRS], refused


def _direct_problem(pairs: list[tuple[str, str]], observed_ips: set[str] | None) -> str | None:
    if len(pairs) != 2 or pairs[0][0] not in ("ip4", "ip6") or pairs[1][0] != "tcp":
        return "only /ip4 or /ip6 TCP addresses are dialed"
    try:
        ip, port = ipaddress.ip_address(pairs[0][1]), int(pairs[1][1])
    except ValueError:
        return "not an IP address and port"
    if not 0 < port < 65536:
        return "no such port"
    if observed_ips is not None and str(ip) not in observed_ips:
        return ELSEWHERE
    return None


async def _observed_ips(p2p, caller) -> set[str]:
    """The IPs of the connections ``caller`` has to this daemon (none when it came through a relay)."""
    ips = set()
    for info in await p2p.list_peers():
        if info.peer_id == caller:
            for maddr in info.addrs:
                pairs = _split(str(maddr))
                if pairs and pairs[0][0] in ("ip4", "ip6") and all(name != "p2p-circuit" for name, _ in pairs):
                    ips.add(str(ipaddress.ip_address(pairs[0][1])))
    return ips


async def _dial(targets: list[str], caller) -> str | None:
    """Dial ``caller`` at ``targets`` from a fresh daemon (its own identity, no swarm); None when it
    connected, else why not."""
    # hivemind loads only when a daemon is dialled: the CLI imports this module at start (peer_agent/join.py)
    from hivemind.p2p import P2P

    prober = await P2P.create(host_maddrs=["/ip4/0.0.0.0/tcp/0"], dht_mode="client", auto_nat=False,
                              nat_port_map=False, use_relay=True, startup_timeout=PROBE_STARTUP_S)
    try:
        dial = [_daemon_maddr(target.removesuffix(f"/p2p/{caller}")) for target in targets]
        await asyncio.wait_for(prober._client.connect(caller, dial), DIAL_TIMEOUT_S)
        return None
    except TimeoutError:
        return f"no answer within {DIAL_TIMEOUT_S:g} s"
    except Exception as exc:  # the daemon's dial error, whatever it says
        return _first_line(exc)
    finally:
        await prober.shutdown()


def dialback_install(dht) -> None:
    """Serve dial-back requests on ``dht``'s p2p daemon (a backbone peer's)."""
    dht.run_coroutine(dialback_serve)


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:300] if str(exc).strip() else type(exc).__name__


def _daemon_maddr(maddr: str):
    """``maddr`` as the daemon reads it. hivemind's multiaddr library writes a ``/p2p/`` part as a CID,
    which the daemon cannot decode (it expects the peer id's bytes), so those parts are written here."""
    # hivemind loads only when a daemon is dialled: the CLI imports this module at start (peer_agent/join.py)
    from hivemind.p2p import PeerID
    from hivemind.utils.multiaddr import Multiaddr

    encoded = b""
    for name, value in _split(maddr):
        if name == "p2p":
            raw = PeerID.from_base58(value).to_bytes()
            encoded += bytes([0xA5, 0x03]) + _varint(len(raw)) + raw  # 421, the p2p protocol's code
        else:
            encoded += Multiaddr(f"/{name}/{value}" if value else f"/{name}").to_bytes()
    return Multiaddr(encoded)


def _varint(number: int) -> bytes:
    out = b""
    while True:
        byte, number = number & 0x7F, number >> 7
        out += bytes([byte | (0x80 if number else 0)])
        if not number:
            return out


async def dialback_serve(dht, node) -> None:
    """Runs in the backbone's DHT process (``dht.run_coroutine``): answer dial-back requests."""
    # protobuf's wrappers load with hivemind's daemon bindings, only when one is used
    from google.protobuf.wrappers_pb2 import StringValue

    p2p = node.p2p
    queue = DialQueue()

    async def handle(request: StringValue, context) -> StringValue:
        answer = await _dialback_answer(p2p, request.value, context.remote_id, queue)
        return StringValue(value=answer.model_dump_json())

    await p2p.add_protobuf_handler(DIALBACK_HANDLER, handle, StringValue)


class DialQueue:
    """One dial at a time, and at most ``waiting`` callers waiting for it: a flood of requests costs
    the backbone one short-lived daemon at a time, and the rest are told to come back. And at most
    ``per_source`` dials in ``window_s`` for one source (the IPs the caller is connected from, or its
    peer id when it has no direct connection): peer ids cost nothing to make, addresses do, so one
    host cannot keep the queue to itself. An agent asks at most twice per check (direct, then
    relayed), and each once more when its answer was lost (``ASK_TRIES``), CALL_TIMEOUT_S later."""

    def __init__(self, waiting: int = 4, per_source: int = 4, window_s: float = 60.0) -> None:
        self.lock, self.waiting, self.limit = asyncio.Lock(), 0, waiting
        self.per_source, self.window_s = per_source, window_s
        self._dials: dict[str, list[float]] = {}  # source -> times of its dials within the window

    def full(self) -> bool:
        return self.waiting >= self.limit

    def admit(self, sources: set[str], now: float | None = None) -> bool:
        """Count a dial for ``sources``; False, counting nothing, when one of them used its budget."""
        now = time.monotonic() if now is None else now
        self._dials = {source: kept for source, times in self._dials.items()
                       if (kept := [at for at in times if now - at < self.window_s])}
        if any(len(self._dials.get(source, ())) >= self.per_source for source in sources):
            return False
        for source in sources:
            self._dials.setdefault(source, []).append(now)
        return True


async def _dialback_answer(p2p, text: str, caller, queue: DialQueue, dial=None) -> DialBackAnswer:
    try:
        request = DialBackRequest.model_validate_json(text)
    except ValidationError as exc:
        return DialBackAnswer(reachable=False, detail=f"invalid request: {exc.errors()[0]['msg']}"[:2000])
    observed_ips = await _observed_ips(p2p, caller)
    targets, refused = dialback_targets(request.maddrs, caller=str(caller), backbone=str(p2p.peer_id),
                                        observed_ips=observed_ips)
    if not targets:
        return DialBackAnswer(reachable=False, refused=refused,
                              detail=f"no address this backbone may dial ({'; '.join(refused)})"[:2000])
    if queue.full():
        return DialBackAnswer(reachable=False, refused=refused, detail="busy: too many dial-backs waiting; ask again later")
    if not queue.admit(observed_ips or {str(caller)}):
        return DialBackAnswer(reachable=False, refused=refused,
                              detail=f"busy: more than {queue.per_source} dial-backs from your address within "
                                     f"{queue.window_s:g} s; ask again later")
    queue.waiting += 1
    try:
        async with queue.lock:
            problem = await (dial or _dial)(targets, caller)
    finally:
        queue.waiting -= 1
    logger.info("dial-back to %s: %s", caller, problem or "reachable")
    return DialBackAnswer(reachable=problem is None, dialed=targets, refused=refused, detail=problem or "")


# ---------------------------------------------------------------- the agent's side

def _peer_id(maddr: str) -> str | None:
    pairs = _split(maddr)
    return pairs[-1][1] if pairs and pairs[-1][0] == "p2p" else None


async def _ask(p2p, backbones: list[str], maddrs: list[str]) -> DialBackAnswer:
    """Ask each backbone peer in turn to dial ``maddrs``; the first answer."""
    # protobuf's wrappers load with hivemind's daemon bindings, only when one is used
    from google.protobuf.wrappers_pb2 import StringValue
    from hivemind.p2p import PeerID

    problems = []
    request = StringValue(value=DialBackRequest(maddrs=maddrs[:MAX_DIALBACK_MADDRS]).model_dump_json())
    for backbone in dict.fromkeys(filter(None, map(_peer_id, backbones))):
        for attempt in range(1, ASK_TRIES + 1):
            try:
                answer = await asyncio.wait_for(p2p.call_protobuf_handler(
                    PeerID.from_base58(backbone), DIALBACK_HANDLER, request, StringValue), CALL_TIMEOUT_S)
                return DialBackAnswer.model_validate_json(answer.value)
            except TimeoutError:
                problems.append(f"{backbone[-8:]}: no answer within {CALL_TIMEOUT_S:g} s (try {attempt})")
            except Exception as exc:  # an older backbone without the handler, or one that is down: the next
                problems.append(f"{backbone[-8:]}: {_first_line(exc)}")
                break
    return DialBackAnswer(reachable=False, detail="no backbone peer answered: " + "; ".join(problems)[:1900])


def _dialable(maddrs: list[str], *, relayed: bool) -> list[str]:
    """This peer's addresses worth a dial-back: relayed ones, or direct ones, off loopback unless
    that is all there is (a peer listening on loopback only, as in tests)."""
    if relayed:
        return [maddr for maddr in maddrs if "/p2p-circuit" in maddr]
    direct = [maddr for maddr in maddrs if "/p2p-circuit" not in maddr]
    return [maddr for maddr in direct if not maddr.startswith(("/ip4/127.", "/ip6/::1/"))] or direct


async def _probe_path(initial_peers: list[str], *, relayed: bool, host_maddrs: list[str],
                      announce_maddrs: list[str] | None) -> tuple[DialBackAnswer, list[str]]:
    # hivemind loads only when a daemon is dialled: the CLI imports this module at start (peer_agent/join.py)
    from hivemind.p2p import P2P, P2PDaemonError

    for attempt in range(1, PROBE_START_TRIES + 1):
        try:
            p2p = await P2P.create(initial_peers=initial_peers, host_maddrs=host_maddrs,
                                   announce_maddrs=None if relayed else announce_maddrs, dht_mode="client",
                                   startup_timeout=PROBE_STARTUP_S, **relay_options(initial_peers, relayed=relayed))
            break
        except P2PDaemonError as exc:
            if "bootstrap" not in str(exc) or attempt == PROBE_START_TRIES:
                raise
            logger.debug("dial-back: the p2p daemon reached no backbone peer (try %d): %s", attempt, exc)
            await asyncio.sleep(PROBE_RETRY_PAUSE_S)
    try:
        deadline = time.monotonic() + (RELAY_WAIT_S if relayed else 0)
        while True:  # a relayed address appears once a backbone peer granted a reservation
            maddrs = _dialable([str(maddr) for maddr in await p2p.get_visible_maddrs(latest=True)], relayed=relayed)
            if maddrs or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.5)
        if not maddrs:
            what = "no backbone peer granted a relay reservation" if relayed else "no address to dial"
            return DialBackAnswer(reachable=False, detail=what), []
        return await _ask(p2p, initial_peers, maddrs), maddrs
    finally:
        await p2p.shutdown()


async def reachability_probe_async(initial_peers: list[str], *, host_maddrs: list[str],
                                   announce_maddrs: list[str] | None = None) -> Reachability:
    """Direct if a backbone peer dialed this machine at its own addresses; else relayed if it dialed
    it through itself as a relay; else none (client mode)."""
    if not initial_peers:
        return Reachability("none", "no backbone peer to dial this machine back")
    try:
        return await _paths_probe(initial_peers, host_maddrs=host_maddrs, announce_maddrs=announce_maddrs)
    except Exception as exc:  # the p2p daemon did not start, or none of the backbone peers answered
        logger.debug("dial-back failed", exc_info=True)
        return Reachability("none", f"the check itself failed: {_first_line(exc)}")


async def _paths_probe(initial_peers: list[str], *, host_maddrs: list[str],
                       announce_maddrs: list[str] | None) -> Reachability:
    direct, tried = await _probe_path(initial_peers, relayed=False, host_maddrs=host_maddrs,
                                      announce_maddrs=announce_maddrs)
    if direct.reachable:
        return Reachability("direct", f"a backbone peer dialed {direct.dialed[0]}", tuple(direct.dialed))
    why_not = direct.detail or "; ".join(direct.refused)
    relayed, _ = await _probe_path(initial_peers, relayed=True, host_maddrs=host_maddrs, announce_maddrs=None)
    if relayed.reachable:
        return Reachability("relayed", f"not directly ({why_not}), but through a backbone peer's relay",
                            tuple(relayed.dialed))
    logger.debug("dial-back: direct %s (tried %s); relayed %s", direct, tried, relayed)
    return Reachability("none", f"not directly ({why_not}) nor through a relay ({relayed.detail})")


def reachability_probe(initial_peers: list[str], *, host_maddrs: list[str],
                       announce_maddrs: list[str] | None = None) -> Reachability:
    """:func:`reachability_probe_async` from synchronous code (the CLI)."""
    return asyncio.run(reachability_probe_async(initial_peers, host_maddrs=host_maddrs,
                                                announce_maddrs=announce_maddrs))
