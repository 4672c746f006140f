"""Strict readers for settings that come from the environment.

A value that cannot be parsed stops start-up with a message naming the variable, instead of
silently falling back to a default. Every variable `X` may also be given as `X_FILE`, a path
whose contents are the value (for secrets mounted as files).
"""

import ipaddress
import os

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _raw(name: str) -> str | None:
    path = os.environ.get(f"{name}_FILE")
    if path:
        try:
            with open(path, encoding="utf-8") as handle:
                return handle.read().strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE={path!r} cannot be read: {exc}") from exc
    return os.environ.get(name)


def env_str(name: str, default: str) -> str:
    value = _raw(name)
    return default if value is None else value


def env_bool(name: str, default: bool) -> bool:
    value = _raw(name)
    if value is None:
        return default
    if value.strip().lower() in _TRUE:
        return True
    if value.strip().lower() in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={value!r} is not a boolean; use one of true/false, 1/0, yes/no, on/off")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    value = _raw(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not an integer") from None
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name}={number} must be at least {minimum}")
    return number


def env_list(name: str, default: list[str]) -> list[str]:
    value = _raw(name)
    if value is None:
        return default
    return [item.strip() for item in value.split(",") if item.strip()]


def env_networks(name: str) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """Comma-separated addresses or networks (`10.0.0.0/8, ::1`) as ipaddress networks."""
    networks = []
    for item in env_list(name, []):
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ImproperlyConfigured(f"{name}: {item!r} is not an address or a network such as 10.0.0.0/8") from None
    return networks


def env_choice(name: str, default: str, choices: set[str]) -> str:
    value = env_str(name, default)
    if value not in choices:
        raise ImproperlyConfigured(f"{name}={value!r} must be one of {', '.join(sorted(choices))}")
    return value


_RATE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def env_rate(name: str, default: str) -> tuple[int, int]:
    """A rate limit written `COUNT/WINDOW`, e.g. `10/15m` (units s, m, h, d), as (count, seconds)."""
    value = env_str(name, default).strip()
    count, _, window = value.partition("/")
    number, unit = window[:-1] or "1", window[-1:]
    if not (count.isdigit() and int(count) >= 1 and number.isdigit() and int(number) >= 1 and unit in _RATE_UNITS):
        raise ImproperlyConfigured(f"{name}={value!r} is not a rate; write COUNT/WINDOW such as 10/15m (units s, m, h, d)")
    return int(count), int(number) * _RATE_UNITS[unit]
