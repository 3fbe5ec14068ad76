/* The tracking adaptor over a host upstream and over a pool: the list and
 * the report name exactly the leaked blocks, largest first; double frees,
 * foreign pointers and wrong sizes are refused before the upstream sees
 * them; with backtraces the report groups by call site; release with live
 * allocations; threads; every bad input. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <rankmem.h>
#include "tap.h"
#include "counting.h"

#define S(x) ((rankmem_stream_t)(uintptr_t)(x))

typedef struct {
    void *ptr;
    size_t bytes;
    rankmem_stream_t stream;
} blk_t;

static int cmp_blk(const void *a, const void *b)
{
    const blk_t *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes > y->bytes ? -1 : 1;
    return (uintptr_t)x->ptr < (uintptr_t)y->ptr ? -1 : (uintptr_t)x->ptr > (uintptr_t)y->ptr;
}

/* The report of a tracking adaptor without backtraces, parsed back. */
static int read_report(rankmem_resource_t *tr, blk_t *out, int cap, size_t *count_p,
                       size_t *bytes_p)
{
    FILE *f = tmpfile();
    if (!f || rankmem_tracking_report(tr, f) != RANKMEM_SUCCESS)
        BAIL_OUT("report: %s", rankmem_last_error());
    rewind(f);
    char line[256];
    int n = -1;
    if (fgets(line, sizeof line, f) &&
        sscanf(line, "rankmem tracking: %zu live allocations, %zu bytes", count_p, bytes_p) == 2) {
        n = 0;
        unsigned long long p, s;
        size_t b;
        while (fgets(line, sizeof line, f)) {
            if (n == cap || sscanf(line, "  0x%llx: %zu bytes, stream 0x%llx", &p, &b, &s) != 3) {
                n = -1;
                break;
            }
            out[n++] = (blk_t){(void *)(uintptr_t)p, b, S(s)};
        }
    }
    fclose(f);
    return n;
}

/* Allocate 7 blocks, free 3: the 4 left are the leaks. up_calls reports how
 * many calls reached the upstream. */
static void leaks(const char *name, rankmem_resource_t *up, size_t (*up_calls)(void *), void *arg)
{
    rankmem_resource_t *tr;
    is_status(rankmem_tracking_create(up, 0, &tr), RANKMEM_SUCCESS, "%s: tracking_create", name);
    static const size_t sizes[7] = {4096, 100, 70000, 256, 4096, 12345, 1};
    blk_t all[7];
    for (int i = 0; i < 7; i++) {
        all[i].bytes = sizes[i];
        all[i].stream = S(i == 2 ? 0x1000 : i == 5 ? 0x2000 : 0);
        if (rankmem_allocate_async(tr, sizes[i], 0, all[i].stream, &all[i].ptr) != RANKMEM_SUCCESS)
            BAIL_OUT("%s: allocate: %s", name, rankmem_last_error());
    }
    static const int freed[3] = {1, 4, 5};
    for (int i = 0; i < 3; i++)
        rankmem_deallocate_async(tr, all[freed[i]].ptr, all[freed[i]].bytes, 0, all[freed[i]].stream);
    blk_t want[4] = {all[0], all[2], all[3], all[6]};
    qsort(want, 4, sizeof *want, cmp_blk);
    size_t want_bytes = 4096 + 70000 + 256 + 1;

    size_t bytes = 0, count = 0;
    is_status(rankmem_tracking_outstanding(tr, &bytes, &count), RANKMEM_SUCCESS, "%s: outstanding", name);
    ok(bytes == want_bytes && count == 4, "%s: outstanding %zu bytes in 4 (got %zu in %zu)", name,
       want_bytes, bytes, count);

    rankmem_allocation_t list[8];
    memset(list, 0, sizeof list);
    is_status(rankmem_tracking_list(tr, list, 8, &count), RANKMEM_SUCCESS, "%s: list", name);
    int good = count == 4;
    for (int i = 0; good && i < 4; i++)
        good = list[i].ptr == want[i].ptr && list[i].bytes == want[i].bytes &&
               list[i].stream == want[i].stream;
    ok(good && list[4].ptr == NULL, "%s: the list is exactly the 4 leaked blocks, largest first", name);
    rankmem_allocation_t two[2];
    is_status(rankmem_tracking_list(tr, two, 2, &count), RANKMEM_SUCCESS, "%s: list into 2 slots", name);
    ok(count == 4 && two[0].ptr == want[0].ptr && two[1].ptr == want[1].ptr,
       "%s: a short array gets the 2 largest and the count of all", name);
    is_status(rankmem_tracking_list(tr, NULL, 0, &count), RANKMEM_SUCCESS, "%s: count only", name);
    ok(count == 4, "%s: count only says 4", name);

    blk_t rep[8];
    size_t rc = 0, rb = 0;
    int n = read_report(tr, rep, 8, &rc, &rb);
    good = n == 4 && rc == 4 && rb == want_bytes;
    for (int i = 0; good && i < 4; i++)
        good = rep[i].ptr == want[i].ptr && rep[i].bytes == want[i].bytes &&
               rep[i].stream == want[i].stream;
    ok(good, "%s: the report lists exactly the leaked blocks, largest first (%d lines)", name, n);

    ok(rankmem_resource_query(tr, RANKMEM_QUERY_USED_CURRENT, &bytes) == 0 && bytes == want_bytes &&
           rankmem_resource_query(tr, RANKMEM_QUERY_LIVE_COUNT, &count) == 0 && count == 4 &&
           rankmem_resource_query(tr, RANKMEM_QUERY_USED_HIGH, &bytes) == 0 &&
           bytes == want_bytes + 100 + 4096 + 12345,
       "%s: queries USED_CURRENT, LIVE_COUNT and USED_HIGH", name);

    /* Refused frees: the upstream sees none of them. */
    size_t calls = up_calls(arg);
    is_status(rankmem_deallocate_async(tr, all[1].ptr, 100, 0, S(0)), RANKMEM_ERR_INVALID_POINTER,
              "%s: double free", name);
    ok(strstr(rankmem_last_error(), "double free") != NULL, "%s: the detail says so: %s", name,
       rankmem_last_error());
    static _Alignas(256) char foreign[512];
    is_status(rankmem_deallocate(tr, foreign, 512, 0), RANKMEM_ERR_INVALID_POINTER, "%s: foreign pointer", name);
    is_status(rankmem_deallocate(tr, (char *)all[0].ptr + 256, 256, 0), RANKMEM_ERR_INVALID_POINTER,
              "%s: interior pointer", name);
    is_status(rankmem_deallocate(tr, all[0].ptr, 4000, 0), RANKMEM_ERR_INVALID_POINTER,
              "%s: wrong size", name);
    ok(strstr(rankmem_last_error(), "4096") != NULL, "%s: the detail gives the real size: %s", name,
       rankmem_last_error());
    ok(up_calls(arg) == calls, "%s: the upstream was not called for any of them", name);
    rankmem_tracking_outstanding(tr, &bytes, &count);
    ok(bytes == want_bytes && count == 4, "%s: and the block refused with a wrong size is still live", name);

    for (int i = 0; i < 4; i++)
        is_status(rankmem_deallocate_async(tr, want[i].ptr, want[i].bytes, 0, want[i].stream),
                  RANKMEM_SUCCESS, "%s: free leak %d", name, i);
    n = read_report(tr, rep, 8, &rc, &rb);
    ok(n == 0 && rc == 0 && rb == 0, "%s: an empty report has only its header", name);
    is_status(rankmem_resource_release(tr), RANKMEM_SUCCESS, "%s: released", name);
}

static size_t counting_calls(void *arg)
{
    counting_t *c = arg;
    return c->allocs + c->frees;
}

static size_t pool_calls(void *arg)
{
    /* Anything reaching the pool changes its live count or its used bytes. */
    size_t live = 0, used = 0;
    rankmem_resource_query(arg, RANKMEM_QUERY_LIVE_COUNT, &live);
    rankmem_resource_query(arg, RANKMEM_QUERY_USED_CURRENT, &used);
    return live * 1000003u + used;
}

static void over_counting_and_pool(void)
{
    int finalized;
    counting_t *up = counting_new(&finalized);
    leaks("counting", &up->base, counting_calls, up);
    ok(up->outstanding_blocks == 0, "counting: everything went back");
    rankmem_resource_release(&up->base);

    rankmem_resource_t *sys, *pool;
    rankmem_system_create(&sys);
    rankmem_pool_create(sys, NULL, &pool);
    rankmem_resource_release(sys);
    leaks("pool", pool, pool_calls, pool);
    rankmem_resource_release(pool);
}

/* ---- backtraces ---- */

/* Not static: -export-dynamic puts them in the symbol table backtrace_symbols reads. */
void *site_a(rankmem_resource_t *mr, size_t n);
void *site_b(rankmem_resource_t *mr, size_t n);

__attribute__((noinline)) void *site_a(rankmem_resource_t *mr, size_t n)
{
    void *p = NULL;
    rankmem_allocate(mr, n, 0, &p);
    __asm__ volatile("" ::: "memory"); /* no tail call: keep this frame */
    return p;
}

__attribute__((noinline)) void *site_b(rankmem_resource_t *mr, size_t n)
{
    void *p = NULL;
    rankmem_allocate_async(mr, n, 0, S(0x40), &p);
    __asm__ volatile("" ::: "memory");
    return p;
}

static void backtraces(void)
{
    rankmem_resource_t *sys, *tr;
    rankmem_system_create(&sys);
    is_status(rankmem_tracking_create(sys, 1, &tr), RANKMEM_SUCCESS, "create with backtraces");
    rankmem_resource_release(sys);
    void *a[3], *b[2];
    /* volatile bounds: an unrolled loop would make each call its own call site */
    volatile int n_a = 3, n_b = 2;
    for (int i = 0; i < n_a; i++)
        a[i] = site_a(tr, 1000 + (size_t)i);
    for (int i = 0; i < n_b; i++)
        b[i] = site_b(tr, 8192);
    FILE *f = tmpfile();
    is_status(rankmem_tracking_report(tr, f), RANKMEM_SUCCESS, "report with backtraces");
    rewind(f);
    char text[16384];
    size_t len = fread(text, 1, sizeof text - 1, f);
    text[len] = '\0';
    fclose(f);
    size_t count = 0, bytes = 0, sites = 0;
    ok(sscanf(text, "rankmem tracking: %zu live allocations, %zu bytes, %zu call sites", &count,
              &bytes, &sites) == 3 &&
           count == 5 && bytes == 3003 + 16384 && sites == 2,
       "header: 5 allocations, %d bytes, 2 call sites", 3003 + 16384);
    /* Sites are ordered by bytes: site_b's 16384 first. */
    const char *s1 = strstr(text, "call site 1 of 2: 2 allocations, 16384 bytes\n");
    const char *s2 = strstr(text, "call site 2 of 2: 3 allocations, 3003 bytes\n");
    ok(s1 && s2 && s1 < s2, "two groups, the larger first, with their counts and bytes");
    const char *na = strstr(text, "site_a"), *nb = strstr(text, "site_b");
    ok(na && nb && nb > s1 && nb < s2 && na > s2, "frames are symbolised under the right group");
    const char *own = strstr(text, "rankmem_allocate");
    ok(!own, "rankmem's own frames are left out of the stacks");
    char line[64];
    snprintf(line, sizeof line, "  0x%llx: 1002 bytes", (unsigned long long)(uintptr_t)a[2]);
    const char *l = strstr(text, line);
    ok(l && l > s2, "each block is listed under its call site");
    if (!(s1 && s2 && na && nb && l) || own)
        diag("report:\n%s", text);
    char buf[64] = "";
    tr->ops->describe(tr, buf, sizeof buf);
    ok(strcmp(buf, "tracking(backtraces=1)") == 0, "describe: %s", buf);
    for (int i = 0; i < 3; i++)
        rankmem_deallocate(tr, a[i], 1000 + (size_t)i, 0);
    for (int i = 0; i < 2; i++)
        rankmem_deallocate_async(tr, b[i], 8192, 0, S(0x40));
    rankmem_resource_release(tr);
}

/* ---- release with live allocations ---- */

static void release_with_leaks(void)
{
    int finalized;
    counting_t *up = counting_new(&finalized);
    rankmem_resource_t *tr;
    rankmem_tracking_create(&up->base, 0, &tr);
    void *p, *q;
    rankmem_allocate(tr, 300, 0, &p);
    rankmem_allocate(tr, 700, 0, &q);
    fflush(stderr);
    int saved = dup(2);
    FILE *err = tmpfile();
    dup2(fileno(err), 2);
    rankmem_status_t st = rankmem_resource_release(tr);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(err);
    char text[512] = "";
    size_t len = fread(text, 1, sizeof text - 1, err);
    text[len] = '\0';
    fclose(err);
    is_status(st, RANKMEM_SUCCESS, "release with 2 live allocations succeeds");
    ok(strstr(text, "2 live allocations (1000 bytes)") != NULL && strchr(text, '\n') == text + len - 1,
       "one line on stderr says what was left: %s", text);
    ok(up->outstanding_blocks == 2, "the upstream still holds them");
    rankmem_deallocate(&up->base, p, 300, 0);
    rankmem_deallocate(&up->base, q, 700, 0);
    rankmem_resource_release(&up->base);
    ok(finalized, "the upstream goes with its last reference");
}

/* ---- threads ---- */

typedef struct {
    rankmem_resource_t *mr;
    int errors;
} tw_t;

static void *tworker(void *arg)
{
    tw_t *w = arg;
    void *live[8] = {0};
    for (int i = 0; i < 5000; i++) {
        int k = i % 8;
        if (live[k] && rankmem_deallocate(w->mr, live[k], 256 + (size_t)k, 0) != RANKMEM_SUCCESS)
            w->errors++;
        if (rankmem_allocate(w->mr, 256 + (size_t)k, 0, &live[k]) != RANKMEM_SUCCESS)
            w->errors++;
    }
    /* Leave two behind: 256 and 257 bytes. */
    for (int k = 2; k < 8; k++)
        if (rankmem_deallocate(w->mr, live[k], 256 + (size_t)k, 0) != RANKMEM_SUCCESS)
            w->errors++;
    return NULL;
}

static void threads(void)
{
    rankmem_resource_t *sys, *tr;
    rankmem_system_create(&sys);
    rankmem_tracking_create(sys, 0, &tr);
    rankmem_resource_release(sys);
    pthread_t t[4];
    tw_t w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (tw_t){tr, 0};
        pthread_create(&t[i], NULL, tworker, &w[i]);
    }
    int errors = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        errors += w[i].errors;
    }
    size_t bytes, count;
    rankmem_tracking_outstanding(tr, &bytes, &count);
    ok(errors == 0 && count == 8 && bytes == 4 * (256 + 257),
       "4 threads: every call succeeded and exactly their 8 leaks are live (%zu, %zu)", count, bytes);
    rankmem_allocation_t list[8];
    rankmem_tracking_list(tr, list, 8, &count);
    int good = count == 8;
    for (int i = 0; good && i < 8; i++) {
        good = list[i].bytes == (i < 4 ? 257u : 256u);
        if (good)
            rankmem_deallocate(tr, list[i].ptr, list[i].bytes, 0);
    }
    ok(good, "4 threads: the list has them, largest first");
    rankmem_resource_release(tr);
}

/* 16 threads, each holding 64 known blocks at a barrier, frees of another
 * thread's blocks after it, a double free racing nothing: the shards' sums
 * exact, the list complete, the high-water mark within the documented
 * bound (16 x 8 MiB; exact with one thread). */
#define T16 16
#define HOLD 64
#define SLACK ((size_t)8 << 20)

typedef struct {
    rankmem_resource_t *mr;
    pthread_barrier_t *bar;
    int id;
    void *blk[HOLD];
    size_t size[HOLD], held;
    int errors;
} hw_t;

static hw_t hw[T16];

static size_t hsize(int id, int i) { return 64u * (size_t)(i + 1) + (size_t)id; }

static void *hworker(void *arg)
{
    hw_t *w = arg;
    for (int r = 0; r < 2000; r++) { /* churn over every shard */
        void *p;
        size_t n = hsize(w->id, r % HOLD);
        if (rankmem_allocate(w->mr, n, 0, &p) != RANKMEM_SUCCESS ||
            rankmem_deallocate(w->mr, p, n, 0) != RANKMEM_SUCCESS)
            w->errors++;
    }
    for (int i = 0; i < HOLD; i++) {
        w->size[i] = hsize(w->id, i);
        if (rankmem_allocate(w->mr, w->size[i], 0, &w->blk[i]) != RANKMEM_SUCCESS)
            w->errors++;
        else
            w->held += w->size[i];
    }
    pthread_barrier_wait(w->bar);
    pthread_barrier_wait(w->bar);
    hw_t *o = &hw[(w->id + 1) % T16];
    for (int i = 0; i < HOLD; i++)
        if (rankmem_deallocate(w->mr, o->blk[i], o->size[i], 0) != RANKMEM_SUCCESS)
            w->errors++;
    return NULL;
}

static void sixteen_threads(void)
{
    rankmem_resource_t *sys, *tr;
    rankmem_system_create(&sys);
    rankmem_tracking_create(sys, 0, &tr);
    rankmem_resource_release(sys);
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, T16 + 1);
    pthread_t t[T16];
    for (int i = 0; i < T16; i++) {
        hw[i] = (hw_t){.mr = tr, .bar = &bar, .id = i};
        pthread_create(&t[i], NULL, hworker, &hw[i]);
    }
    pthread_barrier_wait(&bar);
    size_t held = 0;
    for (int i = 0; i < T16; i++)
        held += hw[i].held;
    size_t bytes = 0, count = 0, cur = 0, live = 0;
    rankmem_tracking_outstanding(tr, &bytes, &count);
    rankmem_resource_query(tr, RANKMEM_QUERY_USED_CURRENT, &cur);
    rankmem_resource_query(tr, RANKMEM_QUERY_LIVE_COUNT, &live);
    ok(bytes == held && count == T16 * HOLD && cur == held && live == T16 * HOLD,
       "16 threads at the barrier: outstanding and queries exact (%zu in %zu; got %zu in %zu)",
       held, (size_t)T16 * HOLD, bytes, count);
    size_t n = 0;
    rankmem_tracking_list(tr, NULL, 0, &n);
    ok(n == T16 * HOLD, "16 threads at the barrier: the list has every block (%zu)", n);
    pthread_barrier_wait(&bar);
    int errors = 0;
    for (int i = 0; i < T16; i++) {
        pthread_join(t[i], NULL);
        errors += hw[i].errors;
    }
    rankmem_tracking_outstanding(tr, &bytes, &count);
    ok(errors == 0 && bytes == 0 && count == 0,
       "16 threads after join: every call succeeded, nothing live (%zu, %zu)", bytes, count);
    size_t high = 0;
    rankmem_resource_query(tr, RANKMEM_QUERY_USED_HIGH, &high);
    /* The true peak is held (nothing freed before the barrier; the churn's
     * one block a thread is under the slack). */
    ok(high + T16 * SLACK >= held && high <= held + T16 * SLACK,
       "16 threads: high-water mark %zu within 16 x 8 MiB of %zu", high, held);
    void *p;
    rankmem_allocate(tr, 1000, 0, &p);
    rankmem_deallocate(tr, p, 1000, 0);
    is_status(rankmem_deallocate(tr, p, 1000, 0), RANKMEM_ERR_INVALID_POINTER,
              "16 threads: a double free after them is still refused");
    pthread_barrier_destroy(&bar);
    rankmem_resource_release(tr);
}

/* One thread: the high-water mark is exact, over the flush size too. */
static void one_thread_high(void)
{
    rankmem_resource_t *sys, *tr;
    rankmem_system_create(&sys);
    rankmem_tracking_create(sys, 0, &tr);
    rankmem_resource_release(sys);
    void *a, *b, *c;
    rankmem_allocate(tr, 3 * SLACK + 1, 0, &a);
    rankmem_allocate(tr, 10, 0, &b);
    rankmem_deallocate(tr, a, 3 * SLACK + 1, 0);
    rankmem_allocate(tr, SLACK - 1, 0, &c);
    size_t high = 0;
    rankmem_resource_query(tr, RANKMEM_QUERY_USED_HIGH, &high);
    ok(high == 3 * SLACK + 11, "one thread: high-water mark exact (%zu)", high);
    rankmem_deallocate(tr, b, 10, 0);
    rankmem_deallocate(tr, c, SLACK - 1, 0);
    rankmem_resource_release(tr);
}

static void bad_inputs(void)
{
    rankmem_resource_t *sys, *tr, *out = (rankmem_resource_t *)0x1;
    rankmem_system_create(&sys);
    is_status(rankmem_tracking_create(NULL, 0, &out), RANKMEM_ERR_INVALID_ARGUMENT, "create: NULL upstream");
    ok(out == (rankmem_resource_t *)0x1, "create: output untouched");
    is_status(rankmem_tracking_create(sys, 0, NULL), RANKMEM_ERR_INVALID_ARGUMENT, "create: NULL output");
    rankmem_tracking_create(sys, 0, &tr);
    size_t b = 5, c = 5;
    is_status(rankmem_tracking_outstanding(NULL, &b, &c), RANKMEM_ERR_INVALID_ARGUMENT, "outstanding: NULL resource");
    is_status(rankmem_tracking_outstanding(sys, &b, &c), RANKMEM_ERR_INVALID_ARGUMENT, "outstanding: not tracking");
    ok(strstr(rankmem_last_error(), "not a tracking") != NULL, "outstanding: the detail says so: %s",
       rankmem_last_error());
    is_status(rankmem_tracking_outstanding(tr, NULL, &c), RANKMEM_ERR_INVALID_ARGUMENT, "outstanding: NULL bytes");
    is_status(rankmem_tracking_outstanding(tr, &b, NULL), RANKMEM_ERR_INVALID_ARGUMENT, "outstanding: NULL count");
    ok(b == 5 && c == 5, "outstanding: outputs untouched on failure");
    rankmem_allocation_t list[2];
    is_status(rankmem_tracking_list(NULL, list, 2, &c), RANKMEM_ERR_INVALID_ARGUMENT, "list: NULL resource");
    is_status(rankmem_tracking_list(sys, list, 2, &c), RANKMEM_ERR_INVALID_ARGUMENT, "list: not tracking");
    is_status(rankmem_tracking_list(tr, list, 2, NULL), RANKMEM_ERR_INVALID_ARGUMENT, "list: NULL count");
    is_status(rankmem_tracking_list(tr, NULL, 2, &c), RANKMEM_ERR_INVALID_ARGUMENT, "list: NULL array, capacity 2");
    is_status(rankmem_tracking_report(NULL, stdout), RANKMEM_ERR_INVALID_ARGUMENT, "report: NULL resource");
    is_status(rankmem_tracking_report(sys, stdout), RANKMEM_ERR_INVALID_ARGUMENT, "report: not tracking");
    is_status(rankmem_tracking_report(tr, NULL), RANKMEM_ERR_INVALID_ARGUMENT, "report: NULL FILE");
    is_status(rankmem_deallocate(tr, NULL, 8, 0), RANKMEM_ERR_INVALID_POINTER, "deallocate NULL");
    char buf[32] = "";
    int n = tr->ops->describe(tr, buf, sizeof buf);
    ok(n == 8 && strcmp(buf, "tracking") == 0, "describe: tracking");
    ok(tr->props == sys->props && tr->device == sys->device, "properties and device of the upstream");
    rankmem_resource_release(tr);
    rankmem_resource_release(sys);
}

/* An upstream that hands out one address, over and over. */
static char same_buf[4096] __attribute__((aligned(256)));

static rankmem_status_t same_alloc(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                   rankmem_stream_t stream, void **ptr_p)
{
    (void)mr, (void)bytes, (void)alignment, (void)stream;
    *ptr_p = same_buf;
    return RANKMEM_SUCCESS;
}

static rankmem_status_t same_free(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                  size_t alignment, rankmem_stream_t stream)
{
    (void)mr, (void)ptr, (void)bytes, (void)alignment, (void)stream;
    return RANKMEM_SUCCESS;
}

static const rankmem_resource_ops_t same_ops = {
    .size = sizeof(rankmem_resource_ops_t),
    .name = "same",
    .allocate = same_alloc,
    .deallocate = same_free,
};

/* A block freed behind tracking's back (straight to the upstream) and
 * handed out again to the same thread: the new allocation replaces the
 * stale record. */
static void freed_behind(void)
{
    static rankmem_resource_t up;
    rankmem_resource_init(&up, &same_ops, RANKMEM_PROP_HOST_ACCESSIBLE, NULL);
    rankmem_resource_t *tr;
    rankmem_tracking_create(&up, 0, &tr);
    void *p, *q;
    rankmem_allocate(tr, 100, 0, &p);
    rankmem_deallocate(&up, p, 100, 0); /* behind its back */
    is_status(rankmem_allocate(tr, 200, 0, &q), RANKMEM_SUCCESS, "freed behind: allocated again");
    size_t bytes = 0, count = 0;
    rankmem_tracking_outstanding(tr, &bytes, &count);
    ok(q == p && count == 1 && bytes == 200,
       "freed behind: the new allocation replaced the stale record (%zu in %zu)", bytes, count);
    is_status(rankmem_deallocate(tr, q, 100, 0), RANKMEM_ERR_INVALID_POINTER,
              "freed behind: the stale size is refused");
    is_status(rankmem_deallocate(tr, q, 200, 0), RANKMEM_SUCCESS,
              "freed behind: freed with the new size");
    rankmem_tracking_outstanding(tr, &bytes, &count);
    ok(count == 0 && bytes == 0, "freed behind: nothing live");
    rankmem_resource_release(tr);
}

int main(void)
{
    over_counting_and_pool();
    backtraces();
    release_with_leaks();
    threads();
    sixteen_threads();
    one_thread_high();
    bad_inputs();
    freed_behind();
    return tap_done();
}
