"""RSA keys for the tests' own process, made fast, as the tests' password hasher is (tests/conftest.py).

Every run the tests create gets an authority key (runs/access/authority.py) and every join a hivemind
peer key; OpenSSL makes a 2048-bit key in about 0.1 s, nearly all of it the search for two primes, and
that was about half of the PostgreSQL pass's time. Here a key is the product of two primes from a pool
that grows by one real key's two primes whenever its pairs run out: every key is valid and distinct
from the others, yet ~25 real keys yield a thousand. Keys of a pool share primes, which would expose
them to anyone holding two; the portal and the agent never do this, only the tests' process."""

import threading
from collections.abc import Iterator

from cryptography.hazmat.primitives.asymmetric import rsa

SIZE, EXPONENT = 2048, 65537
_openssl_generate = rsa.generate_private_key
_lock = threading.Lock()


def _prime_pairs() -> Iterator[tuple[int, int]]:
    primes: list[int] = []
    while True:
        numbers = _openssl_generate(public_exponent=EXPONENT, key_size=SIZE).private_numbers()
        for new in (numbers.p, numbers.q):
            yield from ((old, new) for old in primes if (old * new).bit_length() == SIZE)
            primes.append(new)


_pairs = _prime_pairs()


def generate_private_key(public_exponent: int, key_size: int, backend=None) -> rsa.RSAPrivateKey:
    """``rsa.generate_private_key`` for the tests: 2048-bit keys with exponent 65537 from the pool."""
    if (public_exponent, key_size) != (EXPONENT, SIZE):
        return _openssl_generate(public_exponent=public_exponent, key_size=key_size)
    with _lock:
        p, q = next(_pairs)
    d = pow(EXPONENT, -1, (p - 1) * (q - 1))
    numbers = rsa.RSAPrivateNumbers(p, q, d, rsa.rsa_crt_dmp1(d, p), rsa.rsa_crt_dmq1(d, q), rsa.rsa_crt_iqmp(p, q),
                                    rsa.RSAPublicNumbers(EXPONENT, p * q))
    return numbers.private_key(unsafe_skip_rsa_key_validation=True)
