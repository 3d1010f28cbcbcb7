"""One module per procedure (or family); ``register_all`` wires them into a Dispatcher.

The registration table also decides each procedure's bare failure result (``fail_body``):
for NFSv3 the result type itself (every one is built from its status alone), for MNT the
mountstat3 of the same number; the other MOUNT and PORTMAP procedures have none (SYSTEM_ERR).
Where a failure must carry more (wcc_data, post_op_attr), the handler raises its error with
that body attached (``common.on_failure``); no handler catches errors to build a reply."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from gateway.dispatch import CallContext, Dispatcher, Procedure
from gateway.handlers import (
    access,
    create,
    fsinfo,
    get_attributes,
    link,
    lookup,
    mount,
    portmap,
    read,
    readdir,
    readlink,
    remove,
    rename,
    set_attributes,
    write,
)
from gateway.registry import Gateway
from nfsproto import mount3, nfs3
from nfsproto import portmap as pmap
from nfsproto.mount3 import Mnt3Res, MountStat3
from nfsproto.nfs3 import Nfs3Proc, NfsStat3, pack_void, unpack_void


async def _null(ctx: CallContext, args: None) -> None:
    return None


_NULL: Procedure[None, None] = Procedure("NULL", unpack_void, pack_void, _null, any_auth=True)

Handler = Callable[[Gateway, CallContext, Any], Awaitable[Any]]

# proc -> (handler, result type: the bare failure body from a status)
_NFS: dict[Nfs3Proc, tuple[Handler, Callable[[NfsStat3], Any]]] = {
    Nfs3Proc.GETATTR: (get_attributes.getattr3, nfs3.Getattr3Res),
    Nfs3Proc.SETATTR: (set_attributes.setattr3, nfs3.Setattr3Res),
    Nfs3Proc.LOOKUP: (lookup.lookup3, nfs3.Lookup3Res),
    Nfs3Proc.ACCESS: (access.access3, nfs3.Access3Res),
    Nfs3Proc.READLINK: (readlink.readlink3, nfs3.Readlink3Res),
    Nfs3Proc.READ: (read.read3, nfs3.Read3Res),
    Nfs3Proc.WRITE: (write.write3, nfs3.Write3Res),
    Nfs3Proc.CREATE: (create.create3, nfs3.Create3Res),
    Nfs3Proc.MKDIR: (create.mkdir3, nfs3.Mkdir3Res),
    Nfs3Proc.SYMLINK: (create.symlink3, nfs3.Symlink3Res),
    Nfs3Proc.MKNOD: (create.mknod3, nfs3.Mknod3Res),
    Nfs3Proc.REMOVE: (remove.remove3, nfs3.Remove3Res),
    Nfs3Proc.RMDIR: (remove.rmdir3, nfs3.Rmdir3Res),
    Nfs3Proc.RENAME: (rename.rename3, nfs3.Rename3Res),
    Nfs3Proc.LINK: (link.link3, nfs3.Link3Res),
    Nfs3Proc.READDIR: (readdir.readdir3, nfs3.Readdir3Res),
    Nfs3Proc.READDIRPLUS: (readdir.readdirplus3, nfs3.Readdirplus3Res),
    Nfs3Proc.FSSTAT: (fsinfo.fsstat3, nfs3.Fsstat3Res),
    Nfs3Proc.FSINFO: (fsinfo.fsinfo3, nfs3.Fsinfo3Res),
    Nfs3Proc.PATHCONF: (fsinfo.pathconf3, nfs3.Pathconf3Res),
    Nfs3Proc.COMMIT: (write.commit3, nfs3.Commit3Res),
}

_MOUNT_STATS = {int(s) for s in MountStat3}


def _mnt_fail_body(status: NfsStat3) -> Mnt3Res:
    """mountstat3 numbers are nfsstat3's (RFC 1813 Appendix I); a status MOUNT lacks (JUKEBOX,
    STALE...) is MNT3ERR_IO."""
    s = int(status)
    return Mnt3Res(MountStat3(s) if s in _MOUNT_STATS else MountStat3.MNT3ERR_IO)


def register_all(d: Dispatcher, gw: Gateway) -> None:
    procs: dict[int, Procedure[Any, Any]] = {0: _NULL}
    for num, (handler, fail_body) in _NFS.items():
        codec = nfs3.PROCS[num]
        procs[num] = Procedure(
            num.name, codec.unpack_args, codec.pack_res, partial(handler, gw), fail_body
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
                "MNT",
                mount3.unpack_mnt3args,
                mount3.pack_mnt3res,
                partial(mount.mnt, gw),
                _mnt_fail_body,
            ),
            mp.DUMP: Procedure("DUMP", unpack_void, mount3.pack_mountlist, partial(mount.dump, gw)),
            mp.UMNT: Procedure("UMNT", mount3.unpack_mnt3args, pack_void, partial(mount.umnt, gw)),
            mp.UMNTALL: Procedure("UMNTALL", unpack_void, pack_void, partial(mount.umntall, gw)),
            mp.EXPORT: Procedure(
                "EXPORT", unpack_void, mount3.pack_exports, partial(mount.export_list, gw)
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
            pp.DUMP: Procedure("DUMP", unpack_void, pmap.pack_pmaplist, partial(portmap.dump, gw)),
        },
    )
    # NFSACL (100227) and NLM are deliberately not registered: PROG_UNAVAIL turns the Linux
    # client's per-file GETACL calls off.
