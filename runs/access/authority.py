"""Run authority keys and the hivemind access tokens they sign.

Each run has its own RSA key pair; its private half is kept encrypted at rest with a key derived
from the portal's secret. Pure functions, no Django: the model layer passes the secret in.

Done with ``cryptography`` alone, so that the web tier never imports hivemind. The formats are
hivemind's own (``hivemind.utils.crypto``): keys are 2048-bit RSA with exponent 65537, public keys are
OpenSSH text, private keys DER ("traditional OpenSSL"), and a signature is the base64 of RSA-PSS
(MGF1-SHA256, maximum salt) over SHA-256. What is signed is ``peer_agent.protocol.access_token_payload``.
tests/runs/access/test_swarm_auth.py checks that a real hivemind ``TokenAuthorizerBase`` accepts these tokens.
"""

from __future__ import annotations

import base64
import time
from datetime import timedelta

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from peer_agent.protocol import access_token_payload, expiration_format

__all__ = [
    "AuthorityKeyError",
    "access_token_sign",
    "authority_generate",
    "authority_load",
    "peer_key_proof_verify",
    "peer_public_key_parse",
]

_KDF_INFO = b"dedloc-portal/run-authority-key/v1"
_PSS = padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=padding.PSS.MAX_LENGTH)

TokenJSON = dict[str, str]


class AuthorityKeyError(Exception):
    """A run's encrypted authority key cannot be decrypted with the given secret."""


def _fernet(secret: str) -> Fernet:
    if not secret:
        raise ValueError("an empty secret cannot protect a run authority key")
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_KDF_INFO).derive(secret.encode())
    return Fernet(base64.urlsafe_b64encode(key))


def _openssh(public_key: rsa.RSAPublicKey) -> bytes:
    return public_key.public_bytes(encoding=serialization.Encoding.OpenSSH, format=serialization.PublicFormat.OpenSSH)


def peer_public_key_parse(key: bytes | str) -> rsa.RSAPublicKey:
    """A hivemind RSA public key (OpenSSH text); ValueError for anything else."""
    if isinstance(key, str):
        key = key.encode()
    try:
        parsed = serialization.load_ssh_public_key(key)
    except (ValueError, TypeError, UnsupportedAlgorithm) as e:
        raise ValueError(f"not an RSA public key in OpenSSH format (hivemind's RSAPublicKey.to_bytes()): {e}") from None
    if not isinstance(parsed, rsa.RSAPublicKey):
        raise ValueError("not an RSA public key in OpenSSH format (hivemind's RSAPublicKey.to_bytes())")
    return parsed


def authority_generate(*, secret: str) -> tuple[str, bytes]:
    """Create a run authority key; return its public half as text and its private half encrypted."""
    private_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    der = private_key.private_bytes(
        encoding=serialization.Encoding.DER,
        format=serialization.PrivateFormat.TraditionalOpenSSL,
        encryption_algorithm=serialization.NoEncryption(),
    )
    return _openssh(private_key.public_key()).decode(), _fernet(secret).encrypt(der)


def authority_load(*, encrypted: bytes | memoryview, secret: str) -> rsa.RSAPrivateKey:
    """Decrypt a key made by :func:`authority_generate` (a BinaryField may hand over a memoryview)."""
    try:
        der = _fernet(secret).decrypt(bytes(encrypted))
    except InvalidToken:
        raise AuthorityKeyError(
            "cannot decrypt the run's authority key: it was encrypted with another secret "
            "(was the portal's secret key changed?) or the stored value is damaged"
        ) from None
    private_key = serialization.load_der_private_key(der, password=None)
    if not isinstance(private_key, rsa.RSAPrivateKey):
        raise AuthorityKeyError("the run's authority key is not an RSA key")
    return private_key


def access_token_sign(
    *, private_key: rsa.RSAPrivateKey, username: str, peer_public_key: bytes | str, lifetime: timedelta
) -> TokenJSON:
    """Sign a ``hivemind_access`` object admitting ``peer_public_key`` to the run for ``lifetime``.

    ValueError if ``peer_public_key`` is not a hivemind RSA public key (answer 400 then).
    """
    if not username:
        raise ValueError("an access token needs a username")
    public_key = _openssh(peer_public_key_parse(peer_public_key))
    # hivemind's get_dht_time() is the wall clock (time.time); peers compare expiry with it.
    expiration_time = expiration_format(time.time() + lifetime.total_seconds())
    payload = access_token_payload(username=username, public_key=public_key, expiration_time=expiration_time)
    signature = base64.b64encode(private_key.sign(payload, _PSS, hashes.SHA256()))
    return {
        "username": username,
        "peer_public_key": public_key.decode(),
        "expiration_time": expiration_time,
        "signature": signature.decode(),
    }


def peer_key_proof_verify(*, peer_public_key: str, message: bytes, proof: str) -> bool:
    """Whether ``proof`` is the signature of ``message`` by the private half of ``peer_public_key``,
    as hivemind's ``RSAPrivateKey.sign`` makes it."""
    try:
        key = peer_public_key_parse(peer_public_key)
        key.verify(base64.b64decode(proof, validate=True), message, _PSS, hashes.SHA256())
        return True
    except (InvalidSignature, ValueError, TypeError):
        return False
