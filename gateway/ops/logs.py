"""structlog set-up, once per process: a readable console on a terminal, JSON lines to
stdout otherwise: under systemd (journald), into a pipe or a log file (STYLE §6). Every command
configures it (``serve`` from ``[log]``, ``pack`` and the admin client commands too), so no line
is printed by structlog's or the standard library's defaults.

Owns: the processor chain and where lines go. One line per error, per connection open/close,
per directory prefetch and per warm-up; never one per successful RPC. ``dispatch`` sets the
call being served (``dispatch.CALL``: each call runs in its own task), so any line logged
while serving a call, in any layer, carries its ``xid``, ``proc`` and ``client``
(``dispatch.add_call``, a processor here). Standard-library records (botocore, aiohttp, asyncio)
go through the same renderer via ``ProcessorFormatter``.

No secrets: a traceback is rendered without its frames' local variables, in JSON and on the
console alike (structlog's default JSON tracebacks carry every frame's locals: a failure below
the S3 client printed its credentials, the AUTH_SYS credentials of the call and the first bytes
of a WRITE's data). The console renders plain Python tracebacks whatever is installed (rich's
and better-exceptions' show locals too). Types that hold a secret print none in their ``repr``
(``sigv4.Credentials``, ``ops.config.AdminConfig``); tests/reliability/test_no_secrets_in_logs.py
injects failures at each layer and looks for the keys in every line.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import TextIO

import structlog
from structlog.tracebacks import ExceptionDictTransformer

from gateway.dispatch import add_call

LEVELS = ("debug", "info", "warning", "error")


def configure(
    level: str = "info",
    json: bool | None = None,
    *,
    stream: TextIO | None = None,
    cache: bool = True,
) -> None:
    """``json`` None: ``wants_json(stream)``. ``cache=False`` for tests that reconfigure
    (cached loggers keep the configuration they were first used with)."""
    out = stream if stream is not None else sys.stdout
    lvl = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    if json is None:
        json = wants_json(out)
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        add_call,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.types.Processor
    if json:
        renderer = structlog.processors.JSONRenderer()
        shared.append(json_tracebacks())
    else:
        renderer = console_renderer()
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


def json_tracebacks() -> structlog.types.Processor:
    """``exc_info`` as structured frames: file, line and function only, never locals."""
    return structlog.processors.ExceptionRenderer(ExceptionDictTransformer(show_locals=False))


def console_renderer() -> structlog.dev.ConsoleRenderer:
    """The console's renderer: plain tracebacks (no locals, whatever formatter is installed)."""
    return structlog.dev.ConsoleRenderer(exception_formatter=structlog.dev.plain_traceback)


def wants_json(out: TextIO, environ: Mapping[str, str] = os.environ) -> bool:
    """JSON unless ``out`` is a terminal; always JSON into the journal (systemd names the
    stream it connected in ``JOURNAL_STREAM``, "device:inode": compared with ``out``'s, since a
    shell started by a systemd unit inherits the variable for its own terminal)."""
    try:
        st = os.fstat(out.fileno())
    except (OSError, ValueError, AttributeError):  # no file behind it (a test's StringIO)
        return not out.isatty()
    dev, _, ino = environ.get("JOURNAL_STREAM", "").partition(":")
    if f"{st.st_dev}:{st.st_ino}" == f"{dev}:{ino}":
        return True
    return not out.isatty()


def configure_from(level: str, fmt: str) -> None:
    """``configure`` from a ``[log]`` table's level and format ("auto", "json", "console")."""
    configure(level, None if fmt == "auto" else fmt == "json")
