"""structlog set-up, once per process: JSON lines to stdout (journald) or a readable console
on a TTY (STYLE §6).

Owns: the processor chain and where lines go. One line per error, per connection open/close,
per directory prefetch and per warm-up; never one per successful RPC. ``dispatch`` sets the
call being served (``dispatch.CALL``: each call runs in its own task), so any line logged
while serving a call, in any layer, carries its ``xid``, ``proc`` and ``client``
(``dispatch.add_call``, a processor here). Standard-library records (botocore, aiohttp, asyncio)
go through the same renderer via ``ProcessorFormatter``.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog

from gateway.dispatch import add_call

LEVELS = ("debug", "info", "warning", "error")


def configure(
    level: str = "info",
    json: bool | None = None,
    *,
    stream: TextIO | None = None,
    cache: bool = True,
) -> None:
    """``json`` None: JSON unless ``stream`` is a TTY. ``cache=False`` for tests that
    reconfigure (cached loggers keep the configuration they were first used with)."""
    out = stream if stream is not None else sys.stdout
    lvl = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    if json is None:
        json = not out.isatty()
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        add_call,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.types.Processor
    if json:
        renderer = structlog.processors.JSONRenderer()
        shared.append(structlog.processors.dict_tracebacks)
    else:
        renderer = structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=cache,
    )
    # botocore/aiohttp records through the standard library, rendered the same way.
    handler = logging.StreamHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            foreign_pre_chain=shared,
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(lvl, logging.WARNING))
