"""Run authority keys and the hivemind access tokens they sign.

Each run has its own RSA key pair; its private half is kept encrypted at rest with a key derived
from the portal's secret. Pure functions, no Django: the model layer passes the secret in. The
token encoding is shared with the agent, so it lives in ``peer_agent.authorizer``.
"""

from __future__ import annotations

import base64
from datetime import timedelta

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from hivemind.proto.auth_pb2 import AccessToken
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils.timed_storage import get_dht_time

from peer_agent.authorizer import (
    TokenJSON,
    access_token_from_json,
    access_token_payload,
    access_token_to_json,
    expiration_format,
    rsa_public_key_parse,
)

__all__ = [
    "AuthorityKeyError",
    "access_token_from_json",
    "access_token_sign",
    "authority_generate",
    "authority_load",
    "peer_key_proof_verify",
]

_KDF_INFO = b"dedloc-portal/run-authority-key/v1"


class AuthorityKeyError(Exception):
    """A run's encrypted authority key cannot be decrypted with the given secret."""


def _fernet(secret: str) -> Fernet:
    if not secret:
        raise ValueError("an empty secret cannot protect a run authority key")
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_KDF_INFO).derive(secret.encode())
    return Fernet(base64.urlsafe_b64encode(key))


def authority_generate(*, secret: str) -> tuple[str, bytes]:
    """Create a run authority key; return its public half as text and its private half encrypted."""
    private_key = RSAPrivateKey()
    public_key = private_key.get_public_key().to_bytes().decode()
    return public_key, _fernet(secret).encrypt(private_key.to_bytes())


def authority_load(*, encrypted: bytes | memoryview, secret: str) -> RSAPrivateKey:
    """Decrypt a key made by :func:`authority_generate` (a BinaryField may hand over a memoryview)."""
    try:
        der = _fernet(secret).decrypt(bytes(encrypted))
    except InvalidToken:
        raise AuthorityKeyError(
            "cannot decrypt the run's authority key: it was encrypted with another secret "
            "(was the portal's secret key changed?) or the stored value is damaged"
        ) from None
    # RSAPrivateKey has no from_bytes; __setstate__ is hivemind's own way back from to_bytes().
    private_key = RSAPrivateKey.__new__(RSAPrivateKey)
    private_key.__setstate__({"_private_key": der})
    return private_key


def access_token_sign(
    *, private_key: RSAPrivateKey, username: str, peer_public_key: bytes | str, lifetime: timedelta
) -> TokenJSON:
    """Sign a ``hivemind_access`` object admitting ``peer_public_key`` to the run for ``lifetime``.

    ValueError if ``peer_public_key`` is not a hivemind RSA public key (answer 400 then).
    """
    if not username:
        raise ValueError("an access token needs a username")
    token = AccessToken(
        username=username,
        public_key=rsa_public_key_parse(peer_public_key).to_bytes(),
        expiration_time=expiration_format(get_dht_time() + lifetime.total_seconds()),
    )
    token.signature = private_key.sign(access_token_payload(token))
    return access_token_to_json(token)


def peer_key_proof_verify(*, peer_public_key: str, message: bytes, proof: str) -> bool:
    """Whether ``proof`` is the signature of ``message`` by the private half of ``peer_public_key``,
    as hivemind's ``RSAPrivateKey.sign`` makes it: base64 of RSA-PSS (MGF1-SHA256, maximum salt)
    over SHA-256. Done with ``cryptography`` alone, as hivemind's ``RSAPublicKey.verify`` does."""

    try:
        key = serialization.load_ssh_public_key(peer_public_key.encode())
        if not isinstance(key, rsa.RSAPublicKey):
            return False
        pss = padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=padding.PSS.MAX_LENGTH)
        key.verify(base64.b64decode(proof, validate=True), message, pss, hashes.SHA256())
        return True
    except (InvalidSignature, ValueError, TypeError, UnsupportedAlgorithm):
        return False
