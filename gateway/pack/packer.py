"""``nfsgw pack SRC --to DST``: every object under ``SRC`` into POSIX tar shards plus an index
under ``DST`` (the layout and the index text: ``gateway.pack.format``, docs/packs.md).

Owns: checking SRC and DST before any work (``check_access``), the packing pipeline
(``Packer``), resuming an interrupted pack, and writing ``index.tsv.gz`` and
``unpacked.tsv.gz`` (``gateway.pack.verify`` re-reads a pack to check every member). Must
not: modify or delete anything under SRC, rewrite a finished shard, or hold more than its
bounds in memory; it never parses the command line (``gateway.ops.cli`` does).

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
import gzip
import io
import itertools
import re
import sys
import time
import uuid
from collections import deque
from collections.abc import AsyncGenerator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final, TextIO, cast

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
    INDEX_NAME,
    PARTS_DIR,
    UNPACKED_NAME,
    Member,
    PackError,
    Shard,
    Unpacked,
    format_index,
    format_unpacked,
    member_header,
    padding,
    parse_part,
    part_lines,
    part_name,
    shard_name,
)

__all__ = [
    "HASH_ON_LOOP_BYTES",
    "MiB",
    "SOURCE_NAME",
    "PackFailed",
    "PackOptions",
    "PackReport",
    "Packer",
    "Progress",
    "cancel_all",
    "check_access",
    "nested",
    "shard_end",
]

MiB: Final = 1 << 20
SOURCE_NAME: Final = f"{PARTS_DIR}source.url"
_SHARD_RE: Final = re.compile(r"shard-(\d{6,})\.tar")
_PART_RE: Final = re.compile(r"shard-(\d{6,})\.tsv")
HASH_ON_LOOP_BYTES: Final = 1 << 20  # CRC-32 of more than this runs in a thread


class PackFailed(Exception):
    """SRC or DST cannot be used (one line for the user; ``nfsgw pack`` exits 2)."""


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


# ------------------------------------------------------------------------------- progress


class Progress:
    """A progress line on ``stream``: redrawn in place on a terminal, one line every
    ``interval_s`` otherwise. Totals may be unknown (still counting): the ETA is then a lower
    bound ("ETA >= ...")."""

    def __init__(
        self, label: str, stream: TextIO | None = None, *, interval_s: float | None = None
    ) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval_s = interval_s if interval_s is not None else (0.25 if self.tty else 5.0)
        self.files = 0
        self.bytes = 0
        self.total_files = 0
        self.total_bytes = 0
        self.counting = True
        self.t0 = time.monotonic()
        self._last = self.t0
        self._drawn = False

    def add(self, files: int, nbytes: int) -> None:
        self.files += files
        self.bytes += nbytes
        self.tick()

    def tick(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.interval_s:
            return
        self._last = now
        line = self.line(now)
        if self.tty:
            print(f"\r{line}\x1b[K", end="", file=self.stream, flush=True)
        else:
            print(line, file=self.stream, flush=True)
        self._drawn = True

    def line(self, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        dt = max(now - self.t0, 1e-9)
        rate = self.bytes / dt
        total = max(self.total_bytes, self.bytes)
        frac = self.bytes / total if total else 0.0
        n = int(frac * 20)
        eta = ""
        if rate > 0 and total:
            eta = f", ETA {'>= ' if self.counting else ''}{_duration((total - self.bytes) / rate)}"
        of = "" if self.counting else f"/{max(self.total_files, self.files)}"
        return (
            f"{self.label} [{'#' * n}{'.' * (20 - n)}] {frac:4.0%} {self.files}{of} files, "
            f"{self.bytes / 1e6:.1f}/{total / 1e6:.1f} MB, {rate / 1e6:.1f} MB/s{eta}"
        )

    def close(self) -> None:
        if self._drawn and self.tty:
            print(file=self.stream, flush=True)


async def cancel_all(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel ``tasks`` and wait for them to end (their errors dropped; a cancellation of
    the caller is not)."""
    ts = list(tasks)
    for t in ts:
        t.cancel()
    await asyncio.gather(*ts, return_exceptions=True)


def _duration(s: float) -> str:
    s = max(0, int(s))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


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
class _Done:
    """A finished shard: its table row, member count and last path."""

    shard: Shard
    count: int
    last: str


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


class _ShardWriter:
    """One shard as one multipart upload: bytes in, ``part_size`` parts out, at most
    ``uploads`` in flight."""

    def __init__(self, store: ObjectStore, key: str, part_size: int, uploads: int) -> None:
        self.store = store
        self.key = key
        self.part_size = part_size
        self.uploads = uploads
        self.size = 0  # bytes written so far (the next member's header offset)
        self._buf = bytearray()
        self._upload_id: str | None = None
        self._inflight: deque[asyncio.Task[tuple[int, str]]] = deque()
        self._parts: list[tuple[int, str]] = []
        self._next_part = 1

    async def write(self, data: bytes) -> None:
        self._buf += data
        self.size += len(data)
        while len(self._buf) >= self.part_size:
            part = bytes(self._buf[: self.part_size])
            del self._buf[: self.part_size]
            await self._send(part)

    async def _send(self, part: bytes) -> None:
        if self._upload_id is None:
            self._upload_id = await self.store.create_multipart(self.key)
        while len(self._inflight) >= self.uploads:
            self._parts.append(await self._inflight.popleft())
        no = self._next_part
        self._next_part += 1
        self._inflight.append(asyncio.create_task(self._upload(no, part)))

    async def _upload(self, no: int, data: bytes) -> tuple[int, str]:
        assert self._upload_id is not None
        return no, await self.store.upload_part(self.key, self._upload_id, no, data)

    async def finish(self) -> ObjectInfo:
        if self._buf or self._next_part == 1:
            part = bytes(self._buf)
            self._buf.clear()
            await self._send(part)
        while self._inflight:
            self._parts.append(await self._inflight.popleft())
        assert self._upload_id is not None
        info = await self.store.complete_multipart(self.key, self._upload_id, self._parts)
        self._upload_id = None
        return info

    async def abort(self) -> None:
        """Cancel the parts in flight and abort the upload (best effort; never raises but
        cancellation)."""
        inflight, self._inflight = self._inflight, deque()
        await cancel_all(inflight)
        upload_id, self._upload_id = self._upload_id, None
        if upload_id is not None:
            with contextlib.suppress(BackendError):
                await self.store.abort_multipart(self.key, upload_id)


def shard_end(last: Member) -> int:
    """The size of a shard whose last member is ``last``."""
    return last.offset + last.size + len(padding(last.size)) + len(END_OF_ARCHIVE)


class Packer:
    """Packs ``src_prefix`` of ``src`` into ``dst_prefix`` of ``dst`` (module docstring).
    ``source_url`` is what the index names as its source (``s3://bucket/prefix/``)."""

    def __init__(
        self,
        src: ObjectStore,
        src_prefix: str,
        dst: ObjectStore,
        dst_prefix: str,
        source_url: str,
        options: PackOptions | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.src = src
        self.src_prefix = src_prefix
        self.dst = dst
        self.dst_prefix = dst_prefix
        self.source_url = source_url
        self.opt = options or PackOptions()
        self.progress = progress
        self.report = PackReport(source_url)
        self._done: list[_Done] = []
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
        await self._resume()
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
            r.index_key = await self._write_index()
            r.unpacked = await self._write_unpacked()
        r.seconds = time.monotonic() - t0
        return r

    def _after(self) -> str | None:
        return self.src_prefix + self._done[-1].last if self._done else None

    # --------------------------------------------------------------------- resume

    async def _list_all(self, prefix: str) -> list[ObjectInfo]:
        out: list[ObjectInfo] = []
        token: str | None = None
        while True:
            page = await self.dst.list_page(prefix, token=token)
            out.extend(page.objects)
            token = page.next_token
            if token is None:
                return out

    async def _resume(self) -> None:
        """Find the finished shards (module docstring); record SRC for a fresh pack."""
        dp = self.dst_prefix
        shards: dict[int, int] = {}
        for o in await self._list_all(dp):
            m = _SHARD_RE.fullmatch(o.key[len(dp) :])
            if m:
                shards[int(m.group(1))] = o.size
        parts: dict[int, str] = {}
        has_source = False
        for o in await self._list_all(dp + PARTS_DIR):
            name = o.key[len(dp) + len(PARTS_DIR) :]
            m = _PART_RE.fullmatch(name)
            if m:
                parts[int(m.group(1))] = o.key
            has_source |= o.key == dp + SOURCE_NAME
        if has_source:
            got = (await self.dst.get(dp + SOURCE_NAME)).data.decode("utf-8", "replace").strip()
            if got != self.source_url:
                raise PackFailed(
                    f"{dp or 'DST'} holds a pack of {got}, not of {self.source_url}: "
                    "pack into another prefix"
                )
        else:
            await self.dst.put(dp + SOURCE_NAME, self.source_url.encode() + b"\n")

        async def load(no: int) -> list[Member] | None:
            data = (await self.dst.get(parts[no])).data
            try:
                return parse_part(io.StringIO(data.decode("utf-8", "surrogateescape")))
            except PackError:
                return None

        # Shard 0, 1, ... in order, 8 part files in flight; only each one's last path is kept.
        nos = list(itertools.takewhile(parts.__contains__, itertools.count()))
        window: deque[asyncio.Task[list[Member] | None]] = deque()
        prev = b""
        try:
            for i, no in enumerate(nos):
                while len(window) < 8 and i + len(window) < len(nos):
                    window.append(asyncio.create_task(load(nos[i + len(window)])))
                members = await window.popleft()
                bad = "its part file does not parse" if members is None else None
                if members is not None:
                    bad = _check_part(no, members, prev)
                    if bad is None and shards.get(no) != shard_end(members[-1]):
                        bad = f"the shard has {shards.get(no)} bytes, not {shard_end(members[-1])}"
                if bad is not None or members is None:
                    self.report.rewritten = f"{shard_name(no)} is written again: {bad}"
                    break
                last = members[-1].path
                self._done.append(_Done(Shard(no, shard_name(no), shards[no]), len(members), last))
                prev = key_order(last)
        finally:
            await cancel_all(window)
        beyond = sorted(no for no in parts if no > len(self._done))
        if beyond:
            raise PackFailed(
                f"{self.dst_prefix or 'DST'}: shard {len(self._done)} is not finished but part "
                f"files of later shards exist ({part_name(beyond[0])}): not a pack this command "
                "wrote; pack into another prefix"
            )

    # ------------------------------------------------------------------- listing

    async def _objects(
        self, after: str | None, *, count_skips: bool
    ) -> AsyncGenerator[_Object, None]:
        """The objects to pack after ``after`` (a full key), in key order."""
        sp = self.src_prefix
        r = self.report

        def fetch(token: str | None) -> asyncio.Task[ListPage]:
            return asyncio.create_task(
                self.src.list_page(
                    sp, delimiter=None, token=token, start_after=None if token else after
                )
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
            res = await self.src.get(info.key, if_match=info.etag)
        else:
            res = await self.src.get(info.key, start, end, if_match=info.etag)
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
        writer: _ShardWriter | None = None
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
                            key = self.dst_prefix + shard_name(no)
                            writer = _ShardWriter(self.dst, key, opt.part_size, opt.uploads)
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

    async def _close(self, writer: _ShardWriter, no: int, members: list[Member]) -> None:
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
        await self.dst.put(self.dst_prefix + part_name(no), text)
        self._done.append(_Done(Shard(no, shard_name(no), size), len(members), members[-1].path))
        r = self.report
        r.shards += 1
        r.files += len(members)
        r.bytes += sum(m.size for m in members)
        stop = self.opt.stop_after_shards
        if stop is not None and r.shards >= stop:
            raise _Stop

    # ------------------------------------------------------------------------ index

    async def _write_index(self) -> str:
        """``index.tsv.gz`` from the finished shards' part files, read back one at a time
        (gzip in a thread; the thread asks the loop for each part file)."""
        loop = asyncio.get_running_loop()
        dst, dp = self.dst, self.dst_prefix
        done = list(self._done)

        def members() -> Iterator[Member]:
            for d in done:
                fut = asyncio.run_coroutine_threadsafe(dst.get(dp + part_name(d.shard.no)), loop)
                data = fut.result().data
                part = parse_part(io.StringIO(data.decode("utf-8", "surrogateescape")))
                if len(part) != d.count:
                    raise PackError(f"{part_name(d.shard.no)} changed while the index was written")
                yield from part

        def build() -> bytes:
            out = io.BytesIO()
            n = sum(d.count for d in done)
            streamed = cast(list[Member], _Sized(n, members()))  # sized, read as it goes
            lines = format_index(self.source_url, [d.shard for d in done], streamed)
            with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=6, mtime=0) as gz:
                buf: list[str] = []
                for line in lines:
                    buf.append(line)
                    if len(buf) >= 4096:
                        gz.write("".join(buf).encode("utf-8", "surrogateescape"))
                        buf.clear()
                gz.write("".join(buf).encode("utf-8", "surrogateescape"))
            return out.getvalue()

        body = await asyncio.to_thread(build)
        key = dp + INDEX_NAME
        await dst.put(key, body)
        return key

    async def _unpacked_keys(self) -> list[Unpacked]:
        """Every key under SRC now that the pack does not hold, in key order: a listing
        walked against the members (read back from the part files one at a time)."""
        sp, dst, dp = self.src_prefix, self.dst, self.dst_prefix

        async def packed() -> AsyncGenerator[bytes, None]:
            for d in list(self._done):
                data = (await dst.get(dp + part_name(d.shard.no))).data
                for m in parse_part(io.StringIO(bytes(data).decode("utf-8", "surrogateescape"))):
                    yield key_order(m.path)

        out: list[Unpacked] = []
        members = packed()
        cur: bytes | None = await anext(members, None)
        token: str | None = None
        while True:
            page = await self.src.list_page(sp, delimiter=None, token=token)
            for o in page.objects:
                rel = o.key[len(sp) :]
                k = key_order(rel)
                while cur is not None and cur < k:
                    cur = await anext(members, None)
                if cur == k:
                    continue  # packed
                out.append(Unpacked(rel, o.size, o.mtime_ns, o.etag))
            token = page.next_token
            if not token:
                return out

    async def _write_unpacked(self) -> int:
        """``unpacked.tsv.gz`` (docs/packs.md): what listings from the index must add."""
        items = await self._unpacked_keys()

        def build() -> bytes:
            text = "".join(format_unpacked(items)).encode("utf-8", "surrogateescape")
            return gzip.compress(text, 6, mtime=0)

        await self.dst.put(self.dst_prefix + UNPACKED_NAME, await asyncio.to_thread(build))
        return len(items)


class _Sized(Iterable[Member]):
    """An iterable that knows its length up front: ``format_index`` writes the count in the
    header before the members, which stream from the part files."""

    def __init__(self, n: int, it: Iterator[Member]) -> None:
        self.n = n
        self.it = it

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[Member]:
        return self.it


def _check_part(no: int, members: list[Member], prev: bytes) -> str | None:
    """Why shard ``no``'s part file does not describe a shard this packer wrote, or None."""
    if not members:
        return "no members"
    end = 0
    for m in members:
        k = key_order(m.path)
        if m.shard != no:
            return f"{m.path!r} names shard {m.shard}"
        if k <= prev:
            return f"{m.path!r} out of key order"
        if m.offset < end + BLOCK or m.size < 0:
            return f"{m.path!r} overlaps the member before it"
        end = m.offset + m.size + len(padding(m.size))
        prev = k
    return None


# ------------------------------------------------------------------------------ verify
