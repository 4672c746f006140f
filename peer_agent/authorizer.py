"""Hivemind access tokens issued by the portal, and the authorizer that enforces them in the swarm.

A token says "the peer holding the private half of ``public_key`` may use this run's DHT until
``expiration_time``" and is signed by the run's authority key. The portal signs tokens
(runs/access/authority.py, with ``cryptography`` alone); every peer checks the tokens of the peers it talks to with
:class:`PortalAuthorizer`. Both sides share the encoding below, so this module must never import
the portal.

On the wire (the ``hivemind_access`` object of the join and refresh endpoints)::

    {"username": "rahul", "peer_public_key": "ssh-rsa AAAAB3Nza...",
     "expiration_time": "2025-01-31 12:30:00.000000", "signature": "<base64>"}

``expiration_time`` is naive UTC in ISO 8601, as in hivemind's own examples; ``signature`` is
what ``RSAPrivateKey.sign`` returns (base64 of an RSA-PSS/SHA-256 signature) over
:func:`access_token_payload`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from cryptography.exceptions import UnsupportedAlgorithm
from hivemind.proto.auth_pb2 import AccessToken
from hivemind.utils.auth import TokenAuthorizerBase
from hivemind.utils.crypto import RSAPrivateKey, RSAPublicKey
from hivemind.utils.timed_storage import get_dht_time

from peer_agent import protocol
from peer_agent.protocol import expiration_parse

logger = logging.getLogger(__name__)

TokenJSON = dict[str, str]
FetchToken = Callable[[], TokenJSON | None | Awaitable[TokenJSON | None]]

_JSON_FIELDS = ("username", "peer_public_key", "expiration_time", "signature")


class PortalAccessError(Exception):
    """The agent holds no valid access token and the portal did not issue a new one."""


def rsa_public_key_parse(key: bytes | str) -> RSAPublicKey:
    """Parse a hivemind RSA public key (OpenSSH text, as ``RSAPublicKey.to_bytes()`` writes it)."""
    if isinstance(key, str):
        key = key.encode()
    try:
        return RSAPublicKey.from_bytes(key)
    except (ValueError, TypeError, UnsupportedAlgorithm) as e:
        raise ValueError(
            f"not an RSA public key in OpenSSH format (hivemind's RSAPublicKey.to_bytes()): {e}"
        ) from None


def access_token_payload(token: AccessToken) -> bytes:
    """The bytes the run authority signs (peer_agent.protocol.access_token_payload)."""
    return protocol.access_token_payload(username=token.username, public_key=token.public_key,
                                         expiration_time=token.expiration_time)


def access_token_to_json(token: AccessToken) -> TokenJSON:
    return {
        "username": token.username,
        "peer_public_key": token.public_key.decode(),
        "expiration_time": token.expiration_time,
        "signature": token.signature.decode(),
    }


def access_token_from_json(data: dict[str, Any]) -> AccessToken:
    """Build an ``AccessToken`` from a ``hivemind_access`` object; ValueError if it is malformed."""
    if not isinstance(data, dict):
        raise ValueError(f"hivemind_access must be a JSON object, got {type(data).__name__}")
    bad = [field for field in _JSON_FIELDS if not isinstance(data.get(field), str)]
    if bad:
        raise ValueError(f"hivemind_access needs text fields {list(_JSON_FIELDS)}; missing or not text: {bad}")
    return AccessToken(
        username=data["username"],
        public_key=data["peer_public_key"].encode(),
        expiration_time=data["expiration_time"],
        signature=data["signature"].encode(),
    )


class PortalAuthorizer(TokenAuthorizerBase):
    """Admits to the run's DHT only peers whose token the run's authority signed and that has not expired.

    ``fetch_token`` returns a fresh ``hivemind_access`` object from the portal; it may be a plain
    function (run in a thread, so a slow portal does not stall the DHT; give it a timeout) or a
    coroutine function. hivemind calls it inside the DHT's forked process (and, once
    :meth:`token_refresh_start` is called, a thread of the main process), so it must not rely on
    connections or event loops opened before the DHT started. A token is refreshed once two thirds of
    its lifetime have passed. While the portal does not issue one, the peer keeps its current token
    until it expires, asking again every ``retry_interval`` seconds; after that its requests fail with
    :class:`PortalAccessError`.

    Give every peer its own ``RSAPrivateKey()``: the token names that key's public half.
    """

    _FIRST_REFRESH_MARGIN = 60.0

    def __init__(
        self,
        local_private_key: RSAPrivateKey,
        authority_public_key: RSAPublicKey,
        fetch_token: FetchToken,
        *,
        retry_interval: float = 10.0,
    ):
        super().__init__(local_private_key)
        self._authority_public_key = authority_public_key
        self._fetch_token = fetch_token
        self._retry_interval = retry_interval
        self._refresh_margin = self._FIRST_REFRESH_MARGIN
        self._next_fetch_time = float("-inf")
        self._last_fetch_error: Exception | None = None
        self._refresher_stop: threading.Event | None = None

    async def get_token(self) -> AccessToken:
        now = get_dht_time()
        if now >= self._next_fetch_time:
            try:
                token = await self._fetch()
            except Exception as e:
                self._next_fetch_time = now + self._retry_interval
                self._last_fetch_error = e
                logger.warning("The portal did not issue a hivemind access token: %s", e)
            else:
                self._refresh_margin = max(expiration_parse(token.expiration_time) - now, 0.0) / 3
                return token

        current = self._local_access_token
        if current is not None and self.is_token_valid(current):
            return current
        raise PortalAccessError(
            f"no valid access token to this run's swarm: the portal did not issue one "
            f"({self._last_fetch_error}); check that the run is active and your agent token is not revoked"
        )

    async def _fetch(self) -> AccessToken:
        if inspect.iscoroutinefunction(self._fetch_token):
            data = await self._fetch_token()
        else:
            data = await asyncio.to_thread(self._fetch_token)
            if inspect.isawaitable(data):
                data = await data
        if not data:
            raise PortalAccessError("the portal returned no token")

        token = access_token_from_json(data)
        if token.public_key != self.local_public_key.to_bytes():
            raise PortalAccessError("the portal issued a token for another peer key than this agent's")
        if not self.is_token_valid(token):
            raise PortalAccessError(
                "the portal issued a token that is expired or not signed by this run's authority "
                "(is this machine's clock right?)"
            )
        return token

    def access_token_current(self) -> AccessToken:
        """This peer's token as held now, never fetched here; :class:`PortalAccessError` if it holds no valid one.

        For the training thread, which must not wait on the portal: hivemind refreshes only the copy of
        this authorizer in the DHT's own process, so the copy that signs membership proofs
        (``peer_agent.averaging``) is kept fresh by :meth:`token_refresh_start`."""
        token = self._local_access_token
        if token is None:
            raise PortalAccessError("no access token to this run's swarm yet (token_refresh_start() fetches one)")
        if not self.is_token_valid(token):
            raise PortalAccessError(f"this peer's access token to the run's swarm has expired and the portal did not "
                                    f"issue a new one ({self._last_fetch_error})")
        return token

    def token_refresh_start(self) -> None:
        """Fetch a token now if none is held, then keep it fresh in a daemon thread until
        :meth:`token_refresh_stop`, checking every ``retry_interval`` seconds whether a refresh is due.

        Call it in the main process after hivemind has forked its DHT and averagers: the first fetch may
        wait on the portal here, and never again in the caller's thread."""
        if self._refresher_stop is not None and not self._refresher_stop.is_set():
            return
        self._token_refresh()
        stop = self._refresher_stop = threading.Event()
        threading.Thread(target=self._token_keep_fresh, args=(stop,), name="portal-token-refresh", daemon=True).start()

    def token_refresh_stop(self) -> None:
        """End the refresh thread (at once between checks; a fetch under way finishes on its own)."""
        if self._refresher_stop is not None:
            self._refresher_stop.set()

    def _token_keep_fresh(self, stop: threading.Event) -> None:
        while not stop.wait(self._retry_interval):
            self._token_refresh()

    def _token_refresh(self) -> None:
        try:
            asyncio.run(self.refresh_token_if_needed())
        except PortalAccessError:
            pass  # get_token has warned, and a proof built without a valid token warns again
        except Exception:  # the refresh must go on whatever one attempt raised
            logger.exception("Could not refresh the hivemind access token")

    def peer_key_sign(self, data: bytes) -> bytes:
        """Sign ``data`` with this peer's key, the one its access token names."""
        return self._local_private_key.sign(data)

    def is_token_valid(self, access_token: AccessToken) -> bool:
        if not self._authority_public_key.verify(access_token_payload(access_token), access_token.signature):
            logger.debug("Access token of %r is not signed by this run's authority", access_token.username)
            return False
        try:
            rsa_public_key_parse(access_token.public_key)
            expires = expiration_parse(access_token.expiration_time)
        except ValueError as e:
            logger.debug("Access token of %r is malformed: %s", access_token.username, e)
            return False
        if expires < get_dht_time():
            logger.debug("Access token of %r has expired", access_token.username)
            return False
        return True

    def does_token_need_refreshing(self, access_token: AccessToken) -> bool:
        try:
            expires = expiration_parse(access_token.expiration_time)
        except ValueError:
            return True
        return expires - get_dht_time() < self._refresh_margin
