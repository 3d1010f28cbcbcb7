"""``nfsgw serve`` and ``nfsgw check-config``: their parsers and what they run.

- ``serve``: loads the configuration (file, then flags), configures logging, and runs a
  ``gateway.ops.server.Server`` (one process, or a worker with the hidden ``--worker``) or a
  ``gateway.ops.workers.Supervisor`` (``server.workers`` > 1) until a signal, under uvloop when
  ``server.uvloop`` is on and uvloop is installed.
- ``check-config``: every error and warning with its location and a fix; exit 1 on errors.

Must not: import ``gateway.ops.cli`` (it imports this module).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gateway.ops import logs
from gateway.ops.cliflags import add_config_flags, overrides_from_args, print_issues
from gateway.ops.config import ServerConfig
from gateway.ops.configfile import ConfigErrors, check_config, find_config_path, load_config
from gateway.ops.workers import (
    Supervisor,
    WorkerRole,
    die_with_supervisor,
    hold_reloads,
    worker_count,
)

if TYPE_CHECKING:
    from gateway.ops.server import Server


def add_parsers(sub: Any) -> None:
    s = sub.add_parser(
        "serve", help="serve exports over NFSv3 + MOUNTv3 (+ a PORTMAP responder) on one TCP port"
    )
    add_config_flags(s)
    # Set by the supervisor of ``--workers N`` on each worker it starts (gateway.ops.workers).
    s.add_argument("--worker", type=WorkerRole.parse, default=None, help=argparse.SUPPRESS)
    cc = sub.add_parser(
        "check-config",
        help="check a configuration: every error with its location and a fix (exit 1 on errors)",
    )
    add_config_flags(cc)
    cc.add_argument("--quiet", action="store_true", help="print errors only")


def cannot_share(config: ServerConfig) -> str:
    """Why the workers could not share one data cache ("" when they can), said in one line:
    without it each would fetch and hold every file it serves (N copies, N GETs), so the
    gateway serves with one process instead."""
    from gateway.data.disk.store import resolve_cache_dir, usable

    cache_dir = resolve_cache_dir(config.server.cache_dir, config.server.state_dir)
    why = usable(cache_dir, config.cache.data.disk)
    if why:
        import structlog

        structlog.get_logger("gateway.ops.cli").warning(
            "workers_need_a_shared_cache",
            reason=why,
            workers=worker_count(config.server.workers),
            serving_with="one worker",
            fix="give the cache a writable directory (--cache-dir) and a budget (cache.disk)",
        )
    return why


async def serve(config: ServerConfig, a: argparse.Namespace, argv: Sequence[str]) -> int:
    from gateway.ops.gcwatch import freeze_long_lived
    from gateway.ops.server import Server
    from gateway.ops.systemd import Notifier

    path = find_config_path(a.config)
    ov = overrides_from_args(a)

    def loader() -> ServerConfig:
        return load_config(path, ov)[0]

    hold_reloads()
    role: WorkerRole | None = a.worker
    if role is not None:
        die_with_supervisor(config.server.drain_timeout_s)
    server: Server | Supervisor
    if role is None and worker_count(config.server.workers) > 1:
        why = await asyncio.to_thread(cannot_share, config)
        if why:
            config = dataclasses.replace(
                config, server=dataclasses.replace(config.server, workers=1)
            )
    if role is None and worker_count(config.server.workers) > 1:
        server = Supervisor(config, argv, notifier=Notifier(), config_loader=loader)
    else:
        server = Server(config, notifier=Notifier(), config_loader=loader, role=role)
    try:
        await server.start()
    except OSError as e:  # a port in use, a directory we may not create
        import structlog

        structlog.get_logger("gateway.ops.cli").error("start_failed", error=str(e))
        await stop_now(server)
        return 1
    except BaseException:
        await stop_now(server)
        raise
    if isinstance(server, Server):
        freeze_long_lived()
    return await server.run_until_signalled()


async def stop_now(server: Server | Supervisor) -> None:
    if isinstance(server, Supervisor):
        await server.stop()
    else:
        await server.stop(drain_timeout_s=0)


def check(a: argparse.Namespace) -> int:
    """``nfsgw check-config``."""
    path = find_config_path(a.config)
    r = check_config(path, overrides_from_args(a))
    print_issues(r.issues, a.quiet)
    if r.config is None:
        n = len(r.errors)
        print(f"nfsgw: {n} error{'s' if n != 1 else ''} in the configuration", file=sys.stderr)
        return 1
    if not a.quiet:
        c = r.config
        src = str(path) if path else "command line"
        print(
            f"{src}: OK: {len(c.exports)} export{'s' if len(c.exports) != 1 else ''} "
            f"({', '.join(e.path for e in c.exports)}) on {c.server.listen}:{c.server.port}; "
            f"admin API {c.admin.listen or 'off'}; {len(r.warnings)} warning"
            f"{'s' if len(r.warnings) != 1 else ''}"
        )
    return 0


def serve_main(a: argparse.Namespace, argv: Sequence[str]) -> int:
    """``nfsgw serve``: exit 2 when the configuration has errors."""
    try:
        config, warnings = load_config(find_config_path(a.config), overrides_from_args(a))
    except ConfigErrors as e:
        print_issues(e.issues)
        print("nfsgw: not starting (nfsgw check-config shows the same)", file=sys.stderr)
        return 2
    logs.configure_from(config.log.level, config.log.format)
    if warnings:
        import structlog

        for w in warnings:
            structlog.get_logger("gateway.ops.config").warning(
                "config_warning", where=w.where, location=w.location, message=w.message
            )
    if config.server.uvloop:
        # Only a missing uvloop falls back to asyncio: an ImportError raised while serving
        # propagates instead of starting the gateway a second time.
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return int(uvloop.run(serve(config, a, argv)))
    return asyncio.run(serve(config, a, argv))
