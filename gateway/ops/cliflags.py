"""What the ``nfsgw`` commands share (``gateway.ops.cli`` and its ``cmd_*`` modules): adding
the configuration's flags to a parser, turning the flags given into ``Overrides``, and printing
configuration issues.

Must not: import ``gateway.ops.cli`` or a ``cmd_*`` module (they import this one).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from gateway.ops.config import DEFAULT_ADMIN_LISTEN, Flag, ServerConfig, flags
from gateway.ops.configfile import Overrides, find_config_path, load_config


def dest(f: Flag) -> str:
    """The ``argparse`` attribute a setting's flag is stored in."""
    return f.name.removeprefix("--").replace("-", "_")


def add_setting_flag(g: argparse._ArgumentGroup, f: Flag) -> None:
    """One setting's flag (``gateway.ops.config.flags``), default None: only a flag given on
    the command line overrides the file."""
    conv = f.entry.setting.conv
    if f.switch:
        g.add_argument(f.name, action="store_true", default=None, help=f.help())
    else:
        g.add_argument(
            f.name,
            action="append" if conv.many else "store",
            type=conv.cli,
            choices=conv.choices,
            metavar=f.entry.setting.metavar,
            help=f.help(),
        )


def add_config_flags(s: argparse.ArgumentParser) -> None:
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
        add_setting_flag(g, f)


def add_client_flags(s: argparse.ArgumentParser) -> None:
    """Where the admin client commands find the gateway's admin API."""
    s.add_argument("--config", metavar="FILE", help="read the admin address and token from it")
    s.add_argument(
        "--admin-url",
        help=f"the gateway's admin API: http://HOST:PORT or unix:/PATH (default: from the "
        f"config, else http://{DEFAULT_ADMIN_LISTEN})",
    )
    s.add_argument("--token-file", help="bearer token for the admin API")


def overrides_from_args(a: argparse.Namespace) -> Overrides:
    sections: dict[tuple[str, str], tuple[object, str]] = {}
    every: dict[str, tuple[object, str]] = {}
    for f in flags():
        v = getattr(a, dest(f), None)
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


def print_issues(issues: Sequence[Any], quiet: bool = False) -> None:
    for i in issues:
        if quiet and i.severity != "error":
            continue
        print(i.format(), file=sys.stderr)
