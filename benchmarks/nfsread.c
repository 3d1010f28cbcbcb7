/* nfsread: a lean NFSv3 reader for the benchmarks (libnfs, one connection per thread).
 *
 * The Python client (tests/libnfs.py over ctypes, threads sharing one GIL) spends about as
 * much CPU per file as the server it measures; on a 2-core machine that is a core the servers
 * never get. This reader does the same calls on the wire (libnfs nfs_open -- LOOKUP of each
 * path component and ACCESS --, nfs_pread until a zero-byte reply, nfs_close) from C threads
 * and checks every byte against the local copy of the tree, so the servers, not the client,
 * set the pace. Built by benchmarks/nfsreader.py (gcc, libnfs-dev); driven over stdin, one
 * command per line, one answer line each on stdout:
 *
 *   open I           (re)connect connection I (mount from the URL)  -> "ok" | "error TEXT"
 *   stat I PATH      one nfs_stat64 over connection I                -> "ok" | "error TEXT"
 *   epoch LISTFILE   every path of LISTFILE (one per line, relative to the export and to
 *                    ROOT), file k on connection k mod N, all connections at once
 *                    -> {"files":..,"errors":..,"bytes":..,"seconds":..,"p50_ms":..,
 *                        "p99_ms":..,"max_ms":..}; a connection's first wrong or
 *                    unreadable file of the epoch is named on stderr
 *   quit
 *
 * Usage: nfsread URL ROOT N     (URL as tests/libnfs.py takes it: nfs://host/export?...)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <nfsc/libnfs.h>

#define CHUNK (1 << 20)
#define MAX_CONN 256

static const char *url;
static const char *root;
static int nconn;
static struct nfs_context *conns[MAX_CONN];

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int connect_one(int i, char *err, size_t errlen) {
    if (conns[i] != NULL) {
        nfs_destroy_context(conns[i]);
        conns[i] = NULL;
    }
    struct nfs_context *nfs = nfs_init_context();
    if (nfs == NULL) {
        snprintf(err, errlen, "nfs_init_context failed");
        return -1;
    }
    nfs_set_timeout(nfs, 120000);
    struct nfs_url *u = nfs_parse_url_dir(nfs, url);
    if (u == NULL) {
        snprintf(err, errlen, "bad url: %s", nfs_get_error(nfs));
        nfs_destroy_context(nfs);
        return -1;
    }
    int rc = nfs_mount(nfs, u->server, u->path);
    nfs_destroy_url(u);
    if (rc != 0) {
        snprintf(err, errlen, "mount: %s", nfs_get_error(nfs));
        nfs_destroy_context(nfs);
        return -1;
    }
    conns[i] = nfs;
    return 0;
}

struct job {
    int w;
    char **paths;
    size_t npaths;
    double *lat; /* per path, seconds (index k for path k) */
    uint64_t bytes;
    uint64_t errors;
};

/* The whole file over NFS into buf (grown as needed); its length, or -1. */
static ssize_t read_nfs(struct nfs_context *nfs, const char *path, char **buf, size_t *cap) {
    struct nfsfh *fh = NULL;
    if (nfs_open(nfs, path, O_RDONLY, &fh) != 0)
        return -1;
    size_t off = 0;
    for (;;) {
        if (*cap - off < CHUNK) {
            *cap = (*cap + CHUNK) * 2;
            *buf = realloc(*buf, *cap);
            if (*buf == NULL)
                abort();
        }
        int got = nfs_pread(nfs, fh, off, CHUNK, *buf + off);
        if (got < 0) {
            nfs_close(nfs, fh);
            return -1;
        }
        if (got == 0)
            break;
        off += (size_t)got;
    }
    nfs_close(nfs, fh);
    return (ssize_t)off;
}

/* Does the local copy of path hold exactly data[0:n]? */
static int same_as_local(const char *path, const char *data, size_t n, char **buf, size_t *cap) {
    char full[4096];
    snprintf(full, sizeof full, "%s%s", root, path);
    int fd = open(full, O_RDONLY);
    if (fd < 0)
        return 0;
    if (*cap < n + 1) {
        *cap = (n + 1) * 2;
        *buf = realloc(*buf, *cap);
        if (*buf == NULL)
            abort();
    }
    size_t off = 0;
    ssize_t got;
    while ((got = pread(fd, *buf + off, *cap - off, (off_t)off)) > 0) {
        off += (size_t)got;
        if (off > n)
            break;
    }
    close(fd);
    return off == n && memcmp(*buf, data, n) == 0;
}

static void *worker(void *arg) {
    struct job *j = arg;
    struct nfs_context *nfs = conns[j->w];
    char *buf = NULL, *local = NULL;
    size_t cap = 0, lcap = 0;
    for (size_t k = (size_t)j->w; k < j->npaths; k += (size_t)nconn) {
        double t0 = now();
        ssize_t n = read_nfs(nfs, j->paths[k], &buf, &cap);
        j->lat[k] = now() - t0;
        if (n < 0 || !same_as_local(j->paths[k], buf, (size_t)n, &local, &lcap)) {
            if (j->errors++ == 0) /* which file, once per connection and epoch */
                fprintf(stderr, "nfsread: %s: %s\n", j->paths[k],
                        n < 0 ? nfs_get_error(nfs) : "not the local copy's bytes");
            continue;
        }
        j->bytes += (uint64_t)n;
    }
    free(buf);
    free(local);
    return NULL;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void epoch(const char *listfile) {
    FILE *f = fopen(listfile, "r");
    if (f == NULL) {
        printf("error cannot open %s: %s\n", listfile, strerror(errno));
        return;
    }
    size_t cap = 1024, n = 0;
    char **paths = malloc(cap * sizeof *paths);
    char line[4096];
    while (fgets(line, sizeof line, f) != NULL) {
        line[strcspn(line, "\n")] = 0;
        if (line[0] == 0)
            continue;
        if (n == cap) {
            cap *= 2;
            paths = realloc(paths, cap * sizeof *paths);
        }
        paths[n++] = strdup(line);
    }
    fclose(f);
    double *lat = calloc(n ? n : 1, sizeof *lat);
    struct job jobs[MAX_CONN];
    pthread_t threads[MAX_CONN];
    double t0 = now();
    for (int w = 0; w < nconn; w++) {
        jobs[w] = (struct job){.w = w, .paths = paths, .npaths = n, .lat = lat};
        pthread_create(&threads[w], NULL, worker, &jobs[w]);
    }
    uint64_t bytes = 0, errors = 0;
    for (int w = 0; w < nconn; w++) {
        pthread_join(threads[w], NULL);
        bytes += jobs[w].bytes;
        errors += jobs[w].errors;
    }
    double wall = now() - t0;
    qsort(lat, n, sizeof *lat, cmp_double);
    double p50 = n ? lat[n / 2] : 0, p99 = n ? lat[(size_t)(0.99 * (double)(n - 1))] : 0;
    double mx = n ? lat[n - 1] : 0;
    printf("{\"files\": %zu, \"errors\": %llu, \"bytes\": %llu, \"seconds\": %.6f, "
           "\"p50_ms\": %.3f, \"p99_ms\": %.3f, \"max_ms\": %.3f}\n",
           n, (unsigned long long)errors, (unsigned long long)bytes, wall, p50 * 1e3,
           p99 * 1e3, mx * 1e3);
    for (size_t k = 0; k < n; k++)
        free(paths[k]);
    free(paths);
    free(lat);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s URL ROOT N\n", argv[0]);
        return 2;
    }
    url = argv[1];
    root = argv[2];
    nconn = atoi(argv[3]);
    if (nconn < 1 || nconn > MAX_CONN) {
        fprintf(stderr, "N must be 1..%d\n", MAX_CONN);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    char line[8192], err[512];
    while (fgets(line, sizeof line, stdin) != NULL) {
        line[strcspn(line, "\n")] = 0;
        int i;
        char arg[4096];
        if (sscanf(line, "open %d", &i) == 1 && i >= 0 && i < nconn) {
            if (connect_one(i, err, sizeof err) == 0)
                printf("ok\n");
            else
                printf("error %s\n", err);
        } else if (sscanf(line, "stat %d %4095s", &i, arg) == 2 && i >= 0 && i < nconn &&
                   conns[i] != NULL) {
            struct nfs_stat_64 st;
            if (nfs_stat64(conns[i], arg, &st) == 0)
                printf("ok\n");
            else
                printf("error %s\n", nfs_get_error(conns[i]));
        } else if (sscanf(line, "epoch %4095s", arg) == 1) {
            int ready = 1;
            for (int w = 0; w < nconn; w++)
                ready &= conns[w] != NULL;
            if (ready)
                epoch(arg);
            else
                printf("error not every connection is open\n");
        } else if (strcmp(line, "quit") == 0) {
            break;
        } else {
            printf("error unknown command: %s\n", line);
        }
    }
    for (int w = 0; w < nconn; w++)
        if (conns[w] != NULL)
            nfs_destroy_context(conns[w]);
    return 0;
}
