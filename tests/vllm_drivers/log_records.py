"""The ERROR lines of the ``logitsproc_rs`` logger, kept for the drivers to read (what a
failed-closed request logs)."""

from __future__ import annotations

import logging


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
