"""S3's wire formats, sans-I/O: the XML bodies (ListObjectsV2 results, multipart requests and
replies, error documents), the header values the store reads or writes (ETags, HTTP and
ISO dates, Content-Range, ``x-amz-meta-*``) and the bytes of a request without a body (the
lean wire's).

Owns: bytes/strings in, ``ListPage``/``ObjectInfo`` fields out, and ``MalformedReply`` for a
reply that is not what S3 sends (the store retries those). Must not: do I/O, read clocks,
log, or decide what an error code means (retry, expired credentials, not found: ``s3.py``
does that).

``parse_list`` is the hot one. It runs the compiled twin ``gateway._s3list`` (C, built by the
package's own build) and ``parse_list_reference`` (ElementTree, the reference) only for a
page the C does not fully understand (it returns None, never guesses) or when the C is not
there (``NFSGW_PURE_PYTHON=1``, or not built: ``compiled``). A 1,000-key page costs
0.41-0.55 µs of CPU per entry in C against 3.2-4.9 with ElementTree. A re-list of an
unchanged 1,281-entry directory on SeaweedFS parses nothing (``list_reply`` below): ~1.0 ms of
gateway CPU in all, against 2.6-3.0 when its two pages were parsed (~0.6) and compared (~0.6)
over aiohttp (``benchmarks/list_parse.py``, docs/benchmarks.md "Listings in C" and "Re-lists
that parse nothing").

``list_reply`` is what a LIST reply becomes: the parsed page with its digest, or, for a page
whose digest the caller knew (the same page of the previous listing of that directory), an
``Unchanged`` page that is not parsed (``gateway.namespace.listing``: a re-list of an
unchanged directory parses and compares nothing).

Body checksums (which one a GET reply carries, computing it) are ``checksums.py``'s.
"""

from __future__ import annotations

import calendar
import dataclasses
import email.utils
import functools
import importlib
import os
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from datetime import datetime
from functools import lru_cache
from types import ModuleType
from typing import Final
from urllib.parse import unquote_to_bytes
from xml.sax.saxutils import escape as xml_escape

from gateway.backend.base import BackendError, ListPage, ObjectInfo, Unchanged
from gateway.backend.checksums import page_digest

_META_PREFIX: Final = "x-amz-meta-"


class MalformedReply(Exception):
    """A reply the store cannot use (bad XML, an unexpected root element, a bad
    Content-Range, a truncated listing without a token): worth retrying."""


# ------------------------------------------------------------------------ XML bodies


def xml_root(body: bytes | bytearray) -> ET.Element:
    try:
        return ET.fromstring(body)
    except ET.ParseError as e:
        raise MalformedReply(f"bad XML from the store: {e}") from None


def _local_name(tag: str) -> str:
    """``{namespace}Name`` -> ``Name``."""
    return tag.rpartition("}")[2]


def child_text(el: ET.Element, name: str) -> str:
    for c in el:
        if _local_name(c.tag) == name:
            return c.text or ""
    return ""


def embedded_error(root: ET.Element) -> tuple[str, str] | None:
    """(Code, Message) when a 200 reply's body is an ``<Error>`` document (CopyObject and
    CompleteMultipartUpload may fail after the status line went out), else None."""
    if _local_name(root.tag) != "Error":
        return None
    return child_text(root, "Code"), child_text(root, "Message")


def parse_error(body: bytes) -> tuple[str, str]:
    """(Code, Message) of an error reply; the start of a body that is not XML as the
    message; ("", "") for no body."""
    if not body:
        return "", ""
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        return "", body[:200].decode("utf-8", "replace")
    return child_text(root, "Code"), child_text(root, "Message")


def complete_multipart_body(parts: Iterable[tuple[int, str]]) -> bytes:
    """The CompleteMultipartUpload request body, parts in number order."""
    return (
        "<CompleteMultipartUpload>"
        + "".join(
            f'<Part><PartNumber>{n}</PartNumber><ETag>"{xml_escape(e)}"</ETag></Part>'
            for n, e in sorted(parts)
        )
        + "</CompleteMultipartUpload>"
    ).encode()


def _url_decode(s: str) -> str:
    """encoding-type=url values: S3 writes a space as '+' and '+' as %2B (botocore decodes
    with unquote_plus). Raises UnicodeDecodeError for keys that are not UTF-8."""
    if "%" not in s and "+" not in s:
        return s
    return unquote_to_bytes(s.replace("+", " ")).decode("utf-8")


@functools.cache
def compiled() -> ModuleType | None:
    """``gateway._s3list``, or None: ``NFSGW_PURE_PYTHON=1`` asks for the reference, the
    extension was not built, or ``ObjectInfo`` no longer has the fields the C sets."""
    if os.environ.get("NFSGW_PURE_PYTHON", "") not in ("", "0"):
        return None
    fields = [(f.name, f.default_factory) for f in dataclasses.fields(ObjectInfo)]
    if fields != [(n, dataclasses.MISSING) for n in _C_FIELDS] + [("metadata", dict)]:
        return None
    try:
        return importlib.import_module("gateway._s3list")
    except ImportError:
        return None


_C_FIELDS: Final = ("key", "size", "etag", "mtime_ns")


def parse_list(body: bytes | bytearray) -> ListPage:
    """One ListObjectsV2 result (``encoding-type=url`` honoured; keys that are not UTF-8
    are counted in ``skipped``): the compiled twin's, else ``parse_list_reference``'s."""
    c = compiled()
    got = None if c is None else c.parse(body, ObjectInfo, _iso_date_ns)
    if got is None:
        return parse_list_reference(body)
    objects, prefixes, next_token, truncated, skipped = got
    if not truncated:
        next_token = None
    elif next_token is None:
        raise MalformedReply("truncated listing without NextContinuationToken")
    return ListPage(objects, prefixes, next_token, skipped)


def list_reply(body: bytes | bytearray, known: bytes = b"") -> ListPage | Unchanged:
    """A ListObjectsV2 reply body: ``Unchanged`` (the body kept, not parsed) when its
    ``page_digest`` is ``known``, else ``parse_list``'s page with its digest. An unchanged page
    parses later as its twin did (``Unchanged.parse``; should it not, ``BackendError``: the
    request is over, nothing to retry)."""
    digest = page_digest(body)
    if known and digest == known:

        def parse() -> ListPage:
            try:
                page = parse_list(body)
            except (MalformedReply, UnicodeDecodeError, ValueError) as e:
                raise BackendError(f"a listing page held unparsed: {e}") from e
            page.digest = digest
            return page

        return Unchanged(digest, len(body), parse)
    page = parse_list(body)
    page.digest = digest
    return page


def parse_list_reference(body: bytes | bytearray) -> ListPage:
    """``parse_list`` with ElementTree: the reference the C twin is tested against, and what
    parses the pages the C does not understand. One pass over the children of the root and
    of each ``Contents`` (ElementTree's C parser)."""
    root = xml_root(body)
    tag = root.tag
    ns = tag[: tag.index("}") + 1] if tag.startswith("{") else ""
    if tag != ns + "ListBucketResult":
        raise MalformedReply(f"unexpected list response <{_local_name(tag)}>")
    t_contents, t_prefixes, t_token = (
        ns + "Contents",
        ns + "CommonPrefixes",
        ns + "NextContinuationToken",
    )
    t_trunc, t_enc = ns + "IsTruncated", ns + "EncodingType"
    t_key, t_size, t_etag, t_lm, t_prefix = (
        ns + "Key",
        ns + "Size",
        ns + "ETag",
        ns + "LastModified",
        ns + "Prefix",
    )
    raw: list[tuple[str, int, str, str]] = []
    raw_prefixes: list[str] = []
    next_token: str | None = None
    truncated = False
    encoded = False
    for el in root:
        t = el.tag
        if t == t_contents:
            key = etag = lm = ""
            size = 0
            for c in el:
                ct = c.tag
                if ct == t_key:
                    key = c.text or ""
                elif ct == t_size:
                    size = int(c.text or 0)
                elif ct == t_etag:
                    etag = c.text or ""
                elif ct == t_lm:
                    lm = c.text or ""
            raw.append((key, size, etag, lm))
        elif t == t_prefixes:
            for c in el:
                if c.tag == t_prefix:
                    raw_prefixes.append(c.text or "")
        elif t == t_token:
            next_token = el.text or None
        elif t == t_trunc:
            truncated = (el.text or "").strip().lower() == "true"
        elif t == t_enc:
            encoded = (el.text or "").strip().lower() == "url"
    skipped = 0
    objects: list[ObjectInfo] = []
    prefixes: list[str] = []
    for key, size, etag, lm in raw:
        if encoded:
            try:
                key = _url_decode(key)
            except UnicodeDecodeError:
                skipped += 1
                continue
        objects.append(ObjectInfo(key, size, unquote_etag(etag), _iso_date_ns(lm)))
    for p in raw_prefixes:
        if encoded:
            try:
                p = _url_decode(p)
            except UnicodeDecodeError:
                skipped += 1
                continue
        prefixes.append(p)
    if not truncated:
        next_token = None
    elif next_token is None:
        raise MalformedReply("truncated listing without NextContinuationToken")
    return ListPage(objects, prefixes, next_token, skipped)


def parse_object_parts(body: bytes | bytearray) -> tuple[str, list[tuple[int, int]], int | None]:
    """A GetObjectAttributes reply asked for ``ObjectParts``: (the object's ETag unquoted,
    [(part number, size)] in the order given, the next part-number marker when the list is
    truncated, else None)."""
    root = xml_root(body)
    if _local_name(root.tag) != "GetObjectAttributesResponse":
        raise MalformedReply(f"unexpected attributes response <{_local_name(root.tag)}>")
    etag = unquote_etag(child_text(root, "ETag"))
    parts: list[tuple[int, int]] = []
    marker: int | None = None
    for el in root:
        if _local_name(el.tag) != "ObjectParts":
            continue
        truncated = child_text(el, "IsTruncated").strip().lower() == "true"
        try:
            for p in el:
                if _local_name(p.tag) == "Part":
                    parts.append((int(child_text(p, "PartNumber")), int(child_text(p, "Size"))))
            if truncated:
                marker = int(child_text(el, "NextPartNumberMarker"))
        except ValueError:
            raise MalformedReply("bad PartNumber, Size or NextPartNumberMarker") from None
    return etag, parts, marker


# --------------------------------------------------------------------- header values


def metadata_headers(metadata: Mapping[str, str] | None) -> dict[str, str]:
    """x-amz-meta-* request headers. Names are case-insensitive in S3 and come back
    lowercase; values must be printable ASCII (what nfsgw stores: numbers and modes)."""
    if not metadata:
        return {}
    out: dict[str, str] = {}
    for k, v in metadata.items():
        if not k or not k.isascii() or not v.isascii() or "\n" in v or "\r" in v:
            raise ValueError(f"metadata {k!r}={v!r}: names and values must be ASCII")
        out[_META_PREFIX + k.lower()] = v
    return out


def user_metadata(headers: Mapping[str, str]) -> dict[str, str]:
    """The x-amz-meta-* headers of a reply, prefix stripped, names lowercase."""
    meta: dict[str, str] = {}
    n = len(_META_PREFIX)
    for k, v in headers.items():
        lk = k.lower()
        if lk.startswith(_META_PREFIX):
            meta[lk[n:]] = v
    return meta


def unquote_etag(etag: str) -> str:
    if len(etag) >= 2 and etag[0] == '"' and etag[-1] == '"':
        return etag[1:-1]
    return etag.strip('"')


_MONTHS: Final = {
    m: i
    for i, m in enumerate(
        ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1
    )
}


@lru_cache(maxsize=4096)
def http_date_ns(value: str) -> int:
    """IMF-fixdate (``Wed, 12 Oct 2009 17:50:00 GMT``) -> epoch ns; 0 if absent/garbled."""
    if not value:
        return 0
    try:
        _, day, mon, year, hms, _ = value.split()
        hh, mm, ss = hms.split(":")
        t = calendar.timegm((int(year), _MONTHS[mon], int(day), int(hh), int(mm), int(ss)))
        return t * 1_000_000_000
    except (ValueError, KeyError):
        try:
            return int(email.utils.parsedate_to_datetime(value).timestamp()) * 1_000_000_000
        except (TypeError, ValueError):
            return 0


@lru_cache(maxsize=16384)
def _iso_date_ns(value: str) -> int:
    """ListObjectsV2 LastModified (``2009-10-12T17:50:30.000Z``) -> epoch ns, truncated to
    whole seconds so it equals what HEAD/GET report (Last-Modified has 1 s resolution; AWS
    listings always say .000 anyway)."""
    try:
        return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()) * 10**9
    except ValueError:
        return 0


def parse_content_range(value: str) -> tuple[int, int, int]:
    """``bytes first-last/total`` (total may be ``*`` -> -1)."""
    try:
        unit, _, rest = value.partition(" ")
        rng, _, total = rest.partition("/")
        first, _, last = rng.partition("-")
        if unit != "bytes":
            raise ValueError(value)
        return int(first), int(last), (-1 if total == "*" else int(total))
    except ValueError:
        raise MalformedReply(f"bad Content-Range {value!r}") from None


def object_info(key: str, h: Mapping[str, str]) -> ObjectInfo:
    """A HEAD reply's headers (looked up by lowercase name) to an ``ObjectInfo``."""
    return ObjectInfo(
        key,
        int(h.get("content-length", "0")),
        unquote_etag(h.get("etag", "")),
        http_date_ns(h.get("last-modified", "")),
        user_metadata(h),
    )


def parse_unsatisfied_range(value: str) -> int:
    """The size in a 416's ``bytes */<size>``; 0 if absent."""
    _, _, total = value.partition("/")
    try:
        return int(total)
    except ValueError:
        return 0


# ------------------------------------------------------------------------ requests


def request_bytes(method: str, path: str, query: str, headers: Mapping[str, str]) -> bytes:
    """A request without a body, ready for one ``transport.write``. Header values with CR
    or LF are refused (they would split the request)."""
    lines = "".join([f"{k}: {v}\r\n" for k, v in headers.items()])
    n = len(headers)
    if lines.count("\n") != n or lines.count("\r") != n:
        raise ValueError("CR or LF in a request header value")
    target = f"{path}?{query}" if query else path
    return f"{method} {target} HTTP/1.1\r\n{lines}\r\n".encode()
