"""Signals during a run: SIGTERM and SIGHUP unwind it like Ctrl-C (so staged outputs are removed), and a
process of a launched run that already said its error ends silently when the launcher stops it."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator

_HANDLED_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


class Terminated(SystemExit):
    """Raised by :func:`signals_raise` on SIGTERM/SIGHUP: exits with 128 + the signal number after cleanup."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(128 + signum)

    def __str__(self) -> str:
        return f"stopped by {signal.Signals(self.signum).name}"


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """SIGTERM/SIGHUP raise :class:`Terminated` inside the block (SIGINT already raises KeyboardInterrupt).

    Only the main thread can install handlers; elsewhere (and for handlers someone else installed) the block
    runs unchanged. The previous handlers are restored on exit.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for signum in _HANDLED_SIGNALS:
        current = signal.getsignal(signum)
        if current in (signal.SIG_DFL, None) or getattr(current, "_papa_raises", False):
            previous[signum] = current
            signal.signal(signum, _raise_terminated)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def end_on_signals(code: int) -> None:
    """From now on SIGTERM and SIGHUP end this process at once with ``code``, saying nothing.

    For a process of a launched run that already failed and said so: the launcher stops the remaining
    processes once one exits, and that stop is not a second error (nothing is left to clean up).
    Only the main thread can install handlers; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        return

    def end(signum, frame):
        sys.stderr.flush()
        os._exit(code)

    for signum in _HANDLED_SIGNALS:
        signal.signal(signum, end)


def _raise_terminated(signum, frame):
    raise Terminated(signum)


_raise_terminated._papa_raises = True
