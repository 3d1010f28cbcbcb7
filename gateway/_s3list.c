/* gateway._s3list: ListObjectsV2 result pages in C, the compiled twin of the ElementTree code
 * in gateway/backend/s3wire.py (``parse_list``), which stays the reference and the fallback.
 *
 * Owns: parse(body, info_type, date_ns) -> (objects, prefixes, token, truncated, skipped), or
 * None for every body it does not fully understand; s3wire then parses that body with
 * ElementTree, which gives the result or raises MalformedReply. So a page either gets exactly
 * the values the reference gives, or goes to it. Must not: import anything from the project,
 * read a byte outside the buffer it was given, or guess.
 *
 * What it understands (what AWS and SeaweedFS send), everything else is None:
 *   - an optional XML declaration first (version 1.0, encoding UTF-8, standalone), whitespace,
 *     the root <ListBucketResult> with no attribute or one xmlns="..." (no prefixed names, no
 *     other namespace declarations: every element then has the root's namespace), whitespace
 *     after it;
 *   - elements without attributes, nested at most MAX_DEPTH deep, names of ASCII letters,
 *     digits, '_', '-', '.'; no comment, CDATA, DOCTYPE or processing instruction;
 *   - text with the five predefined entities and character references to XML characters;
 *     bytes that are strict UTF-8 (no surrogates, no U+FFFE/U+FFFF), no control character but
 *     tab and newline (a carriage return, which XML would normalise, is not understood);
 *   - the fields read: root children Contents (Key, Size, ETag, LastModified), CommonPrefixes
 *     (Prefix), IsTruncated, NextContinuationToken, EncodingType, each field plain text (no
 *     child element); Size as 1-18 ASCII digits or empty; IsTruncated and EncodingType ASCII.
 * Like the reference, the last of a repeated field wins and EncodingType=url applies to every
 * key and prefix wherever it stands (SeaweedFS sends it after the Contents), so the body is
 * scanned once into spans and the objects are built afterwards.
 *
 * Keys of an encoding-type=url page are decoded as s3wire._url_decode does ('+' is a space,
 * %XX a byte, a '%' not followed by two hex digits kept); one that is not UTF-8 is skipped and
 * counted. LastModified of the form YYYY-MM-DDTHH:MM:SS[.fff]Z (1970-2200) is converted here
 * (whole seconds, as the reference truncates); any other text is handed to ``date_ns``
 * (s3wire._iso_date_ns), so the value is the reference's by construction. Objects are made
 * with ``info_type``'s allocator and its slot descriptors (what its dataclass __init__ does,
 * without running Python per entry); the caller checks the type's fields are the five set
 * here (key, size, etag, mtime_ns, metadata: a new empty dict each).
 *
 * Bounded: one pass over the body with an explicit stack of MAX_DEPTH names (no recursion),
 * entries in arrays grown by doubling with overflow checks, freed before returning.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#define MAX_DEPTH 32
#define SIZE_DIGITS 18 /* below 2**63 */

/* A field's text in the body; amp: it holds a reference to decode. */
typedef struct {
    const unsigned char *p;
    Py_ssize_t n;
    int amp;
} Span;

typedef struct {
    Span key, etag, lm;
    long long size;
} Entry;

typedef struct {
    Entry *entries;
    Py_ssize_t n_entries, cap_entries;
    Span *prefixes;
    Py_ssize_t n_prefixes, cap_prefixes;
    Span token, trunc, enc;
    int has_token;
    Py_ssize_t longest; /* the longest span, for the scratch buffer */
} Page;

enum { OK = 0, FALLBACK = 1, NOMEM = 2 };

/* ------------------------------------------------------------------ bytes and characters */

static int
is_ws(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n';
}

/* Byte classes, looked up once a byte (a third of the parse went to comparisons). */
enum { C_NAME_START = 1, C_NAME = 2, C_TEXT_STOP = 4 };
static unsigned char cls[256];

static void
init_classes(void)
{
    for (int c = 0; c < 256; c++) {
        int start = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
        int name = start || (c >= '0' && c <= '9') || c == '-' || c == '.';
        cls[c] = (unsigned char)((start ? C_NAME_START : 0) | (name ? C_NAME : 0) |
                                 (c == '<' || c == '&' || c == ']' ? C_TEXT_STOP : 0));
    }
}

static inline int
is_name_start(unsigned char c)
{
    return cls[c] & C_NAME_START;
}

static inline int
is_name(unsigned char c)
{
    return cls[c] & C_NAME;
}

static int
is_xml_char(uint32_t c)
{
    return c == 0x9 || c == 0xA || c == 0xD || (c >= 0x20 && c <= 0xD7FF) ||
           (c >= 0xE000 && c <= 0xFFFD) || (c >= 0x10000 && c <= 0x10FFFF);
}

/* Every byte: strict UTF-8, an XML character, no control character but tab and newline. */
static int
check_bytes(const unsigned char *s, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    while (i < n) {
        if (n - i >= 8) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            /* no byte >= 0x80 and none < 0x20: a whole word of plain ASCII */
            if (((w | (w - 0x2020202020202020ULL)) & 0x8080808080808080ULL) == 0) {
                i += 8;
                continue;
            }
        }
        unsigned char c = s[i];
        if (c < 0x80) {
            if (c < 0x20 && c != '\t' && c != '\n')
                return FALLBACK;
            i++;
            continue;
        }
        uint32_t cp;
        Py_ssize_t len;
        if (c >= 0xC2 && c <= 0xDF) {
            len = 2;
            cp = c & 0x1F;
        } else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            cp = c & 0x0F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            cp = c & 0x07;
        } else {
            return FALLBACK;
        }
        if (n - i < len)
            return FALLBACK;
        for (Py_ssize_t k = 1; k < len; k++) {
            unsigned char d = s[i + k];
            if ((d & 0xC0) != 0x80)
                return FALLBACK;
            cp = (cp << 6) | (d & 0x3F);
        }
        if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || !is_xml_char(cp))
            return FALLBACK; /* overlong, surrogate, U+FFFE/U+FFFF, past U+10FFFF */
        i += len;
    }
    return OK;
}

/* The reference at s (s[0] == '&') up to e: its length through ';' and its code point, or 0
 * if it is not one this parser understands. */
static Py_ssize_t
reference(const unsigned char *s, const unsigned char *e, uint32_t *cp)
{
    Py_ssize_t n = e - s;
    if (n >= 3 && s[1] == '#') {
        Py_ssize_t i = 2;
        uint32_t v = 0;
        int hex = 0;
        if (s[2] == 'x') {
            hex = 1;
            i = 3;
        }
        Py_ssize_t start = i;
        for (; i < n && s[i] != ';'; i++) {
            unsigned char c = s[i];
            uint32_t d;
            if (c >= '0' && c <= '9')
                d = c - '0';
            else if (hex && c >= 'a' && c <= 'f')
                d = c - 'a' + 10;
            else if (hex && c >= 'A' && c <= 'F')
                d = c - 'A' + 10;
            else
                return 0;
            v = v * (hex ? 16 : 10) + d;
            if (v > 0x10FFFF)
                return 0;
        }
        if (i == start || i >= n || !is_xml_char(v))
            return 0;
        *cp = v;
        return i + 1;
    }
    static const struct {
        const char *name;
        Py_ssize_t len;
        uint32_t cp;
    } named[] = {
        {"&amp;", 5, '&'},   {"&lt;", 4, '<'},    {"&gt;", 4, '>'},
        {"&quot;", 6, '"'},  {"&apos;", 6, '\''},
    };
    for (size_t k = 0; k < sizeof(named) / sizeof(named[0]); k++) {
        if (n >= named[k].len && memcmp(s, named[k].name, (size_t)named[k].len) == 0) {
            *cp = named[k].cp;
            return named[k].len;
        }
    }
    return 0;
}

/* Text from s to the next '<' (or e): every reference understood, no "]]>". Returns the
 * '<' (or e), or NULL to fall back; *amp set if it holds a reference. */
static const unsigned char *
scan_text(const unsigned char *s, const unsigned char *e, int *amp)
{
    *amp = 0;
    while (s < e) {
        if (!(cls[*s] & C_TEXT_STOP)) {
            s++;
            continue;
        }
        unsigned char c = *s;
        if (c == '<')
            return s;
        if (c == '&') {
            uint32_t cp;
            Py_ssize_t len = reference(s, e, &cp);
            if (len == 0)
                return NULL;
            *amp = 1;
            s += len;
            continue;
        }
        if (c == ']' && e - s >= 3 && s[1] == ']' && s[2] == '>')
            return NULL;
        s++;
    }
    return s;
}

/* A span's text with its references decoded into out (room for sp->n bytes); its length. */
static Py_ssize_t
decode_span(const Span *sp, unsigned char *out)
{
    const unsigned char *s = sp->p, *e = sp->p + sp->n;
    if (!sp->amp) {
        if (sp->n)
            memcpy(out, s, (size_t)sp->n);
        return sp->n;
    }
    Py_ssize_t o = 0;
    while (s < e) {
        if (*s != '&') {
            out[o++] = *s++;
            continue;
        }
        uint32_t cp = 0;
        Py_ssize_t len = reference(s, e, &cp); /* checked by scan_text: never 0 */
        s += len;
        /* the UTF-8 of cp is never longer than its reference ("&#9;" is 4 bytes, 1 out) */
        if (cp < 0x80) {
            out[o++] = (unsigned char)cp;
        } else if (cp < 0x800) {
            out[o++] = (unsigned char)(0xC0 | (cp >> 6));
            out[o++] = (unsigned char)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            out[o++] = (unsigned char)(0xE0 | (cp >> 12));
            out[o++] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
            out[o++] = (unsigned char)(0x80 | (cp & 0x3F));
        } else {
            out[o++] = (unsigned char)(0xF0 | (cp >> 18));
            out[o++] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
            out[o++] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
            out[o++] = (unsigned char)(0x80 | (cp & 0x3F));
        }
    }
    return o;
}

/* ------------------------------------------------------------------------------ the scan */

typedef struct {
    const unsigned char *p;
    Py_ssize_t n;
} Name;

/* nm is the string literal lit (its length known at compile time: memcmp inlined). */
#define name_is(nm, lit) \
    ((nm).n == (Py_ssize_t)(sizeof(lit) - 1) && memcmp((nm).p, (lit), sizeof(lit) - 1) == 0)

/* A name at *s: advanced past it; 0 if there is none this parser understands. */
static int
take_name(const unsigned char **s, const unsigned char *e, Name *nm)
{
    const unsigned char *p = *s;
    if (p >= e || !is_name_start(*p))
        return 0;
    const unsigned char *q = p + 1;
    while (q < e && is_name(*q))
        q++;
    if (q < e && *q == ':')
        return 0; /* a prefixed name: namespaces other than the root's default */
    nm->p = p;
    nm->n = q - p;
    *s = q;
    return 1;
}

static const unsigned char *
skip_ws(const unsigned char *s, const unsigned char *e)
{
    while (s < e && is_ws(*s))
        s++;
    return s;
}

/* A quoted attribute value at *s without '<' or '&': its span, *s advanced past it. */
static int
take_quoted(const unsigned char **s, const unsigned char *e, Span *v)
{
    const unsigned char *p = *s;
    if (p >= e || (*p != '"' && *p != '\''))
        return 0;
    unsigned char q = *p++;
    const unsigned char *start = p;
    while (p < e && *p != q) {
        if (*p == '<' || *p == '&')
            return 0;
        p++;
    }
    if (p >= e)
        return 0;
    v->p = start;
    v->n = p - start;
    v->amp = 0;
    *s = p + 1;
    return 1;
}

/* `<?xml version="1.0" [encoding="UTF-8"] [standalone="yes|no"]?>` at the very start. */
static const unsigned char *
xml_decl(const unsigned char *s, const unsigned char *e)
{
    static const char *names[] = {"version", "encoding", "standalone"};
    s += 5;
    int next = 0; /* the pseudo-attributes come in this order, version first */
    for (;;) {
        const unsigned char *t = skip_ws(s, e);
        if (e - t >= 2 && t[0] == '?' && t[1] == '>')
            return next > 0 ? t + 2 : NULL;
        if (t == s)
            return NULL; /* pseudo-attributes are separated by whitespace */
        s = t;
        Name nm;
        if (!take_name(&s, e, &nm))
            return NULL;
        int k = next;
        while (k < 3 && !((size_t)nm.n == strlen(names[k]) &&
                          memcmp(nm.p, names[k], (size_t)nm.n) == 0))
            k++;
        if (k == 3 || (next == 0 && k != 0))
            return NULL;
        s = skip_ws(s, e);
        if (s >= e || *s != '=')
            return NULL;
        s = skip_ws(s + 1, e);
        Span v;
        if (!take_quoted(&s, e, &v))
            return NULL;
        if (k == 0 && !(v.n == 3 && memcmp(v.p, "1.0", 3) == 0))
            return NULL;
        if (k == 1 && !(v.n == 5 && (v.p[0] | 0x20) == 'u' && (v.p[1] | 0x20) == 't' &&
                        (v.p[2] | 0x20) == 'f' && v.p[3] == '-' && v.p[4] == '8'))
            return NULL;
        if (k == 2 && !((v.n == 3 && memcmp(v.p, "yes", 3) == 0) ||
                        (v.n == 2 && memcmp(v.p, "no", 2) == 0)))
            return NULL;
        next = k + 1;
    }
}

static int
span_is(const Span *v, const char *lit)
{
    size_t n = strlen(lit);
    return (size_t)v->n == n && memcmp(v->p, lit, n) == 0;
}

static int
grow(void **arr, Py_ssize_t *cap, Py_ssize_t n, size_t item)
{
    if (n < *cap)
        return OK;
    Py_ssize_t want = *cap ? *cap : 64;
    if (want > PY_SSIZE_T_MAX / 2 / (Py_ssize_t)item)
        return NOMEM;
    want *= 2;
    void *p = PyMem_Realloc(*arr, (size_t)want * item);
    if (p == NULL)
        return NOMEM;
    *arr = p;
    *cap = want;
    return OK;
}

static void
note(Page *pg, const Span *sp)
{
    if (sp->n > pg->longest)
        pg->longest = sp->n;
}

/* The element whose start tag ended at *s, read as a field: plain text then its end tag. */
static int
field(const unsigned char **s, const unsigned char *e, Name nm, int empty, Span *out)
{
    if (empty) {
        out->p = *s;
        out->n = 0;
        out->amp = 0;
        return OK;
    }
    int amp;
    const unsigned char *t = scan_text(*s, e, &amp);
    if (t == NULL || e - t < 2 || t[1] != '/')
        return FALLBACK; /* a child, a comment, CDATA, or the end of the body */
    out->p = *s;
    out->n = t - *s;
    out->amp = amp;
    const unsigned char *q = t + 2;
    Name end;
    if (!take_name(&q, e, &end) || end.n != nm.n || memcmp(end.p, nm.p, (size_t)nm.n) != 0)
        return FALLBACK;
    q = skip_ws(q, e);
    if (q >= e || *q != '>')
        return FALLBACK;
    *s = q + 1;
    return OK;
}

enum { CTX_OTHER, CTX_ROOT, CTX_CONTENTS, CTX_PREFIXES };

static int
scan(const unsigned char *s, const unsigned char *e, Page *pg)
{
    if (check_bytes(s, e - s) != OK)
        return FALLBACK;
    if (e - s >= 6 && memcmp(s, "<?xml", 5) == 0 && is_ws(s[5])) {
        s = xml_decl(s, e);
        if (s == NULL)
            return FALLBACK;
    }
    s = skip_ws(s, e);
    if (e - s < 2 || *s != '<')
        return FALLBACK;
    s++;
    Name root;
    if (!take_name(&s, e, &root) || !name_is(root, "ListBucketResult"))
        return FALLBACK;
    /* at most one attribute: xmlns="..." */
    const unsigned char *t = skip_ws(s, e);
    if (t != s && t < e && is_name_start(*t)) {
        Name a;
        s = t;
        if (!take_name(&s, e, &a) || !name_is(a, "xmlns"))
            return FALLBACK;
        s = skip_ws(s, e);
        if (s >= e || *s != '=')
            return FALLBACK;
        s = skip_ws(s + 1, e);
        Span v;
        /* The reserved namespaces cannot be the default one; a '}' would end ElementTree's
         * "{uri}" early (the reference then rejects the root). */
        if (!take_quoted(&s, e, &v) || memchr(v.p, '}', (size_t)v.n) != NULL ||
            span_is(&v, "http://www.w3.org/XML/1998/namespace") ||
            span_is(&v, "http://www.w3.org/2000/xmlns/"))
            return FALLBACK;
    }
    s = skip_ws(s, e);
    Name stack[MAX_DEPTH];
    int ctx[MAX_DEPTH];
    int depth = 0;
    if (e - s >= 2 && s[0] == '/' && s[1] == '>') {
        s += 2;
    } else if (s < e && *s == '>') {
        s++;
        stack[0] = root;
        ctx[0] = CTX_ROOT;
        depth = 1;
    } else {
        return FALLBACK;
    }
    Entry *cur = NULL;
    while (depth > 0) {
        int amp;
        const unsigned char *lt = scan_text(s, e, &amp);
        if (lt == NULL || lt >= e)
            return FALLBACK;
        s = lt + 1;
        if (s >= e)
            return FALLBACK;
        if (*s == '/') {
            s++;
            Name nm;
            if (!take_name(&s, e, &nm))
                return FALLBACK;
            Name open = stack[depth - 1];
            if (nm.n != open.n || memcmp(nm.p, open.p, (size_t)nm.n) != 0)
                return FALLBACK;
            s = skip_ws(s, e);
            if (s >= e || *s != '>')
                return FALLBACK;
            s++;
            depth--;
            if (depth == 1)
                cur = NULL;
            continue;
        }
        Name nm;
        if (!take_name(&s, e, &nm))
            return FALLBACK; /* "<!" (comment, CDATA, DOCTYPE), "<?", a prefixed name */
        s = skip_ws(s, e);
        int empty = 0;
        if (e - s >= 2 && s[0] == '/' && s[1] == '>') {
            empty = 1;
            s += 2;
        } else if (s < e && *s == '>') {
            s++;
        } else {
            return FALLBACK; /* an attribute */
        }
        int parent = ctx[depth - 1];
        Span *dst = NULL;
        int child = CTX_OTHER;
        if (parent == CTX_ROOT) {
            if (name_is(nm, "Contents")) {
                if (grow((void **)&pg->entries, &pg->cap_entries, pg->n_entries,
                         sizeof(Entry)) != OK)
                    return NOMEM;
                cur = &pg->entries[pg->n_entries++];
                memset(cur, 0, sizeof(*cur));
                cur->key.p = cur->etag.p = cur->lm.p = s;
                child = CTX_CONTENTS;
            } else if (name_is(nm, "CommonPrefixes")) {
                child = CTX_PREFIXES;
            } else if (name_is(nm, "NextContinuationToken")) {
                dst = &pg->token;
                pg->has_token = 1;
            } else if (name_is(nm, "IsTruncated")) {
                dst = &pg->trunc;
            } else if (name_is(nm, "EncodingType")) {
                dst = &pg->enc;
            }
        } else if (parent == CTX_CONTENTS && cur != NULL) {
            if (name_is(nm, "Key")) {
                dst = &cur->key;
            } else if (name_is(nm, "ETag")) {
                dst = &cur->etag;
            } else if (name_is(nm, "LastModified")) {
                dst = &cur->lm;
            } else if (name_is(nm, "Size")) {
                Span sz;
                if (field(&s, e, nm, empty, &sz) != OK || sz.amp || sz.n > SIZE_DIGITS)
                    return FALLBACK;
                long long v = 0;
                for (Py_ssize_t i = 0; i < sz.n; i++) {
                    if (sz.p[i] < '0' || sz.p[i] > '9')
                        return FALLBACK;
                    v = v * 10 + (sz.p[i] - '0');
                }
                cur->size = v;
                continue;
            }
        } else if (parent == CTX_PREFIXES && name_is(nm, "Prefix")) {
            if (grow((void **)&pg->prefixes, &pg->cap_prefixes, pg->n_prefixes, sizeof(Span)) !=
                OK)
                return NOMEM;
            dst = &pg->prefixes[pg->n_prefixes++];
        }
        if (dst != NULL) {
            if (field(&s, e, nm, empty, dst) != OK)
                return FALLBACK;
            note(pg, dst);
            continue;
        }
        if (empty)
            continue;
        if (depth == MAX_DEPTH)
            return FALLBACK;
        stack[depth] = nm;
        ctx[depth] = child;
        depth++;
    }
    s = skip_ws(s, e);
    return s == e ? OK : FALLBACK;
}

/* ------------------------------------------------------------------------ building values */

static int
hexval(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* s3wire._url_decode in place; its new length. */
static Py_ssize_t
url_decode(unsigned char *b, Py_ssize_t n)
{
    Py_ssize_t o = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = b[i];
        if (c == '+') {
            c = ' ';
        } else if (c == '%' && n - i >= 3) {
            int hi = hexval(b[i + 1]), lo = hexval(b[i + 2]);
            if (hi >= 0 && lo >= 0) {
                c = (unsigned char)(hi * 16 + lo);
                i += 2;
            }
        }
        b[o++] = c;
    }
    return o;
}

/* A key or prefix as str; NULL with no exception set: not UTF-8 after decoding (skipped). */
static PyObject *
key_str(const Span *sp, unsigned char *buf, int encoded)
{
    Py_ssize_t n = decode_span(sp, buf);
    if (encoded && (memchr(buf, '%', (size_t)n) || memchr(buf, '+', (size_t)n))) {
        n = url_decode(buf, n);
        PyObject *s = PyUnicode_DecodeUTF8((const char *)buf, n, "strict");
        if (s == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
            PyErr_Clear();
        return s;
    }
    return PyUnicode_DecodeUTF8((const char *)buf, n, "strict");
}

static int
two(const unsigned char *p)
{
    if (p[0] < '0' || p[0] > '9' || p[1] < '0' || p[1] > '9')
        return -1;
    return (p[0] - '0') * 10 + (p[1] - '0');
}

/* Seconds since 1970 of YYYY-MM-DDTHH:MM:SS[.fff]Z (1970-2200), or -1. */
static long long
iso_seconds(const unsigned char *p, Py_ssize_t n)
{
    if (!(n == 20 || (n == 24 && p[19] == '.')) || p[n - 1] != 'Z' || p[4] != '-' ||
        p[7] != '-' || p[10] != 'T' || p[13] != ':' || p[16] != ':')
        return -1;
    int y1 = two(p), y2 = two(p + 2), mo = two(p + 5), d = two(p + 8);
    int h = two(p + 11), mi = two(p + 14), sec = two(p + 17);
    if (y1 < 0 || y2 < 0 || mo < 1 || mo > 12 || d < 1 || h < 0 || h > 23 || mi < 0 ||
        mi > 59 || sec < 0 || sec > 59)
        return -1;
    if (n == 24 && (p[20] < '0' || p[20] > '9' || p[21] < '0' || p[21] > '9' || p[22] < '0' ||
                    p[22] > '9'))
        return -1;
    long long y = y1 * 100 + y2;
    if (y < 1970 || y > 2200)
        return -1;
    static const int mdays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    if (d > mdays[mo - 1] + (mo == 2 && leap))
        return -1;
    /* days from 1970-01-01 (the civil-from-days algorithm, March-based years) */
    long long yy = mo <= 2 ? y - 1 : y;
    long long era = yy / 400;
    long long yoe = yy - era * 400;
    long long doy = (153 * (mo + (mo > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    long long doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    long long days = era * 146097 + doe - 719468;
    return days * 86400 + h * 3600 + mi * 60 + sec;
}

typedef struct {
    PyTypeObject *type;
    PyObject *descr[5]; /* key, size, etag, mtime_ns, metadata */
} Info;

static int
set_slot(PyObject *descr, PyObject *obj, PyObject *value)
{
    int r = Py_TYPE(descr)->tp_descr_set(descr, obj, value);
    Py_DECREF(value);
    return r;
}

/* One ObjectInfo; steals the references to its values. */
static PyObject *
make_info(const Info *info, PyObject *key, PyObject *size, PyObject *etag, PyObject *mtime)
{
    PyObject *meta = NULL, *o = NULL;
    if (key == NULL || size == NULL || etag == NULL || mtime == NULL)
        goto fail;
    meta = PyDict_New();
    if (meta == NULL)
        goto fail;
    o = info->type->tp_alloc(info->type, 0);
    if (o == NULL)
        goto fail;
    PyObject *values[5] = {key, size, etag, mtime, meta};
    int bad = 0;
    for (int i = 0; i < 5; i++)
        bad |= set_slot(info->descr[i], o, values[i]);
    if (bad) {
        Py_DECREF(o);
        return NULL;
    }
    return o;
fail:
    Py_XDECREF(key);
    Py_XDECREF(size);
    Py_XDECREF(etag);
    Py_XDECREF(mtime);
    Py_XDECREF(meta);
    return NULL;
}

/* "true"/"url" as the reference compares: stripped, lowercased; -1: not ASCII (fall back). */
static int
word_is(const Span *sp, unsigned char *buf, const char *word)
{
    Py_ssize_t n = decode_span(sp, buf), a = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (buf[i] >= 0x80)
            return -1;
    while (a < n && (buf[a] == ' ' || buf[a] == '\t' || buf[a] == '\n' || buf[a] == '\r'))
        a++;
    while (n > a &&
           (buf[n - 1] == ' ' || buf[n - 1] == '\t' || buf[n - 1] == '\n' || buf[n - 1] == '\r'))
        n--;
    size_t w = strlen(word);
    if ((size_t)(n - a) != w)
        return 0;
    for (size_t i = 0; i < w; i++) {
        unsigned char c = buf[a + (Py_ssize_t)i];
        if (c >= 'A' && c <= 'Z')
            c = (unsigned char)(c + 32);
        if (c != (unsigned char)word[i])
            return 0;
    }
    return 1;
}

static PyObject *
build(const Page *pg, const Info *info, PyObject *date_ns)
{
    PyObject *objects = NULL, *prefixes = NULL, *token = NULL, *last_mtime = NULL;
    unsigned char *buf = PyMem_Malloc((size_t)pg->longest + 1);
    const unsigned char *last_lm = NULL;
    Py_ssize_t last_lm_n = -1;
    Py_ssize_t skipped = 0;
    if (buf == NULL)
        return PyErr_NoMemory();
    int encoded = 0, truncated = 0;
    if (pg->enc.p != NULL && (encoded = word_is(&pg->enc, buf, "url")) < 0)
        goto fallback;
    if (pg->trunc.p != NULL && (truncated = word_is(&pg->trunc, buf, "true")) < 0)
        goto fallback;
    objects = PyList_New(0);
    prefixes = PyList_New(0);
    if (objects == NULL || prefixes == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < pg->n_entries; i++) {
        const Entry *en = &pg->entries[i];
        PyObject *key = key_str(&en->key, buf, encoded);
        if (key == NULL) {
            if (PyErr_Occurred())
                goto fail;
            skipped++;
            continue;
        }
        PyObject *mtime;
        if (last_mtime != NULL && en->lm.n == last_lm_n && !en->lm.amp &&
            memcmp(en->lm.p, last_lm, (size_t)last_lm_n) == 0) {
            mtime = Py_NewRef(last_mtime);
        } else {
            Py_ssize_t n = decode_span(&en->lm, buf);
            long long secs = n == 0 ? 0 : iso_seconds(buf, n);
            if (secs >= 0)
                mtime = PyLong_FromLongLong(secs * 1000000000LL);
            else
                mtime = PyObject_CallFunction(date_ns, "s#", (const char *)buf, n);
            if (mtime != NULL && !en->lm.amp) {
                Py_XSETREF(last_mtime, Py_NewRef(mtime));
                last_lm = en->lm.p;
                last_lm_n = en->lm.n;
            }
        }
        Py_ssize_t n = decode_span(&en->etag, buf);
        unsigned char *et = buf;
        if (n >= 2 && et[0] == '"' && et[n - 1] == '"') {
            et++;
            n -= 2;
        } else {
            while (n > 0 && et[0] == '"') {
                et++;
                n--;
            }
            while (n > 0 && et[n - 1] == '"')
                n--;
        }
        PyObject *etag = PyUnicode_DecodeUTF8((const char *)et, n, "strict");
        PyObject *o = make_info(info, key, PyLong_FromLongLong(en->size), etag, mtime);
        if (o == NULL)
            goto fail;
        int r = PyList_Append(objects, o);
        Py_DECREF(o);
        if (r < 0)
            goto fail;
    }
    for (Py_ssize_t i = 0; i < pg->n_prefixes; i++) {
        PyObject *p = key_str(&pg->prefixes[i], buf, encoded);
        if (p == NULL) {
            if (PyErr_Occurred())
                goto fail;
            skipped++;
            continue;
        }
        int r = PyList_Append(prefixes, p);
        Py_DECREF(p);
        if (r < 0)
            goto fail;
    }
    if (pg->has_token && pg->token.n > 0) {
        Py_ssize_t n = decode_span(&pg->token, buf);
        token = PyUnicode_DecodeUTF8((const char *)buf, n, "strict");
        if (token == NULL)
            goto fail;
    } else {
        token = Py_NewRef(Py_None);
    }
    PyMem_Free(buf);
    Py_XDECREF(last_mtime);
    return Py_BuildValue("(NNNOn)", objects, prefixes, token, truncated ? Py_True : Py_False,
                         skipped);
fallback:
    PyMem_Free(buf);
    Py_RETURN_NONE;
fail:
    PyMem_Free(buf);
    Py_XDECREF(objects);
    Py_XDECREF(prefixes);
    Py_XDECREF(last_mtime);
    return NULL;
}

static const char *const FIELDS[5] = {"key", "size", "etag", "mtime_ns", "metadata"};

static PyObject *
py_parse(PyObject *Py_UNUSED(module), PyObject *args)
{
    Py_buffer body;
    PyObject *type, *date_ns;
    if (!PyArg_ParseTuple(args, "y*O!O:parse", &body, &PyType_Type, &type, &date_ns))
        return NULL;
    Info info = {(PyTypeObject *)type, {NULL, NULL, NULL, NULL, NULL}};
    Page pg;
    memset(&pg, 0, sizeof(pg));
    PyObject *out = NULL;
    for (int i = 0; i < 5; i++) {
        info.descr[i] = PyObject_GetAttrString(type, FIELDS[i]);
        if (info.descr[i] == NULL)
            goto done;
        if (!Py_IS_TYPE(info.descr[i], &PyMemberDescr_Type)) {
            PyErr_Format(PyExc_TypeError, "%R.%s is not a slot", type, FIELDS[i]);
            goto done;
        }
    }
    const unsigned char *s = body.buf;
    int r = scan(s, s + body.len, &pg);
    if (r == NOMEM)
        PyErr_NoMemory();
    else if (r == FALLBACK)
        out = Py_NewRef(Py_None);
    else
        out = build(&pg, &info, date_ns);
done:
    for (int i = 0; i < 5; i++)
        Py_XDECREF(info.descr[i]);
    PyMem_Free(pg.entries);
    PyMem_Free(pg.prefixes);
    PyBuffer_Release(&body);
    return out;
}

static PyMethodDef module_methods[] = {
    {"parse", py_parse, METH_VARARGS,
     PyDoc_STR("parse(body, info_type, date_ns): (objects, prefixes, token, truncated, "
               "skipped) of a ListObjectsV2 page, or None: parse it with ElementTree.")},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef s3list_module = {
    PyModuleDef_HEAD_INIT,
    "gateway._s3list",
    PyDoc_STR("ListObjectsV2 pages in C: the twin of gateway.backend.s3wire.parse_list."),
    -1,
    module_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__s3list(void)
{
    init_classes();
    return PyModule_Create(&s3list_module);
}
