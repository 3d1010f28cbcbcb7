/* _get_floor_engine: a GET engine in C on its own thread, a measurement probe for
 * benchmarks/get_floor.py (issue 25), not product code.
 *
 * One engine thread owns N connected keep-alive sockets (made non-blocking by the caller) and
 * sends the same pre-built request (pre-signed by the caller) on them: no TLS, no signing, no
 * retries, HTTP/1.1 with Content-Length bodies only, one request per connection at a time.
 * Nothing of Python runs on that thread. Each connection has a preallocated buffer; the head and
 * the body are received into it (recv as far as the body's end, never beyond).
 *
 * The asyncio loop submits a GET (an id) into a single-producer ring and writes the engine's
 * eventfd only when the engine sleeps in epoll_wait. Completions (id, body length) go into a
 * second ring; the engine writes the loop's eventfd (which the loop watches with add_reader)
 *   - batch mode: once per epoll round, and only if the loop has drained the ring since the
 *     last notification ("armed");
 *   - per-GET mode: after every completion.
 * Any error (connection closed, status other than 200, no Content-Length, a head or body
 * larger than the buffer, bytes after the body) stops the engine: eng_drain returns -1 and
 * eng_error says why.
 *
 * Built by get_floor.py at run time: cc -O2 -Wall -Wextra -Werror -shared -fPIC -pthread.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define RING 4096u /* entries per ring, a power of two */
#define SUBMIT_TAG UINT32_MAX

typedef struct {
    int fd;
    int64_t id; /* -1: idle */
    size_t got; /* bytes in buf */
    size_t body; /* offset of the body once the head is complete, else 0 */
    size_t total; /* body + Content-Length */
    char *buf;
} conn_t;

typedef struct eng {
    char *req;
    size_t reqlen, bufsize;
    int nconn, epfd, submit_fd, notify_fd, per_get;
    conn_t *conns;
    pthread_t thread;
    /* Python -> engine: ids of GETs to send */
    _Atomic uint32_t sub_head, sub_tail;
    int64_t sub[RING];
    _Atomic int sleeping;
    /* engine -> Python: (id, body length) pairs */
    _Atomic uint32_t done_head, done_tail;
    int64_t done[2 * RING];
    _Atomic int armed;
    _Atomic int stop, failed;
    char error[256];
    _Atomic int64_t repeat_left; /* > 0: a completed GET is sent again at once, not handed off */
    uint64_t notifies; /* eventfd writes by the engine */
} eng_t;

static void fail(eng_t *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void fail(eng_t *e, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->error, sizeof e->error, fmt, ap);
    va_end(ap);
    atomic_store(&e->failed, 1);
    uint64_t one = 1;
    if (write(e->notify_fd, &one, sizeof one) < 0) {
        /* the loop also finds `failed` at its next drain */
    }
}

static int send_request(eng_t *e, conn_t *c) {
    ssize_t k = send(c->fd, e->req, e->reqlen, MSG_NOSIGNAL);
    if (k != (ssize_t)e->reqlen) {
        /* the socket's buffer is empty between GETs: a short send is not expected */
        fail(e, "send: %s", k < 0 ? strerror(errno) : "short send");
        return -1;
    }
    return 0;
}

/* Take submitted ids onto idle connections. */
static int assign(eng_t *e) {
    uint32_t tail = atomic_load_explicit(&e->sub_tail, memory_order_relaxed);
    uint32_t head = atomic_load_explicit(&e->sub_head, memory_order_acquire);
    for (int i = 0; i < e->nconn && tail != head; i++) {
        conn_t *c = &e->conns[i];
        if (c->id >= 0)
            continue;
        c->id = e->sub[tail & (RING - 1)];
        tail++;
        if (send_request(e, c) < 0)
            return -1;
    }
    atomic_store_explicit(&e->sub_tail, tail, memory_order_release);
    return 0;
}

static int has_idle(eng_t *e) {
    for (int i = 0; i < e->nconn; i++)
        if (e->conns[i].id < 0)
            return 1;
    return 0;
}

static void notify(eng_t *e) {
    uint64_t one = 1;
    e->notifies++;
    if (write(e->notify_fd, &one, sizeof one) < 0)
        fail(e, "eventfd write: %s", strerror(errno));
}

static void complete(eng_t *e, conn_t *c) {
    if (atomic_load_explicit(&e->repeat_left, memory_order_relaxed) > 0) {
        atomic_fetch_sub_explicit(&e->repeat_left, 1, memory_order_relaxed);
        c->got = c->body = c->total = 0;
        send_request(e, c);
        return;
    }
    uint32_t head = atomic_load_explicit(&e->done_head, memory_order_relaxed);
    /* at most one GET per connection and RING > connections: the ring cannot be full
       unless the loop stopped draining; then stop too */
    if (head - atomic_load_explicit(&e->done_tail, memory_order_acquire) >= RING) {
        fail(e, "completion ring full");
        return;
    }
    e->done[2 * (head & (RING - 1))] = c->id;
    e->done[2 * (head & (RING - 1)) + 1] = (int64_t)(c->total - c->body);
    atomic_store_explicit(&e->done_head, head + 1, memory_order_release);
    c->id = -1;
    c->got = c->body = c->total = 0;
    if (e->per_get)
        notify(e);
}

/* Parse the head in c->buf[0, end): status 200 and Content-Length. */
static int parse_head(eng_t *e, conn_t *c, size_t end) {
    const char *b = c->buf;
    if (end < 12 || memcmp(b, "HTTP/1.1 200", 12) != 0) {
        size_t n = 0;
        while (n < end && n < 80 && b[n] != '\r')
            n++;
        fail(e, "response: %.*s", (int)n, b);
        return -1;
    }
    long long length = -1;
    for (size_t i = 0; i + 17 < end; i++) {
        if (b[i] != '\r' || b[i + 1] != '\n')
            continue;
        if (strncasecmp(b + i + 2, "transfer-encoding:", 18) == 0) {
            fail(e, "Transfer-Encoding in the response: only Content-Length bodies here");
            return -1;
        }
        if (strncasecmp(b + i + 2, "content-length:", 15) == 0) {
            size_t j = i + 17;
            while (j < end && (b[j] == ' ' || b[j] == '\t'))
                j++;
            length = 0;
            if (j >= end || b[j] < '0' || b[j] > '9') {
                fail(e, "malformed Content-Length");
                return -1;
            }
            while (j < end && b[j] >= '0' && b[j] <= '9' && length < (1LL << 40))
                length = length * 10 + (b[j++] - '0');
        }
    }
    if (length < 0) {
        fail(e, "no Content-Length in the response");
        return -1;
    }
    c->body = end + 4;
    c->total = c->body + (size_t)length;
    if (c->total > e->bufsize) {
        fail(e, "response of %zu bytes > the %zu-byte buffer", c->total, e->bufsize);
        return -1;
    }
    if (c->got > c->total) {
        fail(e, "%zu bytes after the body (nothing was asked for)", c->got - c->total);
        return -1;
    }
    return 0;
}

/* Receive what has arrived on c; complete the GET when its body is in. */
static int on_readable(eng_t *e, conn_t *c) {
    for (;;) {
        size_t want = c->body ? c->total - c->got : e->bufsize - c->got;
        if (c->id < 0) {
            char x;
            ssize_t k = recv(c->fd, &x, 1, MSG_DONTWAIT);
            if (k == 0)
                fail(e, "idle connection closed by the server");
            else if (k > 0)
                fail(e, "bytes on an idle connection");
            else if (errno == EAGAIN)
                return 0;
            else
                fail(e, "recv: %s", strerror(errno));
            return -1;
        }
        if (c->body && want == 0) {
            complete(e, c);
            return 0;
        }
        ssize_t k = recv(c->fd, c->buf + c->got, want, 0);
        if (k < 0) {
            if (errno == EAGAIN)
                return 0;
            if (errno == EINTR)
                continue;
            fail(e, "recv: %s", strerror(errno));
            return -1;
        }
        if (k == 0) {
            fail(e, "connection closed by the server mid-response");
            return -1;
        }
        size_t from = c->got >= 3 ? c->got - 3 : 0;
        c->got += (size_t)k;
        if (!c->body) {
            const char *end = memmem(c->buf + from, c->got - from, "\r\n\r\n", 4);
            if (!end) {
                if (c->got == e->bufsize) {
                    fail(e, "head larger than the buffer");
                    return -1;
                }
                continue;
            }
            if (parse_head(e, c, (size_t)(end - c->buf)) < 0)
                return -1;
        }
        if (c->got == c->total) {
            complete(e, c);
            return 0;
        }
    }
}

static void *run(void *arg) {
    eng_t *e = arg;
    struct epoll_event evs[64];
    while (!atomic_load(&e->stop) && !atomic_load(&e->failed)) {
        if (assign(e) < 0)
            break;
        atomic_store(&e->sleeping, 1);
        if (has_idle(e) && atomic_load(&e->sub_head) != atomic_load(&e->sub_tail)) {
            atomic_store(&e->sleeping, 0);
            continue;
        }
        int n = epoll_wait(e->epfd, evs, 64, -1);
        atomic_store(&e->sleeping, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            fail(e, "epoll_wait: %s", strerror(errno));
            break;
        }
        uint32_t before = atomic_load_explicit(&e->done_head, memory_order_relaxed);
        for (int i = 0; i < n; i++) {
            if (evs[i].data.u32 == SUBMIT_TAG) {
                uint64_t v;
                if (read(e->submit_fd, &v, sizeof v) < 0 && errno != EAGAIN) {
                    fail(e, "eventfd read: %s", strerror(errno));
                    break;
                }
                continue;
            }
            conn_t *c = &e->conns[evs[i].data.u32];
            if (evs[i].events & (EPOLLERR | EPOLLHUP) && c->id < 0) {
                fail(e, "connection %u: error or hang-up", evs[i].data.u32);
                break;
            }
            if (on_readable(e, c) < 0)
                break;
        }
        if (!e->per_get && atomic_load_explicit(&e->done_head, memory_order_relaxed) != before &&
            atomic_exchange(&e->armed, 0))
            notify(e);
    }
    return NULL;
}

/* fds: connected sockets, made non-blocking by the caller; req is copied. NULL on error. */
eng_t *eng_start(const int *fds, int nconn, const char *req, size_t reqlen, size_t bufsize,
                 int per_get) {
    eng_t *e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    e->req = malloc(reqlen);
    e->conns = calloc((size_t)nconn, sizeof *e->conns);
    e->reqlen = reqlen;
    e->bufsize = bufsize;
    e->nconn = nconn;
    e->per_get = per_get;
    e->epfd = epoll_create1(EPOLL_CLOEXEC);
    e->submit_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    e->notify_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    atomic_store(&e->armed, 1);
    if (!e->req || !e->conns || e->epfd < 0 || e->submit_fd < 0 || e->notify_fd < 0)
        goto error;
    memcpy(e->req, req, reqlen);
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = SUBMIT_TAG};
    if (epoll_ctl(e->epfd, EPOLL_CTL_ADD, e->submit_fd, &ev) < 0)
        goto error;
    for (int i = 0; i < nconn; i++) {
        conn_t *c = &e->conns[i];
        c->fd = fds[i];
        c->id = -1;
        c->buf = malloc(bufsize);
        if (!c->buf)
            goto error;
        memset(c->buf, 0, bufsize); /* fault the pages in before measuring */
        ev.data.u32 = (uint32_t)i;
        if (epoll_ctl(e->epfd, EPOLL_CTL_ADD, c->fd, &ev) < 0)
            goto error;
    }
    if (pthread_create(&e->thread, NULL, run, e) != 0)
        goto error;
    return e;
error:
    if (e->conns)
        for (int i = 0; i < nconn; i++)
            free(e->conns[i].buf);
    free(e->conns);
    free(e->req);
    if (e->epfd >= 0)
        close(e->epfd);
    if (e->submit_fd >= 0)
        close(e->submit_fd);
    if (e->notify_fd >= 0)
        close(e->notify_fd);
    free(e);
    return NULL;
}

int eng_notify_fd(eng_t *e) { return e->notify_fd; }

/* Queue one GET; wakes the engine only if it sleeps. 0, or -1 if the ring is full. */
int eng_submit(eng_t *e, int64_t id) {
    uint32_t head = atomic_load_explicit(&e->sub_head, memory_order_relaxed);
    if (head - atomic_load_explicit(&e->sub_tail, memory_order_acquire) >= RING)
        return -1;
    e->sub[head & (RING - 1)] = id;
    atomic_store(&e->sub_head, head + 1);
    if (atomic_exchange(&e->sleeping, 0)) {
        uint64_t one = 1;
        if (write(e->submit_fd, &one, sizeof one) < 0)
            return -1;
    }
    return 0;
}

/* Up to max completions into out (id, length pairs); re-arms the notification once the ring
   is found empty. Returns the count, or -1 when the engine has failed (see eng_error). */
int eng_drain(eng_t *e, int64_t *out, int max) {
    uint64_t v;
    if (atomic_load(&e->failed))
        return -1;
    if (read(e->notify_fd, &v, sizeof v) < 0) {
        /* EAGAIN: nothing was written since the last read */
    }
    int n = 0;
    for (int pass = 0; pass < 2; pass++) {
        uint32_t tail = atomic_load_explicit(&e->done_tail, memory_order_relaxed);
        uint32_t head = atomic_load_explicit(&e->done_head, memory_order_acquire);
        while (tail != head && n < max) {
            out[2 * n] = e->done[2 * (tail & (RING - 1))];
            out[2 * n + 1] = e->done[2 * (tail & (RING - 1)) + 1];
            tail++;
            n++;
        }
        atomic_store_explicit(&e->done_tail, tail, memory_order_release);
        if (n == max)
            return n;
        if (pass == 0)
            atomic_store(&e->armed, 1); /* then look once more: a completion pushed before
                                            this store was not notified */
    }
    return n;
}

/* The next n completions are not handed off: each GET is sent again on its connection (the
   engine's own cost, without the loop). Set before submitting. */
void eng_repeat(eng_t *e, int64_t n) { atomic_store(&e->repeat_left, n); }

/* No engine, no thread, no Python: count GETs one after another on a blocking socket, head and
   body into buf (the wire's floor for any client here). Total body bytes, or -1. */
int64_t blocking_gets(int fd, const char *req, size_t reqlen, char *buf, size_t bufsize,
                      int count) {
    int64_t bytes = 0;
    for (int i = 0; i < count; i++) {
        if (send(fd, req, reqlen, MSG_NOSIGNAL) != (ssize_t)reqlen)
            return -1;
        size_t got = 0, body = 0, total = 0;
        while (!body || got < total) {
            ssize_t k = recv(fd, buf + got, body ? total - got : bufsize - got, 0);
            if (k <= 0)
                return -1;
            size_t from = got >= 3 ? got - 3 : 0;
            got += (size_t)k;
            if (body)
                continue;
            const char *end = memmem(buf + from, got - from, "\r\n\r\n", 4);
            if (!end)
                continue;
            const char *cl = NULL;
            for (const char *p = buf; p + 17 < end && !cl; p++)
                if (p[0] == '\r' && p[1] == '\n' && strncasecmp(p + 2, "content-length:", 15) == 0)
                    cl = p + 17;
            if (!cl || memcmp(buf, "HTTP/1.1 200", 12) != 0)
                return -1;
            body = (size_t)(end + 4 - buf);
            total = body + strtoull(cl, NULL, 10);
            if (total > bufsize || got > total)
                return -1;
        }
        bytes += (int64_t)(total - body);
    }
    return bytes;
}

const char *eng_error(eng_t *e) { return e->error; }

uint64_t eng_notifies(eng_t *e) { return e->notifies; }

/* CPU time of the engine's thread, ns (-1 on error). */
int64_t eng_thread_cpu_ns(eng_t *e) {
    clockid_t cid;
    struct timespec ts;
    if (pthread_getcpuclockid(e->thread, &cid) != 0 || clock_gettime(cid, &ts) != 0)
        return -1;
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Stop and join the thread, free everything; the sockets stay the caller's. */
void eng_stop(eng_t *e) {
    uint64_t one = 1;
    atomic_store(&e->stop, 1);
    if (write(e->submit_fd, &one, sizeof one) < 0) {
        /* the thread may already have exited after a failure */
    }
    pthread_join(e->thread, NULL);
    for (int i = 0; i < e->nconn; i++)
        free(e->conns[i].buf);
    free(e->conns);
    free(e->req);
    close(e->epfd);
    close(e->submit_fd);
    close(e->notify_fd);
    free(e);
}
