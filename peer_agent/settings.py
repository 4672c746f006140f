"""The agent's settings and where each one comes from.

Every option of :class:`AgentSettings` is read, first source wins, from

1. a command-line flag (``--threads 4``),
2. the environment (``PEER_AGENT_THREADS=4``),
3. the ``--config FILE`` TOML file (``threads = 4``; the join page's ``agent.toml``),
4. the stored login (``peer-agent login``: portal and token only),
5. the defaults below.

The stored token is used only with the portal it was issued by, so an agent pointed at another
portal never sends it there. The agent keeps its files in its home: ``$PEER_AGENT_HOME`` if set,
else ``$XDG_CONFIG_HOME/peer-agent`` (``~/.config/peer-agent``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ENV_PREFIX = "PEER_AGENT_"
CREDENTIALS_FILE = "credentials.toml"


class SettingsError(ValueError):
    """A setting is missing or malformed; the message names its source and what to do."""


def agent_home(environ: Mapping[str, str] | None = None) -> Path:
    """The folder holding the stored login, the report spool and downloads."""
    environ = os.environ if environ is None else environ
    if environ.get("PEER_AGENT_HOME"):
        return Path(environ["PEER_AGENT_HOME"]).expanduser()
    base = environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "peer-agent"


def duration_parse(text: str | float | int) -> float:
    """Seconds from ``90``, ``"90s"``, ``"30m"``, ``"2h"`` or ``"1d"``."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = float(text)
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", str(text))
        if not match:
            raise ValueError(f"{text!r} is not a duration such as 90, 90s, 30m, 2h or 1d")
        seconds = float(match[1]) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[match[2]]
    if seconds <= 0:
        raise ValueError("a duration must be positive")
    return seconds


def _positive(kind: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def parse(value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError(f"{value!r} is not a number")
        number = kind(value)
        if number <= 0:
            raise ValueError(f"{value!r} must be positive")
        return number
    return parse


def _choice(*choices: str) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        if str(value) not in choices:
            raise ValueError(f"{value!r} is not one of {', '.join(choices)}")
        return str(value)
    return parse


def _url(value: Any) -> str:
    text = str(value).strip().rstrip("/")
    if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", text):
        raise ValueError(f"{value!r} is not an http(s) address such as https://portal.example.org")
    return text


def _multiaddr(value: Any) -> str:
    if not re.fullmatch(r"/\S+", str(value)):
        raise ValueError(f"{value!r} is not a multiaddress such as /ip4/0.0.0.0/tcp/31337")
    return str(value)


def _option(help: str, parse: Callable[[Any], Any] = str, metavar: str | None = None, default: Any = None,
            aliases: tuple[str, ...] = ()) -> Any:
    return field(default=default, metadata={"help": help, "parse": parse, "metavar": metavar, "aliases": aliases})


@dataclass(frozen=True)
class AgentSettings:
    """Everything a volunteer can set; ``None`` means "not set, decide at run time"."""

    portal: str | None = _option("Address of the portal, e.g. https://portal.example.org.", _url, "URL")
    run: str | None = _option("The run to join (its short name on the portal).", str, "RUN")
    token: str | None = _option("Agent token from the run's join page (prefer PEER_AGENT_TOKEN or `peer-agent login`).",
                                str, "TOKEN")
    device: str = _option('Device to train on: "auto" (a GPU if there is one), "cpu", "cuda" or "mps".',
                          _choice("auto", "cpu", "cuda", "mps"), "DEVICE", "auto")
    per_device_batch_size: int | None = _option("Samples per forward pass, overriding the run's setting "
                                                "(lower it if you run out of memory).", _positive(int), "N")
    threads: int | None = _option("CPU threads torch may use (default: torch's choice).", _positive(int), "N")
    client_mode: str = _option('Accept connections from other peers? "auto" (decide by asking a backbone peer of the '
                               'run to dial you back, directly or through its relay), "on" (client mode: outgoing '
                               'connections only) or "off".', _choice("auto", "on", "off"), "MODE", "auto")
    bandwidth_mbps: float | None = _option("Your upload bandwidth in Mbit/s, declared to the swarm for load "
                                           "balancing (default: measured or the run's floor).", _positive(float), "MBPS",
                                           aliases=("--bandwidth",))
    max_runtime: float | None = _option("Stop cleanly after this long, e.g. 90m or 8h (default: run until Ctrl-C).",
                                        duration_parse, "DURATION")
    host: str = _option("Multiaddress to listen on for other peers.", _multiaddr, "MADDR", "/ip4/0.0.0.0/tcp/0")
    announce: str | None = _option("Public multiaddress other peers should dial, if you forward a port "
                                   "(e.g. /ip4/203.0.113.5/tcp/31337).", _multiaddr, "MADDR")
    backbone: str | None = _option("For `check`: a backbone peer of the run (a multiaddress ending in /p2p/ID, "
                                   "as `join` logs them) to ask for a dial-back.", _multiaddr, "MADDR")
    spool_dir: Path | None = _option("Folder for reports not yet acknowledged by the portal "
                                     "(default: <agent home>/spool).", Path, "DIR")
    cache_dir: Path | None = _option("Folder for the tokenizer and data files (default: <agent home>/cache).",
                                     Path, "DIR")
    report_interval: float = _option("Seconds between progress reports to the portal.", _positive(float), "SECONDS", 5.0)
    progress_every: float = _option("Seconds between progress lines where there is no terminal to draw a live line on "
                                    "(a log file, a service, a notebook).", _positive(float), "SECONDS", 60.0)

    def resolved_spool_dir(self, environ: Mapping[str, str] | None = None) -> Path:
        return self.spool_dir or agent_home(environ) / "spool"

    def resolved_cache_dir(self, environ: Mapping[str, str] | None = None) -> Path:
        return self.cache_dir or agent_home(environ) / "cache"

    def require(self, *names: str) -> None:
        """Raise SettingsError naming how to provide the first of ``names`` that is unset."""
        hints = {"portal": "pass --portal URL, set PEER_AGENT_PORTAL, or run `peer-agent login --portal URL`",
                 "run": "name the run (`peer-agent join RUN`), set PEER_AGENT_RUN, or use the join page's agent.toml",
                 "token": "set PEER_AGENT_TOKEN, use the join page's agent.toml, or run `peer-agent login`"}
        for name in names:
            if getattr(self, name) is None:
                raise SettingsError(f"no {name} given: {hints.get(name, f'pass --{_flag(name)}')}")


def _flag(name: str) -> str:
    return name.replace("_", "-")


OPTIONS = {f.name: f for f in dataclasses.fields(AgentSettings)}


def add_arguments(parser: argparse.ArgumentParser, *, positional_run: bool = False, only: tuple[str, ...] = ()) -> None:
    """Add a flag for every setting (or those in ``only``); unset flags stay ``None`` so lower sources apply."""
    for name, option in OPTIONS.items():
        if only and name not in only:
            continue
        help_text = option.metadata["help"]
        if option.default is not None:
            help_text += f" Default: {option.default}."
        if name == "run" and positional_run:
            parser.add_argument("run", nargs="?", default=None, metavar="RUN", help=help_text)
        else:
            parser.add_argument(f"--{_flag(name)}", *option.metadata["aliases"], dest=name, default=None,
                                metavar=option.metadata["metavar"], help=help_text)


def _parse(name: str, value: Any, source: str) -> Any:
    try:
        return OPTIONS[name].metadata["parse"](value)
    except (TypeError, ValueError) as exc:
        raise SettingsError(f"{source}: {exc}") from None


def config_file_load(path: Path) -> dict[str, Any]:
    """The settings in a TOML file; unknown keys are an error so typos do not pass silently."""
    try:
        with open(path, "rb") as file:
            data = tomllib.load(file)
    except FileNotFoundError:
        raise SettingsError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"config file {path} is not valid TOML: {exc}") from None
    unknown = sorted(set(data) - set(OPTIONS))
    if unknown:
        raise SettingsError(f"config file {path}: unknown key(s) {', '.join(unknown)}; known keys: {', '.join(OPTIONS)}")
    return {name: _parse(name, value, f"{path}: {name}") for name, value in data.items()}


def credentials_path(environ: Mapping[str, str] | None = None) -> Path:
    return agent_home(environ) / CREDENTIALS_FILE


def credentials_load(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The stored login ``{"portal", "token"}``, or ``{}`` if there is none."""
    path = credentials_path(environ)
    if not path.exists():
        return {}
    data = config_file_load(path)
    return {key: data[key] for key in ("portal", "token") if key in data}


def credentials_store(portal: str, token: str, environ: Mapping[str, str] | None = None) -> Path:
    """Write the login readable by its owner only (mode 0600), replacing any earlier one atomically."""
    path = credentials_path(environ)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    partial = path.with_suffix(".tmp")
    partial.unlink(missing_ok=True)
    # JSON strings are valid TOML basic strings.
    text = f"# peer-agent login, written by `peer-agent login`\nportal = {json.dumps(portal)}\ntoken = {json.dumps(token)}\n"
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    os.replace(partial, path)
    return path


def settings_resolve(flags: Mapping[str, Any] | None = None, *, config_file: Path | None = None,
                     environ: Mapping[str, str] | None = None) -> AgentSettings:
    """Merge the sources in precedence order (flag > environment > config file > login > default)."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    login = credentials_load(environ)
    file_values = config_file_load(config_file) if config_file else {}
    for name in OPTIONS:
        env_name = ENV_PREFIX + name.upper()
        if flags and flags.get(name) is not None:
            values[name] = _parse(name, flags[name], f"--{_flag(name)}")
        elif environ.get(env_name):
            values[name] = _parse(name, environ[env_name], env_name)
        elif name in file_values:
            values[name] = file_values[name]
    if "portal" not in values and "portal" in login:
        values["portal"] = _parse("portal", login["portal"], str(credentials_path(environ)))
    if "token" not in values and "token" in login and login.get("portal", "").rstrip("/") == values.get("portal"):
        values["token"] = login["token"]
    return AgentSettings(**values)


def settings_from_args(args: argparse.Namespace) -> AgentSettings:
    """The settings for a parsed ``peer-agent`` command line (its flags, ``--config`` and the other sources)."""
    flags = {name: value for name, value in vars(args).items() if name not in ("command", "config", "verbose")}
    return settings_resolve(flags, config_file=args.config)
