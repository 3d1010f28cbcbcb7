/* gateway._checksums: the CRCs S3 stores (CRC32, CRC32C, CRC64NVME) in C, the compiled twin
 * of the pure-Python reference in gateway/backend/checksums.py (which also says how they are
 * chosen and used).
 *
 * Owns: crc32(data, crc=0), crc32c(data, crc=0) and crc64nvme(data, crc=0), each the same
 * value as its twin for the same bytes (zlib.crc32's convention: crc is a previous result, so
 * crc64nvme(b, crc64nvme(a)) == crc64nvme(a + b)). Must not: import anything from the
 * project, or read a byte outside the buffer it was given.
 *
 * All three are reflected CRCs with init and xorout all ones (CRC-32/ISO-HDLC, CRC-32/ISCSI,
 * CRC-64/NVME in the CRC catalogue). One generic engine serves them, set up at import from
 * the reflected polynomial alone:
 *
 *   - portable: slicing-by-8 tables (8 x 256 entries, built at import), ~1 byte a cycle;
 *     NFSGW_CHECKSUMS_NO_CLMUL=1 forces them, NFSGW_CHECKSUMS_NO_AVX512=1 the 128-bit loop
 *     (the tests run every engine); ``engines`` names the ones this CPU can run, best first,
 *     ``engine`` the one in use, and ``use_engine(name)`` switches to another of them (the
 *     start-up self-check, ``checksums.self_check``, falls back with it on a mismatch);
 *   - x86-64 with PCLMULQDQ (checked at run time with cpuid): carry-less multiplication
 *     folding, four 16-byte lanes at a time (Intel, "Fast CRC Computation for Generic
 *     Polynomials Using PCLMULQDQ Instruction", 2009), ~7x the tables; with AVX-512 and
 *     VPCLMULQDQ the same folds four lanes an instruction, eight 64-byte registers at a time,
 *     ~18x (110 kB: tables ~56 µs, PCLMULQDQ ~8 µs, VPCLMULQDQ ~3 µs on the reference
 *     machine). A lane X of 128 bits that lies d bits before another is folded into it as
 *     X_hi * (x^(64+d-1) mod P) + X_lo * (x^(d-1) mod P) (the -1: a carry-less product of two
 *     reflected 64-bit words comes out shifted by one bit); what is left after the last lane
 *     is run through the tables (16 bytes and the tail), so no Barrett reduction is needed
 *     and every constant is computed at import from P, none written out by hand.
 *
 * Arguments are taken through the buffer protocol as one contiguous run of bytes (bytes,
 * bytearray, a contiguous memoryview); the GIL is released for buffers of RELEASE_GIL bytes
 * and more.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_CLMUL 1
#include <immintrin.h>
#else
#define HAVE_CLMUL 0
#endif

/* Below this the GIL hand-off costs more than the CRC (~0.1 µs against ~1 µs with CLMUL). */
#define RELEASE_GIL 32768
/* Below this the table loop is as fast as setting up the lanes. */
#define CLMUL_MIN 128
/* Below this the 128-bit loop is as fast (and AVX-512 may lower the clock for no gain). */
#define VCLMUL_MIN 1024
/* 512-bit registers folded side by side in the AVX-512 loop. */
#define V 8

typedef struct {
    const char *name;
    int width;                /* 32 or 64 */
    uint64_t poly;            /* reflected */
    uint64_t table[8][256];   /* slicing-by-8 */
#if HAVE_CLMUL
    __m128i k_lanes;          /* fold a lane forward by LANES lanes */
    __m128i k128;             /* fold 1 lane forward by 128 bits */
    __m128i k512;             /* fold 4 lanes (one 512-bit register) forward by 512 bits */
    __m128i k_vround;         /* fold a 512-bit register forward by V registers */
#endif
} Crc;

static Crc crc32_ieee = {.name = "crc32", .width = 32, .poly = 0xEDB88320u};
static Crc crc32_c = {.name = "crc32c", .width = 32, .poly = 0x82F63B78u};
static Crc crc64_nvme = {.name = "crc64nvme", .width = 64, .poly = 0x9A6C9329AC4BC9B5ull};
static int use_clmul, use_vclmul;
static int cpu_clmul, cpu_vclmul; /* what the CPU can run, whatever the environment says */

/* ---------------------------------------------------------------------------- the tables */

static inline uint64_t
le64(const uint8_t *p)
{
    return (uint64_t)p[0] | ((uint64_t)p[1] << 8) | ((uint64_t)p[2] << 16) |
           ((uint64_t)p[3] << 24) | ((uint64_t)p[4] << 32) | ((uint64_t)p[5] << 40) |
           ((uint64_t)p[6] << 48) | ((uint64_t)p[7] << 56);
}

static void
build_tables(Crc *c)
{
    for (unsigned i = 0; i < 256; i++) {
        uint64_t r = i;
        for (int k = 0; k < 8; k++)
            r = (r & 1) ? (r >> 1) ^ c->poly : r >> 1;
        c->table[0][i] = r;
    }
    for (unsigned i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++) {
            uint64_t prev = c->table[t - 1][i];
            c->table[t][i] = (prev >> 8) ^ c->table[0][prev & 0xFF];
        }
}

/* The raw register (no init, no xorout) after `n` bytes. For width 32 the register's upper
 * half stays zero: every table entry is below 2^32. */
static uint64_t
crc_tables(const Crc *c, uint64_t r, const uint8_t *p, size_t n)
{
    const uint64_t(*t)[256] = c->table;
    if (c->width == 64) {
        for (; n >= 8; n -= 8, p += 8) {
            r ^= le64(p);
            r = t[7][r & 0xFF] ^ t[6][(r >> 8) & 0xFF] ^ t[5][(r >> 16) & 0xFF] ^
                t[4][(r >> 24) & 0xFF] ^ t[3][(r >> 32) & 0xFF] ^ t[2][(r >> 40) & 0xFF] ^
                t[1][(r >> 48) & 0xFF] ^ t[0][r >> 56];
        }
    } else {
        for (; n >= 8; n -= 8, p += 8) {
            uint64_t w = le64(p) ^ r;
            r = t[7][w & 0xFF] ^ t[6][(w >> 8) & 0xFF] ^ t[5][(w >> 16) & 0xFF] ^
                t[4][(w >> 24) & 0xFF] ^ t[3][(w >> 32) & 0xFF] ^ t[2][(w >> 40) & 0xFF] ^
                t[1][(w >> 48) & 0xFF] ^ t[0][w >> 56];
        }
    }
    for (; n; n--, p++)
        r = (r >> 8) ^ t[0][(r ^ *p) & 0xFF];
    return r;
}

/* -------------------------------------------------------------------------------- CLMUL */

#if HAVE_CLMUL

/* x^e mod P, P of degree `width` in the ordinary (unreflected) bit order. */
static uint64_t
xpow_mod(const Crc *c, unsigned e)
{
    uint64_t p = 0;
    for (int i = 0; i < c->width; i++) /* unreflect the polynomial, without x^width */
        if (c->poly & ((uint64_t)1 << i))
            p |= (uint64_t)1 << (c->width - 1 - i);
    uint64_t top = (uint64_t)1 << (c->width - 1), r = 1;
    for (unsigned k = 0; k < e; k++) {
        int carry = (r & top) != 0;
        r <<= 1;
        if (c->width < 64)
            r &= ((uint64_t)1 << c->width) - 1;
        if (carry)
            r ^= p;
    }
    return r;
}

/* `k` (degree < 64) as a reflected 64-bit word: the coefficient of x^i at bit 63 - i. */
static uint64_t
reflect64(uint64_t k)
{
    uint64_t out = 0;
    for (int i = 0; i < 64; i++)
        if (k & ((uint64_t)1 << i))
            out |= (uint64_t)1 << (63 - i);
    return out;
}

static __m128i
fold_constants(const Crc *c, unsigned d)
{
    uint64_t hi = reflect64(xpow_mod(c, 64 + d - 1)), lo = reflect64(xpow_mod(c, d - 1));
    return _mm_set_epi64x((long long)lo, (long long)hi);
}

__attribute__((target("pclmul,sse4.1"))) static inline __m128i
fold(__m128i x, __m128i k)
{
    return _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11));
}

#define LANES 4

/* The raw register after the whole 16-byte lanes of `n` (>= 16 * LANES) bytes; sets *done.
 * Four lanes keep the multiplier busy: eight measured the same (8.0 µs per 110 kB), bound by
 * PCLMULQDQ's throughput of one product a cycle; going faster takes VPCLMULQDQ (AVX-512),
 * four products an instruction. */
__attribute__((target("pclmul,sse4.1"))) static uint64_t
crc_clmul(const Crc *c, uint64_t r, const uint8_t *p, size_t n, size_t *done)
{
    const uint8_t *start = p;
    __m128i x[LANES];
    for (int i = 0; i < LANES; i++)
        x[i] = _mm_loadu_si128((const __m128i *)(const void *)(p + 16 * i));
    x[0] = _mm_xor_si128(x[0], _mm_cvtsi64_si128((long long)r));
    p += 16 * LANES;
    n -= 16 * LANES;
    for (; n >= 16 * LANES; n -= 16 * LANES, p += 16 * LANES)
        for (int i = 0; i < LANES; i++)
            x[i] = _mm_xor_si128(fold(x[i], c->k_lanes),
                                 _mm_loadu_si128((const __m128i *)(const void *)(p + 16 * i)));
    for (int i = 1; i < LANES; i++)
        x[i] = _mm_xor_si128(x[i], fold(x[i - 1], c->k128));
    __m128i y = x[LANES - 1];
    for (; n >= 16; n -= 16, p += 16)
        y = _mm_xor_si128(fold(y, c->k128), _mm_loadu_si128((const __m128i *)(const void *)p));
    uint8_t last[16];
    _mm_storeu_si128((__m128i *)(void *)last, y);
    *done = (size_t)(p - start);
    return crc_tables(c, 0, last, sizeof last);
}

/* The same with VPCLMULQDQ (AVX-512): four 128-bit lanes a register, V registers, 64 * V
 * bytes a round; four products an instruction. `n` >= 64 * V; what is left after the whole
 * 64-byte blocks goes through the 16-byte folds. */

__attribute__((target("avx512f,vpclmulqdq,pclmul,sse4.1"))) static inline __m512i
vfold(__m512i x, __m512i k, __m512i next)
{
    return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x, k, 0x00),
                                     _mm512_clmulepi64_epi128(x, k, 0x11), next, 0x96);
}

__attribute__((target("avx512f,vpclmulqdq,pclmul,sse4.1"))) static uint64_t
crc_vclmul(const Crc *c, uint64_t r, const uint8_t *p, size_t n, size_t *done)
{
    const uint8_t *start = p;
    __m512i kv = _mm512_broadcast_i32x4(c->k_vround), k512 = _mm512_broadcast_i32x4(c->k512);
    __m512i z[V];
    for (int i = 0; i < V; i++)
        z[i] = _mm512_loadu_si512((const void *)(p + 64 * i));
    z[0] = _mm512_xor_si512(z[0], _mm512_zextsi128_si512(_mm_cvtsi64_si128((long long)r)));
    p += 64 * V;
    n -= 64 * V;
    for (; n >= 64 * V; n -= 64 * V, p += 64 * V)
        for (int i = 0; i < V; i++)
            z[i] = vfold(z[i], kv, _mm512_loadu_si512((const void *)(p + 64 * i)));
    for (int i = 1; i < V; i++)
        z[i] = vfold(z[i - 1], k512, z[i]);
    __m512i y = z[V - 1];
    for (; n >= 64; n -= 64, p += 64)
        y = vfold(y, k512, _mm512_loadu_si512((const void *)p));
    __m128i x = _mm512_extracti32x4_epi32(y, 0);
    x = _mm_xor_si128(_mm512_extracti32x4_epi32(y, 1), fold(x, c->k128));
    x = _mm_xor_si128(_mm512_extracti32x4_epi32(y, 2), fold(x, c->k128));
    x = _mm_xor_si128(_mm512_extracti32x4_epi32(y, 3), fold(x, c->k128));
    for (; n >= 16; n -= 16, p += 16)
        x = _mm_xor_si128(fold(x, c->k128), _mm_loadu_si128((const __m128i *)(const void *)p));
    uint8_t last[16];
    _mm_storeu_si128((__m128i *)(void *)last, x);
    *done = (size_t)(p - start);
    return crc_tables(c, 0, last, sizeof last);
}

#endif

static uint64_t
crc_update(const Crc *c, uint64_t crc, const uint8_t *p, size_t n)
{
    uint64_t ones = c->width == 64 ? ~(uint64_t)0 : 0xFFFFFFFFu;
    uint64_t r = crc ^ ones;
#if HAVE_CLMUL
    if (use_clmul && n >= CLMUL_MIN) {
        size_t done = 0;
        r = use_vclmul && n >= VCLMUL_MIN ? crc_vclmul(c, r, p, n, &done)
                                          : crc_clmul(c, r, p, n, &done);
        p += done;
        n -= done;
    }
#endif
    return crc_tables(c, r, p, n) ^ ones;
}

/* ---------------------------------------------------------------------------- the module */

static PyObject *
crc_call(const Crc *c, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"data", "crc", NULL};
    Py_buffer view;
    PyObject *start = NULL;
    char format[32];
    PyOS_snprintf(format, sizeof format, "y*|O:%s", c->name);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, format, kwlist, &view, &start))
        return NULL;
    uint64_t crc = 0;
    if (start != NULL) {
        unsigned long long v = 0;
        if (!PyLong_Check(start)) {
            PyErr_Format(PyExc_TypeError, "%s() crc must be an int", c->name);
            goto fail;
        }
        v = PyLong_AsUnsignedLongLong(start);
        if (v == (unsigned long long)-1 && PyErr_Occurred())
            PyErr_Clear();
        else if (c->width == 64 || v <= 0xFFFFFFFFull)
            goto valid;
        PyErr_Format(PyExc_ValueError, "%s() crc must be in [0, 2**%d)", c->name, c->width);
        goto fail;
    valid:
        crc = v;
    }
    const uint8_t *p = view.buf;
    size_t n = (size_t)view.len;
    if (n >= RELEASE_GIL) {
        Py_BEGIN_ALLOW_THREADS
        crc = crc_update(c, crc, p, n);
        Py_END_ALLOW_THREADS
    } else {
        crc = crc_update(c, crc, p, n);
    }
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLongLong(crc);
fail:
    PyBuffer_Release(&view);
    return NULL;
}

static PyObject *
py_crc32(PyObject *Py_UNUSED(m), PyObject *args, PyObject *kwargs)
{
    return crc_call(&crc32_ieee, args, kwargs);
}

static PyObject *
py_crc32c(PyObject *Py_UNUSED(m), PyObject *args, PyObject *kwargs)
{
    return crc_call(&crc32_c, args, kwargs);
}

static PyObject *
py_crc64nvme(PyObject *Py_UNUSED(m), PyObject *args, PyObject *kwargs)
{
    return crc_call(&crc64_nvme, args, kwargs);
}

/* use_engine(name): compute with `name` ("vpclmulqdq", "pclmul" or "tables") from now on;
 * ValueError for one this CPU cannot run. Sets the module's `engine`. */
static PyObject *
py_use_engine(PyObject *m, PyObject *arg)
{
    const char *name = PyUnicode_Check(arg) ? PyUnicode_AsUTF8(arg) : NULL;
    if (name == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "use_engine() takes an engine name (str)");
        return NULL;
    }
    int clmul, vclmul;
    if (strcmp(name, "tables") == 0) {
        clmul = vclmul = 0;
    } else if (strcmp(name, "pclmul") == 0 && cpu_clmul) {
        clmul = 1;
        vclmul = 0;
    } else if (strcmp(name, "vpclmulqdq") == 0 && cpu_vclmul) {
        clmul = vclmul = 1;
    } else {
        PyErr_Format(PyExc_ValueError, "engine %R is not one this CPU runs", arg);
        return NULL;
    }
    if (PyObject_SetAttrString(m, "engine", arg) < 0)
        return NULL;
    use_clmul = clmul;
    use_vclmul = vclmul;
    Py_RETURN_NONE;
}

#define KWCALL(f) (PyCFunction)(void (*)(void))(f), METH_VARARGS | METH_KEYWORDS

static PyMethodDef module_methods[] = {
    {"crc32", KWCALL(py_crc32),
     PyDoc_STR("crc32(data, crc=0): CRC-32 (zlib's), continuing from crc.")},
    {"crc32c", KWCALL(py_crc32c),
     PyDoc_STR("crc32c(data, crc=0): CRC-32C (Castagnoli), continuing from crc.")},
    {"crc64nvme", KWCALL(py_crc64nvme),
     PyDoc_STR("crc64nvme(data, crc=0): CRC-64/NVME, continuing from crc.")},
    {"use_engine", py_use_engine, METH_O,
     PyDoc_STR("use_engine(name): compute with this engine (one of `engines`) from now on.")},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef checksums_module = {
    PyModuleDef_HEAD_INIT,
    "gateway._checksums",
    PyDoc_STR("CRC32, CRC32C and CRC64NVME in C: the twin of gateway.backend.checksums."),
    -1,
    module_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

static void
setup(Crc *c)
{
    build_tables(c);
#if HAVE_CLMUL
    c->k_lanes = fold_constants(c, 128 * LANES);
    c->k128 = fold_constants(c, 128);
    c->k512 = fold_constants(c, 512);
    c->k_vround = fold_constants(c, 512 * V);
#endif
}

PyMODINIT_FUNC
PyInit__checksums(void)
{
#if HAVE_CLMUL
    __builtin_cpu_init();
    cpu_clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
    cpu_vclmul = cpu_clmul && __builtin_cpu_supports("avx512f") &&
                 __builtin_cpu_supports("vpclmulqdq");
    use_clmul = cpu_clmul && getenv("NFSGW_CHECKSUMS_NO_CLMUL") == NULL;
    use_vclmul = use_clmul && cpu_vclmul && getenv("NFSGW_CHECKSUMS_NO_AVX512") == NULL;
#endif
    setup(&crc32_ieee);
    setup(&crc32_c);
    setup(&crc64_nvme);
    PyObject *m = PyModule_Create(&checksums_module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddStringConstant(
            m, "engine", use_vclmul ? "vpclmulqdq" : use_clmul ? "pclmul" : "tables") < 0) {
        Py_DECREF(m);
        return NULL;
    }
    PyObject *engines = cpu_vclmul  ? Py_BuildValue("(sss)", "vpclmulqdq", "pclmul", "tables")
                        : cpu_clmul ? Py_BuildValue("(ss)", "pclmul", "tables")
                                    : Py_BuildValue("(s)", "tables");
    if (engines == NULL || PyModule_AddObject(m, "engines", engines) < 0) {
        Py_XDECREF(engines);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
