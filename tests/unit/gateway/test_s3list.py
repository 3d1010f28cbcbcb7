"""``gateway._s3list`` (C) against ``s3wire.parse_list_reference`` (ElementTree), the reference.

For every body: ``parse_list`` gives what the reference gives (the same ``ListPage``, field
values and types, or the same exception), and the C alone gives either exactly that or None
(a page it leaves to the reference). The generated pages are the kind S3 and SeaweedFS send
(``Pages``: random keys with unicode, entities and character references, url-encoding with
'+', '%' and keys that are not UTF-8, very long keys, empty and self-closing values, 0 to
1,000 entries, truncated pages with tokens, namespaced and plain roots, pretty-printed or
not) and the C must understand all of them (None would be a silent slow path); then every
prefix of some pages, random byte flips, and constructs the C must leave to the reference
(comments, CDATA, a DOCTYPE, attributes, prefixed names, other encodings, ...).
``test_s3list_sanitizers.py`` runs ``Pages`` and the mutations through an ASan/UBSan build.

Skips the C side when the extension is not built, unless ``NFSGW_REQUIRE_NATIVE=1``.
"""

from __future__ import annotations

import importlib
import os
import random
from typing import Any
from urllib.parse import quote

import pytest

from gateway.backend import s3wire
from gateway.backend.base import ListPage, ObjectInfo

NS = b' xmlns="http://s3.amazonaws.com/doc/2006-03-01/"'

# Captured from SeaweedFS (loadgen.seaweed, S3Store.list_page: encoding-type=url, max-keys 3
# then 1,000): numeric references for quotes, EncodingType after the Contents, no fraction.
_SW_HEAD = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult xmlns="http://s3.amazonaws.com/'
    b'doc/2006-03-01/"><Name>cap</Name><Prefix>d/</Prefix><MaxKeys>3</MaxKeys><Delimiter>/'
    b"</Delimiter><IsTruncated>true</IsTruncated>"
)
_SW_ETAG = b"<ETag>&#34;3e44107170a520582ade522fa73c1d15&#34;</ETag><Size>2</Size>"
_SW_TAIL = b"<StorageClass>STANDARD</StorageClass><LastModified>2026-11-27T01:37:46Z</LastModified>"


def _sw_contents(key: bytes) -> bytes:
    return b"<Contents><Key>" + key + b"</Key>" + _SW_ETAG + _SW_TAIL + b"</Contents>"


SEAWEED_PAGES = [
    _SW_HEAD
    + _sw_contents(b"d/a+b%2Bc%25.jpg")
    + _sw_contents(b"d/q%3F%3D%23")
    + b"<CommonPrefixes><Prefix>d/sub/</Prefix></CommonPrefixes><NextContinuationToken>d/sub/"
    b"</NextContinuationToken><EncodingType>url</EncodingType><KeyCount>3</KeyCount>"
    b"</ListBucketResult>",
    _SW_HEAD
    + _sw_contents(b"d/tab%09x")
    + _sw_contents(b"d/x%26y%3Cz%3E%27%22")
    + b"<CommonPrefixes><Prefix>d/sub2/</Prefix></CommonPrefixes><ContinuationToken>d/sub/"
    b"</ContinuationToken><NextContinuationToken>d/x&amp;y&lt;z&gt;&#39;&#34;"
    b"</NextContinuationToken><EncodingType>url</EncodingType><KeyCount>3</KeyCount>"
    b"</ListBucketResult>",
    _SW_HEAD.replace(b"<IsTruncated>true", b"<IsTruncated>false")
    + b"".join(
        _sw_contents(k)
        for k in (b"d/a+b%2Bc%25.jpg", b"d/%C3%A9%2B%C3%A9", b"d/%E6%97%A5%E6%9C%AC")
    )
    + b"<CommonPrefixes><Prefix>d/sub/</Prefix></CommonPrefixes><EncodingType>url"
    b"</EncodingType><KeyCount>8</KeyCount></ListBucketResult>",
]

# AWS's documented shape (and tests/integration/test_backend_s3.py's): Owner, fractions.
AWS_PAGE = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult' + NS + b">"
    b"<Name>bucket</Name><Prefix>p/</Prefix><KeyCount>3</KeyCount><MaxKeys>3</MaxKeys>"
    b"<EncodingType>url</EncodingType><IsTruncated>true</IsTruncated>"
    b"<NextContinuationToken>1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=</NextContinuationToken>"
    b"<Contents><Key>p/a+b%2Bc%25.jpg</Key><LastModified>2009-10-12T17:50:30.000Z</LastModified>"
    b"<ETag>&quot;fba9dede5f27731c9771645a39863328&quot;</ETag><Size>434234</Size>"
    b"<Owner><ID>75aa57f09aa0c8caeab4f8c24e99d10f8e7faeebf76c078efc7c6caea54ba06a</ID>"
    b"<DisplayName>mtd@amazon.com</DisplayName></Owner><StorageClass>STANDARD</StorageClass>"
    b"</Contents>"
    b"<Contents><Key>p/%FF%FE</Key><LastModified>2009-10-12T17:50:30.000Z</LastModified>"
    b"<ETag>&quot;e2&quot;</ETag><Size>1</Size></Contents>"
    b"<Contents><Key>p/%E6%97%A5</Key><LastModified>2009-10-12T17:50:30.123Z</LastModified>"
    b"<ETag>&quot;e3-2&quot;</ETag><Size>7</Size><ChecksumAlgorithm>CRC32</ChecksumAlgorithm>"
    b"</Contents>"
    b"<CommonPrefixes><Prefix>p/sub%20dir/</Prefix></CommonPrefixes>"
    b"</ListBucketResult>"
)


def native() -> Any:
    c = s3wire.compiled()
    if c is None:
        if os.environ.get("NFSGW_REQUIRE_NATIVE") == "1":
            pytest.fail("NFSGW_REQUIRE_NATIVE=1 but gateway._s3list is not used")
        pytest.skip("gateway._s3list is not built (or NFSGW_PURE_PYTHON is set)")
    return c


def outcome(fn: Any, body: Any) -> tuple[object, ...]:
    try:
        page = fn(body)
    except Exception as e:
        return ("error", type(e), str(e))
    return ("ok", page, shape(page))


def shape(page: ListPage) -> object:
    """The types inside a page (== on dataclasses does not compare them)."""
    return (
        type(page.next_token),
        type(page.skipped),
        [
            (type(o), type(o.key), type(o.size), type(o.etag), type(o.mtime_ns))
            for o in page.objects
        ],
        [type(o.metadata) for o in page.objects],
        [type(p) for p in page.prefixes],
    )


def check(
    c: Any, body: bytes, *, understood: bool | None = None, buffer: Any = None
) -> tuple[object, ...]:
    """Asserts the C agrees with the reference on ``body`` (handed to the C as ``buffer`` if
    given), and, if ``understood`` is given, whether it took the page itself; the reference's
    outcome."""
    want = outcome(s3wire.parse_list_reference, body)
    got = c.parse(body if buffer is None else buffer, ObjectInfo, s3wire._iso_date_ns)
    if got is not None:
        objects, prefixes, token, truncated, skipped = got
        if truncated and token is None:
            mine: tuple[object, ...] = ("error", s3wire.MalformedReply)
        else:
            page = ListPage(objects, prefixes, token if truncated else None, skipped)
            mine = ("ok", page, shape(page))
        assert mine == want[: len(mine)], body
        metas = [id(o.metadata) for o in objects]
        assert len(set(metas)) == len(metas)  # a dict each, as the dataclass default makes
    if understood is not None:
        assert (got is not None) == understood, (body, want)
    assert outcome(s3wire.parse_list, body) == want
    return want


# ---------------------------------------------------------------------------- generation

_ALPHABET = (
    "abcxyzABC0189_-./ +%&<>\"'=?#;:!~*()[]{}@$,\t\n"
    "\u00e9\u00df\u00a0\u0085\u2028\u65e5\u672c\U0001f600\ufeff\u00ff\ud7ff\ue000\ufffd"
)
_NAMED = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&apos;"}


class Pages:
    """Random ListObjectsV2 bodies of the kinds stores send, all well-formed and all within
    what the C understands (``raw=False`` texts may not hold "]]>", which XML forbids)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def text(self, s: str) -> bytes:
        """``s`` as XML text: each character raw where it may be, or a reference."""
        rng = self.rng
        out: list[str] = []
        for ch in s:
            r = rng.random()
            if ch in "<&" or (ch == ">" and out and out[-1].endswith("]")) or r < 0.08:
                cp = ord(ch)
                if ch in _NAMED and r < 0.5:
                    out.append(_NAMED[ch])
                elif r < 0.75:
                    out.append(f"&#{cp:0{rng.randint(1, 5)}d};")
                else:
                    out.append(f"&#x{cp:{'X' if r < 0.9 else 'x'}};")
            else:
                out.append(ch)
        return "".join(out).encode()

    def key(self, kp: str) -> str:
        rng = self.rng
        kind = rng.random()
        if kind < 0.3:
            name = f"n{rng.randrange(10**8):08d}_{rng.randrange(1300)}.JPEG"
        elif kind < 0.95:
            name = "".join(rng.choice(_ALPHABET) for _ in range(rng.choice([0, 1, 3, 12, 40])))
        else:
            name = "k" * rng.choice([255, 1024, 5000])
        return kp + name

    def encoded(self, key: str) -> str:
        """What S3 sends for ``key`` with encoding-type=url (a space as '+' or %20), sometimes
        with a byte that is not UTF-8, lowercase hex, or a stray '%'."""
        rng = self.rng
        s = quote(key, safe="/" + ("~" if rng.random() < 0.5 else ""))
        if rng.random() < 0.5:
            s = s.replace("%20", "+")
        if rng.random() < 0.2:
            s = s.lower()
        if rng.random() < 0.05:
            s += rng.choice(["%FF", "%C3", "%ED%A0%80", "%", "%2", "%zz", "%C3%28"])
        return s

    def date(self) -> bytes:
        rng = self.rng
        t = rng.choice(
            [
                "2009-10-12T17:50:30.000Z",
                "2026-11-27T01:37:46Z",
                f"20{rng.randrange(100):02d}-{rng.randint(1, 12):02d}-{rng.randint(1, 31):02d}"
                f"T{rng.randrange(25):02d}:{rng.randrange(61):02d}:{rng.randrange(61):02d}"
                + rng.choice(["Z", ".123Z", ".999Z", ".5Z", ".999999Z", "+00:00", "+02:00", ""]),
                "1969-12-31T23:59:59.500Z",
                "0001-01-01T00:00:00Z",
                "2201-01-01T00:00:00Z",
                "9999-12-31T23:59:59.999999Z",
                "2000-02-29T00:00:00Z",
                "1900-02-29T00:00:00Z",
                "2023-02-29T00:00:00Z",
                "2024-02-29T12:00:00.000Z",
                "2023-04-31T00:00:00Z",
                "2023-13-01T00:00:00Z",
                "2023-00-10T00:00:00Z",
                "2023-01-00T00:00:00Z",
                "2023-01-01T24:00:00Z",
                "2023-01-01T23:60:00Z",
                "2023-01-01T23:59:60Z",
                "1970-01-01T00:00:00Z",
                "2200-12-31T23:59:59.999Z",
                "2023-01-01T00:00:00.12aZ",
                "2023-01-01t00:00:00Z",
                "2023-01-01T00:00:00z",
                "",
                "garbage",
            ]
        )
        return self.text(t)

    def ws(self, pretty: bool) -> bytes:
        return self.rng.choice([b"\n", b"\n  ", b" ", b"\t"]) if pretty else b""

    def field(self, name: bytes, value: bytes, pretty: bool) -> bytes:
        if not value and self.rng.random() < 0.5:
            return b"<" + name + (b" " if self.rng.random() < 0.3 else b"") + b"/>"
        end = b"</" + name + (b" " if self.rng.random() < 0.1 else b"") + b">"
        return self.ws(pretty) + b"<" + name + b">" + value + end

    def page(self, n: int | None = None) -> bytes:
        rng = self.rng
        pretty = rng.random() < 0.3
        encoded = rng.random() < 0.7
        kp = rng.choice(["", "ds/", "a b/", "日/", "x+y%/"])
        n = rng.choice([0, 1, 2, 5, 30]) if n is None else n
        body: list[bytes] = []
        if rng.random() < 0.8:
            body.append(
                rng.choice(
                    [
                        b'<?xml version="1.0" encoding="UTF-8"?>\n',
                        b"<?xml version='1.0' encoding='utf-8'?>",
                        b'<?xml version="1.0"?>\n\n',
                        b'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>',
                    ]
                )
            )
        root = b"<ListBucketResult" + (NS if rng.random() < 0.7 else b"") + b">"
        body.append(root)
        head = [
            self.field(b"Name", self.text("bucket"), pretty),
            self.field(b"Prefix", self.text(kp), pretty),
            self.field(b"MaxKeys", b"1000", pretty),
            self.field(b"Delimiter", b"/", pretty),
        ]
        truncated = rng.random() < 0.5
        trunc = rng.choice(["true", "TRUE", " true\n", "false", "", "yes", "True"])
        if not truncated:
            trunc = rng.choice(["false", "False", ""])
        head.append(self.field(b"IsTruncated", self.text(trunc), pretty))
        if truncated or rng.random() < 0.2:
            token = rng.choice(["", "tok/+=", "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36H==", "a&b"])
            head.append(self.field(b"NextContinuationToken", self.text(token), pretty))
        enc = (rng.choice(["url", "URL", " url ", "Url"]) if encoded else "") or "none"
        enc_field = self.field(b"EncodingType", self.text(enc), pretty)
        if encoded or rng.random() < 0.1:
            head.insert(rng.randrange(len(head) + 1), enc_field)
        items: list[bytes] = []
        for _ in range(n):
            key = self.key(kp)
            key_text = self.text(self.encoded(key) if encoded else key)
            fields = [
                self.field(b"Key", key_text, pretty),
                self.field(b"LastModified", self.date(), pretty),
                self.field(
                    b"ETag",
                    self.text(
                        rng.choice([f'"{rng.getrandbits(128):032x}"', '"e-2"', '"', "", "x"])
                    ),
                    pretty,
                ),
                self.field(
                    b"Size", rng.choice([b"0", b"42", b"110000", b"", b"007", b"9" * 18]), pretty
                ),
                self.field(b"StorageClass", b"STANDARD", pretty),
            ]
            if rng.random() < 0.2:
                owner = self.field(b"ID", self.text("75aa57f0"), pretty) + self.field(
                    b"DisplayName", self.text("me & you"), pretty
                )
                fields.append(self.ws(pretty) + b"<Owner>" + owner + b"</Owner>")
            rng.shuffle(fields)
            if rng.random() < 0.05:
                fields.append(self.field(b"Key", key_text + b"2", pretty))  # the last one wins
            items.append(self.ws(pretty) + b"<Contents>" + b"".join(fields) + b"</Contents>")
        for _ in range(rng.choice([0, 0, 1, 3])):
            p = self.key(kp) + "/"
            pt = self.text(self.encoded(p) if encoded else p)
            inner = self.field(b"Prefix", pt, pretty)
            if rng.random() < 0.1:
                inner += self.field(b"Prefix", pt + b"x/", pretty)
            items.append(self.ws(pretty) + b"<CommonPrefixes>" + inner + b"</CommonPrefixes>")
        tail = [self.field(b"KeyCount", str(n).encode(), pretty)]
        if encoded and rng.random() < 0.5:  # SeaweedFS: after the Contents
            head.remove(enc_field)
            tail.insert(0, enc_field)
        body += head + items + tail
        body.append(self.ws(pretty) + b"</ListBucketResult>" + (b"\n" if pretty else b""))
        return b"".join(body)


# Bodies the C must leave to the reference (each is either parsed by ElementTree, or raises
# MalformedReply there): one construct each, in an otherwise ordinary page.
_BASE = (
    b"<ListBucketResult"
    + NS
    + b"><Contents><Key>k</Key><Size>1</Size></Contents>%s</ListBucketResult>"
)
NOT_UNDERSTOOD = [
    _BASE % b"<!-- a comment -->",
    _BASE % b"<Contents><Key><![CDATA[a<b]]></Key></Contents>",
    _BASE % b"<?pi data?>",
    _BASE % b"<Contents><Key a='1'>k</Key></Contents>",
    _BASE % b"<Contents xmlns='other'><Key>k</Key></Contents>",
    _BASE % b"<s3:Contents xmlns:s3='x'><s3:Key>k</s3:Key></s3:Contents>",
    _BASE % b"<Contents><Key>a\r\nb</Key></Contents>",
    _BASE % b"<Contents><Key>a<b/>c</Key></Contents>",
    _BASE % b"<Contents><Size> 42 </Size></Contents>",
    _BASE % b"<Contents><Size>-1</Size></Contents>",
    _BASE % b"<Contents><Size>1_000</Size></Contents>",
    _BASE % b"<Contents><Size>x</Size></Contents>",
    _BASE % b"<Contents><Size>1234567890123456789</Size></Contents>",
    _BASE % b"<Contents><Size>&#52;2</Size></Contents>",
    _BASE % b"<IsTruncated>\xc5\xbfrue</IsTruncated>",
    _BASE % b"<EncodingType>\xe2\x84\xaa</EncodingType>",
    _BASE % b"<Contents><Key>&foo;</Key></Contents>",
    _BASE % b"<Contents><Key>&#0;</Key></Contents>",
    _BASE % b"<Contents><Key>&#xD800;</Key></Contents>",
    _BASE % b"<Contents><Key>&#x110000;</Key></Contents>",
    _BASE % b"<Contents><Key>&amp</Key></Contents>",
    _BASE % b"<Contents><Key>a]]>b</Key></Contents>",
    _BASE % b"<Contents><Key>\x01</Key></Contents>",
    _BASE % b"<Contents><Key>\xff</Key></Contents>",
    _BASE % b"<Contents><Key>\xef\xbf\xbe</Key></Contents>",
    _BASE % b"<Contents><Key>\xed\xa0\x80</Key></Contents>",
    _BASE % b"<Contents><Key>\xc0\xaf</Key></Contents>",
    _BASE % b"<Contents><Key>k</Key></Content>",
    _BASE % b"<Contents><Key>k</Kez></Contents>",
    _BASE % b"<1Contents/>",
    _BASE % b"< Contents/>",
    b'<?xml version="1.0" encoding="ISO-8859-1"?><ListBucketResult><Contents><Key>\xe9</Key>'
    b"</Contents></ListBucketResult>",
    b'<?xml version="1.1"?><ListBucketResult/>',
    b'<?xml encoding="UTF-8"?><ListBucketResult/>',
    b'<?xml version="1.0" standalone="yes" encoding="UTF-8"?><ListBucketResult/>',
    b"\xef\xbb\xbf<ListBucketResult><Contents><Key>k</Key></Contents></ListBucketResult>",
    b' <?xml version="1.0"?><ListBucketResult/>',
    b'<!DOCTYPE x [<!ENTITY e "k">]><ListBucketResult><Contents><Key>&e;</Key></Contents>'
    b"</ListBucketResult>",
    b"<ListBucketResult xmlns='http://www.w3.org/2000/xmlns/'/>",
    b"<ListBucketResult xmlns='a' other='b'/>",
    b"<ListBucketResult xmlns='a}b'/>",
    b"<ListBucketResult xmlns='a&amp;b'/>",
    b"<Error><Code>SlowDown</Code></Error>",
    b"<ListBucketResult></ListBucketResult><ListBucketResult/>",
    b"<ListBucketResult/>trailing",
    b"",
    b"not xml",
    b"<" + b"<a>" * 40 + b"</a>" * 40 + b">",
    b"<ListBucketResult>" + b"<a>" * 40 + b"</a>" * 40 + b"</ListBucketResult>",
    b"<ListBucketResult><Contents><Key>k</Key></Contents>",
]


# --------------------------------------------------------------------------------- tests


def test_seaweedfs_and_aws_pages() -> None:
    c = native()
    for body in [*SEAWEED_PAGES, AWS_PAGE]:
        check(c, body, understood=True)
    page = s3wire.parse_list(AWS_PAGE)
    assert [o.key for o in page.objects] == ["p/a b+c%.jpg", "p/日"] and page.skipped == 1
    assert page.objects[0].etag == "fba9dede5f27731c9771645a39863328"
    assert page.objects[0].mtime_ns == page.objects[1].mtime_ns == 1255369830 * 10**9
    page = s3wire.parse_list(SEAWEED_PAGES[1])
    assert [o.key for o in page.objects] == ["d/tab\tx", "d/x&y<z>'\""]
    assert page.next_token == "d/x&y<z>'\"" and page.prefixes == ["d/sub2/"]


@pytest.mark.parametrize("seed", range(6))
def test_generated_pages(seed: int) -> None:
    c = native()
    rng = random.Random(seed)
    pages = Pages(rng)
    for _ in range(150):
        check(c, pages.page(), understood=True)


def test_large_pages() -> None:
    c = native()
    pages = Pages(random.Random(7))
    for n in (0, 1000):
        want = check(c, pages.page(n), understood=True)
        assert want[0] == "ok"


def test_every_prefix() -> None:
    c = native()
    pages = Pages(random.Random(11))
    for body in [SEAWEED_PAGES[1], AWS_PAGE, pages.page(3), pages.page(2)]:
        for i in range(len(body) + 1):
            check(c, body[:i])


def test_byte_flips() -> None:
    c = native()
    rng = random.Random(13)
    pages = Pages(rng)
    bodies = [*SEAWEED_PAGES, AWS_PAGE] + [pages.page() for _ in range(30)]
    for _ in range(3000):
        b = bytearray(rng.choice(bodies))
        if not b:
            continue
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(b))
            if rng.random() < 0.5:
                b[at] = rng.choice(b"<>/&;#x\"'=?! \t\r\n\x00\x80\xff]")
            else:
                b[at] ^= 1 << rng.randrange(8)
        check(c, bytes(b))


@pytest.mark.parametrize("body", NOT_UNDERSTOOD, ids=range(len(NOT_UNDERSTOOD)))
def test_left_to_the_reference(body: bytes) -> None:
    check(native(), body, understood=False)


def test_truncated_without_token_is_malformed() -> None:
    native()
    body = (
        b"<ListBucketResult><IsTruncated>true</IsTruncated><NextContinuationToken/>"
        b"</ListBucketResult>"
    )
    with pytest.raises(s3wire.MalformedReply):
        s3wire.parse_list(body)
    with pytest.raises(s3wire.MalformedReply):
        s3wire.parse_list(b"<ListBucketResult><Contents>")


def test_odd_dates_go_through_the_reference_conversion() -> None:
    c = native()
    seen: list[str] = []

    def date_ns(value: str) -> int:
        seen.append(value)
        return s3wire._iso_date_ns(value)

    lm = ["2009-10-12T17:50:30.000Z", "2009-10-12T17:50:30.5Z", "1969-12-31T23:59:59.5Z", ""]
    body = (
        b"<ListBucketResult>"
        + b"".join(b"<Contents><LastModified>%s</LastModified></Contents>" % t.encode() for t in lm)
        + b"</ListBucketResult>"
    )
    got = c.parse(body, ObjectInfo, date_ns)
    assert got is not None
    assert [o.mtime_ns for o in got[0]] == [s3wire._iso_date_ns(t) for t in lm]
    assert seen == lm[1:3]  # the usual form and the empty one are converted in C


def test_pure_python_selects_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NFSGW_PURE_PYTHON", "1")
    s3wire.compiled.cache_clear()
    try:
        assert s3wire.compiled() is None
        assert s3wire.parse_list(AWS_PAGE) == s3wire.parse_list_reference(AWS_PAGE)
    finally:
        monkeypatch.delenv("NFSGW_PURE_PYTHON")
        s3wire.compiled.cache_clear()
    try:
        importlib.import_module("gateway._s3list")
    except ImportError:
        return
    assert s3wire.compiled() is not None
