"""The ERROR lines of the ``logitsproc_rs`` logger, kept for the drivers to read (what a
failed-closed request logs)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def capture() -> Records:
    records = Records()
    logging.getLogger("logitsproc_rs").addHandler(records)
    return records


@contextlib.contextmanager
def only_errors() -> Iterator[Records]:
    """The ERROR lines logged inside the block, even where the driver has raised the logger's
    level to keep failed-closed requests quiet; none reach the root logger meanwhile."""
    log = logging.getLogger("logitsproc_rs")
    records = Records()
    level, propagate = log.level, log.propagate
    log.addHandler(records)
    log.setLevel(logging.ERROR)
    log.propagate = False
    try:
        yield records
    finally:
        log.removeHandler(records)
        log.setLevel(level)
        log.propagate = propagate
