"""``nfsgw`` command line: ``nfsgw serve ...``."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from gateway import logs
from gateway.config import (
    ConfigError,
    ExportConfig,
    S3Config,
    ServerConfig,
    default_cache_memory,
    parse_export,
    parse_size,
)


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nfsgw",
        description="NFSv3 gateway in front of S3-compatible object storage, built for ML "
        "training: directory metadata prefetch and read coalescing make each small file cost "
        "at most one backend request in a cold epoch and none in a warm one.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser(
        "serve",
        help="serve exports over NFSv3 + MOUNTv3 (+ a PORTMAP responder) on one TCP port",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    s.add_argument("--listen", default="127.0.0.1", help="address to listen on")
    s.add_argument(
        "--port",
        type=int,
        default=2049,
        help="TCP port for NFS, MOUNT and PORTMAP (0 = any free port)",
    )
    s.add_argument(
        "--export",
        action="append",
        required=True,
        metavar="/PATH=URL",
        help="export PATH backed by s3://BUCKET/PREFIX or file:///DIR; repeatable",
    )
    s.add_argument("--read-only", action="store_true", help="make every export read-only")
    s.add_argument("--s3-endpoint-url", help="S3 endpoint (default: AWS for the region)")
    s.add_argument("--s3-region", default="us-east-1", help="S3 region used for signing")
    s.add_argument(
        "--s3-addressing-style",
        choices=["auto", "path", "virtual"],
        default="auto",
        help="bucket addressing (auto: path with an endpoint URL)",
    )
    s.add_argument("--s3-profile", help="AWS shared-config profile for credentials")
    s.add_argument(
        "--s3-max-connections", type=int, default=64, help="concurrent backend connections"
    )
    s.add_argument(
        "--state-dir",
        type=Path,
        default=Path("/var/lib/nfsgw"),
        help="handle secret and long-handle map live here",
    )
    s.add_argument(
        "--cache-memory",
        type=_size,
        default=None,
        help="data cache budget, e.g. 8G (default: a quarter of RAM, "
        f"here {default_cache_memory() >> 20} MiB)",
    )
    s.add_argument(
        "--metadata-memory",
        type=_size,
        default=256 << 20,
        help="directory index budget across exports",
    )
    s.add_argument(
        "--small-file-max",
        type=_size,
        default=4 << 20,
        help="objects up to this size are fetched whole on first READ",
    )
    s.add_argument("--block-size", type=_size, default=1 << 20, help="read block of larger objects")
    s.add_argument(
        "--max-readahead",
        type=_size,
        default=32 << 20,
        help="largest read-ahead window on sequential reads",
    )
    s.add_argument(
        "--attr-ttl",
        type=float,
        default=60.0,
        help="seconds before a listed directory is re-listed (in the background)",
    )
    s.add_argument(
        "--immutable",
        action="store_true",
        help="the bucket never changes under the gateway: listings never expire",
    )
    s.add_argument(
        "--no-prefetch",
        action="store_true",
        help="disable directory metadata prefetch (for comparisons)",
    )
    s.add_argument(
        "--no-coalesce",
        action="store_true",
        help="disable whole-object reads and read-ahead (for comparisons)",
    )
    s.add_argument(
        "--portmap-port",
        type=int,
        default=None,
        help="also answer PORTMAP on this port (111); if a system rpcbind owns "
        "it, register our programs there instead",
    )
    s.add_argument(
        "--metrics-listen",
        default=None,
        metavar="HOST:PORT",
        help="serve /metrics and /healthz here, e.g. 127.0.0.1:9426",
    )
    s.add_argument(
        "--max-inflight",
        type=int,
        default=64,
        help="calls in flight per connection before it stops reading",
    )
    s.add_argument(
        "--max-record",
        type=_size,
        default=4 * 1024 * 1024 + 64 * 1024,
        help="largest RPC record accepted; larger ones close the connection",
    )
    s.add_argument("--no-uvloop", action="store_true", help="use the default asyncio loop")
    s.add_argument("--log-level", default="info", help="debug, info, warning, error")
    s.add_argument(
        "--log-format",
        choices=["auto", "json", "console"],
        default="auto",
        help="auto: console on a TTY, JSON otherwise",
    )
    return p


def config_from_args(a: argparse.Namespace) -> ServerConfig:
    exports: list[ExportConfig] = []
    for spec in a.export:
        e = parse_export(spec, read_only=a.read_only)
        exports.append(
            ExportConfig(
                path=e.path,
                backend=e.backend,
                read_only=e.read_only,
                attr_ttl_s=a.attr_ttl,
                immutable=a.immutable,
            )
        )
    return ServerConfig(
        listen=a.listen,
        port=a.port,
        portmap_port=a.portmap_port,
        state_dir=a.state_dir,
        exports=tuple(exports),
        s3=S3Config(
            endpoint_url=a.s3_endpoint_url,
            region=a.s3_region,
            addressing_style=a.s3_addressing_style,
            profile=a.s3_profile,
            max_connections=a.s3_max_connections,
        ),
        cache_memory=a.cache_memory if a.cache_memory is not None else default_cache_memory(),
        metadata_memory=a.metadata_memory,
        small_file_max=a.small_file_max,
        block_size=a.block_size,
        max_readahead=a.max_readahead,
        max_inflight_per_conn=a.max_inflight,
        max_record=a.max_record,
        metrics_listen=a.metrics_listen,
        uvloop=not a.no_uvloop,
        prefetch=not a.no_prefetch,
        coalesce=not a.no_coalesce,
    )


async def _serve(config: ServerConfig) -> None:
    from gateway.server import Server

    server = Server(config)
    await server.start()
    await server.run_until_signalled()


def main(argv: Sequence[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if a.command == "serve":
        try:
            config = config_from_args(a)
        except ConfigError as e:
            print(f"nfsgw: {e}", file=sys.stderr)
            return 2
        logs.configure(a.log_level, None if a.log_format == "auto" else a.log_format == "json")
        if config.uvloop:
            try:
                import uvloop

                uvloop.run(_serve(config))
                return 0
            except ImportError:
                pass
        asyncio.run(_serve(config))
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
