"""DeDLOC peer agent: joins a portal run and trains with hivemind on a volunteer's machine."""

__version__ = "0.1.0"
