"""``nfsgw pack SRC --to DST``: pack every object under SRC into tar shards plus an index under
DST (``gateway.pack.packer``), with the S3 settings ``serve`` uses (``--config``, the ``--s3-*``
flags, the AWS credential chain). Exit 0 when done, 1 on a failure during the work or a
verification error, 2 when SRC or DST cannot be used (nothing is written then), 130 when
interrupted (Ctrl-C or SIGTERM: the shard being uploaded is aborted; run it again to resume).

Must not: import ``gateway.ops.cli`` (it imports this module).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING, Any

from gateway.ops import logs
from gateway.ops.cliflags import add_setting_flag, dest, print_issues
from gateway.ops.config import flags
from gateway.ops.configfile import Overrides, check_config, find_config_path

if TYPE_CHECKING:
    from gateway.backend.base import ObjectStore
    from gateway.pack.packer import PackOptions


def add_parser(sub: Any) -> None:
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
        if f.table == "s3":
            add_setting_flag(g, f)
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


def _size_arg(text: str) -> int:
    from gateway.settings import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def pack_main(a: argparse.Namespace) -> int:
    from gateway.backend import open_store, parse_store_url
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
        v = getattr(a, dest(f), None)
        if f.table == "s3" and v is not None and not (f.switch and not v):
            sections[("s3", f.entry.key)] = (not f.entry.default() if f.switch else v, f.name)
    # The file's [s3] table and the flags, checked like ``serve`` checks them (a configuration
    # is whole with an export: SRC is it).
    r = check_config(find_config_path(a.config), Overrides(sections, (f"/.nfsgw-pack={a.src}",)))
    if r.config is None:
        print_issues(r.issues, quiet=True)
        print("nfsgw pack: not packing: fix the configuration first", file=sys.stderr)
        return 2
    s3 = r.config.s3
    # Its lines (backend retries, credentials) as serve's: [log], console on a terminal.
    logs.configure_from(r.config.log.level, r.config.log.format)

    # Whether the two overlap, which store each is and what the source is called are the
    # URLs' own answers (gateway.backend), the [s3] section the stores' defaults; uploads in
    # flight need connections of their own.
    if nested(*su.space(), *du.space()):
        print(
            f"nfsgw pack: {a.dst} and {a.src} overlap: DST must lie outside SRC (and SRC "
            "outside DST)",
            file=sys.stderr,
        )
        return 2
    connections = max(s3.max_connections, a.concurrency + 8)

    def store(url: str) -> ObjectStore:
        return open_store(url, s3=s3, max_connections=connections)

    source = su.canonical()
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
    from gateway.pack.packer import Packer, PackJob, check_access
    from gateway.pack.verify import verify
    from gateway.progress import Progress

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
                rep = await Packer(
                    PackJob(src, src_prefix, dst, dst_prefix, source), opts, progress
                ).run()
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
