"""Hypothesis strategies for every NFSv3 wire type (nfsproto.nfs3).

``ARGS`` and ``RESULTS`` map the lower-case procedure name (``"lookup"``) to a strategy for its
``<Proc>3Args`` / ``<Proc>3Res``. Results cover NFS3_OK and failure statuses; a failure result
only sets the fields of the RFC 1813 fail arm, the way the unpacker returns it.
"""

from __future__ import annotations

from hypothesis import strategies as st

from nfsproto import nfs3
from nfsproto.nfs3 import (
    DONT_CHANGE,
    MAX_NAME,
    SET_TO_SERVER_TIME,
    Access3Args,
    Access3Res,
    Commit3Args,
    Commit3Res,
    Create3Args,
    Create3Res,
    CreateHow3,
    CreateMode3,
    Diropargs3,
    Entry3,
    Entryplus3,
    Fattr3,
    Fsinfo3Args,
    Fsinfo3Res,
    Fsstat3Args,
    Fsstat3Res,
    Ftype3,
    Getattr3Args,
    Getattr3Res,
    Link3Args,
    Link3Res,
    Lookup3Args,
    Lookup3Res,
    Mkdir3Args,
    Mkdir3Res,
    Mknod3Args,
    Mknod3Res,
    Mknoddata3,
    NfsStat3,
    NfsTime3,
    Pathconf3Args,
    Pathconf3Res,
    Read3Args,
    Read3Res,
    Readdir3Args,
    Readdir3Res,
    Readdirplus3Args,
    Readdirplus3Res,
    Readlink3Args,
    Readlink3Res,
    Remove3Args,
    Remove3Res,
    Rename3Args,
    Rename3Res,
    Rmdir3Args,
    Rmdir3Res,
    Sattr3,
    Setattr3Args,
    Setattr3Res,
    SetTime,
    Specdata3,
    StableHow,
    Symlink3Args,
    Symlink3Res,
    Symlinkdata3,
    TimeHow,
    WccAttr,
    WccData,
    Write3Args,
    Write3Res,
)

OK = NfsStat3.NFS3_OK

u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
fh = st.binary(max_size=nfs3.NFS3_FHSIZE)
# Mostly short names (keeps every-prefix tests cheap), sometimes the 255-byte maximum.
name = st.one_of(st.binary(max_size=24), st.binary(min_size=MAX_NAME, max_size=MAX_NAME))
path = st.binary(max_size=64)
data = st.binary(max_size=64)
verf8 = st.binary(min_size=8, max_size=8)
fail_status = st.sampled_from([s for s in NfsStat3 if s != OK])

nfstime3 = st.builds(NfsTime3, u32, u32)
specdata3 = st.builds(Specdata3, u32, u32)
fattr3 = st.builds(
    Fattr3,
    st.sampled_from(Ftype3),
    u32,
    u32,
    u32,
    u32,
    u64,
    u64,
    specdata3,
    u64,
    u64,
    nfstime3,
    nfstime3,
    nfstime3,
)
post_op_attr = st.none() | fattr3
wcc_attr = st.builds(WccAttr, u64, nfstime3, nfstime3)
wcc_data = st.builds(WccData, st.none() | wcc_attr, post_op_attr)
post_op_fh3 = st.none() | fh
set_time = st.one_of(
    st.just(DONT_CHANGE),
    st.just(SET_TO_SERVER_TIME),
    nfstime3.map(lambda t: SetTime(TimeHow.SET_TO_CLIENT_TIME, t)),
)
sattr3 = st.builds(
    Sattr3, st.none() | u32, st.none() | u32, st.none() | u32, st.none() | u64, set_time, set_time
)
diropargs3 = st.builds(Diropargs3, fh, name)
createhow3 = st.one_of(
    st.builds(CreateHow3, st.sampled_from([CreateMode3.UNCHECKED, CreateMode3.GUARDED]), sattr3),
    st.builds(CreateHow3, st.just(CreateMode3.EXCLUSIVE), st.none(), verf8),
)
mknoddata3 = st.one_of(
    st.builds(Mknoddata3, st.sampled_from([Ftype3.NF3CHR, Ftype3.NF3BLK]), sattr3, specdata3),
    st.builds(Mknoddata3, st.sampled_from([Ftype3.NF3SOCK, Ftype3.NF3FIFO]), sattr3),
    st.builds(Mknoddata3, st.sampled_from([Ftype3.NF3REG, Ftype3.NF3DIR, Ftype3.NF3LNK])),
)
entry3 = st.builds(Entry3, u64, name, u64)
entryplus3 = st.builds(Entryplus3, u64, name, u64, post_op_attr, post_op_fh3)


def _diropres(cls: type) -> st.SearchStrategy:
    return st.one_of(
        st.builds(cls, st.just(OK), post_op_fh3, post_op_attr, wcc_data),
        st.builds(cls, fail_status, dir_wcc=wcc_data),
    )


ARGS: dict[str, st.SearchStrategy] = {
    "getattr": st.builds(Getattr3Args, fh),
    "setattr": st.builds(Setattr3Args, fh, sattr3, st.none() | nfstime3),
    "lookup": st.builds(Lookup3Args, diropargs3),
    "access": st.builds(Access3Args, fh, u32),
    "readlink": st.builds(Readlink3Args, fh),
    "read": st.builds(Read3Args, fh, u64, u32),
    "write": st.builds(Write3Args, fh, u64, u32, st.sampled_from(StableHow), data),
    "create": st.builds(Create3Args, diropargs3, createhow3),
    "mkdir": st.builds(Mkdir3Args, diropargs3, sattr3),
    "symlink": st.builds(Symlink3Args, diropargs3, st.builds(Symlinkdata3, sattr3, path)),
    "mknod": st.builds(Mknod3Args, diropargs3, mknoddata3),
    "remove": st.builds(Remove3Args, diropargs3),
    "rmdir": st.builds(Rmdir3Args, diropargs3),
    "rename": st.builds(Rename3Args, diropargs3, diropargs3),
    "link": st.builds(Link3Args, fh, diropargs3),
    "readdir": st.builds(Readdir3Args, fh, u64, verf8, u32),
    "readdirplus": st.builds(Readdirplus3Args, fh, u64, verf8, u32, u32),
    "fsstat": st.builds(Fsstat3Args, fh),
    "fsinfo": st.builds(Fsinfo3Args, fh),
    "pathconf": st.builds(Pathconf3Args, fh),
    "commit": st.builds(Commit3Args, fh, u64, u32),
}

RESULTS: dict[str, st.SearchStrategy] = {
    "getattr": st.one_of(
        st.builds(Getattr3Res, st.just(OK), fattr3), st.builds(Getattr3Res, fail_status)
    ),
    "setattr": st.builds(Setattr3Res, st.sampled_from(NfsStat3), wcc_data),
    "lookup": st.one_of(
        st.builds(Lookup3Res, st.just(OK), fh, post_op_attr, post_op_attr),
        st.builds(Lookup3Res, fail_status, dir_attributes=post_op_attr),
    ),
    "access": st.one_of(
        st.builds(Access3Res, st.just(OK), post_op_attr, u32),
        st.builds(Access3Res, fail_status, post_op_attr),
    ),
    "readlink": st.one_of(
        st.builds(Readlink3Res, st.just(OK), post_op_attr, path),
        st.builds(Readlink3Res, fail_status, post_op_attr),
    ),
    "read": st.one_of(
        st.builds(Read3Res, st.just(OK), post_op_attr, u32, st.booleans(), data),
        st.builds(Read3Res, fail_status, post_op_attr),
    ),
    "write": st.one_of(
        st.builds(Write3Res, st.just(OK), wcc_data, u32, st.sampled_from(StableHow), verf8),
        st.builds(Write3Res, fail_status, wcc_data),
    ),
    "create": _diropres(Create3Res),
    "mkdir": _diropres(Mkdir3Res),
    "symlink": _diropres(Symlink3Res),
    "mknod": _diropres(Mknod3Res),
    "remove": st.builds(Remove3Res, st.sampled_from(NfsStat3), wcc_data),
    "rmdir": st.builds(Rmdir3Res, st.sampled_from(NfsStat3), wcc_data),
    "rename": st.builds(Rename3Res, st.sampled_from(NfsStat3), wcc_data, wcc_data),
    "link": st.builds(Link3Res, st.sampled_from(NfsStat3), post_op_attr, wcc_data),
    "readdir": st.one_of(
        st.builds(
            Readdir3Res,
            st.just(OK),
            post_op_attr,
            verf8,
            st.lists(entry3, max_size=6),
            st.booleans(),
        ),
        st.builds(Readdir3Res, fail_status, post_op_attr),
    ),
    "readdirplus": st.one_of(
        st.builds(
            Readdirplus3Res,
            st.just(OK),
            post_op_attr,
            verf8,
            st.lists(entryplus3, max_size=4),
            st.booleans(),
        ),
        st.builds(Readdirplus3Res, fail_status, post_op_attr),
    ),
    "fsstat": st.one_of(
        st.builds(Fsstat3Res, st.just(OK), post_op_attr, u64, u64, u64, u64, u64, u64, u32),
        st.builds(Fsstat3Res, fail_status, post_op_attr),
    ),
    "fsinfo": st.one_of(
        st.builds(
            Fsinfo3Res,
            st.just(OK),
            post_op_attr,
            u32,
            u32,
            u32,
            u32,
            u32,
            u32,
            u32,
            u64,
            nfstime3,
            u32,
        ),
        st.builds(Fsinfo3Res, fail_status, post_op_attr),
    ),
    "pathconf": st.one_of(
        st.builds(
            Pathconf3Res,
            st.just(OK),
            post_op_attr,
            u32,
            u32,
            st.booleans(),
            st.booleans(),
            st.booleans(),
            st.booleans(),
        ),
        st.builds(Pathconf3Res, fail_status, post_op_attr),
    ),
    "commit": st.one_of(
        st.builds(Commit3Res, st.just(OK), wcc_data, verf8),
        st.builds(Commit3Res, fail_status, wcc_data),
    ),
}
