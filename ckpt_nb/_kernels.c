/* The codec's hot loops in C: ckpt_nb/_native.py loads them through ctypes.
 *
 * Byte grouping (what the codec does to every chunk):
 * group:   element i's byte k  ->  out[k * per + i]   (rows of one contiguous array;
 *                                                       of raw XOR base for a delta)
 * ungroup: rows[k][i]          ->  out[i * nrows + k] (rows anywhere: raw streams are
 *                                                       read in place in the blob)
 *
 * Plain loops over restrict pointers, which compilers vectorize: about 12 GB/s here
 * against 2-4 GB/s for NumPy's shift-and-or, and a ctypes call releases the GIL, so
 * restore threads overlap. The callers check every length first.
 *
 * Decoding whole CKB2 blobs (ckpt_decode, below): a restore decodes a batch of
 * chunks in one call, so the GIL is let go once per batch instead of four times
 * per chunk (zstd, ungroup, XOR, checksum), each time costing a wake-up on another
 * CPU to get it back. zstd and xxh3 come in as function pointers, found in the
 * zstandard and xxhash packages' own libraries (ckpt_decode_init): this file
 * needs no headers but libc's, and decodes with the very zstd that encoded.
 *
 * Writing packs (ckpt_writer_*, at the end): a thread that writes staged buffers
 * with pwrite(), so that the disk never waits for Python's GIL.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* in[j], XORed with base[j] when there is a base (a delta's bytes), inlined twice:
 * with no base the test folds away. */
#define AT(j) (base ? (uint8_t)(in[j] ^ base[j]) : in[j])

static inline __attribute__((always_inline)) void
group_rows(uint8_t *restrict out, const uint8_t *restrict in, const uint8_t *restrict base,
           size_t nrows, size_t per)
{
    if (nrows == 2) {
        uint8_t *restrict a = out, *restrict b = out + per;
        for (size_t i = 0; i < per; i++) {
            a[i] = AT(2 * i);
            b[i] = AT(2 * i + 1);
        }
    } else if (nrows == 4) {
        uint8_t *restrict a = out, *restrict b = out + per, *restrict c = out + 2 * per,
                *restrict d = out + 3 * per;
        for (size_t i = 0; i < per; i++) {
            a[i] = AT(4 * i);
            b[i] = AT(4 * i + 1);
            c[i] = AT(4 * i + 2);
            d[i] = AT(4 * i + 3);
        }
    } else if (nrows == 8) {
        uint8_t *restrict r[8];
        for (size_t k = 0; k < 8; k++)
            r[k] = out + k * per;
        uint8_t *restrict a = r[0], *restrict b = r[1], *restrict c = r[2], *restrict d = r[3],
                *restrict e = r[4], *restrict f = r[5], *restrict g = r[6], *restrict h = r[7];
        /* 64-bit words, split by shifts: gcc does not vectorize an 8-way
         * de-interleave of bytes, which then runs at a tenth of the speed. */
        for (size_t i = 0; i < per; i++) {
            uint64_t w;
            memcpy(&w, in + 8 * i, 8);
            if (base) {
                uint64_t v;
                memcpy(&v, base + 8 * i, 8);
                w ^= v;
            }
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
            w = __builtin_bswap64(w);
#endif
            a[i] = (uint8_t)w, b[i] = (uint8_t)(w >> 8), c[i] = (uint8_t)(w >> 16);
            d[i] = (uint8_t)(w >> 24), e[i] = (uint8_t)(w >> 32), f[i] = (uint8_t)(w >> 40);
            g[i] = (uint8_t)(w >> 48), h[i] = (uint8_t)(w >> 56);
        }
    } else {
        for (size_t k = 0; k < nrows; k++) {
            uint8_t *restrict row = out + k * per;
            for (size_t i = 0; i < per; i++)
                row[i] = AT(i * nrows + k);
        }
    }
}

void ckpt_group(uint8_t *restrict out, const uint8_t *restrict in, size_t nrows, size_t per)
{
    group_rows(out, in, NULL, nrows, per);
}

/* The streams of a delta, raw XOR base, in one pass: no XORed copy to group after. */
void ckpt_group_xor(uint8_t *restrict out, const uint8_t *restrict in,
                    const uint8_t *restrict base, size_t nrows, size_t per)
{
    group_rows(out, in, base, nrows, per);
}

#undef AT

void ckpt_ungroup(uint8_t *restrict out, const uint8_t *const *rows, size_t nrows, size_t per)
{
    if (nrows == 2) {
        const uint8_t *restrict a = rows[0], *restrict b = rows[1];
        for (size_t i = 0; i < per; i++) {
            out[2 * i] = a[i];
            out[2 * i + 1] = b[i];
        }
    } else if (nrows == 4) {
        const uint8_t *restrict a = rows[0], *restrict b = rows[1], *restrict c = rows[2],
                      *restrict d = rows[3];
        for (size_t i = 0; i < per; i++) {
            out[4 * i] = a[i];
            out[4 * i + 1] = b[i];
            out[4 * i + 2] = c[i];
            out[4 * i + 3] = d[i];
        }
    } else if (nrows == 8) {
        const uint8_t *restrict a = rows[0], *restrict b = rows[1], *restrict c = rows[2],
                      *restrict d = rows[3], *restrict e = rows[4], *restrict f = rows[5],
                      *restrict g = rows[6], *restrict h = rows[7];
        for (size_t i = 0; i < per; i++) {
            uint8_t *w = out + 8 * i;
            w[0] = a[i], w[1] = b[i], w[2] = c[i], w[3] = d[i];
            w[4] = e[i], w[5] = f[i], w[6] = g[i], w[7] = h[i];
        }
    } else {
        for (size_t k = 0; k < nrows; k++) {
            const uint8_t *restrict row = rows[k];
            for (size_t i = 0; i < per; i++)
                out[i * nrows + k] = row[i];
        }
    }
}

/* ---- decoding blobs: the layout is ckpt_nb/_codec.py's docstring ---------- */

typedef struct {
    uint64_t low64, high64;
} ckpt_xxh128;

typedef struct {
    void *(*create_dctx)(void);
    size_t (*free_dctx)(void *);
    size_t (*decompress_dctx)(void *, void *, size_t, const void *, size_t);
    unsigned (*is_error)(size_t);
    ckpt_xxh128 (*xxh3_128)(const void *, size_t);
} ckpt_api;

/* One chunk to decode. ``status`` comes back: 0 done and checked, 1 left for
 * Python (a CKB1 blob, or more streams than MAX_STREAMS), < 0 one of CKPT_E*;
 * ``detail`` holds zstd's error code for CKPT_EZSTD. */
typedef struct {
    const uint8_t *blob;
    uint64_t blob_len;
    uint8_t *out;
    uint64_t out_len;
    const uint8_t *base; /* the base chunk's raw bytes (out_len of them) for a delta */
    uint8_t name[8];     /* the head of the digest the blob is read under */
    uint32_t has_name;
    int32_t status;
    uint64_t detail;
} ckpt_job;

enum {
    CKPT_LEFT = 1,
    CKPT_ETRUNCATED = -1,
    CKPT_EHEADER = -2,
    CKPT_ENAME = -3,
    CKPT_ELENGTH = -4,
    CKPT_EBASE = -5,
    CKPT_ESTREAMS = -6,
    CKPT_ESTREAM = -7,
    CKPT_ESTREAMLEN = -8,
    CKPT_EZSTD = -9,
    CKPT_ECHECKSUM = -10,
    CKPT_ENOMEM = -11,
};

#define MAX_STREAMS 16
#define HEADER_BYTES 16
#define CHECK_BYTES 16
#define NAME_BYTES 8
#define DIGEST_BYTES 32
#define STREAM_BYTES 9

static ckpt_api api;
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

/* Each thread keeps a zstd context and a buffer for decompressed streams. */
typedef struct {
    void *dctx;
    uint8_t *buf;
    size_t cap;
} scratch;

static void scratch_free(void *p)
{
    scratch *s = p;
    if (s->dctx)
        api.free_dctx(s->dctx);
    free(s->buf);
    free(s);
}

static void scratch_key_make(void) { pthread_key_create(&scratch_key, scratch_free); }

static scratch *thread_scratch(size_t need)
{
    scratch *s = pthread_getspecific(scratch_key);
    if (!s) {
        s = calloc(1, sizeof *s);
        if (!s || pthread_setspecific(scratch_key, s)) {
            free(s);
            return NULL;
        }
    }
    if (!s->dctx && !(s->dctx = api.create_dctx()))
        return NULL;
    if (s->cap < need) {
        uint8_t *buf = realloc(s->buf, need);
        if (!buf)
            return NULL;
        s->buf = buf, s->cap = need;
    }
    return s;
}

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static void be64(uint8_t *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--, v >>= 8)
        p[i] = (uint8_t)v;
}

static int32_t decode_one(ckpt_job *job)
{
    const uint8_t *b = job->blob;
    uint64_t n = job->blob_len;
    if (n < HEADER_BYTES)
        return CKPT_ETRUNCATED;
    int ckb2 = !memcmp(b, "CKB2", 4);
    unsigned delta = b[4], itemsize = b[5], nstreams = b[6];
    if ((!ckb2 && memcmp(b, "CKB1", 4)) || itemsize == 0 || nstreams == 0)
        return CKPT_EHEADER;
    if (!ckb2 || nstreams > MAX_STREAMS)
        return CKPT_LEFT;
    uint64_t raw_len = le64(b + 8), pos = HEADER_BYTES;
    if (n < pos + CHECK_BYTES + NAME_BYTES + (delta ? DIGEST_BYTES : 0))
        return CKPT_ETRUNCATED;
    const uint8_t *check = b + pos, *name = b + pos + CHECK_BYTES;
    pos += CHECK_BYTES + NAME_BYTES + (delta ? DIGEST_BYTES : 0);
    if (job->has_name && memcmp(name, job->name, NAME_BYTES))
        return CKPT_ENAME;
    if (job->out_len != raw_len)
        return CKPT_ELENGTH;
    if (!delta != !job->base)
        return CKPT_EBASE;
    uint64_t per = raw_len / nstreams;
    if (per * nstreams != raw_len)
        return CKPT_ESTREAMS;
    unsigned method[MAX_STREAMS];
    uint64_t length[MAX_STREAMS];
    for (unsigned i = 0; i < nstreams; i++, pos += STREAM_BYTES) {
        if (pos + STREAM_BYTES > n)
            return CKPT_ETRUNCATED;
        method[i] = b[pos], length[i] = le64(b + pos + 1);
    }
    const uint8_t *rows[MAX_STREAMS];
    uint64_t compressed = 0;
    for (unsigned i = 0; i < nstreams; i++) {
        if (method[i] > 1 || length[i] > n - pos)
            return CKPT_ESTREAM;
        rows[i] = b + pos;
        pos += length[i];
        if (method[i] == 1)
            compressed++;
        else if (length[i] != per)
            return CKPT_ESTREAMLEN;
    }
    /* Compressed streams go to this thread's buffer, or straight to out when
     * there is one stream; raw ones are read in place. */
    scratch *s = NULL;
    if (compressed && !(s = thread_scratch(nstreams > 1 ? compressed * per : 0)))
        return CKPT_ENOMEM;
    uint8_t *spare = nstreams > 1 && compressed ? s->buf : job->out;
    for (unsigned i = 0, k = 0; i < nstreams; i++) {
        if (method[i] != 1)
            continue;
        uint8_t *dst = spare + (uint64_t)k++ * per;
        size_t got = api.decompress_dctx(s->dctx, dst, per, rows[i], length[i]);
        if (api.is_error(got)) {
            job->detail = got;
            return CKPT_EZSTD;
        }
        if (got != per)
            return CKPT_ESTREAMLEN;
        rows[i] = dst;
    }
    if (nstreams > 1)
        ckpt_ungroup(job->out, rows, nstreams, per);
    else if (rows[0] != job->out)
        memcpy(job->out, rows[0], per);
    if (job->base) {
        uint8_t *restrict o = job->out;
        const uint8_t *restrict a = job->base;
        for (uint64_t i = 0; i < raw_len; i++)
            o[i] ^= a[i];
    }
    ckpt_xxh128 h = api.xxh3_128(job->out, raw_len);
    uint8_t canonical[16]; /* xxhash's canonical form: high half first, big-endian */
    be64(canonical, h.high64);
    be64(canonical + 8, h.low64);
    return memcmp(canonical, check, CHECK_BYTES) ? CKPT_ECHECKSUM : 0;
}

void ckpt_decode_init(const ckpt_api *functions)
{
    api = *functions;
    pthread_once(&scratch_once, scratch_key_make);
}

/* Decode ``n`` jobs in order, each on its own: one failing does not stop the rest. */
void ckpt_decode(ckpt_job *jobs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        jobs[i].status = decode_one(&jobs[i]);
}

/* ---- weighing a delta against a plain blob (for choosing deltas) ----------- */

#define ESTIMATE_MAX_ITEMSIZE 16

/* About how many bytes the n / itemsize whole elements of raw (XORed with base when
 * given) take as a blob: each grouped stream costed at its order-0 entropy, or raw
 * where that would not gain what the codec asks for (coded < keep_ratio * length),
 * as codec.estimated_length does in NumPy. One call per estimate: from Python the
 * histogram and the sums cost a dozen NumPy calls, each letting the GIL go.
 * Returns -1 for an itemsize over ESTIMATE_MAX_ITEMSIZE (the caller uses NumPy). */
double ckpt_estimated_length(const uint8_t *restrict raw, const uint8_t *restrict base,
                             size_t n, size_t itemsize, double keep_ratio)
{
    uint32_t counts[ESTIMATE_MAX_ITEMSIZE * 256];
    size_t per = itemsize ? n / itemsize : 0;
    if (itemsize == 0 || itemsize > ESTIMATE_MAX_ITEMSIZE)
        return -1.0;
    if (per == 0)
        return (double)n;
    memset(counts, 0, itemsize * 256 * sizeof *counts);
    for (size_t i = 0; i < per; i++) {
        const uint8_t *r = raw + i * itemsize;
        const uint8_t *b = base ? base + i * itemsize : NULL;
        for (size_t k = 0; k < itemsize; k++)
            counts[k * 256 + (b ? r[k] ^ b[k] : r[k])]++;
    }
    double total = 0.0;
    for (size_t k = 0; k < itemsize; k++) {
        double bits = 0.0;
        for (size_t v = 0; v < 256; v++) {
            uint32_t c = counts[k * 256 + v];
            if (c) {
                double p = (double)c / (double)per;
                bits -= p * log2(p);
            }
        }
        double coded = bits * (double)per / 8.0;
        total += coded < keep_ratio * (double)per ? coded : (double)per;
    }
    return total;
}

/* ---- writing packs: a thread that never waits for Python's GIL ------------
 *
 * A pack is written with direct I/O a stage (a few MiB) at a time. From a Python
 * thread each write, back from the disk in ~2.5 ms, waited up to 4 ms more for the
 * GIL while encoding threads held it, and the disk sat idle meanwhile. Here the
 * caller queues stages (ckpt_writer_submit returns at once, unless WRITER_QUEUE are
 * in flight) and this thread pwrite()s them in order; the caller reuses a stage's
 * memory once ckpt_writer_wait says its write is done. The first error stops the
 * writing and comes back, as -errno, from every later call. */

#define WRITER_QUEUE 8

typedef struct {
    const uint8_t *data;
    size_t len;
    int64_t offset;
} ckpt_write;

typedef struct {
    int fd;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    ckpt_write queue[WRITER_QUEUE];
    uint64_t submitted, done; /* writes queued, and finished, since the start */
    int error;                /* the first write's errno, or 0 */
    int closing;
} ckpt_writer;

static int write_fully(int fd, const uint8_t *data, size_t len, int64_t offset)
{
    while (len) {
        ssize_t n = pwrite(fd, data, len, (off_t)offset);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        if (n == 0)
            return EIO;
        data += n, len -= (size_t)n, offset += n;
    }
    return 0;
}

static void *writer_main(void *arg)
{
    ckpt_writer *w = arg;
    pthread_mutex_lock(&w->lock);
    for (;;) {
        while (w->done == w->submitted && !w->closing)
            pthread_cond_wait(&w->changed, &w->lock);
        if (w->done == w->submitted)
            break;
        ckpt_write job = w->queue[w->done % WRITER_QUEUE];
        int failed = w->error;
        pthread_mutex_unlock(&w->lock);
        int error = failed ? 0 : write_fully(w->fd, job.data, job.len, job.offset);
        pthread_mutex_lock(&w->lock);
        if (error && !w->error)
            w->error = error;
        w->done++;
        pthread_cond_broadcast(&w->changed);
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

/* A writer for fd, its thread started; NULL when no thread could be made. */
ckpt_writer *ckpt_writer_open(int fd)
{
    ckpt_writer *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->fd = fd;
    if (pthread_mutex_init(&w->lock, NULL)) {
        free(w);
        return NULL;
    }
    if (pthread_cond_init(&w->changed, NULL)) {
        pthread_mutex_destroy(&w->lock);
        free(w);
        return NULL;
    }
    if (pthread_create(&w->thread, NULL, writer_main, w)) {
        pthread_cond_destroy(&w->changed);
        pthread_mutex_destroy(&w->lock);
        free(w);
        return NULL;
    }
    return w;
}

/* Queue len bytes at data for offset; returns the write's number (from 1), to
 * wait for, or -errno of an earlier write that failed. data must stay as it is
 * until that write is done. */
int64_t ckpt_writer_submit(ckpt_writer *w, const uint8_t *data, size_t len, int64_t offset)
{
    pthread_mutex_lock(&w->lock);
    while (w->submitted - w->done >= WRITER_QUEUE && !w->error)
        pthread_cond_wait(&w->changed, &w->lock);
    int64_t result;
    if (w->error) {
        result = -w->error;
    } else {
        w->queue[w->submitted % WRITER_QUEUE] = (ckpt_write){data, len, offset};
        result = (int64_t)++w->submitted;
        pthread_cond_broadcast(&w->changed);
    }
    pthread_mutex_unlock(&w->lock);
    return result;
}

/* Wait until writes 1..upto are done; 0, or -errno of the first that failed. */
int ckpt_writer_wait(ckpt_writer *w, uint64_t upto)
{
    pthread_mutex_lock(&w->lock);
    while (w->done < upto && w->done < w->submitted)
        pthread_cond_wait(&w->changed, &w->lock);
    int error = w->error;
    pthread_mutex_unlock(&w->lock);
    return -error;
}

/* Finish every queued write, stop the thread and free the writer; 0 or -errno. */
int ckpt_writer_close(ckpt_writer *w)
{
    pthread_mutex_lock(&w->lock);
    w->closing = 1;
    pthread_cond_broadcast(&w->changed);
    pthread_mutex_unlock(&w->lock);
    pthread_join(w->thread, NULL);
    int error = w->error;
    pthread_cond_destroy(&w->changed);
    pthread_mutex_destroy(&w->lock);
    free(w);
    return -error;
}
