"""Regenerate the golden bytes in ``tests/data/``: the Linux kernel's NFSv3 client (the e2e
guest) mounts a gateway on this host through a ``RecordingForwarder``, stats a file, lists a
directory and reads the file; the LOOKUP of ``hello.txt``, the GETATTR, ACCESS and READ of
that file, the first READDIRPLUS it sent, and our replies to them, are written one record each
(without the record mark) as ``<proc>_call.bin`` / ``<proc>_reply.bin``, with a README saying
how. ``tests/unit/nfsproto/test_golden.py`` decodes them.

    .venv/bin/python -m tests.e2e.capture_golden [--out tests/data]

Needs QEMU and the guest image (``tests.e2e.guest``); boots one guest (a minute under TCG).
Must not: change the gateway (it is served as configured for users, from a local directory).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

from gateway.exports import ExportConfig
from nfsproto import nfs3, rpc
from nfsproto.client import decode_reply
from nfsproto.nfs3 import Nfs3Proc
from nfsproto.xdr import Reader
from tests.e2e.guest import SLIRP_INSECURE, Guest, GuestImage
from tests.e2e.recorder import RecordingForwarder
from tests.harness.thread import GatewayThread

__all__ = ["FILES", "STEMS", "capture"]

DATA = Path(__file__).resolve().parents[1] / "data"
MTIME = 1_700_000_000
FILES = {
    "hello.txt": b"hello from the golden bytes of nfsgw\n",
    "dir/a.txt": b"a\n",
    "dir/b.txt": b"bb\n",
}
SCRIPT = r"""
nfs_mount /data /mnt/data || exit 9
stat /mnt/data/hello.txt > /dev/null || exit 10
ls -l /mnt/data/dir > /dev/null || exit 11
cat /mnt/data/hello.txt > /dev/null || exit 12
umount /mnt/data
"""
COMMAND = "python -m tests.e2e.capture_golden"


# Kept: the LOOKUP of LOOKUP_NAME; the GETATTR, ACCESS and READ of the file it found (what
# opening and reading a file costs); the first READDIRPLUS (of dir/).
STEMS = ("getattr", "lookup", "access", "read", "readdirplus")
LOOKUP_NAME = b"hello.txt"
_OF_THE_FILE: dict[int, str] = {
    Nfs3Proc.GETATTR: "getattr",
    Nfs3Proc.ACCESS: "access",
    Nfs3Proc.READ: "read",
}


def _pick(exchanges: list[tuple[bytes, bytes | None]]) -> dict[str, tuple[bytes, bytes]]:
    calls: list[tuple[int, Any, bytes, bytes]] = []  # (proc, args, call, reply)
    for call, reply in exchanges:
        r = Reader(call)
        try:
            h = rpc.unpack_call(r)
        except rpc.RpcDecodeError:
            continue
        if h.prog == nfs3.PROGRAM and h.vers == nfs3.VERSION and reply is not None:
            calls.append((h.proc, nfs3.PROCS[Nfs3Proc(h.proc)].unpack_args(r), call, reply))
    out: dict[str, tuple[bytes, bytes]] = {}
    file_fh = None
    for proc, args, call, reply in calls:
        if proc == Nfs3Proc.LOOKUP and args.what.name == LOOKUP_NAME and file_fh is None:
            file_fh = nfs3.unpack_lookup3res(decode_reply(reply)[1]).object
            out["lookup"] = (call, reply)
        elif proc == Nfs3Proc.READDIRPLUS and "readdirplus" not in out:
            out["readdirplus"] = (call, reply)
        elif proc in _OF_THE_FILE and file_fh is not None:
            fh = args.file if proc == Nfs3Proc.READ else args.object
            if fh == file_fh:
                out.setdefault(_OF_THE_FILE[proc], (call, reply))
    missing = sorted(set(STEMS) - set(out))
    if missing:
        raise RuntimeError(f"the capture has no call for {missing}")
    return out


def _export_dir(root: Path) -> None:
    for rel, body in FILES.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(body)
    for p in [*sorted(root.rglob("*"), reverse=True), root]:  # directories after their files
        os.utime(p, (MTIME, MTIME))


def capture(out: Path, guest: Guest | None = None) -> dict[str, Any]:
    """Boot a guest, capture, write ``out/<stem>_{call,reply}.bin`` and ``out/README.md``.
    Returns what the README records (kernel package, guest output)."""
    guest = guest or Guest(GuestImage.ensure())
    with tempfile.TemporaryDirectory(prefix="nfsgw-golden-") as tmp:
        export = Path(tmp) / "export"
        _export_dir(export)
        exports = [
            ExportConfig("/data", f"file://{export}", read_only=True, insecure=SLIRP_INSECURE)
        ]
        with (
            GatewayThread(exports, state_dir=Path(tmp) / "state") as gw,
            RecordingForwarder(gw.port) as fwd,
        ):
            r = guest.run(SCRIPT, nfs_port=fwd.port, timeout_s=300)
            exchanges = fwd.capture.exchanges()
    if r.rc != 0 or r.timed_out:
        raise RuntimeError(r.describe())
    picked = _pick(exchanges)
    out.mkdir(parents=True, exist_ok=True)
    for stem, (call, reply) in picked.items():
        (out / f"{stem}_call.bin").write_bytes(call)
        (out / f"{stem}_reply.bin").write_bytes(reply)
    kernel = guest.image.version
    (out / "README.md").write_text(
        "# Golden bytes\n\n"
        "One ONC RPC record each, without its record mark: `<proc>_call.bin` is what the Linux\n"
        f"NFSv3 client of `{kernel}` (Debian's kernel, booted by `tests/e2e/guest.py`;\n"
        "mount options `vers=3,proto=tcp,nolock,soft`) sent, `<proc>_reply.bin` what nfsgw\n"
        "answered. Captured by a recording TCP forwarder (`tests/e2e/recorder.py`) between the\n"
        "guest and a gateway serving a local directory read-only, while the guest ran:\n\n"
        f"```sh\n{SCRIPT.strip()}\n```\n\n"
        "Kept: the LOOKUP of `hello.txt`; the GETATTR, ACCESS and READ of the file it found\n"
        "(what opening and reading a file costs); the first READDIRPLUS (of `dir/`).\n"
        f"Regenerate with `{COMMAND}` (QEMU, one guest boot: seconds).\n"
        "`tests/unit/nfsproto/test_golden.py` decodes them. Handles differ at every capture\n"
        "(the gateway's handle key is new), so the test checks their length, not their bytes.\n"
    )
    return {"kernel": kernel, "output": r.output}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DATA, help=f"directory (default {DATA})")
    args = ap.parse_args()
    info = capture(args.out)
    print(f"captured with {info['kernel']} into {args.out}")


if __name__ == "__main__":
    main()
