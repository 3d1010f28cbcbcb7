"""``nfsgw`` command line.

- ``nfsgw serve [--config FILE] [flags]``: run the gateway. The file (``--config``, else
  ``$NFSGW_CONFIG``, else ``/etc/nfsgw/nfsgw.toml`` when it exists) is read first; flags given
  on the command line win over it (``--export`` adds an export or replaces the file's export
  with the same path; ``--read-only``, ``--attr-ttl`` and ``--immutable`` apply to every
  export).
- ``nfsgw check-config [--config FILE] [flags]``: report every error and warning with its
  location and a fix; exit 0 when there is no error, 1 otherwise.
- ``nfsgw pack SRC --to DST [--shard-size N] [--concurrency N] [--verify | --verify-only]``:
  pack every object under SRC into tar shards plus an index under DST
  (``gateway.pack.packer``), with the S3 settings ``serve`` uses (``--config``, the ``--s3-*``
  flags, the AWS credential chain). Exit 0 when done, 1 on a failure during the work or a
  verification error, 2 when SRC or DST cannot be used (nothing is written then), 130 when
  interrupted (Ctrl-C or SIGTERM: the shard being uploaded is aborted; run it again to resume).
- ``nfsgw stats``, ``nfsgw warmup PATH``, ``nfsgw invalidate PATH``, ``nfsgw reload``: call
  the admin API of a running gateway (its address and token from ``--admin-url`` /
  ``--token-file`` or the config file).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.ops import logs
from gateway.ops.config import DEFAULT_ADMIN_LISTEN, Flag, ServerConfig, flags, split_listen
from gateway.ops.configfile import (
    ConfigErrors,
    Overrides,
    check_config,
    find_config_path,
    load_config,
)
from gateway.ops.workers import Supervisor, WorkerRole, hold_reloads, worker_count

if TYPE_CHECKING:
    from gateway.backend.base import ObjectStore
    from gateway.ops.server import Server
    from gateway.pack.packer import PackOptions


def _dest(f: Flag) -> str:
    return f.name.removeprefix("--").replace("-", "_")


def _add_config_flags(s: argparse.ArgumentParser) -> None:
    """Flags shared by ``serve`` and ``check-config``, one per setting that declares a flag
    (``gateway.ops.config.flags``). Defaults are None: only flags given on the command line
    override the file; the defaults shown are the file's."""
    s.add_argument(
        "--config",
        metavar="FILE",
        help="TOML configuration (default: $NFSGW_CONFIG, else /etc/nfsgw/nfsgw.toml if it exists)",
    )
    groups: dict[str, argparse._ArgumentGroup] = {}
    for f in flags():
        g = groups.get(f.group)
        if g is None:
            g = groups[f.group] = s.add_argument_group(f.group)
            if f.table == "export":
                g.add_argument(
                    "--export",
                    action="append",
                    metavar="/PATH=URL",
                    help="export PATH backed by s3://BUCKET/PREFIX or file:///DIR; repeatable; "
                    "replaces a file export with the same path",
                )
        conv = f.entry.setting.conv
        if f.switch:
            g.add_argument(f.name, action="store_true", default=None, help=f.help())
        else:
            g.add_argument(
                f.name,
                type=conv.cli,
                choices=conv.choices,
                metavar=f.entry.setting.metavar,
                help=f.help(),
            )


def _add_client_flags(s: argparse.ArgumentParser) -> None:
    s.add_argument("--config", metavar="FILE", help="read the admin address and token from it")
    s.add_argument(
        "--admin-url",
        help=f"the gateway's admin API (default: from the config, else "
        f"http://{DEFAULT_ADMIN_LISTEN})",
    )
    s.add_argument("--token-file", help="bearer token for the admin API")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nfsgw",
        description="NFSv3 gateway in front of S3-compatible object storage, built for ML "
        "training: directory metadata prefetch and read coalescing make each small file cost "
        "at most one backend request in a cold epoch and none in a warm one.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser(
        "serve", help="serve exports over NFSv3 + MOUNTv3 (+ a PORTMAP responder) on one TCP port"
    )
    _add_config_flags(s)
    # Set by the supervisor of ``--workers N`` on each worker it starts (gateway.ops.workers).
    s.add_argument("--worker", type=WorkerRole.parse, default=None, help=argparse.SUPPRESS)
    cc = sub.add_parser(
        "check-config",
        help="check a configuration: every error with its location and a fix (exit 1 on errors)",
    )
    _add_config_flags(cc)
    cc.add_argument("--quiet", action="store_true", help="print errors only")
    st = sub.add_parser("stats", help="print a running gateway's statistics")
    _add_client_flags(st)
    st.add_argument("--json", action="store_true", help="the raw JSON of GET /v1/stats")
    w = sub.add_parser(
        "warmup", help="prefetch the metadata (and with --data the contents) of a subtree"
    )
    _add_client_flags(w)
    w.add_argument("path", help="/EXPORT/DIR to warm")
    w.add_argument(
        "--data",
        action="store_true",
        help="also fetch every file: into the disk tier when there is one (stops at its "
        "budget; files already there are skipped, so a second run resumes), else into memory",
    )
    w.add_argument("--concurrency", type=int, default=8, help="backend requests at once")
    w.add_argument("--no-wait", action="store_true", help="start the job and return")
    inv = sub.add_parser("invalidate", help="make the gateway forget cached metadata of a path")
    _add_client_flags(inv)
    inv.add_argument("path", help="/EXPORT/PATH")
    inv.add_argument("--subtree", action="store_true", help="everything under the path too")
    rl = sub.add_parser("reload", help="re-read the configuration (like SIGHUP)")
    _add_client_flags(rl)
    _add_pack_parser(sub)
    return p


def _add_pack_parser(sub: Any) -> None:
    pk = sub.add_parser(
        "pack",
        help="pack every object under SRC into tar shards plus an index under DST (resumable)",
        description="Stream every object under SRC, in key order, into POSIX tar shards "
        "DST/shard-NNNNNN.tar and write the index DST/index.tsv.gz (docs/packs.md). Run it "
        "again after an interruption: finished shards are kept and packing continues after "
        "them. SRC is only read.",
    )
    pk.add_argument("src", metavar="SRC", help="s3://BUCKET/PREFIX (or file:///DIR) to pack")
    pk.add_argument("--to", dest="dst", required=True, metavar="DST", help="s3://BUCKET/PREFIX")
    pk.add_argument(
        "--config",
        metavar="FILE",
        help="read the [s3] settings from it (default: $NFSGW_CONFIG, else "
        "/etc/nfsgw/nfsgw.toml if it exists)",
    )
    g = pk.add_argument_group("S3")
    for f in flags():
        if f.table != "s3":
            continue
        conv = f.entry.setting.conv
        if f.switch:
            g.add_argument(f.name, action="store_true", default=None, help=f.help())
        else:
            g.add_argument(
                f.name,
                type=conv.cli,
                choices=conv.choices,
                metavar=f.entry.setting.metavar,
                help=f.help(),
            )
    pk.add_argument(
        "--shard-size", type=_size_arg, default="256M", help="bytes per shard (default 256M)"
    )
    pk.add_argument("--concurrency", type=int, default=16, help="GETs in flight (default 16)")
    pk.add_argument(
        "--verify",
        action="store_true",
        help="after packing, re-read every shard and check every member's CRC-32",
    )
    pk.add_argument(
        "--verify-only", action="store_true", help="only check the existing pack at DST"
    )
    pk.add_argument("--quiet", action="store_true", help="no progress line")
    # Tests: stop (as if killed) after N new shards, without writing the index.
    pk.add_argument("--stop-after-shards", type=int, default=None, help=argparse.SUPPRESS)


def overrides_from_args(a: argparse.Namespace) -> Overrides:
    sections: dict[tuple[str, str], tuple[object, str]] = {}
    every: dict[str, tuple[object, str]] = {}
    for f in flags():
        v = getattr(a, _dest(f), None)
        if v is None or (f.switch and not v):
            continue
        if f.switch:
            v = not f.entry.default()
        if f.table == "export":
            every[f.entry.key] = (v, f.name)
        else:
            sections[(f.table, f.entry.key)] = (v, f.name)
    return Overrides(sections, tuple(a.export or ()), every)


def config_from_args(a: argparse.Namespace) -> ServerConfig:
    """The configuration ``serve`` would run with (raises ``ConfigErrors``)."""
    return load_config(find_config_path(a.config), overrides_from_args(a))[0]


def _cannot_share(config: ServerConfig) -> str:
    """Why the workers could not share one data cache ("" when they can), said in one line:
    without it each would fetch and hold every file it serves (N copies, N GETs), so the
    gateway serves with one process instead."""
    from gateway.data.disk import resolve_cache_dir, usable

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


async def _serve(config: ServerConfig, a: argparse.Namespace, argv: Sequence[str]) -> int:
    from gateway.ops.gcwatch import freeze_long_lived
    from gateway.ops.server import Server
    from gateway.ops.systemd import Notifier

    path = find_config_path(a.config)
    ov = overrides_from_args(a)

    def loader() -> ServerConfig:
        return load_config(path, ov)[0]

    hold_reloads()
    role: WorkerRole | None = a.worker
    server: Server | Supervisor
    if role is None and worker_count(config.server.workers) > 1:
        why = await asyncio.to_thread(_cannot_share, config)
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
        await _stop_now(server)
        return 1
    except BaseException:
        await _stop_now(server)
        raise
    if isinstance(server, Server):
        freeze_long_lived()
    return await server.run_until_signalled()


async def _stop_now(server: Server | Supervisor) -> None:
    if isinstance(server, Supervisor):
        await server.stop()
    else:
        await server.stop(drain_timeout_s=0)


def _print_issues(issues: Sequence[Any], quiet: bool = False) -> None:
    for i in issues:
        if quiet and i.severity != "error":
            continue
        print(i.format(), file=sys.stderr)


def _check(a: argparse.Namespace) -> int:
    path = find_config_path(a.config)
    r = check_config(path, overrides_from_args(a))
    _print_issues(r.issues, a.quiet)
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


def _serve_main(a: argparse.Namespace, argv: Sequence[str]) -> int:
    try:
        config, warnings = load_config(find_config_path(a.config), overrides_from_args(a))
    except ConfigErrors as e:
        _print_issues(e.issues)
        print("nfsgw: not starting (nfsgw check-config shows the same)", file=sys.stderr)
        return 2
    fmt = config.log.format
    logs.configure(config.log.level, None if fmt == "auto" else fmt == "json")
    if warnings:
        import structlog

        for w in warnings:
            structlog.get_logger("gateway.ops.config").warning(
                "config_warning", where=w.where, location=w.location, message=w.message
            )
    if config.server.uvloop:
        try:
            import uvloop

            return int(uvloop.run(_serve(config, a, argv)))
        except ImportError:
            pass
    return asyncio.run(_serve(config, a, argv))


# ---------------------------------------------------------------------------- admin clients


def _admin(a: argparse.Namespace) -> tuple[str, str | None]:
    """(base URL, token) for the client commands."""
    url = a.admin_url
    token_file = a.token_file
    path = find_config_path(a.config)
    if path is not None and (url is None or token_file is None):
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8")).get("admin", {})
        except (OSError, tomllib.TOMLDecodeError):
            raw = {}
        if url is None and isinstance(raw.get("listen"), str) and raw["listen"]:
            host, port = split_listen(raw["listen"])
            host = "127.0.0.1" if host in ("0.0.0.0", "") else "::1" if host == "::" else host
            url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        if token_file is None and isinstance(raw.get("token_file"), str):
            token_file = raw["token_file"]
    url = (url or f"http://{DEFAULT_ADMIN_LISTEN}").rstrip("/")
    if not url.startswith("http"):
        url = "http://" + url
    token = os.environ.get("NFSGW_ADMIN_TOKEN")
    if token_file:
        token = Path(token_file).read_text(encoding="utf-8").strip()
    return url, token


def _call(
    a: argparse.Namespace, method: str, path: str, body: dict[str, Any] | None = None
) -> tuple[int, Any]:
    base, token = _admin(a)
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read() or b"null")
        except ValueError:
            return e.code, {"error": e.reason}
    except (urllib.error.URLError, OSError) as e:
        raise SystemExit(f"nfsgw: cannot reach the admin API at {base}: {e}") from None


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _stats(a: argparse.Namespace) -> int:
    code, s = _call(a, "GET", "/v1/stats")
    if code != 200:
        print(f"nfsgw: {code}: {s}", file=sys.stderr)
        return 1
    if a.json:
        print(json.dumps(s, indent=2, sort_keys=True))
        return 0
    dc, md = s["data_cache"], s["metadata"]
    out = [
        f"nfsgw {s['version']}, up {s['uptime_s']:.0f} s, port {s['port']}, "
        f"{'ready' if s['ready'] else 'not ready'}",
        f"connections: {s['connections']['open']} open, {s['connections']['opened']} opened, "
        f"{s['connections']['refused']} refused; calls in flight: {s['rpc']['inflight']}",
        f"RPC calls: {s['rpc']['calls_total']}; network in {_human(s['network']['received_bytes'])}"
        f", out {_human(s['network']['sent_bytes'])}",
        f"files opened: {s['files_opened']}; backend requests: {s['backend']['requests_total']} "
        f"({s['backend_requests_per_file_opened']} per file opened)",
    ]
    for op, outcomes in sorted(s["backend"]["requests"].items()):
        out.append(f"  {op:<20} " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
    out.append(
        f"data cache: {_human(dc.get('cache_bytes', 0))} of {_human(dc['budget_bytes'])}, "
        f"hits {dc.get('hits', 0)}, misses {dc.get('misses', 0)} (hit ratio {dc['hit_ratio']}), "
        f"evictions {dc.get('evictions', 0)}, read-ahead blocks {dc.get('readahead_blocks', 0)}"
    )
    dk = s.get("disk_cache") or {}
    if dk.get("enabled"):
        out.append(
            f"disk cache: {_human(dk['used_bytes'])} of {_human(dk['budget_bytes'])} "
            f"({dk['entries']} entries, {_human(dk['fs_free_bytes'])} free on its filesystem), "
            f"hits {dk['hits']}, misses {dk['misses']} (hit ratio {dk['hit_ratio']}), "
            f"evictions {dk['evictions']}, corrupt {dk['corrupt']}, "
            f"errors {dk['read_errors'] + dk['write_errors']}"
        )
    out.append(
        f"metadata: {md.get('dirs', 0)} dirs, {md.get('entries', 0)} entries, "
        f"{_human(md.get('bytes', 0))}; hits {md.get('hits', 0)}, negative "
        f"{md.get('negative_hits', 0)}, listings {md.get('prefetches', 0)} (+{md.get('relists', 0)}"
        f" re-lists), evictions {md.get('evictions', 0)}"
    )
    for e in s["exports"]:
        out.append(
            f"export {e['path']} <- {e['backend']} ({'ro' if e['read_only'] else 'rw'}, "
            f"squash {e['squash']}, clients {', '.join(e['clients'])})"
        )
    for j in s["warmups"]:
        out.append(_job_line(j))
    print("\n".join(out))
    return 0


def _progress(j: dict[str, Any]) -> str:
    """A data warm-up's bar, share and ETA ("ETA >=" while it is still listing)."""
    if not j.get("data") or "target_bytes" not in j:
        return ""
    done = j["bytes_read"] + j["bytes_cached"]
    target = min(j["bytes_seen"], j["target_bytes"]) if j["target_bytes"] else j["bytes_seen"]
    frac = min(1.0, done / target) if target else float(j["state"] == "done")
    n = int(frac * 20)
    eta = j.get("eta_s")
    when = "" if eta is None else f", ETA {'>= ' if j.get('listing') else ''}{eta:.0f} s"
    return f"[{'#' * n}{'.' * (20 - n)}] {frac:4.0%} of {_human(target)}{when} "


def _job_line(j: dict[str, Any]) -> str:
    data = ""
    if j["data"]:
        data = f", {j['files_read']} files / {_human(j['bytes_read'])} read"
        if j.get("tier"):
            data += f" into {j['tier']}, {j.get('files_cached', 0)} already cached"
    err = f", error: {j['error']}" if j.get("error") else ""
    err += f", stopped: {j['stopped']}" if j.get("stopped") else ""
    return (
        f"{_progress(j)}warmup #{j['id']} {j['path']}: {j['state']}, {j['dirs_listed']} dirs, "
        f"{j['files_seen']} files ({_human(j['bytes_seen'])}){data}, {j['errors']} errors, "
        f"{j['elapsed_s']:.1f} s{err}"
    )


def _warmup(a: argparse.Namespace) -> int:
    body = {"path": a.path, "data": a.data, "concurrency": a.concurrency}
    code, job = _call(a, "POST", "/v1/warmup", body)
    if code not in (200, 202):
        print(
            f"nfsgw: warmup refused ({code}): {job.get('error') if job else job}", file=sys.stderr
        )
        return 1
    tty = sys.stdout.isatty()  # on a terminal the progress line is redrawn in place
    print(_job_line(job), end="" if tty and not a.no_wait else "\n", flush=True)
    if a.no_wait:
        return 0
    while job["state"] == "running":
        time.sleep(1.0)
        code, job = _call(a, "GET", f"/v1/warmup/{job['id']}")
        if code != 200:
            print(f"\nnfsgw: lost the warm-up ({code})", file=sys.stderr)
            return 1
        line = _job_line(job)
        print(f"\r{line}\x1b[K" if tty else line, end="", flush=True)
        if not tty:
            print()
    if tty:
        print()
    return 0 if job["state"] == "done" else 1


def _invalidate(a: argparse.Namespace) -> int:
    code, r = _call(a, "POST", "/v1/invalidate", {"path": a.path, "subtree": a.subtree})
    print(json.dumps(r))
    return 0 if code == 200 else 1


def _reload(a: argparse.Namespace) -> int:
    code, r = _call(a, "POST", "/v1/reload")
    if code == 200:
        print("reloaded")
        return 0
    for e in (r or {}).get("errors", []):
        print(e, file=sys.stderr)
    print("nfsgw: reload failed; the gateway keeps its running configuration", file=sys.stderr)
    return 1


# ----------------------------------------------------------------------------------- pack


def _size_arg(text: str) -> int:
    from gateway.settings import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _pack_main(a: argparse.Namespace) -> int:
    from gateway.backend import StoreUrl, open_store, parse_store_url
    from gateway.pack.packer import PackFailed, PackOptions, nested

    try:
        su, du = parse_store_url(a.src), parse_store_url(a.dst)
        opts = PackOptions(
            shard_size=a.shard_size,
            concurrency=a.concurrency,
            stop_after_shards=a.stop_after_shards,
        )
    except ValueError as e:
        print(f"nfsgw pack: {e}", file=sys.stderr)
        return 2
    sections: dict[tuple[str, str], tuple[object, str]] = {}
    for f in flags():
        v = getattr(a, _dest(f), None)
        if f.table == "s3" and v is not None and not (f.switch and not v):
            sections[("s3", f.entry.key)] = (not f.entry.default() if f.switch else v, f.name)
    # The file's [s3] table and the flags, checked like ``serve`` checks them (a configuration
    # is whole with an export: SRC is it).
    r = check_config(find_config_path(a.config), Overrides(sections, (f"/.nfsgw-pack={a.src}",)))
    if r.config is None:
        _print_issues(r.issues, quiet=True)
        print("nfsgw pack: not packing: fix the configuration first", file=sys.stderr)
        return 2
    s3 = r.config.s3

    def where(u: StoreUrl) -> tuple[str, str]:  # (bucket, prefix); a directory as a prefix
        return (u.location, u.prefix) if u.scheme == "s3" else ("", u.location.rstrip("/") + "/")

    if su.scheme == du.scheme and nested(*where(su), *where(du)):
        print(
            f"nfsgw pack: {a.dst} and {a.src} overlap: DST must lie outside SRC (and SRC "
            "outside DST)",
            file=sys.stderr,
        )
        return 2

    def store(url: str) -> ObjectStore:
        if not url.startswith("s3://"):
            return open_store(url)
        return open_store(
            url,
            endpoint_url=s3.endpoint_url,
            region=s3.region,
            addressing_style=s3.addressing_style,
            profile=s3.profile,
            anonymous=s3.anonymous or None,
            lean_http=s3.lean_http and None,  # true: NFSGW_S3_LEAN_HTTP decides (default on)
            max_connections=max(s3.max_connections, a.concurrency + 8),
            retry=s3.retry,
            checksums=s3.checksums,
        )

    source = f"{su.scheme}://{su.location}/{su.prefix}" if su.scheme == "s3" else a.src
    try:
        src, dst = store(a.src), store(a.dst)
    except ValueError as e:
        print(f"nfsgw pack: {e}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_pack(a, src, su.prefix, dst, du.prefix, source, opts))
    except PackFailed as e:
        print(f"nfsgw pack: {e}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("\nnfsgw pack: interrupted; run the same command again to resume", file=sys.stderr)
        return 130


async def _pack(
    a: argparse.Namespace,
    src: ObjectStore,
    src_prefix: str,
    dst: ObjectStore,
    dst_prefix: str,
    source: str,
    opts: PackOptions,
) -> int:
    import signal

    from gateway.backend.base import BackendError
    from gateway.pack.format import PackError
    from gateway.pack.packer import Packer, Progress, check_access
    from gateway.pack.verify import verify

    main = asyncio.current_task()
    loop = asyncio.get_running_loop()
    if main is not None:  # SIGTERM like Ctrl-C: abort the shard being uploaded, then exit
        loop.add_signal_handler(signal.SIGTERM, main.cancel)
    progress = None if a.quiet else Progress("pack")
    mb = 1e6
    try:
        if not a.verify_only:
            await check_access(src, src_prefix, dst, dst_prefix, a.src, a.dst)
            try:
                rep = await Packer(src, src_prefix, dst, dst_prefix, source, opts, progress).run()
            except (BackendError, PackError) as e:
                print(f"nfsgw pack: failed: {e} (run it again to resume)", file=sys.stderr)
                return 1
            rate = rep.bytes / rep.seconds / mb if rep.seconds else 0.0
            print(
                f"packed {rep.files} files, {rep.bytes / mb:.1f} MB into {rep.shards} shards in "
                f"{rep.seconds:.1f} s ({rate:.1f} MB/s); kept {rep.resumed_shards} finished "
                f"shards ({rep.resumed_files} files); skipped {rep.skipped} (dir markers "
                f"{rep.skipped_markers}, unservable names {rep.skipped_names}, changed "
                f"{rep.changed}, deleted {rep.deleted})"
            )
            if rep.rewritten:
                print(f"note: {rep.rewritten}")
            if rep.stopped:
                print(f"stopped after {rep.shards} shards; run it again to finish")
                return 0
            print(
                f"index: {a.dst.rstrip('/')}/{rep.index_key[len(dst_prefix) :]} "
                f"({rep.total_files} files in {rep.total_shards} shards, "
                f"{rep.total_bytes / mb:.1f} MB)"
            )
        if a.verify or a.verify_only:
            try:
                v = await verify(dst, dst_prefix, progress=None if a.quiet else Progress("verify"))
            except BackendError as e:
                print(f"nfsgw pack: verify failed: {e}", file=sys.stderr)
                return 1
            for err in v.errors[:50]:
                print(f"verify: {err}", file=sys.stderr)
            rate = v.bytes / v.seconds / mb if v.seconds else 0.0
            print(
                f"verify: {v.files} files in {v.shards} shards, {v.bytes / mb:.1f} MB in "
                f"{v.seconds:.1f} s ({rate:.1f} MB/s): "
                + ("OK" if v.ok else f"{len(v.errors)} errors")
            )
            if not v.ok:
                return 1
        return 0
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        await src.close()
        await dst.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    a = build_parser().parse_args(args)
    cmd = a.command
    if cmd == "serve":
        return _serve_main(a, args)
    if cmd == "check-config":
        return _check(a)
    if cmd == "stats":
        return _stats(a)
    if cmd == "warmup":
        return _warmup(a)
    if cmd == "invalidate":
        return _invalidate(a)
    if cmd == "reload":
        return _reload(a)
    if cmd == "pack":
        return _pack_main(a)
    return 2


if __name__ == "__main__":
    sys.exit(main())
