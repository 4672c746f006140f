"""This machine's torch device, and how the agent describes it to the portal when joining."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import TYPE_CHECKING

from peer_agent.protocol import DeviceInfo
from peer_agent.settings import SettingsError

if TYPE_CHECKING:
    import torch


def device_resolve(choice: str) -> torch.device:
    """The torch device for ``--device`` ("auto": CUDA, then Apple MPS, then the CPU)."""
    # torch loads only when a command asks for a device, not for `--help`, `login` or `stats`
    import torch

    mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "mps" if mps else "cpu"
    elif (choice == "cuda" and not torch.cuda.is_available()) or (choice == "mps" and not mps):
        raise SettingsError(f"--device {choice}: torch sees no such device here (is torch built for it?); try --device auto")
    return torch.device(choice)


def device_info(device: torch.device, precision: str) -> DeviceInfo:
    """How the agent describes its device when joining."""
    # torch loads only when a command asks for a device, not for `--help`, `login` or `stats`
    import torch

    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        name, memory = properties.name, properties.total_memory / 2**30
    else:
        name = next((line.split(":", 1)[1].strip() for line in _read_lines("/proc/cpuinfo") if line.startswith("model name")),
                    platform.processor() or platform.machine() or device.type)
        try:
            memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
        except (ValueError, OSError, AttributeError):
            memory = None
    return DeviceInfo(kind=device.type, name=name[:200] or device.type, memory_gb=round(memory, 1) if memory else None,
                      precision=precision)


def _read_lines(path: str) -> list[str]:
    try:
        return Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return []
