"""Run authority keys and the access tokens they sign, checked the way every peer checks them."""

import asyncio
import base64
import time
from datetime import timedelta

import pytest
from cryptography.hazmat.primitives import serialization
from hivemind.proto import dht_pb2
from hivemind.utils.crypto import RSAPrivateKey

from peer_agent.authorizer import (
    PortalAccessError,
    PortalAuthorizer,
    access_token_from_json,
    expiration_parse,
)
from runs.access import authority
from runs.access.authority import AuthorityKeyError, access_token_sign, authority_load
from tests.factories import RunAuthority

SECRET = RunAuthority.SECRET


@pytest.fixture(scope="module")
def run_authority():
    return RunAuthority()


@pytest.fixture(scope="module")
def other_run_authority():
    return RunAuthority()


@pytest.fixture(scope="module")
def peer_key():
    return RSAPrivateKey()


def authorizer_for(authority, peer_key, fetch_token=lambda: None, **kwargs):
    return PortalAuthorizer(peer_key, authority.public_key, fetch_token, **kwargs)


def private_der(key) -> bytes:
    return key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.TraditionalOpenSSL,
                             serialization.NoEncryption())


def test_authority_key_survives_encryption_round_trip(run_authority):
    loaded = authority_load(encrypted=run_authority.encrypted, secret=SECRET)
    public = loaded.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)

    assert public.decode() == run_authority.public_text
    assert private_der(loaded) == private_der(run_authority.private_key)


def test_authority_key_loads_from_a_memoryview_as_binary_fields_return(run_authority):
    loaded = authority_load(encrypted=memoryview(run_authority.encrypted), secret=SECRET)

    assert private_der(loaded) == private_der(run_authority.private_key)


def test_a_key_stored_by_hivemind_loads_and_signs_tokens_hivemind_accepts(peer_key):
    """Runs created before the portal signed with ``cryptography`` alone stored hivemind's own key
    bytes (``RSAPrivateKey.to_bytes``); they load, and hivemind's public key checks their tokens."""
    hivemind_key = RSAPrivateKey()
    loaded = authority_load(encrypted=authority._fernet(SECRET).encrypt(hivemind_key.to_bytes()), secret=SECRET)
    token = access_token_sign(private_key=loaded, username="rahul", peer_public_key=peer_key.get_public_key().to_bytes(),
                              lifetime=timedelta(minutes=5))

    authorizer = PortalAuthorizer(peer_key, hivemind_key.get_public_key(), lambda: token)
    assert authorizer.is_token_valid(access_token_from_json(token))


def test_authority_key_is_refused_under_another_secret(run_authority):
    with pytest.raises(AuthorityKeyError, match="another secret"):
        authority_load(encrypted=run_authority.encrypted, secret="rotated-secret")


def test_encrypted_authority_key_does_not_hold_the_private_key_in_clear(run_authority):
    der = private_der(run_authority.private_key)
    blob = run_authority.encrypted

    for clear in (der, der[64:96], base64.b64encode(der)[64:96], base64.urlsafe_b64encode(der)[64:96]):
        assert clear not in blob


def test_token_dict_carries_text_fields_hivemind_can_read(run_authority, peer_key):
    token = run_authority.sign(peer_key, username="rahul", lifetime=timedelta(minutes=30))

    assert set(token) == {"username", "peer_public_key", "expiration_time", "signature"}
    assert token["username"] == "rahul"
    assert token["peer_public_key"] == peer_key.get_public_key().to_bytes().decode()
    assert abs(expiration_parse(token["expiration_time"]) - (time.time() + 1800)) < 5
    assert len(base64.b64decode(token["signature"], validate=True)) == 256
    assert access_token_from_json(token).public_key == peer_key.get_public_key().to_bytes()


def test_token_from_json_names_missing_fields():
    with pytest.raises(ValueError, match="signature"):
        access_token_from_json({"username": "rahul", "peer_public_key": "ssh-rsa A", "expiration_time": "x"})


def test_signing_refuses_a_malformed_peer_key(run_authority):
    with pytest.raises(ValueError, match="OpenSSH"):
        access_token_sign(
            private_key=run_authority.private_key,
            username="volunteer",
            peer_public_key="ssh-rsa not-a-key",
            lifetime=timedelta(minutes=5),
        )


def test_token_is_valid_under_its_run_authority(run_authority, peer_key):
    token = access_token_from_json(run_authority.sign(peer_key))

    assert authorizer_for(run_authority, RSAPrivateKey()).is_token_valid(token)


def test_token_is_invalid_under_another_runs_authority(run_authority, other_run_authority, peer_key):
    token = access_token_from_json(run_authority.sign(peer_key))

    assert not authorizer_for(other_run_authority, RSAPrivateKey()).is_token_valid(token)


def test_expired_token_is_invalid(run_authority, peer_key):
    token = access_token_from_json(run_authority.sign(peer_key, lifetime=timedelta(seconds=-1)))

    assert not authorizer_for(run_authority, RSAPrivateKey()).is_token_valid(token)


@pytest.mark.parametrize(
    "field, forged",
    [
        ("username", "organizer"),
        ("peer_public_key", RSAPrivateKey().get_public_key().to_bytes().decode()),
        ("expiration_time", "2999-01-01 00:00:00.000000"),
    ],
)
def test_tampered_token_is_invalid(run_authority, peer_key, field, forged):
    token = run_authority.sign(peer_key)

    forged_token = access_token_from_json({**token, field: forged})

    assert not authorizer_for(run_authority, RSAPrivateKey()).is_token_valid(forged_token)


def test_agent_gets_its_token_from_the_portal_sync_or_async(run_authority, peer_key):
    async def fetch_async():
        return run_authority.sign(peer_key, username="async")

    from_sync = authorizer_for(run_authority, peer_key, lambda: run_authority.sign(peer_key, username="sync"))
    from_async = authorizer_for(run_authority, peer_key, fetch_async)

    assert asyncio.run(from_sync.get_token()).username == "sync"
    assert asyncio.run(from_async.get_token()).username == "async"


def test_agent_refuses_a_token_issued_for_another_peer_key(run_authority, peer_key):
    authorizer = authorizer_for(run_authority, RSAPrivateKey(), lambda: run_authority.sign(peer_key))

    with pytest.raises(PortalAccessError, match="no valid access token"):
        asyncio.run(authorizer.get_token())


def test_agent_refreshes_once_two_thirds_of_the_lifetime_passed(run_authority, peer_key):
    authorizer = authorizer_for(run_authority, peer_key, lambda: run_authority.sign(peer_key))
    asyncio.run(authorizer.get_token())  # a 30 min token: refresh with 10 min left

    fresh = access_token_from_json(run_authority.sign(peer_key, lifetime=timedelta(minutes=11)))
    aging = access_token_from_json(run_authority.sign(peer_key, lifetime=timedelta(minutes=9)))

    assert not authorizer.does_token_need_refreshing(fresh)
    assert authorizer.does_token_need_refreshing(aging)


def test_agent_signs_with_its_token_while_the_portal_refuses_until_it_expires(run_authority, peer_key):
    answers = [run_authority.sign(peer_key, lifetime=timedelta(seconds=1.5))]
    calls = []

    def refresh():
        calls.append(time.time())
        return answers.pop() if answers else None  # the portal refuses after the first token

    authorizer = authorizer_for(run_authority, peer_key, refresh, retry_interval=0)

    async def scenario():
        await authorizer.sign_request(dht_pb2.PingRequest(), None)
        await asyncio.sleep(1.1)  # past two thirds of the lifetime: asks again, keeps the current token
        await authorizer.sign_request(dht_pb2.PingRequest(), None)
        assert len(calls) == 2
        await asyncio.sleep(0.5)
        with pytest.raises(PortalAccessError, match="did not issue"):
            await authorizer.sign_request(dht_pb2.PingRequest(), None)

    asyncio.run(scenario())
