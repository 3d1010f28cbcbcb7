"""``nfsgw pack SRC --to DST``: every object under ``SRC`` into POSIX tar shards plus an index
under ``DST`` (the layout and the index text: ``gateway.pack.format``, docs/packs.md).

Owns: checking SRC and DST before any work (``check_access``) and the packing pipeline (``Packer``);
it finds what an interrupted pack finished with ``gateway.pack.resume``, writes shards with
``gateway.pack.shards`` and ``index.tsv.gz`` and ``unpacked.tsv.gz`` with
``gateway.pack.indexwriter`` (``gateway.pack.verify`` re-reads a pack to check every member). Must
not: modify or delete anything under SRC, rewrite a finished shard, or hold more than its bounds in
memory; it never parses the command line (``gateway.ops.cli`` does).

Pipeline, in key order (UTF-8 bytes, as S3 lists):

- **List** ``SRC`` recursively (``delimiter=None``, the next page fetched while the current
  one is used), skipping ``dir/`` markers and keys with a segment the gateway cannot serve
  (``gateway.namespace.paths.bad_name``), counted. A second listing only counts what is left,
  for the ETA.
- **Fetch** each object with ``If-Match`` its listed ETag: objects up to ``range_size`` in one
  GET, larger ones in ranged GETs of ``range_size``. At most ``concurrency`` GETs in flight and
  ``buffer_bytes`` fetched but not yet written (one range is always allowed), in a window that
  hands them to the writer in key order. An object that changed or vanished before its first
  bytes arrived is skipped and counted (it is served from its own object); one that changes
  between two ranges of a large object (its first bytes already written) makes the current
  shard start again without it.
- **Write** each member as ``member_header``, its bytes, ``padding``; CRC-32 of the bytes; a
  shard closes once it holds ``shard_size`` bytes (a member is never split) and ends with
  ``END_OF_ARCHIVE``. A shard is one multipart upload of ``part_size`` parts, at most
  ``uploads`` parts in flight; it is aborted on any failure or cancellation (Ctrl-C, SIGTERM).
  Its part file (``parts/shard-NNNNNN.tsv``) is written only after the shard is complete.

Memory: about ``buffer_bytes`` + ``concurrency`` small objects fetched ahead, plus the writer's
buffer (one part) and the parts in flight (``uploads`` x ``part_size``): ~128 MiB at the
defaults, whatever the dataset's size. Writing the index holds one part file and the
compressed index (a few tens of MB for ImageNet's 1.28M files).

Resuming: a shard is finished when its part file parses and its object has the size the part
file implies (the last member's end, padding, and the end-of-archive blocks). Finished shards
must be shards 0..k-1; packing continues with shard k from the key after the last member of
shard k-1 (keys added to SRC since, if they sort after it, are packed too; earlier ones are
not). ``parts/source.url`` records SRC: a DST made from another source is refused. A shard being
written when the process died has no part file and is written again under its number;
multipart uploads of a killed process stay behind (an S3 lifecycle rule
``AbortIncompleteMultipartUpload`` removes them).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import deque
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass
from typing import Final

from gateway.backend.base import (
    BackendError,
    ListPage,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    PreconditionFailed,
)
from gateway.backend.checksums import crc32
from gateway.namespace.paths import bad_name, key_order
from gateway.pack.format import (
    BLOCK,
    END_OF_ARCHIVE,
    Member,
    Shard,
    member_header,
    padding,
    part_lines,
    part_name,
    shard_name,
)
from gateway.pack.indexwriter import write_index, write_unpacked
from gateway.pack.resume import SOURCE_NAME, PackFailed, resume
from gateway.pack.shards import Finished, ShardWriter, cancel_all, shard_end
from gateway.progress import Progress

__all__ = [
    "HASH_ON_LOOP_BYTES",
    "SOURCE_NAME",
    "MiB",
    "PackFailed",
    "PackJob",
    "PackOptions",
    "PackReport",
    "Packer",
    "cancel_all",
    "check_access",
    "nested",
    "shard_end",
]

MiB: Final = 1 << 20
HASH_ON_LOOP_BYTES: Final = 1 << 20  # CRC-32 of more than this runs in a thread


@dataclass(frozen=True, slots=True)
class PackJob:
    """What to pack where: ``src_prefix`` of ``src`` into ``dst_prefix`` of ``dst``;
    ``source_url`` is what the index names as its source (``s3://bucket/prefix/``)."""

    src: ObjectStore
    src_prefix: str
    dst: ObjectStore
    dst_prefix: str
    source_url: str


@dataclass(frozen=True, slots=True)
class PackOptions:
    shard_size: int = 256 * MiB
    concurrency: int = 16
    range_size: int = 16 * MiB  # objects larger than this are read in ranges of this size
    part_size: int = 16 * MiB  # multipart part size (S3: >= 5 MiB but for the last)
    uploads: int = 2  # part uploads in flight
    buffer_bytes: int = 64 * MiB  # fetched bytes not yet written, at most (one range always)
    stop_after_shards: int | None = None  # tests: stop (as if killed) after N new shards

    def __post_init__(self) -> None:
        if self.shard_size < BLOCK or self.concurrency < 1 or self.uploads < 1:
            raise ValueError("shard_size >= 512, concurrency >= 1 and uploads >= 1")
        if self.range_size < 1 or self.part_size < 1 or self.buffer_bytes < 1:
            raise ValueError("range_size, part_size and buffer_bytes must be positive")


@dataclass(slots=True)
class PackReport:
    source: str
    index_key: str = ""
    unpacked: int = 0  # keys under SRC not in the pack (unpacked.tsv.gz)
    files: int = 0  # packed by this run
    bytes: int = 0  # member bytes packed by this run
    shards: int = 0  # written by this run
    resumed_shards: int = 0  # finished by an earlier run, kept
    resumed_files: int = 0
    total_shards: int = 0
    total_files: int = 0
    total_bytes: int = 0  # shard bytes of the whole pack
    skipped_markers: int = 0  # "dir/" keys
    skipped_names: int = 0  # keys the gateway cannot serve (a//b, .., not UTF-8, too long)
    changed: int = 0  # changed between the listing and the GET (served from the object)
    deleted: int = 0  # gone between the listing and the GET
    redone_shards: int = 0  # shards started again (an object changed between two ranges)
    stopped: bool = False  # stop_after_shards reached: no index written
    rewritten: str = ""  # why a shard with a part file is written again, if one is
    seconds: float = 0.0

    @property
    def skipped(self) -> int:
        return self.skipped_markers + self.skipped_names + self.changed + self.deleted


# ----------------------------------------------------------------------------- set-up


async def check_access(
    src: ObjectStore, src_prefix: str, dst: ObjectStore, dst_prefix: str, src_url: str, dst_url: str
) -> None:
    """``PackFailed`` unless SRC can be listed (and holds an object) and DST can be listed and
    written (a small probe object put and deleted). Nothing else is created."""
    try:
        page = await src.list_page(src_prefix, delimiter=None, max_keys=1)
    except BackendError as e:
        raise PackFailed(f"cannot list {src_url}: {e}") from e
    if not page.objects and not page.prefixes:
        raise PackFailed(f"{src_url}: no objects under it")
    try:  # resuming lists DST; and some stores create a missing bucket on the first PUT
        await dst.list_page(dst_prefix, max_keys=1)
    except BackendError as e:
        raise PackFailed(f"cannot write to {dst_url}: cannot list it: {e}") from e
    probe = f"{dst_prefix}nfsgw-pack-probe-{uuid.uuid4().hex[:12]}"
    try:
        await dst.put(probe, b"")
    except BackendError as e:
        raise PackFailed(f"cannot write to {dst_url}: {e}") from e
    try:
        await dst.delete(probe)
    except BackendError as e:
        raise PackFailed(f"cannot delete the probe {probe} under {dst_url}: {e}") from e


def nested(src_location: str, src_prefix: str, dst_location: str, dst_prefix: str) -> bool:
    """Whether DST lies inside SRC or SRC inside DST (same bucket or directory)."""
    if src_location.rstrip("/") != dst_location.rstrip("/"):
        return False
    return dst_prefix.startswith(src_prefix) or src_prefix.startswith(dst_prefix)


# --------------------------------------------------------------------------- the packer


@dataclass(slots=True)
class _Object:
    info: ObjectInfo
    path: str  # relative to SRC


@dataclass(slots=True)
class _Chunk:
    obj: _Object
    start: int
    end: int
    task: asyncio.Task[bytes]

    @property
    def first(self) -> bool:
        return self.start == 0

    @property
    def last(self) -> bool:
        return self.end >= self.obj.info.size


class _Redo(Exception):
    """An object changed between two ranges after its first bytes were written."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


class _Stop(Exception):
    """``stop_after_shards`` reached."""


class Packer:
    """Packs ``job`` (module docstring): ``Packer(job, options, progress).run()``."""

    def __init__(
        self, job: PackJob, options: PackOptions | None = None, progress: Progress | None = None
    ) -> None:
        self.job = job
        self.opt: PackOptions = options or PackOptions()
        self.progress: Progress | None = progress
        self.report = PackReport(job.source_url)
        self._done: list[Finished] = []
        self._excluded: set[str] = set()
        self._skip_hw = b""  # skipped keys up to here are counted (a redone shard re-lists)
        self._page_hw = b""
        self._counted: set[str] = set()  # changed or deleted keys counted

    def _first_sight(self, key: str) -> bool:
        k = key_order(key)
        if k <= self._skip_hw:
            return False
        self._skip_hw = k
        return True

    # ------------------------------------------------------------------------ run

    async def run(self) -> PackReport:
        t0 = time.monotonic()
        r = self.report
        job = self.job
        resumed = await resume(job.dst, job.dst_prefix, job.source_url)
        self._done = resumed.done
        r.rewritten = resumed.rewritten
        r.resumed_shards = len(self._done)
        r.resumed_files = sum(d.count for d in self._done)
        counter = asyncio.create_task(self._count(self._after()))
        try:
            while True:
                try:
                    await self._pack_from(self._after())
                    break
                except _Redo as e:
                    self._excluded.add(e.key)
                    r.changed += 1
                    r.redone_shards += 1
                except _Stop:
                    r.stopped = True
                    break
        finally:
            await cancel_all([counter])
            if self.progress is not None:
                self.progress.tick(force=True)
                self.progress.close()
        r.total_shards = len(self._done)
        r.total_files = sum(d.count for d in self._done)
        r.total_bytes = sum(d.shard.size for d in self._done)
        if not r.stopped:
            r.index_key = await write_index(job.dst, job.dst_prefix, job.source_url, self._done)
            r.unpacked = await write_unpacked(
                job.src, job.src_prefix, job.dst, job.dst_prefix, self._done
            )
        r.seconds = time.monotonic() - t0
        return r

    def _after(self) -> str | None:
        return self.job.src_prefix + self._done[-1].last if self._done else None

    # ------------------------------------------------------------------- listing

    async def _objects(
        self, after: str | None, *, count_skips: bool
    ) -> AsyncGenerator[_Object, None]:
        """The objects to pack after ``after`` (a full key), in key order."""
        sp, src = self.job.src_prefix, self.job.src
        r = self.report

        def fetch(token: str | None) -> asyncio.Task[ListPage]:
            return asyncio.create_task(
                src.list_page(sp, delimiter=None, token=token, start_after=None if token else after)
            )

        task = fetch(None)
        try:
            while True:
                page = await task
                if page.next_token is not None:
                    task = fetch(page.next_token)  # the next page while this one is used
                if count_skips and page.skipped and page.objects:
                    last = key_order(page.objects[-1].key)
                    if last > self._page_hw:  # not a page a redone shard lists again
                        self._page_hw = last
                        r.skipped_names += page.skipped
                for o in page.objects:
                    rel = o.key[len(sp) :]
                    marker = not o.key.startswith(sp) or o.key.endswith("/")
                    if marker or any(bad_name(seg) for seg in rel.split("/")):
                        if count_skips and self._first_sight(o.key):
                            if marker:
                                r.skipped_markers += 1
                            else:
                                r.skipped_names += 1
                        continue
                    if o.key in self._excluded:
                        continue
                    yield _Object(o, rel)
                if page.next_token is None:
                    return
        finally:
            await cancel_all([task])

    async def _count(self, after: str | None) -> None:
        """Totals for the ETA: a second listing that only counts."""
        p = self.progress
        if p is None:
            return
        try:
            async with contextlib.aclosing(self._objects(after, count_skips=False)) as objs:
                async for o in objs:
                    p.total_files += 1
                    p.total_bytes += o.info.size
            p.counting = False
        except BackendError:
            pass  # the packing listing reports it

    # -------------------------------------------------------------------- fetching

    def _chunk_specs(self, o: _Object) -> Iterator[tuple[int, int]]:
        size, step = o.info.size, self.opt.range_size
        if size <= step:
            yield 0, size
            return
        for start in range(0, size, step):
            yield start, min(size, start + step)

    async def _get(self, o: _Object, start: int, end: int) -> bytes:
        info = o.info
        if end - start == info.size:
            res = await self.job.src.get(info.key, if_match=info.etag)
        else:
            res = await self.job.src.get(info.key, start, end, if_match=info.etag)
        if res.size != info.size or len(res.data) != end - start:
            raise PreconditionFailed(
                f"{info.key}: {res.size} bytes now, {info.size} when listed "
                f"(got {len(res.data)} of {end - start})"
            )
        return res.data

    async def _chunks(self, objects: AsyncGenerator[_Object, None]) -> AsyncGenerator[_Chunk, None]:
        """The objects' bytes in key order: a window of at most ``concurrency`` GETs and
        ``buffer_bytes`` in flight. Each yielded chunk's task is done."""
        window: deque[_Chunk] = deque()
        held = 0
        specs = self._specs(objects)
        nxt = await anext(specs, None)
        try:
            while True:
                while nxt is not None and len(window) < self.opt.concurrency:
                    o, start, end = nxt
                    if window and held + (end - start) > self.opt.buffer_bytes:
                        break
                    t = asyncio.create_task(self._get(o, start, end))
                    window.append(_Chunk(o, start, end, t))
                    held += end - start
                    nxt = await anext(specs, None)
                if not window:
                    return
                c = window.popleft()
                with contextlib.suppress(BackendError):
                    await c.task  # its outcome is the consumer's to read
                held -= c.end - c.start
                yield c
        finally:
            await cancel_all(c.task for c in window)
            await specs.aclose()

    async def _specs(
        self, objects: AsyncGenerator[_Object, None]
    ) -> AsyncGenerator[tuple[_Object, int, int], None]:
        async with contextlib.aclosing(objects):
            async for o in objects:
                for start, end in self._chunk_specs(o):
                    yield o, start, end

    # --------------------------------------------------------------------- writing

    async def _pack_from(self, after: str | None) -> None:
        """Write shards from the key after ``after`` to the end of SRC."""
        r = self.report
        opt = self.opt
        progress = self.progress
        writer: ShardWriter | None = None
        members: list[Member] = []
        skip: _Object | None = None  # an object whose first chunk failed: its other chunks
        crc = 0
        data_at = 0
        pending = [0, 0]  # files and bytes of the open shard shown by the progress line
        no = len(self._done)
        objs = self._objects(after, count_skips=True)
        try:
            async with contextlib.aclosing(self._chunks(objs)) as chunks:
                async for c in chunks:
                    o = c.obj
                    if o is skip:
                        continue
                    err = c.task.exception()
                    if err is not None:
                        if not isinstance(err, ObjectNotFound | PreconditionFailed):
                            raise err
                        if not c.first:
                            raise _Redo(o.info.key)
                        skip = o
                        if o.info.key not in self._counted:
                            self._counted.add(o.info.key)
                            if isinstance(err, ObjectNotFound):
                                r.deleted += 1
                            else:
                                r.changed += 1
                        continue
                    data = c.task.result()
                    if c.first:
                        if writer is None:
                            key = self.job.dst_prefix + shard_name(no)
                            writer = ShardWriter(self.job.dst, key, opt.part_size, opt.uploads)
                            members = []
                        await writer.write(member_header(o.path, o.info.size, o.info.mtime_ns))
                        data_at = writer.size
                        crc = 0
                    assert writer is not None
                    if len(data) > HASH_ON_LOOP_BYTES:
                        crc = await asyncio.to_thread(crc32, data, crc)
                    else:
                        crc = crc32(data, crc)
                    await writer.write(data)
                    pending[0] += c.last
                    pending[1] += len(data)
                    if progress is not None:
                        progress.add(int(c.last), len(data))
                    if not c.last:
                        continue
                    info = o.info
                    await writer.write(padding(info.size))
                    members.append(
                        Member(o.path, info.size, info.mtime_ns, info.etag, no, data_at, crc)
                    )
                    if writer.size + len(END_OF_ARCHIVE) >= opt.shard_size:
                        w, writer = writer, None
                        pending = [0, 0]
                        await self._close(w, no, members)
                        no += 1
                if writer is not None:
                    w, writer = writer, None
                    pending = [0, 0]
                    await self._close(w, no, members)
        finally:
            if writer is not None:
                await writer.abort()
                if progress is not None:  # the open shard is written again (or not at all)
                    progress.add(-pending[0], -pending[1])

    async def _close(self, writer: ShardWriter, no: int, members: list[Member]) -> None:
        """Finish shard ``no``: end of archive, complete the upload, then its part file."""
        try:
            await writer.write(END_OF_ARCHIVE)
            size = writer.size
            info = await writer.finish()
        except BaseException:
            await writer.abort()
            raise
        if info.size != size:
            raise BackendError(f"{writer.key}: {info.size} bytes stored, {size} written")
        text = "".join(part_lines(members)).encode("utf-8", "surrogateescape")
        await self.job.dst.put(self.job.dst_prefix + part_name(no), text)
        self._done.append(Finished(Shard(no, shard_name(no), size), len(members), members[-1].path))
        r = self.report
        r.shards += 1
        r.files += len(members)
        r.bytes += sum(m.size for m in members)
        stop = self.opt.stop_after_shards
        if stop is not None and r.shards >= stop:
            raise _Stop
