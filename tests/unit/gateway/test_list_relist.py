"""A re-list whose pages are the same as the last listing's parses and compares nothing
(``gateway.namespace.listing``, ``PageDigests``; ``s3wire.list_reply``), and sees every change
exactly as the full parse and compare does.

Differential: two namespaces over the same bucket, as S3 would send it (ListObjectsV2 XML
rendered from ``MemoryStore``'s pages, read back through ``s3wire.list_reply``): one whose
store has ``list_page_if_changed`` (unchanged pages held unparsed), one whose store does not
(every page parsed and compared, the reference). After each change in the bucket (an ETag, a
size, a time, a new key, a removed key, a new subdirectory, a page more or less; in the
first, a middle or the last page) both re-list, and must show the same entries, attributes,
verifier and counters. Run with the compiled parser and digest, and with the pure-Python ones
(``NFSGW_PURE_PYTHON=1``)."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterator
from urllib.parse import quote
from xml.sax.saxutils import escape

import pytest

from gateway.backend import checksums, s3wire
from gateway.backend.base import ListPage, StoreWrapper, Unchanged
from gateway.backend.memory import MemoryStore
from gateway.clock import FakeClock
from gateway.namespace import Namespace, NamespaceConfig
from gateway.namespace.listing import HELD_MAX_BYTES

P = "exp/"
D = "n01440764"
FILES = 2500  # three pages of 1,000 keys
T0 = 1_650_000_000 * 10**9


def fname(j: int) -> str:
    return f"{D}_{j:05d}.JPEG"


def render(page: ListPage, prefix: str, max_keys: int) -> bytes:
    """``page`` as SeaweedFS writes a ListObjectsV2 result (``encoding-type=url``)."""
    out = [
        '<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult xmlns="http://s3.amazonaws'
        f'.com/doc/2006-03-01/"><Name>b</Name><Prefix>{quote(prefix)}</Prefix>'
        f"<MaxKeys>{max_keys}</MaxKeys><Delimiter>%2F</Delimiter>"
        f"<IsTruncated>{'true' if page.next_token else 'false'}</IsTruncated>"
    ]
    for o in page.objects:
        when = datetime.datetime.fromtimestamp(o.mtime_ns // 10**9, datetime.UTC)
        out.append(
            f"<Contents><Key>{quote(o.key)}</Key><ETag>&#34;{o.etag}&#34;</ETag>"
            f"<Size>{o.size}</Size><LastModified>{when:%Y-%m-%dT%H:%M:%S}.000Z</LastModified>"
            "<StorageClass>STANDARD</StorageClass></Contents>"
        )
    for p in page.prefixes:
        out.append(f"<CommonPrefixes><Prefix>{quote(p)}</Prefix></CommonPrefixes>")
    if page.next_token:
        out.append(f"<NextContinuationToken>{escape(page.next_token)}</NextContinuationToken>")
    out.append("<EncodingType>url</EncodingType></ListBucketResult>")
    return "".join(out).encode()


class XmlStore(StoreWrapper):
    """``MemoryStore``'s listings as XML bodies through ``s3wire.list_reply``: every page with
    its digest, none unparsed (the reference)."""

    def __init__(self, inner: MemoryStore) -> None:
        super().__init__(inner)
        self.bodies = 0

    async def body(self, prefix: str, token: str | None, max_keys: int) -> bytes:
        page = await self.inner.list_page(prefix, delimiter="/", token=token, max_keys=max_keys)
        self.bodies += 1
        return render(page, prefix, max_keys)

    async def list_page(
        self,
        prefix: str,
        *,
        delimiter: str | None = "/",
        token: str | None = None,
        start_after: str | None = None,
        max_keys: int = 1000,
    ) -> ListPage:
        got = s3wire.list_reply(await self.body(prefix, token, max_keys))
        assert isinstance(got, ListPage)
        return got


class SkippingXmlStore(XmlStore):
    """... with ``list_page_if_changed``, as ``S3Store`` has it."""

    async def list_page_if_changed(
        self,
        prefix: str,
        *,
        delimiter: str | None = "/",
        token: str | None = None,
        max_keys: int = 1000,
        known: bytes,
    ) -> ListPage | Unchanged:
        return s3wire.list_reply(await self.body(prefix, token, max_keys), known)


@pytest.fixture(params=["compiled", "pure"])
def twins(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("NFSGW_PURE_PYTHON", "1" if request.param == "pure" else "0")
    s3wire.compiled.cache_clear()
    checksums.compiled.cache_clear()
    if request.param == "compiled" and (s3wire.compiled() is None or not checksums.fast_crcs()):
        pytest.skip("the compiled parser or CRCs are not built")
    yield request.param
    monkeypatch.undo()
    s3wire.compiled.cache_clear()
    checksums.compiled.cache_clear()


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many pages were parsed (one counter)."""
    n = [0]
    original = s3wire.parse_list

    def counting(body: bytes | bytearray) -> ListPage:
        n[0] += 1
        return original(body)

    monkeypatch.setattr(s3wire, "parse_list", counting)
    return n


class Pair:
    """The bucket, and a namespace over it with the shortcut and one without."""

    def __init__(self, files: int = FILES) -> None:
        self.clock = FakeClock()
        self.mem = MemoryStore(clock=self.clock)
        for j in range(files):
            self.mem.seed(f"{P}{D}/{fname(j)}", b"x" * (j % 7 + 1), mtime_ns=T0 + j * 10**9)
        self.mem.seed(f"{P}{D}/", b"")  # a marker
        cfg = NamespaceConfig(memory_bytes=1 << 30, age_ttl_factor=0.0, list_page_keys=1000)
        self.fast_store = SkippingXmlStore(self.mem)
        self.ref_store = XmlStore(self.mem)
        self.fast = Namespace(self.fast_store, P, clock=self.clock, config=cfg)
        self.ref = Namespace(self.ref_store, P, clock=self.clock, config=cfg)

    async def view(self, ns: Namespace) -> tuple[object, ...]:
        entries = []
        cookie = 0
        while True:
            page = await ns.readdir(D, cookie, 4096)
            entries += [(e.name, e.kind, e.size, e.etag, e.mtime_ns) for _, e in page.entries]
            if page.eof:
                break
            cookie = page.entries[-1][0]
        d = ns._dirs[D]
        s = ns.stats
        counters = (s.list_pages, s.relists, s.skipped_keys, s.entries, s.bytes, s.list_errors)
        return (entries, d.verf, d.count(), d.exists, d.last_seen, d.partial, d.ttl, counters)

    async def relist(self) -> tuple[object, object]:
        self.clock.advance(100_000.0)
        for ns in (self.fast, self.ref):
            await ns.lookup(D, fname(0))  # stale: starts the re-list
            await ns.quiesce()
        return await self.view(self.fast), await self.view(self.ref)

    async def close(self) -> None:
        await self.fast.close()
        await self.ref.close()


async def test_an_unchanged_relist_parses_nothing(twins: str, parses: list[int]) -> None:
    pair = Pair()
    await pair.view(pair.fast)
    await pair.view(pair.ref)
    assert parses[0] == 6  # the first listings: three pages each
    d = pair.fast._dirs[D]
    cols = d.cols
    assert d.pages is not None and len(d.pages) == 3
    for _ in range(3):
        parses[0] = 0
        bodies = pair.fast_store.bodies
        fast, ref = await pair.relist()
        assert fast == ref
        assert parses[0] == 3  # the reference's three pages; none of the fast one's
        assert pair.fast_store.bodies - bodies == 3  # its LIST pages, nothing more
        assert d.cols is cols  # the same columns: nothing rebuilt
    assert pair.fast.stats.list_pages == pair.ref.stats.list_pages == 12
    await pair.close()


def _etag(pair: Pair, j: int) -> None:
    pair.mem.seed(f"{P}{D}/{fname(j)}", b"etag" * (j % 7 + 1), mtime_ns=T0 + j * 10**9)


def _same_size_new_etag(pair: Pair, j: int) -> None:
    pair.mem.seed(f"{P}{D}/{fname(j)}", b"z" * (j % 7 + 1), mtime_ns=T0 + j * 10**9)


def _size(pair: Pair, j: int) -> None:
    pair.mem.seed(f"{P}{D}/{fname(j)}", b"x" * (j % 7 + 1000), mtime_ns=T0 + j * 10**9)


def _mtime(pair: Pair, j: int) -> None:
    pair.mem.seed(f"{P}{D}/{fname(j)}", b"x" * (j % 7 + 1), mtime_ns=T0 + (j + 5) * 10**9)


def _new_key(pair: Pair, j: int) -> None:
    pair.mem.seed(f"{P}{D}/{fname(j)}-new", b"new", mtime_ns=T0)


def _removed(pair: Pair, j: int) -> None:
    pair.mem.unseed(f"{P}{D}/{fname(j)}")


def _new_dir(pair: Pair, j: int) -> None:
    pair.mem.seed(f"{P}{D}/{fname(j)}-dir/inside", b"in", mtime_ns=T0)


def _page_less(pair: Pair, j: int) -> None:
    for k in range(j, FILES):
        pair.mem.unseed(f"{P}{D}/{fname(k)}")


def _page_more(pair: Pair, j: int) -> None:
    for k in range(FILES, FILES + 700):
        pair.mem.seed(f"{P}{D}/{fname(k)}", b"more", mtime_ns=T0)


def _marker_gone(pair: Pair, j: int) -> None:
    pair.mem.unseed(f"{P}{D}/")


def _bad_key(pair: Pair, j: int) -> None:
    pair.mem.seed(f"{P}{D}/{fname(j)}-x/../up", b"bad", mtime_ns=T0)  # no path: skipped


CHANGES: dict[str, Callable[[Pair, int], None]] = {
    "etag": _etag,
    "etag, same size": _same_size_new_etag,
    "size": _size,
    "mtime": _mtime,
    "new key": _new_key,
    "removed key": _removed,
    "new subdirectory": _new_dir,
    "a page less": _page_less,
    "a page more": _page_more,
    "marker gone": _marker_gone,
    "a key skipped": _bad_key,
}


@pytest.mark.parametrize("where", [3, 1500, 2499])
@pytest.mark.parametrize("change", list(CHANGES))
async def test_a_change_is_seen_exactly_as_by_the_full_compare(
    twins: str, parses: list[int], change: str, where: int
) -> None:
    pair = Pair()
    assert await pair.view(pair.fast) == await pair.view(pair.ref)
    fast, ref = await pair.relist()  # unchanged: the fast one parses nothing
    assert fast == ref
    before = fast
    CHANGES[change](pair, where if change != "a page less" else 1900)
    parses[0] = 0
    fast, ref = await pair.relist()
    assert fast == ref
    if change != "marker gone":  # (a marker is no entry: the pages differ, the view not)
        assert fast[0] != before[0]  # the change shows
    assert parses[0] >= 2 * 2  # both parsed (the fast one from its first page)
    # ... and the next re-list, unchanged again, is skipped again from the new pages
    parses[0] = 0
    fast, ref = await pair.relist()
    assert fast == ref
    assert parses[0] == ref_pages(pair)
    await pair.close()


def ref_pages(pair: Pair) -> int:
    d = pair.ref._dirs[D]
    assert d.pages is not None
    return len(d.pages)


async def test_mutations_through_the_gateway_drop_the_digests(twins: str) -> None:
    """A view changed by the gateway itself (an upsert folded into new columns) no longer is
    what the pages made: the next re-list parses and compares, and both agree."""
    pair = Pair(files=300)
    await pair.view(pair.fast)
    await pair.view(pair.ref)
    for ns in (pair.fast, pair.ref):
        for j in range(100):  # enough to fold the directory's extra into new columns
            ns.remove(f"{D}/{fname(j)}")
        await pair.view(ns)
    assert pair.fast._dirs[D].pages is None
    fast, ref = await pair.relist()  # the bucket still has them: they come back
    assert fast == ref
    assert len(fast[0]) == 300  # type: ignore[arg-type]
    await pair.close()


async def test_held_pages_are_bounded(
    twins: str, parses: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ``HELD_MAX_BYTES`` of unparsed pages, they are parsed and the re-list compares as
    before (here: past the first page)."""
    import gateway.namespace.listing as listing

    pair = Pair()
    await pair.view(pair.fast)
    await pair.view(pair.ref)
    monkeypatch.setattr(listing, "HELD_MAX_BYTES", 1000)
    assert HELD_MAX_BYTES > 1000
    parses[0] = 0
    fast, ref = await pair.relist()
    assert fast == ref
    assert parses[0] == 6  # both parsed every page
    assert pair.fast._dirs[D].pages is not None  # and left the digests for the next
    await pair.close()
