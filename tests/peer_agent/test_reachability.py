"""peer_agent/reachability.py without a network: which addresses a backbone peer agrees to dial back
(only the caller, at its own IP or through this backbone), each rule played by a cheater, and how the
agent's options for a relayed path are built."""

import pytest

from peer_agent.protocol import MAX_DIALBACK_MADDRS, DialBackRequest
from peer_agent.reachability import ELSEWHERE, _daemon_maddr, dialback_targets, relay_options

CALLER = "12D3KooWDZeMRc8hEBjgZByN4rp9CjsuY1LzbQ2rAro9V6fgaSxX"
BACKBONE = "12D3KooWDKyZhaKXHGRXDxrfWnYM8p8biV4aexDfJ9C58kvyUFEw"
OTHER = "12D3KooWQyEJxw56NxTg487yYEMPj193pZgeWDR4LpM9CtAp9cg4"
SEEN_AT = {"11.77.0.2"}


def targets(*maddrs, observed=SEEN_AT):
    return dialback_targets(list(maddrs), caller=CALLER, backbone=BACKBONE, observed_ips=observed)


def test_the_callers_own_addresses_are_dialed_ending_in_its_peer_id():
    dial, refused = targets("/ip4/11.77.0.2/tcp/31337", f"/ip4/11.77.0.2/tcp/31338/p2p/{CALLER}",
                            f"/ip4/11.77.0.1/tcp/4001/p2p/{BACKBONE}/p2p-circuit/p2p/{CALLER}")
    assert dial == [f"/ip4/11.77.0.2/tcp/31337/p2p/{CALLER}", f"/ip4/11.77.0.2/tcp/31338/p2p/{CALLER}",
                    f"/ip4/11.77.0.1/tcp/4001/p2p/{BACKBONE}/p2p-circuit/p2p/{CALLER}"]
    assert refused == []


def test_a_cheater_cannot_make_the_backbone_dial_another_peer():
    dial, refused = targets(f"/ip4/11.77.0.2/tcp/31337/p2p/{OTHER}")
    assert dial == [] and "not the caller's peer id" in refused[0]


def test_a_cheater_cannot_make_the_backbone_scan_another_host():
    """An address at another IP is dialed only at the IP the request came from (as a forwarded port)."""
    dial, refused = targets("/ip4/8.8.8.8/tcp/22", "/ip4/10.78.3.2/tcp/41843")
    assert dial == [f"/ip4/11.77.0.2/tcp/22/p2p/{CALLER}", f"/ip4/11.77.0.2/tcp/41843/p2p/{CALLER}"]
    assert all(ELSEWHERE in reason for reason in refused) and len(refused) == 2
    dial, refused = targets("/ip4/8.8.8.8/tcp/22", observed=set())  # it came in through a relay: no direct dial
    assert dial == [] and ELSEWHERE in refused[0]


def test_a_cheater_cannot_use_the_backbone_to_probe_through_another_relay():
    dial, refused = targets(f"/ip4/11.77.0.9/tcp/4001/p2p/{OTHER}/p2p-circuit/p2p/{CALLER}",
                            f"/ip4/11.77.0.1/tcp/4001/p2p-circuit/p2p/{CALLER}",
                            f"/ip4/11.77.0.1/tcp/4001/p2p/{BACKBONE}/p2p-circuit/p2p/{OTHER}")
    assert dial == []
    assert ["through this backbone" in reason for reason in refused] == [True, True, False]
    assert "not the caller's peer id" in refused[2]


@pytest.mark.parametrize("maddr", ["/ip4/11.77.0.2/udp/4001/quic", "/dns4/example.org/tcp/4001", "/ip4/11.77.0.2/tcp/0",
                                   "/ip4/11.77.0.2/tcp/99999", "/ip4/not-an-ip/tcp/1", "/ip4/11.77.0.2/tcp", "/unix/x"])
def test_anything_but_an_ip_and_tcp_port_is_refused_with_a_reason(maddr):
    dial, refused = targets(maddr)
    assert dial == [] and len(refused) == 1 and refused[0].startswith(maddr)


def test_at_most_eight_addresses_are_asked_for_and_dialed():
    with pytest.raises(ValueError, match="at most 8"):
        DialBackRequest(maddrs=[f"/ip4/11.77.0.2/tcp/{port}" for port in range(1, MAX_DIALBACK_MADDRS + 2)])
    with pytest.raises(ValueError):
        DialBackRequest(maddrs=[])
    dial, _ = targets(*[f"/ip4/11.77.0.2/tcp/{port}" for port in range(1, 20)])
    assert len(dial) == MAX_DIALBACK_MADDRS


def test_peer_ids_inside_an_address_are_written_as_the_daemon_reads_them():
    from hivemind.p2p import PeerID

    encoded = _daemon_maddr(f"/ip4/11.77.0.1/tcp/4001/p2p/{BACKBONE}/p2p-circuit").to_bytes()
    raw = PeerID.from_base58(BACKBONE).to_bytes()
    assert bytes([0xA5, 0x03, len(raw)]) + raw in encoded and encoded.endswith(bytes([0xA2, 0x02]))


def test_only_an_agent_behind_nat_uses_the_backbones_as_static_relays():
    assert relay_options(["/ip4/11.77.0.1/tcp/4001/p2p/X"], relayed=False) == {"use_relay": True}
    relayed = relay_options(["/ip4/11.77.0.1/tcp/4001/p2p/X"], relayed=True)
    assert relayed == dict(use_relay=True, use_auto_relay=True, trusted_relays=["/ip4/11.77.0.1/tcp/4001/p2p/X"],
                           force_reachability="private")
    from hivemind.p2p import P2P

    args = P2P._make_process_args("p2pd", trustedRelays="/ip4/11.77.0.1/tcp/4001/p2p/X", autoRelay=True)
    assert "-relayDiscovery=0" in args, "with discovery on, the daemon waits minutes before using them"
    assert "-relayDiscovery=0" not in P2P._make_process_args("p2pd", autoRelay=True)


class FakeP2P:
    """What the dial-back handler reads of the backbone's daemon: its id and the caller's connections."""

    peer_id = BACKBONE

    async def list_peers(self):
        from types import SimpleNamespace

        return [SimpleNamespace(peer_id=CALLER, addrs=["/ip4/11.77.0.2/tcp/50000"])]


def test_a_garbled_or_oversized_request_is_answered_with_a_reason_and_nothing_is_dialed():
    import asyncio

    from peer_agent.reachability import DialQueue, _dialback_answer

    dialed = []

    async def dial(targets, caller):
        dialed.append(targets)

    for text in ("not json", '{"maddrs": []}', '{"maddrs": ["/ip4/1.2.3.4/tcp/1"], "extra": 1}',
                 '{"maddrs": ["' + "/x" * 300 + '"]}'):
        answer = asyncio.run(_dialback_answer(FakeP2P(), text, CALLER, DialQueue(), dial))
        assert not answer.reachable and answer.detail.startswith("invalid request"), text
    assert dialed == []


def test_the_dial_back_dials_the_caller_where_it_connected_from_and_a_flood_is_turned_away():
    import asyncio

    from peer_agent.reachability import DialQueue, _dialback_answer

    dialed = []

    async def dial(targets, caller):
        dialed.append(targets)
        await asyncio.sleep(0.05)
        return None

    async def flood():
        queue = DialQueue(waiting=2)
        request = '{"maddrs": ["/ip4/10.78.3.2/tcp/4001"]}'
        return await asyncio.gather(*(_dialback_answer(FakeP2P(), request, CALLER, queue, dial) for _ in range(5)))

    answers = asyncio.run(flood())
    assert [answer.reachable for answer in answers] == [True, True, False, False, False]
    assert all("busy" in answer.detail for answer in answers[2:])
    assert dialed == [[f"/ip4/11.77.0.2/tcp/4001/p2p/{CALLER}"]] * 2  # at its router's address, not its own


def test_one_host_cannot_keep_the_dial_back_to_itself_whatever_peer_ids_it_makes():
    import asyncio

    from peer_agent.reachability import DialQueue, _dialback_answer

    dialed = []

    async def dial(targets, caller):
        dialed.append(caller)

    class FreshIdsP2P(FakeP2P):
        """The same host calling with a new peer id each time."""

        async def list_peers(self):
            from types import SimpleNamespace

            return [SimpleNamespace(peer_id=caller, addrs=["/ip4/11.77.0.2/tcp/50000"]) for caller in callers]

    callers = [f"12D3KooWCaller{index}" for index in range(6)]
    queue = DialQueue(per_source=4, window_s=60.0)
    request = '{"maddrs": ["/ip4/11.77.0.2/tcp/4001"]}'
    answers = [asyncio.run(_dialback_answer(FreshIdsP2P(), request, caller, queue, dial)) for caller in callers]
    assert [answer.reachable for answer in answers] == [True] * 4 + [False] * 2
    assert all("from your address" in answer.detail for answer in answers[4:])
    assert dialed == callers[:4]


def test_the_dial_back_budget_is_per_source_and_comes_back_after_its_window():
    from peer_agent.reachability import DialQueue

    queue = DialQueue(per_source=2, window_s=60.0)
    assert queue.admit({"11.77.0.2"}, now=0) and queue.admit({"11.77.0.2"}, now=1)
    assert not queue.admit({"11.77.0.2"}, now=2), "its budget is spent"
    assert not queue.admit({"11.77.0.2", "11.77.0.9"}, now=3), "a second address does not lift it"
    assert queue.admit({"11.77.0.3"}, now=3), "another host has its own"
    assert queue.admit({"11.77.0.2"}, now=61), "the window moved on"
    assert queue.admit({"12D3KooWRelayedOnly"}, now=61), "a caller with no direct connection is counted by peer id"


def test_an_answer_lost_on_its_way_back_is_asked_for_again_and_an_error_answer_is_not(monkeypatch):
    """CI once saw a backbone log "reachable" while the agent's call waited out its timeout."""
    import asyncio

    from google.protobuf.wrappers_pb2 import StringValue

    from peer_agent import reachability
    from peer_agent.protocol import DialBackAnswer

    monkeypatch.setattr(reachability, "CALL_TIMEOUT_S", 0.05)
    reachable = StringValue(value=DialBackAnswer(reachable=True, dialed=["/ip4/11.77.0.2/tcp/4001"]).model_dump_json())

    class Caller:
        def __init__(self, *outcomes):
            self.outcomes, self.asked = list(outcomes), []

        async def call_protobuf_handler(self, peer_id, name, request, answer_type):
            self.asked.append(peer_id.to_base58())
            outcome = self.outcomes.pop(0)
            if outcome == "lost":
                await asyncio.sleep(1)
            if isinstance(outcome, Exception):
                raise outcome
            return outcome

    backbones = [f"/ip4/11.77.0.1/tcp/1/p2p/{BACKBONE}", f"/ip4/11.77.0.9/tcp/1/p2p/{OTHER}"]
    maddrs = ["/ip4/11.77.0.2/tcp/4001"]

    lost_once = Caller("lost", reachable)
    assert asyncio.run(reachability._ask(lost_once, backbones, maddrs)).reachable
    assert lost_once.asked == [BACKBONE, BACKBONE]

    lost_twice = Caller("lost", "lost", reachable)
    assert asyncio.run(reachability._ask(lost_twice, backbones, maddrs)).reachable
    assert lost_twice.asked == [BACKBONE, BACKBONE, OTHER], "after two lost answers, the next backbone"

    refused = Caller(RuntimeError("protocol not supported"), "lost", "lost")
    answer = asyncio.run(reachability._ask(refused, backbones, maddrs))
    assert not answer.reachable and refused.asked == [BACKBONE, OTHER, OTHER]
    assert "protocol not supported" in answer.detail and "no answer within" in answer.detail
