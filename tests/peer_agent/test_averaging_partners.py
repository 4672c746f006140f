"""The agent's gradient averager averages only with peers that prove they hold an access token
(peer_agent.averaging: membership proofs)."""

import secrets
import threading
import time
from datetime import timedelta

import pytest
import torch
from hivemind.dht import DHT
from hivemind.p2p import PeerID
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils.serializer import MSGPackSerializer

from peer_agent import authorizer as authorizer_module
from peer_agent.authorizer import PortalAuthorizer, access_token_from_json
from peer_agent.averaging import FlooredGradientAverager, MembershipCheck, membership_payload, membership_proof
from peer_agent.training import Trainer, TrainerSetup
from runs.authority import access_token_sign
from tests.peer_agent.test_training_swarm import train_together

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def authority():
    return RSAPrivateKey()


@pytest.fixture(scope="module")
def other_authority():
    return RSAPrivateKey()


def token_json(authority: RSAPrivateKey, peer_key: RSAPrivateKey, *, lifetime=timedelta(minutes=10)) -> dict:
    return access_token_sign(private_key=authority, username="vik", peer_public_key=peer_key.get_public_key().to_bytes(),
                             lifetime=lifetime)


def peer_authorizer(authority: RSAPrivateKey, peer_key: RSAPrivateKey | None = None, **token_kwargs) -> PortalAuthorizer:
    """A peer's authorizer whose portal issues a token signed by ``authority``."""
    peer_key = peer_key or RSAPrivateKey()
    token = token_json(authority, peer_key, **token_kwargs)
    return PortalAuthorizer(peer_key, authority.get_public_key(), lambda: token)


def random_peer_id() -> PeerID:
    return PeerID(secrets.token_bytes(34))


def proof_bytes(proof) -> bytes:
    """A proof as the averager finds it in a member's gathered data."""
    return MSGPackSerializer.dumps(proof)


def hand_made_proof(token: dict, peer_key: RSAPrivateKey, peer_id: PeerID) -> bytes:
    """A proof built around any token, even one that the agent's authorizer would not hold."""
    token = access_token_from_json(token)
    return proof_bytes([token.SerializeToString(), peer_key.sign(membership_payload(peer_id))])


def test_a_proof_admits_the_peer_it_was_made_for(authority):
    peer_id = random_peer_id()
    proof = proof_bytes(membership_proof(peer_authorizer(authority), peer_id))
    assert MembershipCheck(peer_authorizer(authority)).refusal(proof, peer_id) is None


def test_a_proof_replayed_by_another_peer_is_refused(authority):
    proof = proof_bytes(membership_proof(peer_authorizer(authority), random_peer_id()))
    refusal = MembershipCheck(peer_authorizer(authority)).refusal(proof, random_peer_id())
    assert refusal is not None and "without proving it holds its key for this peer id" in refusal


def test_a_token_held_by_another_key_is_refused(authority):
    """The token is genuine, but the signature over the peer id is made with a key it does not name."""
    peer_id = random_peer_id()
    proof = hand_made_proof(token_json(authority, RSAPrivateKey()), RSAPrivateKey(), peer_id)
    assert "without proving it holds its key" in MembershipCheck(peer_authorizer(authority)).refusal(proof, peer_id)


def test_an_expired_token_is_refused(authority):
    peer_key, peer_id = RSAPrivateKey(), random_peer_id()
    proof = hand_made_proof(token_json(authority, peer_key, lifetime=timedelta(seconds=-1)), peer_key, peer_id)
    assert "holds no valid access token" in MembershipCheck(peer_authorizer(authority)).refusal(proof, peer_id)


def test_a_token_signed_by_another_authority_is_refused(authority, other_authority):
    peer_id = random_peer_id()
    proof = proof_bytes(membership_proof(peer_authorizer(other_authority), peer_id))
    assert "holds no valid access token" in MembershipCheck(peer_authorizer(authority)).refusal(proof, peer_id)


def test_a_peer_that_sends_no_proof_is_refused(authority):
    """An agent from before membership proofs, or plain hivemind, gathers None."""
    refusal = MembershipCheck(peer_authorizer(authority)).refusal(proof_bytes(None), random_peer_id())
    assert "sent no membership proof" in refusal


@pytest.mark.parametrize("proof", [
    b"\xc1 not msgpack", b"", proof_bytes("text"), proof_bytes([1, 2]), proof_bytes([b"not a token", b"x"]),
    proof_bytes([b"a", b"b", b"c"]), proof_bytes({"token": b"x"}),
], ids=["garbage", "empty", "text", "numbers", "bad-token", "three-parts", "map"])
def test_a_malformed_proof_is_refused_without_an_exception(authority, proof):
    assert MembershipCheck(peer_authorizer(authority)).refusal(proof, random_peer_id()) == "sent a malformed membership proof"


def test_a_signature_that_is_not_bytes_is_refused(authority):
    peer_key, peer_id = RSAPrivateKey(), random_peer_id()
    token = access_token_from_json(token_json(authority, peer_key))
    proof = proof_bytes([token.SerializeToString(), 12345])
    assert "without proving" in MembershipCheck(peer_authorizer(authority)).refusal(proof, peer_id)


def test_a_remembered_proof_is_refused_once_its_token_expires(authority, monkeypatch):
    peer_key, peer_id = RSAPrivateKey(), random_peer_id()
    proof = hand_made_proof(token_json(authority, peer_key, lifetime=timedelta(minutes=1)), peer_key, peer_id)
    check = MembershipCheck(peer_authorizer(authority))
    assert check.refusal(proof, peer_id) is None
    assert check.refusal(proof, peer_id) is None, "remembered"
    later = authorizer_module.get_dht_time() + 120
    monkeypatch.setattr(authorizer_module, "get_dht_time", lambda: later)
    monkeypatch.setattr("peer_agent.averaging.get_dht_time", lambda: later)
    assert "holds no valid access token" in check.refusal(proof, peer_id)


def test_the_training_thread_refreshes_its_own_token_when_due(authority, monkeypatch):
    """hivemind refreshes only the DHT process's copy of the authorizer; the proof's copy fetches its own."""
    peer_key = RSAPrivateKey()
    tokens = [token_json(authority, peer_key, lifetime=timedelta(minutes=1)), token_json(authority, peer_key)]
    fetched = []

    def fetch_token():
        fetched.append(tokens[len(fetched)])
        return fetched[-1]

    authorizer = PortalAuthorizer(peer_key, authority.get_public_key(), fetch_token)
    first = authorizer.access_token_current()
    assert authorizer.access_token_current() is first and len(fetched) == 1, "not fetched again before it is due"
    later = authorizer_module.get_dht_time() + 45  # past two thirds of its lifetime
    monkeypatch.setattr(authorizer_module, "get_dht_time", lambda: later)
    second = authorizer.access_token_current()
    assert len(fetched) == 2 and second.expiration_time == tokens[1]["expiration_time"]


@pytest.mark.parametrize("outsider_starts_after", [0.0, 1.5], ids=["outsider-leads", "outsider-follows"])
def test_a_group_with_an_outsider_averages_only_among_token_holders(authority, outsider_starts_after, monkeypatch,
                                                                    tmp_path, reap_children):
    """Three agents with tokens of one run and an outsider look for a group of four at once. The
    outsider runs the agent's averager without an authorizer: plain hivemind's behaviour (it sends no
    proof and admits anyone) under the RPC names the agents use (``<prefix>::<class name>.<method>``).
    The DHTs check no tokens here, so it finds the group through matchmaking: only the averagers' own
    check keeps it out. Starting first, the outsider usually leads (the agents' members then refuse
    its group); starting later, it usually asks an agent to lead (which refuses its request)."""
    refused = tmp_path / "refused.txt"
    check_refusal = MembershipCheck.refusal

    def refusal_recorded(self, proof, peer_id):
        """Writes down whom the averagers (child processes) refused, so the test knows the outsider took part."""
        reason = check_refusal(self, proof, peer_id)
        if reason is not None:
            with refused.open("a") as file:
                file.write(f"{peer_id}\n")
        return reason

    monkeypatch.setattr(MembershipCheck, "refusal", refusal_recorded)
    first = DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    dhts = [first] + [DHT(start=True, initial_peers=first.get_visible_maddrs(), host_maddrs=["/ip4/127.0.0.1/tcp/0"])
                      for _ in range(3)]
    values = [1.0, 2.0, 3.0, 100.0]  # the last is the outsider's
    parameters = [[torch.zeros(64, 33, requires_grad=True)] for _ in values]
    for (parameter,), value in zip(parameters, values):
        parameter.grad = torch.full_like(parameter, value)
    options = dict(prefix="test_partners", start=True, target_group_size=4, min_matchmaking_time=3.0,
                   request_timeout=1.0, warn=False)
    averagers = [FlooredGradientAverager(params, dht=dht, authorizer=peer_authorizer(authority), **options)
                 for params, dht in zip(parameters[:3], dhts[:3])]
    averagers.append(FlooredGradientAverager(parameters[3], dht=dhts[3], **options))
    honest_ids = {averager.peer_id: value for averager, value in zip(averagers[:3], values)}
    outsider_id = averagers[3].peer_id
    try:
        groups = [None] * len(averagers)

        def average(index: int) -> None:
            averagers[index].accumulate_grads_(batch_size=1)
            try:
                # The outsider keeps trying for less long: the agents' group forms in its first seconds.
                groups[index] = averagers[index].step(timeout=60 if index < 3 else 20)
            except Exception as e:  # a failed round is a valid outcome; the assertions below judge it
                groups[index] = e

        threads = [threading.Thread(target=average, args=(index,)) for index in range(len(averagers))]
        for thread in threads[:3]:
            thread.start()
        time.sleep(outsider_starts_after)  # arranges who leads; the assertions hold either way
        threads[3].start()
        for thread in threads:
            thread.join(120)
        assert str(outsider_id) in refused.read_text().split(), "the outsider took part in matchmaking and was refused"
        honest_groups = groups[:3]
        succeeded = [index for index, group in enumerate(honest_groups) if isinstance(group, dict)]
        assert any(set(honest_groups[index]) == set(honest_ids) for index in succeeded), groups
        for index in succeeded:
            members = set(honest_groups[index])
            assert outsider_id not in members, f"agent {index} averaged with the outsider: {groups}"
            expected = sum(honest_ids[member] for member in members) / len(members)
            with averagers[index].get_tensors() as (averaged,):
                assert torch.allclose(averaged, torch.full_like(averaged, expected)), (index, averaged.flatten()[:3])
    finally:
        for averager in averagers:
            averager.shutdown()
        for dht in dhts:
            dht.shutdown()


@pytest.mark.swarm
def test_two_agents_with_tokens_average_gradients_together(authority, tiny_config, tokenizer, corpus_file, monkeypatch,
                                                           tmp_path, reap_children, torch_threads):
    """Trainers built as the agent builds them (an authorizer on the DHT and the gradient averager)
    prove their membership to each other and average every round as a pair."""
    checked = tmp_path / "groups.txt"
    group_refusal = FlooredGradientAverager._group_refusal

    def group_refusal_recorded(self, group_info):
        """Writes down each group the averagers (child processes) checked and what they found."""
        refusal = group_refusal(self, group_info)
        with checked.open("a") as file:
            file.write(f"{len(group_info.peer_ids)} {refusal}\n")
        return refusal

    monkeypatch.setattr(FlooredGradientAverager, "_group_refusal", group_refusal_recorded)
    config = tiny_config(averaging=dict(matchmaking_time=2.0, averaging_timeout=10.0))
    trainers = []
    try:
        for seed in (1, 2):
            key = RSAPrivateKey()
            joins = [str(addr) for addr in trainers[0].dht.get_visible_maddrs()] if trainers else []
            setup = TrainerSetup(config=config, run_id="test_partners_run", initial_peers=joins,
                                 authorizer=peer_authorizer(authority, key), private_key=key,
                                 host_maddrs=["/ip4/127.0.0.1/tcp/0"], threads=1, seed=seed,
                                 data_files=[str(corpus_file)], progress_refresh_s=1.0, bandwidth=100.0)
            trainers.append(Trainer(setup, tokenizer))
        train_together(trainers, epochs=3)
        groups = checked.read_text().splitlines()
        assert groups and all(line == "2 None" for line in groups), groups
        assert min(trainer.optimizer.local_epoch for trainer in trainers) >= 3
    finally:
        for trainer in trainers:
            trainer.shutdown()
