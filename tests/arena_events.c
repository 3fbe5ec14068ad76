/* The arena's stream ordering as it runs with a GPU, checked without one:
 * this program compiles src/arena.c with recording stand-ins for the GPU
 * helpers (rk_gpu_count says 1; rk_gpu_stream_wait and rk_gpu_stream_sync
 * log their arguments) over an upstream that calls itself device-accessible,
 * so the arena takes its event path, and checks every wait and
 * synchronisation it makes: superblocks and large blocks passing between
 * streams, frees on other streams, the default stream, a free range that
 * remembers too many streams, forgetting a stream, a failing wait, and
 * release. Linked statically, so the library's own arena.o is not used. */
#define rk_gpu_count test_gpu_count
#define rk_gpu_stream_wait test_gpu_stream_wait
#define rk_gpu_stream_sync test_gpu_stream_sync
#define rk_gpu_event_destroy test_gpu_event_destroy
#include "../src/arena.c"

#include "tap.h"
#include "counting.h"

#define KiB ((size_t)1 << 10)
#define SB (64 * KiB)
#define S(n) ((rankmem_stream_t)(uintptr_t)(0x1000 * (n)))

static char log_buf[8192];
static size_t log_len;
static int events_alive;
static rankmem_status_t fail_next;

static void log_add(const char *fmt, rankmem_stream_t a, rankmem_stream_t b)
{
    if (log_len + 64 < sizeof log_buf)
        log_len += (size_t)snprintf(log_buf + log_len, sizeof log_buf - log_len, fmt,
                                    (unsigned long)(uintptr_t)a, (unsigned long)(uintptr_t)b);
}

int test_gpu_count(void) { return 1; }

rankmem_status_t test_gpu_stream_wait(rankmem_stream_t waiter, rankmem_stream_t from,
                                      void **event_p)
{
    if (fail_next) {
        rankmem_status_t st = fail_next;
        fail_next = RANKMEM_SUCCESS;
        return rk_error(st, "stand-in: cudaStreamWaitEvent failed");
    }
    if (!*event_p) {
        *event_p = malloc(1);
        events_alive++;
    }
    log_add("wait %lx<%lx ", waiter, from);
    return RANKMEM_SUCCESS;
}

rankmem_status_t test_gpu_stream_sync(rankmem_stream_t stream)
{
    log_add("sync %lx ", stream, NULL);
    return RANKMEM_SUCCESS;
}

void test_gpu_event_destroy(void *event)
{
    if (event)
        events_alive--;
    free(event);
}

/* The waits and synchronisations since the last call, e.g. "wait 2000<1000 sync 0 ". */
static const char *calls(void)
{
    static char out[sizeof log_buf];
    memcpy(out, log_buf, log_len + 1);
    log_len = 0;
    log_buf[0] = '\0';
    return out;
}

#define is_calls(want, ...)                                                                  \
    do {                                                                                     \
        const char *got_ = calls();                                                          \
        if (!ok(strcmp(got_, want) == 0, __VA_ARGS__))                                       \
            diag("  calls: '%s', want '%s'", got_, want);                                    \
    } while (0)

/* An upstream of host memory that says it is device memory. */
static counting_t *device_upstream(int *finalized)
{
    counting_t *c = counting_new(finalized);
    if (!c)
        BAIL_OUT("counting_new");
    c->base.props |= RANKMEM_PROP_DEVICE_ACCESSIBLE;
    return c;
}

static rankmem_resource_t *make(counting_t *up, size_t slots)
{
    rankmem_arena_params_t prm;
    rankmem_arena_params_default(&prm);
    prm.arena_size = slots * SB;
    prm.superblock_size = SB;
    rankmem_resource_t *mr = NULL;
    if (rankmem_arena_create(&up->base, &prm, &mr) != RANKMEM_SUCCESS)
        BAIL_OUT("arena_create: %s", rankmem_last_error());
    return mr;
}

static void *get(rankmem_resource_t *mr, size_t n, rankmem_stream_t s)
{
    void *p = NULL;
    rankmem_status_t st = rankmem_allocate_async(mr, n, 0, s, &p);
    if (st != RANKMEM_SUCCESS)
        diag("allocate %zu on %p: %s", n, (void *)s, rankmem_last_error());
    return p;
}

static void put(rankmem_resource_t *mr, void *p, size_t n, rankmem_stream_t s)
{
    if (rankmem_deallocate_async(mr, p, n, 0, s) != RANKMEM_SUCCESS)
        diag("deallocate %p on %p: %s", p, (void *)s, rankmem_last_error());
}

static void end(rankmem_resource_t *mr, counting_t *up, int *finalized, const char *what)
{
    is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "%s: released", what);
    calls();
    int clean = up->outstanding_blocks == 0;
    rankmem_resource_release(&up->base);
    ok(clean && *finalized && events_alive == 0, "%s: nothing left, every event destroyed", what);
}

static void test_superblocks(void)
{
    int fin;
    counting_t *up = device_upstream(&fin);
    rankmem_resource_t *mr = make(up, 8);
    is_calls("sync 0 ", "creation: the default stream, on which the upstream allocated, is waited for");
    void *a1 = get(mr, 40 * KiB, S(1)), *a2 = get(mr, 40 * KiB, S(1));
    is_calls("", "fresh memory: no wait");
    put(mr, a1, 40 * KiB, S(1));
    put(mr, a2, 40 * KiB, S(1)); /* the second superblock goes back, freed on S1 */
    is_calls("", "frees on the arena's own stream: no wait");
    void *b = get(mr, 1000, S(2));
    ok(b == a2, "stream 2 takes the superblock stream 1 gave back");
    is_calls("wait 2000<1000 ", "and waits for stream 1 once");
    void *c = get(mr, 1000, S(2));
    is_calls("", "the next block of that superblock needs no wait");
    put(mr, b, 1000, S(2));
    put(mr, c, 1000, S(2));
    a1 = get(mr, 40 * KiB, S(1));
    a2 = get(mr, 40 * KiB, S(1)); /* stream 1's second superblock: from the rest, freed on 1 */
    is_calls("", "stream 1 takes back memory only it freed: no wait");
    put(mr, a1, 40 * KiB, S(1));
    put(mr, a2, 40 * KiB, S(1));
    end(mr, up, &fin, "superblocks");
}

static void test_pending(void)
{
    int fin;
    counting_t *up = device_upstream(&fin);
    rankmem_resource_t *mr = make(up, 8);
    calls();
    void *q[4];
    for (int i = 0; i < 4; i++)
        q[i] = get(mr, 16 * KiB, S(1));
    put(mr, q[1], 16 * KiB, S(2));
    is_calls("", "a free on another stream waits for nothing yet");
    void *x = get(mr, 16 * KiB, S(1));
    ok(x == q[1], "stream 1 reuses the block freed on stream 2");
    is_calls("wait 1000<2000 ", "after waiting for stream 2");
    put(mr, x, 16 * KiB, S(3));
    put(mr, q[0], 16 * KiB, S(4));
    put(mr, q[2], 16 * KiB, S(3));
    is_calls("", "three more frees on streams 3 and 4: no wait yet");
    x = get(mr, 48 * KiB, S(1));
    ok(x == q[0], "they coalesced");
    is_calls("wait 1000<3000 wait 1000<4000 ", "one wait per stream");
    /* A failing wait: nothing changes, the next try works. */
    put(mr, x, 48 * KiB, S(5));
    fail_next = RANKMEM_ERR_DEVICE;
    void *y = NULL;
    is_status(rankmem_allocate_async(mr, 48 * KiB, 0, S(1), &y), RANKMEM_ERR_DEVICE,
              "a failing wait is the allocation's error");
    ok(y == NULL && strstr(rankmem_last_error(), "stand-in"), "with its detail: %s",
       rankmem_last_error());
    y = get(mr, 48 * KiB, S(1));
    ok(y == q[0], "the block was still pending; the retry gets it");
    is_calls("wait 1000<5000 ", "after one wait");
    put(mr, y, 48 * KiB, S(1));
    put(mr, q[3], 16 * KiB, S(1));
    end(mr, up, &fin, "pending");
}

static void test_large(void)
{
    int fin;
    counting_t *up = device_upstream(&fin);
    rankmem_resource_t *mr = make(up, 8);
    calls();
    void *a = get(mr, 3 * SB, S(1));
    put(mr, a, 3 * SB, S(1));
    void *b = get(mr, 3 * SB, S(2));
    ok(a == b, "a large block freed on stream 1 goes to stream 2");
    is_calls("wait 2000<1000 ", "which waits for stream 1");
    put(mr, b, 3 * SB, S(2));
    a = get(mr, 3 * SB, S(1));
    is_calls("wait 1000<2000 ", "back on stream 1: it waits for stream 2 only");
    put(mr, a, 3 * SB, S(1));
    /* Blocks ending inside the same slot, freed on five streams: the slot
     * remembers four, the fifth is waited for on the host. */
    for (int i = 0; i < 5; i++) {
        void *l = get(mr, SB + 256, S(10 + i));
        put(mr, l, SB + 256, S(10 + i));
    }
    const char *c = calls();
    ok(strstr(c, "wait a000<1000 ") && strstr(c, "sync e000 ") && !strstr(c, "sync a000 "),
       "a slot that would remember a fifth stream waits for it on the host (%s)", c);
    end(mr, up, &fin, "large");
}

static rankmem_resource_t *tmr;
static void *thread_block;

static void *other_thread(void *arg)
{
    (void)arg;
    thread_block = get(tmr, 1000, NULL);
    return NULL;
}

static void test_default_stream(void)
{
    int fin;
    counting_t *up = device_upstream(&fin);
    tmr = make(up, 8);
    calls();
    void *a1 = get(tmr, 40 * KiB, NULL), *a2 = get(tmr, 40 * KiB, NULL);
    put(tmr, a1, 40 * KiB, NULL);
    put(tmr, a2, 40 * KiB, NULL); /* the second superblock goes back, freed on the default stream */
    void *s = get(tmr, 1000, S(1));
    ok(s == a2, "stream 1 takes it");
    is_calls("wait 1000<0 ", "and waits for the default stream");
    put(tmr, s, 1000, S(1));
    a1 = get(tmr, 40 * KiB, NULL);
    a2 = get(tmr, 40 * KiB, NULL);
    put(tmr, a1, 40 * KiB, NULL);
    put(tmr, a2, 40 * KiB, NULL);
    pthread_t t;
    pthread_create(&t, NULL, other_thread, NULL);
    pthread_join(t, NULL);
    ok(thread_block == a2, "another thread's arena takes the superblock this thread gave back");
    put(tmr, thread_block, 1000, NULL);
    is_calls("", "threads on the default stream never wait for each other");
    a1 = get(tmr, 40 * KiB, NULL);
    put(tmr, a1, 40 * KiB, S(1));
    is_calls("", "a default-stream block freed on a stream: held");
    a2 = get(tmr, 40 * KiB, NULL);
    ok(a2 == a1, "reused");
    is_calls("wait 0<1000 ", "once the default stream waits for that stream");
    put(tmr, a2, 40 * KiB, NULL);
    end(tmr, up, &fin, "default stream");
}

static void test_forget(void)
{
    int fin;
    counting_t *up = device_upstream(&fin);
    rankmem_resource_t *mr = make(up, 8);
    calls();
    void *q[4];
    for (int i = 0; i < 4; i++)
        q[i] = get(mr, 16 * KiB, S(1));
    put(mr, q[1], 16 * KiB, S(2)); /* pending in stream 1's arena */
    void *big = get(mr, 3 * SB, S(2));
    put(mr, big, 3 * SB, S(2)); /* a free range remembers stream 2 */
    calls();
    is_status(rankmem_arena_forget_stream(mr, S(2)), RANKMEM_SUCCESS, "forget stream 2");
    is_calls("sync 2000 ", "waits for it once, on the host");
    void *x = get(mr, 16 * KiB, S(1));
    ok(x == q[1], "its pending free became free");
    big = get(mr, 3 * SB, S(3));
    is_calls("", "nobody waits for stream 2 any more");
    put(mr, big, 3 * SB, S(3));
    /* Stream 1 forgotten: its arena holds a free from stream 4, then gives everything back. */
    put(mr, q[2], 16 * KiB, S(4));
    calls();
    is_status(rankmem_arena_forget_stream(mr, S(1)), RANKMEM_SUCCESS, "forget stream 1");
    is_calls("sync 1000 ", "waits for stream 1");
    put(mr, x, 16 * KiB, S(5));
    put(mr, q[0], 16 * KiB, S(5));
    put(mr, q[3], 16 * KiB, S(5));
    calls();
    is_status(rankmem_resource_trim(mr, 0), RANKMEM_SUCCESS, "trim");
    is_calls("sync 4000 sync 5000 ", "a forgotten stream cannot wait: the host waits for the frees it holds");
    void *all = get(mr, 8 * SB, S(6));
    ok(all != NULL, "the whole arena is free");
    is_calls("wait 6000<3000 ", "memory the forgotten stream 1 gave back is waited for by no one; stream 3's is");
    put(mr, all, 8 * SB, S(6));
    end(mr, up, &fin, "forget");
}

static void test_release(void)
{
    int fin;
    counting_t *up = device_upstream(&fin);
    rankmem_resource_t *mr = make(up, 8);
    void *a = get(mr, 1000, S(1)), *b = get(mr, 1000, S(2));
    put(mr, a, 1000, S(1));
    put(mr, b, 1000, S(3));
    calls();
    is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "release");
    const char *c = calls();
    ok(strstr(c, "sync 1000 ") && strstr(c, "sync 2000 ") && strstr(c, "sync 3000 "),
       "release waits for every stream that may still use its memory (%s)", c);
    int clean = up->outstanding_blocks == 0;
    rankmem_resource_release(&up->base);
    ok(clean && fin && events_alive == 0, "release: nothing left");
}

/* ---- the bitmap search against a naive reference ---- */

/* Summaries consistent with the bits, and the bits with the reference. */
static int bitmap_consistent(const sb_t *sb, const unsigned char *ref, size_t units)
{
    size_t nwords = units / 64;
    for (size_t u = 0; u < units; u++)
        if (bit_get(sb->bits, u) != ref[u])
            return 0;
    for (size_t w = 0; w < nwords; w++) {
        int nz = (int)((sb->nz[w / 64] >> (w % 64)) & 1), full = (int)((sb->full[w / 64] >> (w % 64)) & 1);
        if (nz != (sb->bits[w] != 0) || full != (sb->bits[w] == ~0ull))
            return 0;
    }
    return 1;
}

/* The lowest u = rem (mod au) with [u, u+n) free, or SIZE_MAX. */
static size_t naive_find(const unsigned char *ref, size_t units, size_t n, size_t au, size_t rem)
{
    for (size_t u = rem % au; u + n <= units; u += au) {
        size_t k = 0;
        while (k < n && ref[u + k])
            k++;
        if (k == n)
            return u;
    }
    return SIZE_MAX;
}

static size_t naive_longest(const unsigned char *ref, size_t units)
{
    size_t best = 0, cur = 0;
    for (size_t u = 0; u < units; u++) {
        cur = ref[u] ? cur + 1 : 0;
        if (cur > best)
            best = cur;
    }
    return best;
}

static void test_bitmaps(void)
{
    enum { UNITS = 16384, WORDS = UNITS / 64 };
    static uint64_t bits[WORDS], nz[WORDS / 64], full[WORDS / 64];
    static unsigned char ref[UNITS];
    sb_t sb = {.bits = bits, .nz = nz, .full = full};
    memset(ref, 1, sizeof ref);
    bits_set(&sb, 0, UNITS);
    int consistent = bitmap_consistent(&sb, ref, UNITS), found_ok = 1, bound_ok = 1, ops = 0;
    test_seed(4242);
    for (int step = 0; step < 20000 && consistent && found_ok && bound_ok; step++) {
        size_t n = test_log_size(1, step % 3 ? 600 : UNITS);
        static const size_t aligns[] = {1, 1, 1, 2, 4, 16, 64, 128, 1024};
        size_t au = aligns[test_rand() % 9], rem = au > 1 ? test_rand() % au : 0;
        if (test_rand() % 2) { /* search, and take what is found */
            size_t bound = SIZE_MAX, want = naive_find(ref, UNITS, n, au, rem);
            size_t got = sb_find(&sb, WORDS, n, au, rem, &bound);
            if (got != want) {
                diag("step %d: find %zu units (align %zu, rem %zu): got %zu, want %zu", step, n, au,
                     rem, got, want);
                found_ok = 0;
            } else if (got == SIZE_MAX && bound != SIZE_MAX && bound < naive_longest(ref, UNITS)) {
                diag("step %d: bound %zu below the longest run %zu", step, bound, naive_longest(ref, UNITS));
                bound_ok = 0;
            } else if (got != SIZE_MAX) {
                bits_clear(&sb, got, n);
                memset(ref + got, 0, n);
                ops++;
            }
        } else { /* free a random range that is allocated */
            size_t u = test_rand() % UNITS;
            if (u + n > UNITS)
                n = UNITS - u;
            size_t k = 0;
            while (k < n && !ref[u + k])
                k++;
            if (k) {
                bits_set(&sb, u, k);
                memset(ref + u, 1, k);
                if (u / 64 < sb.first_word)
                    sb.first_word = (uint32_t)(u / 64);
                ops++;
            }
        }
        consistent = bitmap_consistent(&sb, ref, UNITS);
    }
    ok(consistent, "bitmaps: bits and both summaries stay consistent over %d changes of 1..16384 units", ops);
    ok(found_ok, "bitmaps: every search finds the reference's first fit, at every alignment");
    ok(bound_ok, "bitmaps: a failed search's bound is never below the longest free run");
}

int main(void)
{
    test_bitmaps();
    test_superblocks();
    test_pending();
    test_large();
    test_default_stream();
    test_forget();
    test_release();
    return tap_done();
}
