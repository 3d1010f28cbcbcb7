"""One module per procedure (or family); ``register_all`` wires them into a Dispatcher."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from gateway.dispatch import CallContext, Dispatcher, Procedure
from gateway.errors import GatewayError
from gateway.handlers import (
    access,
    create,
    fsinfo,
    getattr,
    lookup,
    mount,
    portmap,
    read,
    readdir,
    readlink,
    readonly,
    remove,
    rename,
    setattr,
    write,
)
from gateway.registry import Gateway
from nfsproto import mount3, nfs3
from nfsproto import portmap as pmap
from nfsproto.nfs3 import Nfs3Proc
from nfsproto.xdr import Reader, Writer


async def _null(ctx: CallContext, args: None) -> None:
    return None


def _void_args(r: Reader) -> None:
    return None


def _void_res(w: Writer, v: None) -> None:
    return None


_NULL: Procedure[None, None] = Procedure("NULL", _void_args, _void_res, _null, any_auth=True)

Handler = Callable[[Gateway, CallContext, Any], Awaitable[Any]]
Fail = Callable[[GatewayError, Any], Any]

# proc -> (handler, failure body)
_NFS: dict[Nfs3Proc, tuple[Handler, Fail]] = {
    Nfs3Proc.GETATTR: (getattr.getattr3, getattr.getattr3_fail),
    Nfs3Proc.SETATTR: (setattr.setattr3, setattr.setattr3_fail),
    Nfs3Proc.LOOKUP: (lookup.lookup3, lookup.lookup3_fail),
    Nfs3Proc.ACCESS: (access.access3, access.access3_fail),
    Nfs3Proc.READLINK: (readlink.readlink3, readlink.readlink3_fail),
    Nfs3Proc.READ: (read.read3, read.read3_fail),
    Nfs3Proc.WRITE: (write.write3, write.write3_fail),
    Nfs3Proc.CREATE: (create.create3, create.create3_fail),
    Nfs3Proc.MKDIR: (create.mkdir3, create.mkdir3_fail),
    Nfs3Proc.SYMLINK: (create.symlink3, create.symlink3_fail),
    Nfs3Proc.MKNOD: (readonly.mknod3, readonly.mknod3_fail),
    Nfs3Proc.REMOVE: (remove.remove3, remove.remove3_fail),
    Nfs3Proc.RMDIR: (remove.rmdir3, remove.rmdir3_fail),
    Nfs3Proc.RENAME: (rename.rename3, rename.rename3_fail),
    Nfs3Proc.LINK: (readonly.link3, readonly.link3_fail),
    Nfs3Proc.READDIR: (readdir.readdir3, readdir.readdir3_fail),
    Nfs3Proc.READDIRPLUS: (readdir.readdirplus3, readdir.readdirplus3_fail),
    Nfs3Proc.FSSTAT: (fsinfo.fsstat3, fsinfo.fsstat3_fail),
    Nfs3Proc.FSINFO: (fsinfo.fsinfo3, fsinfo.fsinfo3_fail),
    Nfs3Proc.PATHCONF: (fsinfo.pathconf3, fsinfo.pathconf3_fail),
    Nfs3Proc.COMMIT: (write.commit3, write.commit3_fail),
}


def register_all(d: Dispatcher, gw: Gateway) -> None:
    procs: dict[int, Procedure[Any, Any]] = {0: _NULL}
    for num, (handler, fail) in _NFS.items():
        codec = nfs3.PROCS[num]
        procs[num] = Procedure(
            num.name, codec.unpack_args, codec.pack_res, partial(handler, gw), fail
        )
    assert len(procs) == 22, "every NFSv3 procedure has a handler"
    d.register(nfs3.PROGRAM, "NFS3", nfs3.VERSION, procs)

    mp = mount3.MountProc
    d.register(
        mount3.PROGRAM,
        "MOUNT3",
        mount3.VERSION,
        {
            mp.NULL: _NULL,
            mp.MNT: Procedure(
                "MNT", mount3.unpack_mnt3args, mount3.pack_mnt3res, partial(mount.mnt, gw)
            ),
            mp.DUMP: Procedure("DUMP", _void_args, mount3.pack_mountlist, partial(mount.dump, gw)),
            mp.UMNT: Procedure("UMNT", mount3.unpack_mnt3args, _void_res, partial(mount.umnt, gw)),
            mp.UMNTALL: Procedure("UMNTALL", _void_args, _void_res, partial(mount.umntall, gw)),
            mp.EXPORT: Procedure(
                "EXPORT", _void_args, mount3.pack_exports, partial(mount.export_list, gw)
            ),
        },
    )

    pp = pmap.PmapProc
    d.register(
        pmap.PROGRAM,
        "PMAP2",
        pmap.VERSION,
        {
            pp.NULL: _NULL,
            pp.SET: Procedure(
                "SET", pmap.unpack_mapping, pmap.pack_bool, partial(portmap.set_, gw)
            ),
            pp.UNSET: Procedure(
                "UNSET", pmap.unpack_mapping, pmap.pack_bool, partial(portmap.set_, gw)
            ),
            pp.GETPORT: Procedure(
                "GETPORT", pmap.unpack_mapping, pmap.pack_port, partial(portmap.getport, gw)
            ),
            pp.DUMP: Procedure("DUMP", _void_args, pmap.pack_pmaplist, partial(portmap.dump, gw)),
        },
    )
    # NFSACL (100227) and NLM are deliberately not registered: PROG_UNAVAIL turns the Linux
    # client's per-file GETACL calls off.
