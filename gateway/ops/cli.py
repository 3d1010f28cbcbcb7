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

The entry point (``nfsgw`` = ``gateway.ops.cli:main``; ``python -m gateway.ops.cli`` runs the
same, as the worker supervisor and the tests do). Each command lives in its module:
``cmd_serve`` (serve, check-config), ``cmd_admin`` (the admin client commands), ``cmd_pack``;
the flag helpers they share in ``cliflags``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from gateway import version
from gateway.ops import cmd_admin, cmd_pack, cmd_serve, logs
from gateway.ops.cliflags import config_from_args, overrides_from_args
from gateway.ops.cmd_admin import job_line as _job_line

__all__ = ["_job_line", "build_parser", "config_from_args", "main", "overrides_from_args"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nfsgw",
        description="NFSv3 gateway in front of S3-compatible object storage, built for ML "
        "training: directory metadata prefetch and read coalescing make each small file cost "
        "at most one backend request in a cold epoch and none in a warm one.",
    )
    p.add_argument("--version", action="version", version=f"nfsgw {version()}")
    sub = p.add_subparsers(dest="command", required=True)
    cmd_serve.add_parsers(sub)
    cmd_admin.add_parsers(sub)
    cmd_pack.add_parser(sub)
    return p


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "check-config": cmd_serve.check,
    "stats": cmd_admin.stats,
    "warmup": cmd_admin.warmup,
    "invalidate": cmd_admin.invalidate,
    "reload": cmd_admin.reload,
    "pack": cmd_pack.pack_main,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    a = build_parser().parse_args(args)
    if a.command == "serve":
        return cmd_serve.serve_main(a, args)  # logging from [log]; pack's too
    if argv is None and a.command != "pack":
        # The program itself (not a caller's main([...]), whose logging stays its own): the
        # admin clients' and check-config's lines rendered like serve's.
        logs.configure()
    run = _COMMANDS.get(a.command)
    return 2 if run is None else run(a)


if __name__ == "__main__":
    sys.exit(main())
