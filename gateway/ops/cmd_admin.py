"""The admin client commands: ``nfsgw stats``, ``nfsgw warmup PATH``, ``nfsgw invalidate
PATH``, ``nfsgw reload``. Each calls the admin API of a running gateway (its address and token
from ``--admin-url`` / ``--token-file``, else the config file's ``[admin]``, else
``$NFSGW_ADMIN_TOKEN`` and the default address) and prints the answer for a person. The
address is ``http://HOST:PORT`` or ``unix:/PATH`` (the Unix-socket listen, trusted by its
file mode: no token needed); on TCP a mutating call (reload, invalidate, warm-up) needs the
token.

Must not: import ``gateway.ops.cli`` (it imports this module).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import sys
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from gateway.ops.cliflags import add_client_flags
from gateway.ops.config import DEFAULT_ADMIN_LISTEN, UNIX_PREFIX, split_listen
from gateway.ops.configfile import find_config_path


def add_parsers(sub: Any) -> None:
    st = sub.add_parser("stats", help="print a running gateway's statistics")
    add_client_flags(st)
    st.add_argument("--json", action="store_true", help="the raw JSON of GET /v1/stats")
    w = sub.add_parser(
        "warmup", help="prefetch the metadata (and with --data the contents) of a subtree"
    )
    add_client_flags(w)
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
    add_client_flags(inv)
    inv.add_argument("path", help="/EXPORT/PATH")
    inv.add_argument("--subtree", action="store_true", help="everything under the path too")
    rl = sub.add_parser("reload", help="re-read the configuration (like SIGHUP)")
    add_client_flags(rl)


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
        listen = raw.get("listen")
        if url is None and isinstance(listen, str) and listen.startswith(UNIX_PREFIX):
            url = listen
        elif url is None and isinstance(listen, str) and listen:
            host, port = split_listen(listen)
            host = "127.0.0.1" if host in ("0.0.0.0", "") else "::1" if host == "::" else host
            url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        if token_file is None and isinstance(raw.get("token_file"), str):
            token_file = raw["token_file"]
    url = (url or f"http://{DEFAULT_ADMIN_LISTEN}").rstrip("/")
    if not url.startswith(("http", UNIX_PREFIX)):
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
    headers = {"Content-Type": "application/json"} if data is not None else {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if base.startswith(UNIX_PREFIX):
        return _call_unix(base, method, path, data, headers)
    req = urllib.request.Request(base + path, data=data, method=method, headers=headers)
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


class _UnixConnection(http.client.HTTPConnection):
    """HTTP/1.1 to a Unix socket (the admin API's ``unix:/PATH`` listen)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self.path)
        except OSError:
            s.close()
            raise
        self.sock = s


def _call_unix(
    base: str, method: str, path: str, data: bytes | None, headers: dict[str, str]
) -> tuple[int, Any]:
    sock_path = base[len(UNIX_PREFIX) :]
    conn = _UnixConnection(sock_path, timeout=30)
    try:
        conn.request(method, path, body=data, headers=headers)
        r = conn.getresponse()
        raw = r.read()
    except OSError as e:
        raise SystemExit(f"nfsgw: cannot reach the admin API at {base}: {e}") from None
    finally:
        conn.close()
    try:
        return r.status, json.loads(raw or b"null")
    except ValueError:
        return r.status, {"error": r.reason}


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def stats(a: argparse.Namespace) -> int:
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
            f"squash {e['squash']}, clients {', '.join(e['clients'])}, "
            f"{'secure' if e.get('secure_port', True) else 'insecure'}, "
            f"sec {','.join(e.get('sec', ['sys']))})"
        )
    for j in s["warmups"]:
        out.append(job_line(j))
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


def job_line(j: dict[str, Any]) -> str:
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


def warmup(a: argparse.Namespace) -> int:
    body = {"path": a.path, "data": a.data, "concurrency": a.concurrency}
    code, job = _call(a, "POST", "/v1/warmup", body)
    if code not in (200, 202):
        print(
            f"nfsgw: warmup refused ({code}): {job.get('error') if job else job}", file=sys.stderr
        )
        return 1
    tty = sys.stdout.isatty()  # on a terminal the progress line is redrawn in place
    print(job_line(job), end="" if tty and not a.no_wait else "\n", flush=True)
    if a.no_wait:
        return 0
    while job["state"] == "running":
        time.sleep(1.0)
        code, job = _call(a, "GET", f"/v1/warmup/{job['id']}")
        if code != 200:
            print(f"\nnfsgw: lost the warm-up ({code})", file=sys.stderr)
            return 1
        line = job_line(job)
        print(f"\r{line}\x1b[K" if tty else line, end="", flush=True)
        if not tty:
            print()
    if tty:
        print()
    return 0 if job["state"] == "done" else 1


def invalidate(a: argparse.Namespace) -> int:
    code, r = _call(a, "POST", "/v1/invalidate", {"path": a.path, "subtree": a.subtree})
    print(json.dumps(r))
    return 0 if code == 200 else 1


def reload(a: argparse.Namespace) -> int:
    code, r = _call(a, "POST", "/v1/reload")
    if code == 200:
        print("reloaded")
        return 0
    for e in (r or {}).get("errors", []):
        print(e, file=sys.stderr)
    print("nfsgw: reload failed; the gateway keeps its running configuration", file=sys.stderr)
    return 1
