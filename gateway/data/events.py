"""What the data layer tells the parts above it while it serves READs.

``FileOpened`` is the relay between the ``ObjectReader`` (which sees every READ at offset 0
of a small object) and whoever wants to know (the data prefetcher: what this pass has read,
and whether READs find their files in memory). The reader is built first and the prefetcher
needs the reader, so the relay is built before both and each gets it in its constructor.

Must not: queue or defer. ``note_open`` calls the listeners synchronously, in the order the
READs came: the prefetcher's "waiting hits" rule counts the last first READs in order, and a
drained queue would change when it sees them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

__all__ = ["FileOpened", "OpenListener"]


class OpenListener(Protocol):
    def note_open(self, store_name: str, key: str, hit: bool) -> None:
        """A READ at offset 0 of small object ``key`` of store ``store_name``; ``hit``: it
        was answered from memory."""
        ...


def _nobody(store_name: str, key: str, hit: bool) -> None:
    return None


class FileOpened:
    """The relay: ``note_open`` goes to every subscribed listener, synchronously; without
    any it does nothing. ``listening`` is a plain attribute, so the READ path tests it
    without a call."""

    __slots__ = ("listening", "note_open", "_listeners")

    def __init__(self) -> None:
        self._listeners: list[OpenListener] = []
        self.listening = False
        """Whether anyone listens (the reader skips ``note_open`` otherwise)."""
        self.note_open: Callable[[str, str, bool], None] = _nobody
        """Tell the listeners (``OpenListener.note_open``); one listener is called
        directly, with no fan-out frame between."""

    def subscribe(self, listener: OpenListener) -> None:
        self._listeners.append(listener)
        listeners = tuple(self._listeners)
        self.listening = True
        if len(listeners) == 1:
            self.note_open = listeners[0].note_open
            return

        def fan_out(store_name: str, key: str, hit: bool) -> None:
            for one in listeners:
                one.note_open(store_name, key, hit)

        self.note_open = fan_out
