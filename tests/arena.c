/* The arena over a host upstream (and over a pool): randomized
 * allocate/free with overlap, alignment and content checks (fixed seeds);
 * small and large requests; address-ordered first fit and coalescing;
 * superblocks going back; exhaustion, defragmentation and the dump;
 * per-stream arenas on stand-in streams; frees from other threads and
 * streams; an 8-thread stress test (short here; `tests/arena.t --long` or
 * RANKMEM_TEST_LONG=1 for the long form); every bad input. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <math.h>
#include <rankmem.h>
#include "tap.h"
#include "counting.h"
#include "stress_harness.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define SB (64 * KiB) /* the superblock of most tests: small arenas, many superblocks */

#define SA ((rankmem_stream_t)(uintptr_t)0x1000)
#define SB_ ((rankmem_stream_t)(uintptr_t)0x2000)
#define SC ((rankmem_stream_t)(uintptr_t)0x3000)
#define SD ((rankmem_stream_t)(uintptr_t)0x4000)
#define SE ((rankmem_stream_t)(uintptr_t)0x5000)

static int long_run;

static size_t q(rankmem_resource_t *mr, rankmem_query_t what)
{
    size_t v = (size_t)-1;
    rankmem_resource_query(mr, what, &v);
    return v;
}

/* Drop the test's reference to its counting upstream once nothing is left
 * there; true when nothing was outstanding and the chain is gone. */
static int upstream_clean(counting_t *up, const int *finalized)
{
    int clean = up->outstanding_blocks == 0 && up->outstanding_bytes == 0;
    rankmem_resource_release(&up->base);
    return clean && *finalized;
}

static rankmem_resource_t *make_arena(rankmem_resource_t *up, size_t size, size_t sb, int dump)
{
    rankmem_arena_params_t prm;
    rankmem_arena_params_default(&prm);
    prm.arena_size = size;
    prm.superblock_size = sb;
    prm.dump_on_failure = dump;
    rankmem_resource_t *mr = NULL;
    if (rankmem_arena_create(up, &prm, &mr) != RANKMEM_SUCCESS)
        BAIL_OUT("arena_create(%zu, %zu): %s", size, sb, rankmem_last_error());
    return mr;
}

/* What rankmem_arena_dump writes, in a string (caller frees). */
static char *dump_string(rankmem_resource_t *mr)
{
    FILE *f = tmpfile();
    if (!f)
        BAIL_OUT("tmpfile");
    rankmem_status_t st = rankmem_arena_dump(mr, f);
    long n = ftell(f);
    char *s = calloc(1, (size_t)(n > 0 ? n : 0) + 1);
    rewind(f);
    if (n > 0 && fread(s, 1, (size_t)n, f) != (size_t)n)
        s[0] = '\0';
    fclose(f);
    if (st != RANKMEM_SUCCESS)
        s[0] = '\0';
    return s;
}

/* The number the dump gives for "N <what>" (the first such line), or -1. */
static long dump_count(rankmem_resource_t *mr, const char *what)
{
    char *d = dump_string(mr);
    const char *p = strstr(d, what);
    long v = -1;
    if (p) {
        while (p > d && p[-1] == ' ')
            p--;
        while (p > d && p[-1] >= '0' && p[-1] <= '9')
            p--;
        v = strtol(p, NULL, 10);
    }
    free(d);
    return v;
}

static int count_lines(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

/* ---- randomized runs ---- */

static size_t up_to_two_superblocks(void *arg, unsigned long long *s)
{
    (void)arg;
    return sh_log_size(s, 1, 2 * SB);
}

/* At the end, before the last frees: the peak of what was in use. */
static int note_used_high(void *arg, rankmem_resource_t *mr, long step, const sh_live_t *live,
                          int n)
{
    (void)live, (void)n;
    if (step == -1)
        *(size_t *)arg = q(mr, RANKMEM_QUERY_USED_HIGH);
    return 0;
}

static void random_run(const char *over, rankmem_resource_t *up, unsigned long long seed,
                       size_t arena_bytes, int steps, int use_streams)
{
    rankmem_resource_t *mr = make_arena(up, arena_bytes, SB, 0);
    static const rankmem_stream_t streams[] = {NULL, SA, SB_, SC};
    static const size_t aligns[] = {0, 256, 512, 4096, 65536, 1 << 20};
    size_t used_high = 0;
    /* With streams, one free in four goes on a stream of its own choosing. */
    sh_seq_config_t cfg = {.mr = mr, .steps = steps, .max_live = 512, .alloc_pct = 55,
                           .seed = seed, .size = up_to_two_superblocks,
                           .aligns = aligns, .naligns = sizeof aligns / sizeof aligns[0],
                           .streams = use_streams ? streams : NULL,
                           .nstreams = use_streams ? 4 : 0, .other_stream_pct = 25,
                           .large_above = SB, .refusal = RANKMEM_ERR_OUT_OF_MEMORY,
                           .hook = note_used_high, .arg = &used_high};
    sh_seq_result_t res;
    sh_seq_run(&cfg, &res);
    ok(res.allocs > steps / 4 && res.large > 0,
       "%s seed %llu: %ld allocations served, %ld large (%ld out of memory)", over, seed,
       res.allocs, res.large, res.refused);
    ok(res.overlaps == 0, "%s seed %llu: no two live blocks overlap (%ld)", over, seed,
       res.overlaps);
    ok(res.misaligned == 0, "%s seed %llu: every block has its alignment (%ld)", over, seed,
       res.misaligned);
    ok(res.corrupt == 0, "%s seed %llu: contents survive until freed (%ld)", over, seed,
       res.corrupt);
    ok(res.errors == 0, "%s seed %llu: every call returned success or out of memory (%ld)", over,
       seed, res.errors);
    if (use_streams)
        ok(res.cross > 0, "%s seed %llu: %ld blocks were freed on another stream", over, seed,
           res.cross);
    ok(q(mr, RANKMEM_QUERY_USED_CURRENT) == 0 && q(mr, RANKMEM_QUERY_LIVE_COUNT) == 0,
       "%s seed %llu: nothing in use at the end", over, seed);
    ok(used_high > 0 && used_high <= arena_bytes && q(mr, RANKMEM_QUERY_RESERVED_HIGH) <= arena_bytes,
       "%s seed %llu: used high %zu, reserved high %zu, within the arena", over, seed, used_high,
       q(mr, RANKMEM_QUERY_RESERVED_HIGH));
    is_status(rankmem_resource_trim(mr, 0), RANKMEM_SUCCESS, "%s seed %llu: trim", over, seed);
    ok(q(mr, RANKMEM_QUERY_RESERVED_CURRENT) == 0 && q(mr, RANKMEM_QUERY_FREE_BLOCKS) == 1,
       "%s seed %llu: every superblock back, the global arena one free range again (%zu reserved, "
       "%zu free blocks)",
       over, seed, q(mr, RANKMEM_QUERY_RESERVED_CURRENT), q(mr, RANKMEM_QUERY_FREE_BLOCKS));
    void *all = NULL;
    is_status(rankmem_allocate(mr, arena_bytes, 0, &all), RANKMEM_SUCCESS,
              "%s seed %llu: the whole arena in one block after that", over, seed);
    rankmem_deallocate(mr, all, arena_bytes, 0);
    is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "%s seed %llu: released", over, seed);
}

static void test_random(void)
{
    int finalized;
    counting_t *up = counting_new(&finalized);
    random_run("host", &up->base, 1, 4 * MiB, 20000, 0);
    random_run("host", &up->base, 2, 2 * MiB, 20000, 0); /* tight: runs out, defragments */
    random_run("host+streams", &up->base, 3, 4 * MiB, 20000, 1);
    random_run("host+streams", &up->base, 4, 2 * MiB, 20000, 1);
    ok(up->allocs == 4, "host: one upstream allocation per arena (%zu)", up->allocs);
    ok(upstream_clean(up, &finalized), "host: all given back, chain gone");

    /* Over a pool: the global arena is one block of the pool. */
    up = counting_new(&finalized);
    rankmem_pool_params_t pp;
    rankmem_pool_params_default(&pp);
    rankmem_resource_t *pool;
    if (rankmem_pool_create(&up->base, &pp, &pool) != RANKMEM_SUCCESS)
        BAIL_OUT("pool_create: %s", rankmem_last_error());
    random_run("pool", pool, 5, 4 * MiB, 20000, 0);
    random_run("pool+streams", pool, 6, 3 * MiB, 20000, 1);
    ok(q(pool, RANKMEM_QUERY_LIVE_COUNT) == 0, "pool: the arenas gave their blocks back");
    is_status(rankmem_resource_release(pool), RANKMEM_SUCCESS, "pool released");
    ok(upstream_clean(up, &finalized), "pool: chain gone, nothing outstanding");
}

/* ---- placement: first fit, coalescing, small and large ---- */

static void test_placement(void)
{
    int finalized;
    counting_t *up = counting_new(&finalized);
    rankmem_resource_t *mr = make_arena(&up->base, 1 * MiB, SB, 0);
    unsigned props = 0;
    rankmem_resource_properties(mr, &props);
    ok((props & RANKMEM_PROP_STREAM_ORDERED) && (props & RANKMEM_PROP_HOST_ACCESSIBLE),
       "stream-ordered and host-accessible over a host upstream");
    ok(up->allocs == 1 && up->outstanding_bytes == 1 * MiB, "one upstream allocation of the arena size");
    ok(q(mr, RANKMEM_QUERY_POOL_MAX) == 1 * MiB, "POOL_MAX is the arena size");
    ok(q(mr, RANKMEM_QUERY_RESERVED_CURRENT) == 0, "nothing handed to arenas yet");

    void *a, *b, *c, *d;
    rankmem_allocate(mr, 1000, 0, &a);
    rankmem_allocate(mr, 4096, 0, &b);
    rankmem_allocate(mr, 256, 0, &c);
    ok(q(mr, RANKMEM_QUERY_RESERVED_CURRENT) == SB, "small requests took one superblock");
    ok((char *)b == (char *)a + 1024 && (char *)c == (char *)b + 4096,
       "consecutive blocks are placed in address order, 256-byte units");
    rankmem_deallocate(mr, b, 4096, 0);
    rankmem_allocate(mr, 2000, 0, &d);
    ok(d == b, "first fit: a smaller request reuses the lowest hole");
    rankmem_deallocate(mr, a, 1000, 0);
    rankmem_deallocate(mr, d, 2000, 0);
    void *e;
    rankmem_allocate(mr, 1024 + 4096, 0, &e);
    ok(e == a, "freed neighbours coalesce: a block over both holes lands at the first");
    void *f;
    rankmem_allocate(mr, 300, 4096, &f);
    ok((uintptr_t)f % 4096 == 0 && (char *)f > (char *)c, "an aligned request skips to an aligned unit");
    rankmem_deallocate(mr, e, 1024 + 4096, 0);
    rankmem_deallocate(mr, c, 256, 0);
    rankmem_deallocate(mr, f, 300, 4096);
    ok(q(mr, RANKMEM_QUERY_RESERVED_CURRENT) == SB && q(mr, RANKMEM_QUERY_FREE_BLOCKS) == 2,
       "all freed: the arena keeps its one empty superblock (one run), the global arena one range");

    /* Large: straight from the global arena, at its own size. */
    void *big;
    is_status(rankmem_allocate(mr, SB + 1, 0, &big), RANKMEM_SUCCESS, "a request above a superblock");
    ok(q(mr, RANKMEM_QUERY_RESERVED_CURRENT) == SB + SB + 256,
       "is a large block of its own size, rounded to 256 (%zu reserved)",
       q(mr, RANKMEM_QUERY_RESERVED_CURRENT));
    char *dump = dump_string(mr);
    ok(strstr(dump, "large block") != NULL, "the dump lists the large block");
    free(dump);
    void *small;
    rankmem_allocate(mr, 512, 0, &small);
    ok((char *)small < (char *)big || (char *)small >= (char *)big + SB + 256,
       "small blocks stay out of the large block");
    rankmem_deallocate(mr, small, 512, 0);
    rankmem_deallocate(mr, big, SB + 1, 0);
    ok(q(mr, RANKMEM_QUERY_RESERVED_CURRENT) == SB && q(mr, RANKMEM_QUERY_USED_CURRENT) == 0,
       "a freed large block goes straight back");
    ok(q(mr, RANKMEM_QUERY_RESERVED_HIGH) == 2 * SB + 256, "reserved high-water mark %zu",
       q(mr, RANKMEM_QUERY_RESERVED_HIGH));
    ok(q(mr, RANKMEM_QUERY_USED_HIGH) == SB + 1 + 512, "used high-water mark %zu",
       q(mr, RANKMEM_QUERY_USED_HIGH));

    /* A whole superblock fits in a superblock; an alignment above one is large. */
    void *whole, *al;
    is_status(rankmem_allocate(mr, SB, 0, &whole), RANKMEM_SUCCESS, "a request of exactly a superblock");
    is_status(rankmem_allocate(mr, 256, 2 * SB, &al), RANKMEM_SUCCESS, "a small request aligned above a superblock");
    ok((uintptr_t)al % (2 * SB) == 0, "has its alignment");
    rankmem_deallocate(mr, whole, SB, 0);
    rankmem_deallocate(mr, al, 256, 2 * SB);
    is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "released");
    ok(upstream_clean(up, &finalized), "nothing left upstream");
}

/* ---- superblocks going back, exhaustion, defragmentation, dump ---- */

static void test_superblocks(void)
{
    int finalized;
    counting_t *up = counting_new(&finalized);
    rankmem_resource_t *mr = make_arena(&up->base, 8 * SB, SB, 0);
    void *p[16];
    for (int i = 0; i < 12; i++)
        rankmem_allocate(mr, 16 * KiB, 0, &p[i]); /* 3 superblocks */
    ok(q(mr, RANKMEM_QUERY_RESERVED_CURRENT) == 3 * SB, "12 quarters fill 3 superblocks");
    for (int i = 0; i < 12; i++)
        rankmem_deallocate(mr, p[i], 16 * KiB, 0);
    ok(q(mr, RANKMEM_QUERY_RESERVED_CURRENT) == SB,
       "emptied superblocks went back but one, kept against ping-pong (%zu)",
       q(mr, RANKMEM_QUERY_RESERVED_CURRENT));
    ok(q(mr, RANKMEM_QUERY_FREE_BLOCKS) == 2, "the returned ones coalesced in the global arena");
    is_status(rankmem_resource_trim(mr, SB), RANKMEM_SUCCESS, "trim keeping one superblock");
    ok(q(mr, RANKMEM_QUERY_RESERVED_CURRENT) == SB, "kept it");
    is_status(rankmem_resource_trim(mr, 0), RANKMEM_SUCCESS, "trim to 0");
    ok(q(mr, RANKMEM_QUERY_RESERVED_CURRENT) == 0 && q(mr, RANKMEM_QUERY_FREE_BLOCKS) == 1,
       "every superblock back in the global arena");

    /* Exhaustion, then defragmentation: 8 streams each keep an empty superblock. */
    rankmem_stream_t s[8];
    for (int i = 0; i < 8; i++) {
        s[i] = (rankmem_stream_t)(uintptr_t)(0x10000 * (i + 1));
        void *x;
        rankmem_allocate_async(mr, 1000, 0, s[i], &x);
        rankmem_deallocate_async(mr, x, 1000, 0, s[i]);
    }
    ok(q(mr, RANKMEM_QUERY_RESERVED_CURRENT) == 8 * SB,
       "8 stream arenas each keep an empty superblock: the global arena has none left");
    char *dump = dump_string(mr);
    ok(count_lines(dump, "superblock 0x") == 8 && count_lines(dump, "(stream 0x") == 8,
       "the dump lists 8 stream arenas with a superblock each");
    free(dump);
    void *x;
    long waits = dump_count(mr, "stream waits for memory taken");
    is_status(rankmem_allocate_async(mr, 1000, 0, SE, &x), RANKMEM_SUCCESS,
              "a ninth stream still gets memory: the arena defragmented");
    ok(q(mr, RANKMEM_QUERY_RESERVED_CURRENT) == SB, "the other arenas gave their superblocks back");
    long waits2 = dump_count(mr, "stream waits for memory taken");
    ok(waits >= 0 && waits2 > waits,
       "taking memory other streams freed made the new stream wait for them (%ld, then %ld)",
       waits, waits2);
    rankmem_deallocate_async(mr, x, 1000, 0, SE);

    /* Exhaustion for real: out of memory, the detail, and the dump. */
    void *blk[8];
    int good = 1;
    for (int i = 0; i < 8; i++)
        good &= rankmem_allocate(mr, SB, 0, &blk[i]) == RANKMEM_SUCCESS;
    ok(good, "8 superblock-sized blocks fill the arena");
    is_status(rankmem_allocate(mr, 256, 0, &x), RANKMEM_ERR_OUT_OF_MEMORY, "a full arena says out of memory");
    ok(strstr(rankmem_last_error(), "arena") && strstr(rankmem_last_error(), "256 bytes"),
       "the detail names the arena and the size: %s", rankmem_last_error());
    is_status(rankmem_allocate(mr, 2 * SB, 0, &x), RANKMEM_ERR_OUT_OF_MEMORY, "a large request too");
    ok(strstr(rankmem_last_error(), "global arena") != NULL, "detail: %s", rankmem_last_error());
    dump = dump_string(mr);
    ok(count_lines(dump, "superblock 0x") == 8 && strstr(dump, "0 of 65536 bytes free"),
       "rankmem_arena_dump lists the 8 full superblocks");
    free(dump);
    rankmem_deallocate(mr, blk[3], SB, 0);
    is_status(rankmem_allocate(mr, 256, 0, &x), RANKMEM_SUCCESS, "works again after a free");
    rankmem_deallocate(mr, x, 256, 0);
    for (int i = 0; i < 8; i++)
        if (i != 3)
            rankmem_deallocate(mr, blk[i], SB, 0);
    is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "released");

    /* dump_on_failure writes the state to stderr. */
    mr = make_arena(&up->base, 2 * SB, SB, 1);
    rankmem_allocate(mr, SB, 0, &blk[0]);
    rankmem_allocate(mr, SB, 0, &blk[1]);
    fflush(stderr);
    FILE *cap = tmpfile();
    int saved = dup(2);
    dup2(fileno(cap), 2);
    rankmem_status_t st = rankmem_allocate(mr, 300, 0, &x);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    char text[4096] = "";
    rewind(cap);
    size_t got = fread(text, 1, sizeof text - 1, cap);
    text[got] = '\0';
    fclose(cap);
    is_status(st, RANKMEM_ERR_OUT_OF_MEMORY, "dump_on_failure: out of memory");
    ok(strstr(text, "allocate of 300 bytes") && count_lines(text, "superblock 0x") == 2,
       "and the state went to stderr, with both superblocks");
    rankmem_deallocate(mr, blk[0], SB, 0);
    rankmem_deallocate(mr, blk[1], SB, 0);
    rankmem_resource_release(mr);
    ok(upstream_clean(up, &finalized), "nothing left upstream");
}

/* ---- streams ---- */

static void test_streams(void)
{
    int finalized;
    counting_t *up = counting_new(&finalized);
    rankmem_resource_t *mr = make_arena(&up->base, 16 * SB, SB, 0);
    void *a, *b, *n0;
    rankmem_allocate_async(mr, 1000, 0, SA, &a);
    rankmem_allocate_async(mr, 1000, 0, SB_, &b);
    rankmem_allocate_async(mr, 1000, 0, NULL, &n0);
    ok((uintptr_t)a / SB != (uintptr_t)b / SB && (uintptr_t)a / SB != (uintptr_t)n0 / SB,
       "each stream (and the default stream's thread) has its own arena and superblock");
    ok(q(mr, RANKMEM_QUERY_RESERVED_CURRENT) == 3 * SB, "three superblocks out");
    rankmem_deallocate_async(mr, a, 1000, 0, SA);
    void *a2;
    rankmem_allocate_async(mr, 1000, 0, SA, &a2);
    ok(a2 == a, "a block freed on A is reused on A at once");

    /* Freed on another stream: held until A's stream waits for B. */
    void *q4[4];
    rankmem_deallocate_async(mr, a2, 1000, 0, SA);
    for (int i = 0; i < 4; i++)
        rankmem_allocate_async(mr, 16 * KiB, 0, SA, &q4[i]);
    ok(q(mr, RANKMEM_QUERY_RESERVED_CURRENT) == 3 * SB, "four quarters fill A's superblock");
    is_status(rankmem_deallocate_async(mr, q4[1], 16 * KiB, 0, SB_), RANKMEM_SUCCESS,
              "a block of A freed on B");
    ok(q(mr, RANKMEM_QUERY_USED_CURRENT) == 3 * 16 * KiB + 2000, "no longer in use");
    char *dump = dump_string(mr);
    ok(strstr(dump, "1 pending frees from other streams, 0 stream waits") != NULL,
       "A's arena holds it as a pending free");
    free(dump);
    is_status(rankmem_deallocate_async(mr, q4[1], 16 * KiB, 0, SA), RANKMEM_ERR_INVALID_POINTER,
              "freeing it again is a double free");
    void *again;
    rankmem_allocate_async(mr, 16 * KiB, 0, SA, &again);
    ok(again == q4[1], "when A runs out, it waits for B and reuses the block");
    ok(q(mr, RANKMEM_QUERY_RESERVED_CURRENT) == 3 * SB, "without taking another superblock");
    dump = dump_string(mr);
    ok(strstr(dump, "0 pending frees from other streams, 1 stream waits") != NULL,
       "one stream wait for the pending free");
    free(dump);
    /* Many frees on other streams: each is held, then drained together. */
    rankmem_deallocate_async(mr, again, 16 * KiB, 0, SC);
    rankmem_deallocate_async(mr, q4[0], 16 * KiB, 0, SD);
    rankmem_deallocate_async(mr, q4[2], 16 * KiB, 0, SC);
    ok(q(mr, RANKMEM_QUERY_FREE_BLOCKS) >= 3, "pending frees count as free blocks");
    void *half;
    rankmem_allocate_async(mr, 48 * KiB, 0, SA, &half);
    ok(half == q4[0], "drained and coalesced: three quarters in one block");
    dump = dump_string(mr);
    ok(strstr(dump, "0 pending frees from other streams, 3 stream waits") != NULL,
       "one wait per stream (C and D), three in all");
    free(dump);
    rankmem_deallocate_async(mr, half, 48 * KiB, 0, SA);
    rankmem_deallocate_async(mr, q4[3], 16 * KiB, 0, SA);
    rankmem_deallocate_async(mr, b, 1000, 0, SB_);
    rankmem_deallocate_async(mr, n0, 1000, 0, NULL);

    /* Large blocks freed on a stream: whoever takes that memory next waits. */
    void *big, *big2;
    rankmem_allocate_async(mr, 3 * SB, 0, SC, &big);
    rankmem_deallocate_async(mr, big, 3 * SB, 0, SD);
    rankmem_allocate_async(mr, 3 * SB, 0, SC, &big2);
    dump = dump_string(mr);
    ok(big2 == big && strstr(dump, "1 stream waits for memory taken") != NULL,
       "a large block freed on D and taken on C made C wait for D");
    free(dump);
    rankmem_allocate_async(mr, 3 * SB, 0, SD, &big);
    rankmem_deallocate_async(mr, big, 3 * SB, 0, SD);
    rankmem_allocate_async(mr, 3 * SB, 0, SD, &big);
    dump = dump_string(mr);
    ok(strstr(dump, "1 stream waits for memory taken") != NULL,
       "taking back memory freed on the same stream needs no wait");
    free(dump);
    rankmem_deallocate_async(mr, big, 3 * SB, 0, SD);
    rankmem_deallocate_async(mr, big2, 3 * SB, 0, SC);

    /* Forgetting streams: what they freed needs no wait any more. */
    void *f[4];
    for (int i = 0; i < 4; i++)
        rankmem_allocate_async(mr, 16 * KiB, 0, SA, &f[i]);
    rankmem_deallocate_async(mr, f[2], 16 * KiB, 0, SB_); /* pending in A's arena */
    rankmem_allocate_async(mr, 3 * SB, 0, SC, &big);
    rankmem_deallocate_async(mr, big, 3 * SB, 0, SB_);    /* a free range freed on B */
    dump = dump_string(mr);
    ok(strstr(dump, "1 pending frees") && strstr(dump, " 0x2000"),
       "before: a pending free from B, a free range freed on B");
    free(dump);
    is_status(rankmem_arena_forget_stream(mr, SB_), RANKMEM_SUCCESS, "forget stream B");
    is_status(rankmem_arena_forget_stream(mr, SC), RANKMEM_SUCCESS, "forget stream C");
    is_status(rankmem_arena_forget_stream(mr, SD), RANKMEM_SUCCESS, "forget stream D");
    dump = dump_string(mr);
    ok(!strstr(dump, "1 pending frees") && !strstr(dump, "freed on") &&
       strstr(dump, "(stream 0x2000, forgotten)"),
       "after: B's pending free is free, no range remembers B, C or D, B's arena is marked");
    free(dump);
    long w0 = dump_count(mr, "stream waits for memory taken");
    long p0 = dump_count(mr, "stream waits for them");
    rankmem_allocate_async(mr, 3 * SB, 0, SC, &big2);
    void *again2;
    rankmem_allocate_async(mr, 16 * KiB, 0, SA, &again2);
    ok(big2 == big && again2 == f[2] && dump_count(mr, "stream waits for memory taken") == w0,
       "their memory is reused without a wait");
    rankmem_allocate_async(mr, 1000, 0, SB_, &b);
    dump = dump_string(mr);
    ok(strstr(dump, "(stream 0x2000)") != NULL && p0 >= 0, "B used again: its arena is no longer forgotten");
    free(dump);
    rankmem_deallocate_async(mr, b, 1000, 0, SB_);
    rankmem_deallocate_async(mr, big2, 3 * SB, 0, SC);
    rankmem_deallocate_async(mr, again2, 16 * KiB, 0, SA);
    for (int i = 0; i < 4; i++)
        if (i != 2)
            rankmem_deallocate_async(mr, f[i], 16 * KiB, 0, SA);
    ok(q(mr, RANKMEM_QUERY_LIVE_COUNT) == 0, "nothing live");
    rankmem_resource_release(mr);
    ok(upstream_clean(up, &finalized), "nothing left upstream");
}

/* ---- threads: frees from another thread; per-thread arenas ---- */

static rankmem_resource_t *xmr;
/* The peak in use with several arenas comes from a shared total that each
 * arena moves only when its use runs 256 KiB above its part or a superblock
 * below it: the answer lies within those bounds of the true peak, at least
 * the largest arena's own peak and never above the peak reserved. */
static void test_used_high_arenas(void)
{
    int finalized;
    counting_t *up = counting_new(&finalized);
    const size_t sb = MiB, blk = 900 * KiB;
    rankmem_resource_t *mr = make_arena(&up->base, 8 * sb, sb, 0);
    void *a, *b;
    /* A's part rises to 900 KiB and stays there after the free. */
    for (int i = 0; i < 100; i++) {
        rankmem_allocate_async(mr, blk, 0, SA, &a);
        rankmem_deallocate_async(mr, a, blk, 0, SA);
    }
    /* A's empty superblock goes back: nothing is reserved, A's part stays. */
    is_status(rankmem_resource_trim(mr, 0), RANKMEM_SUCCESS, "trim");
    ok(q(mr, RANKMEM_QUERY_RESERVED_CURRENT) == 0, "nothing reserved after trim");
    rankmem_allocate_async(mr, blk, 0, SB_, &b);
    /* True peak: 900 KiB at any time; A's stale part and B's make 1800 KiB. */
    size_t high = q(mr, RANKMEM_QUERY_USED_HIGH), rhigh = q(mr, RANKMEM_QUERY_RESERVED_HIGH);
    ok(rhigh == sb, "peak reserved: one superblock (%zu)", rhigh);
    ok(high >= blk && high <= rhigh,
       "peak in use %zu: at least the largest arena's %zu, at most the peak reserved %zu", high,
       blk, rhigh);
    /* Under the band: both arenas in use at once, their parts not moved. */
    void *a2, *b2;
    rankmem_allocate_async(mr, 100 * KiB, 0, SA, &a2);
    rankmem_allocate_async(mr, 100 * KiB, 0, SB_, &b2);
    size_t truth = blk + 200 * KiB;
    high = q(mr, RANKMEM_QUERY_USED_HIGH);
    rhigh = q(mr, RANKMEM_QUERY_RESERVED_HIGH);
    ok(high + 2 * 256 * KiB >= truth && high <= truth + 2 * sb && high <= rhigh,
       "peak in use %zu: within 2 x 256 KiB below and 2 superblocks above the true %zu, at "
       "most the peak reserved %zu",
       high, truth, rhigh);
    rankmem_deallocate_async(mr, a2, 100 * KiB, 0, SA);
    rankmem_deallocate_async(mr, b2, 100 * KiB, 0, SB_);
    rankmem_deallocate_async(mr, b, blk, 0, SB_);
    ok(q(mr, RANKMEM_QUERY_USED_CURRENT) == 0 && q(mr, RANKMEM_QUERY_LIVE_COUNT) == 0,
       "in use now is exact: nothing");
    rankmem_resource_release(mr);
    ok(upstream_clean(up, &finalized), "peak with several arenas: nothing left upstream");
}

static void *xptr[64];

static void *alloc_thread(void *arg)
{
    (void)arg;
    for (int i = 0; i < 64; i++)
        if (rankmem_allocate(xmr, 700, 0, &xptr[i]) != RANKMEM_SUCCESS)
            xptr[i] = NULL;
    return NULL;
}

static void *free_thread(void *arg)
{
    (void)arg;
    intptr_t bad = 0;
    for (int i = 0; i < 64; i++)
        bad += rankmem_deallocate(xmr, xptr[i], 700, 0) != RANKMEM_SUCCESS;
    return (void *)bad;
}

static void test_cross_thread(void)
{
    int finalized;
    counting_t *up = counting_new(&finalized);
    xmr = make_arena(&up->base, 16 * SB, SB, 0);
    void *mine;
    rankmem_allocate(xmr, 700, 0, &mine);
    pthread_t t;
    pthread_create(&t, NULL, alloc_thread, NULL);
    pthread_join(t, NULL);
    int all = 1;
    for (int i = 0; i < 64; i++)
        all &= xptr[i] != NULL && (uintptr_t)xptr[i] / SB != (uintptr_t)mine / SB;
    ok(all, "another thread on the default stream has an arena of its own");
    void *r;
    pthread_create(&t, NULL, free_thread, NULL);
    pthread_join(t, &r);
    ok(r == NULL, "a third thread frees all its blocks");
    ok(q(xmr, RANKMEM_QUERY_LIVE_COUNT) == 1 && q(xmr, RANKMEM_QUERY_USED_CURRENT) == 700,
       "they are free; this thread's block is still live");
    /* The exited thread's arena is adopted by the next thread (bounded memory). */
    pthread_create(&t, NULL, alloc_thread, NULL);
    pthread_join(t, NULL);
    char *dump = dump_string(xmr);
    ok(count_lines(dump, "a thread's, default stream") == 2,
       "a new thread reuses an exited thread's arena (2 arenas, not 3)");
    free(dump);
    for (int i = 0; i < 64; i++)
        rankmem_deallocate(xmr, xptr[i], 700, 0);
    rankmem_deallocate(xmr, mine, 700, 0);
    rankmem_resource_release(xmr);
    ok(upstream_clean(up, &finalized), "nothing left upstream");
}

/* ---- 8-thread stress: own streams, handoffs, a bounded arena ---- */

#define NTHREADS 8

static int stress_steps;

/* Mostly small; one in 16 up to three superblocks. */
static size_t stress_size(void *arg, unsigned r, unsigned long long *s)
{
    (void)arg;
    return r % 16 == 0 ? 1 + sh_rng(s) % (3 * SB) : 1 + sh_rng(s) % (16 * KiB);
}

static void stress(const char *what, size_t arena_bytes)
{
    int finalized;
    counting_t *up = counting_new(&finalized);
    rankmem_resource_t *smr = make_arena(&up->base, arena_bytes, SB, 0);
    /* Threads 0 and 1 share the default stream (per-thread arenas); the others have their own. */
    sh_config_t cfg = {.mr = smr, .threads = NTHREADS, .steps = stress_steps, .live = 32,
                       .seed = 12345, .handoff_mod = 7, .take_mod = 11, .default_streams = 2,
                       .refusal = RANKMEM_ERR_OUT_OF_MEMORY, .size = stress_size,
                       .hook = sh_hook_trim};
    sh_result_t res;
    sh_run(&cfg, &res);
    sh_report(&res, what, NTHREADS * stress_steps / 4); /* refused: out of memory */
    ok(q(smr, RANKMEM_QUERY_LIVE_COUNT) == 0 && q(smr, RANKMEM_QUERY_USED_CURRENT) == 0,
       "%s: nothing live at the end", what);
    ok(q(smr, RANKMEM_QUERY_RESERVED_HIGH) <= arena_bytes, "%s: reserved high %zu within the arena",
       what, q(smr, RANKMEM_QUERY_RESERVED_HIGH));
    is_status(rankmem_resource_trim(smr, 0), RANKMEM_SUCCESS, "%s: trim", what);
    ok(q(smr, RANKMEM_QUERY_RESERVED_CURRENT) == 0 && q(smr, RANKMEM_QUERY_FREE_BLOCKS) == 1,
       "%s: every superblock back and coalesced (%zu reserved, %zu free ranges)", what,
       q(smr, RANKMEM_QUERY_RESERVED_CURRENT), q(smr, RANKMEM_QUERY_FREE_BLOCKS));
    is_status(rankmem_resource_release(smr), RANKMEM_SUCCESS, "%s: released", what);
    ok(upstream_clean(up, &finalized), "%s: nothing left upstream", what);
}

/* ---- fragmentation on a power-law trace ---- */

static void test_fragmentation(void)
{
    int finalized;
    counting_t *up = counting_new(&finalized);
    rankmem_resource_t *mr = make_arena(&up->base, 2048 * MiB, 0, 0); /* default 4 MiB superblocks */
    enum { SLOTS = 4096 };
    static struct {
        void *p;
        size_t n;
        int death;
    } live[SLOTS];
    int nlive = 0, fails = 0;
    test_seed(77);
    for (int step = 0; step < 17000; step++) {
        for (int i = 0; i < nlive;) /* free what died */
            if (live[i].death <= step) {
                fails += rankmem_deallocate(mr, live[i].p, live[i].n, 0) != RANKMEM_SUCCESS;
                live[i] = live[--nlive];
            } else
                i++;
        if (nlive == SLOTS)
            continue;
        /* Power-law sizes, 256 B to 64 MiB: p(s) ~ s^-1.25, drawn by inverse CDF. */
        double u = (double)(test_rand() >> 11) / (double)(1ull << 53);
        double lo = pow(256.0, -0.25), hi = pow(64.0 * MiB, -0.25);
        size_t n = (size_t)pow(lo + u * (hi - lo), -4.0);
        n = n < 256 ? 256 : n > 64 * MiB ? 64 * MiB : n;
        /* Lifetimes: mostly a few steps, some hundreds, a few thousands. */
        unsigned r = (unsigned)(test_rand() % 100);
        int life = r < 70 ? 1 + (int)(test_rand() % 8)
                 : r < 93 ? 1 + (int)(test_rand() % 600)
                          : 1 + (int)(test_rand() % 8000);
        void *p;
        if (rankmem_allocate(mr, n, 0, &p) != RANKMEM_SUCCESS) {
            fails++;
            continue;
        }
        live[nlive].p = p, live[nlive].n = n, live[nlive].death = step + life;
        nlive++;
    }
    for (int i = 0; i < nlive; i++)
        rankmem_deallocate(mr, live[i].p, live[i].n, 0);
    double ratio = (double)q(mr, RANKMEM_QUERY_RESERVED_HIGH) / (double)q(mr, RANKMEM_QUERY_USED_HIGH);
    ok(fails == 0, "power-law trace: every call succeeded (%d failures)", fails);
    ok(ratio <= 1.15, "power-law trace: peak reserved / peak live = %.3f (%zu / %zu), at most 1.15",
       ratio, q(mr, RANKMEM_QUERY_RESERVED_HIGH), q(mr, RANKMEM_QUERY_USED_HIGH));
    rankmem_resource_release(mr);
    ok(upstream_clean(up, &finalized), "power-law trace: nothing left upstream");
}

/* ---- bad inputs ---- */

static void test_bad_inputs(void)
{
    int finalized;
    counting_t *up = counting_new(&finalized);
    rankmem_arena_params_t prm, bad;
    is_status(rankmem_arena_params_default(NULL), RANKMEM_ERR_INVALID_ARGUMENT, "params_default: NULL");
    is_status(rankmem_arena_params_default(&prm), RANKMEM_SUCCESS, "params_default");
    ok(prm.size == sizeof prm && prm.arena_size == 0 && prm.superblock_size == 0 && !prm.dump_on_failure,
       "defaults: size and superblock chosen by the arena, no dump");
    prm.arena_size = 1 * MiB;
    prm.superblock_size = SB;
    rankmem_resource_t *none = NULL, *mr;
    is_status(rankmem_arena_create(NULL, &prm, &none), RANKMEM_ERR_INVALID_ARGUMENT, "create: NULL upstream");
    is_status(rankmem_arena_create(&up->base, &prm, NULL), RANKMEM_ERR_INVALID_ARGUMENT, "create: NULL output");
    bad = prm;
    bad.size = 3;
    is_status(rankmem_arena_create(&up->base, &bad, &none), RANKMEM_ERR_INVALID_ARGUMENT, "create: params.size not set");
    bad = prm;
    bad.superblock_size = 96 * KiB;
    is_status(rankmem_arena_create(&up->base, &bad, &none), RANKMEM_ERR_INVALID_ARGUMENT, "create: superblock not a power of two");
    ok(strstr(rankmem_last_error(), "power of two") != NULL, "says why: %s", rankmem_last_error());
    bad.superblock_size = 32 * KiB;
    is_status(rankmem_arena_create(&up->base, &bad, &none), RANKMEM_ERR_INVALID_ARGUMENT, "create: superblock below 64 KiB");
    bad.superblock_size = (size_t)2 << 30;
    bad.arena_size = (size_t)4 << 30;
    is_status(rankmem_arena_create(&up->base, &bad, &none), RANKMEM_ERR_INVALID_ARGUMENT, "create: superblock above 1 GiB");
    bad = prm;
    bad.arena_size = SB - 1;
    is_status(rankmem_arena_create(&up->base, &bad, &none), RANKMEM_ERR_INVALID_ARGUMENT, "create: arena smaller than a superblock");
    bad.arena_size = SIZE_MAX;
    is_status(rankmem_arena_create(&up->base, &bad, &none), RANKMEM_ERR_INVALID_ARGUMENT, "create: absurd arena size");
    up->fail_above = 1 * KiB;
    is_status(rankmem_arena_create(&up->base, &prm, &none), RANKMEM_ERR_OUT_OF_MEMORY, "create: the upstream refuses the arena");
    ok(strstr(rankmem_last_error(), "1048576 bytes for the global arena") != NULL, "says so: %s", rankmem_last_error());
    /* Default size: half of physical memory over a host upstream. */
    rankmem_arena_params_t def;
    rankmem_arena_params_default(&def);
    is_status(rankmem_arena_create(&up->base, &def, &none), RANKMEM_ERR_OUT_OF_MEMORY, "create: default size, refused");
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    char want[64];
    snprintf(want, sizeof want, "refused %zu bytes", ((size_t)pages / 2 * (size_t)page) & ~(size_t)255);
    ok(strstr(rankmem_last_error(), want) != NULL, "the default asks for half of physical memory: %s",
       rankmem_last_error());
    up->fail_above = 0;
    ok(none == NULL && up->base.refcount == 1 && up->outstanding_blocks == 0,
       "failed creates leave nothing behind, the output untouched");

    mr = make_arena(&up->base, 1 * MiB, SB, 0);
    void *p = NULL, *big = NULL;
    rankmem_allocate(mr, 1000, 0, &p);
    rankmem_allocate(mr, 2 * SB, 0, &big);
    size_t used = q(mr, RANKMEM_QUERY_USED_CURRENT), live = q(mr, RANKMEM_QUERY_LIVE_COUNT);
    void *out = NULL;
    is_status(rankmem_allocate(mr, 0, 0, &out), RANKMEM_ERR_INVALID_ARGUMENT, "allocate: 0 bytes");
    is_status(rankmem_allocate(mr, 100, 0, NULL), RANKMEM_ERR_INVALID_ARGUMENT, "allocate: NULL output");
    is_status(rankmem_allocate(mr, 100, 300, &out), RANKMEM_ERR_INVALID_ARGUMENT, "allocate: alignment not a power of two");
    is_status(rankmem_allocate(mr, SIZE_MAX / 2, 0, &out), RANKMEM_ERR_OUT_OF_MEMORY, "allocate: absurd size");
    is_status(rankmem_allocate(mr, 2 * MiB, 0, &out), RANKMEM_ERR_OUT_OF_MEMORY, "allocate: more than the arena");
    ok(out == NULL, "failed allocates leave the output untouched");
    int local;
    is_status(rankmem_deallocate(mr, NULL, 100, 0), RANKMEM_ERR_INVALID_POINTER, "deallocate: NULL");
    is_status(rankmem_deallocate(mr, &local, 100, 0), RANKMEM_ERR_INVALID_POINTER, "deallocate: a stack address");
    is_status(rankmem_deallocate(mr, (char *)p + 256, 100, 0), RANKMEM_ERR_INVALID_POINTER, "deallocate: an interior pointer");
    is_status(rankmem_deallocate(mr, (char *)p + 2 * SB, 100, 0), RANKMEM_ERR_INVALID_POINTER, "deallocate: a free part of the arena");
    is_status(rankmem_deallocate(mr, p, 999, 0), RANKMEM_ERR_INVALID_POINTER, "deallocate: wrong size");
    ok(strstr(rankmem_last_error(), "allocated with 1000") != NULL, "says so: %s", rankmem_last_error());
    is_status(rankmem_deallocate(mr, big, 2 * SB + 1, 0), RANKMEM_ERR_INVALID_POINTER, "deallocate: wrong size of a large block");
    is_status(rankmem_deallocate(mr, (char *)big + 256, 2 * SB, 0), RANKMEM_ERR_INVALID_POINTER, "deallocate: inside a large block");
    is_status(rankmem_deallocate(mr, p, 1000, 3), RANKMEM_ERR_INVALID_ARGUMENT, "deallocate: bad alignment");
    ok(q(mr, RANKMEM_QUERY_USED_CURRENT) == used && q(mr, RANKMEM_QUERY_LIVE_COUNT) == live,
       "nothing changed by the refused calls");
    is_status(rankmem_deallocate(mr, p, 1000, 0), RANKMEM_SUCCESS, "the real free still works");
    is_status(rankmem_deallocate(mr, p, 1000, 0), RANKMEM_ERR_INVALID_POINTER, "double free");
    is_status(rankmem_deallocate_async(mr, p, 1000, 0, SA), RANKMEM_ERR_INVALID_POINTER, "double free on another stream");
    is_status(rankmem_deallocate(mr, big, 2 * SB, 0), RANKMEM_SUCCESS, "the large block's free works");
    is_status(rankmem_deallocate(mr, big, 2 * SB, 0), RANKMEM_ERR_INVALID_POINTER, "double free of a large block");
    size_t v = 0;
    is_status(rankmem_resource_query(mr, RANKMEM_QUERY_LIMIT, &v), RANKMEM_ERR_NOT_SUPPORTED, "query: no limit");
    is_status(rankmem_resource_query(mr, (rankmem_query_t)99, &v), RANKMEM_ERR_NOT_SUPPORTED, "query: unknown");
    is_status(rankmem_resource_query(mr, RANKMEM_QUERY_USED_CURRENT, NULL), RANKMEM_ERR_INVALID_ARGUMENT, "query: NULL output");

    FILE *f = tmpfile();
    is_status(rankmem_arena_dump(NULL, f), RANKMEM_ERR_INVALID_ARGUMENT, "dump: NULL resource");
    is_status(rankmem_arena_dump(mr, NULL), RANKMEM_ERR_INVALID_ARGUMENT, "dump: NULL FILE");
    is_status(rankmem_arena_dump(&up->base, f), RANKMEM_ERR_INVALID_ARGUMENT, "dump: not an arena");
    ok(strstr(rankmem_last_error(), "no arena") != NULL, "says so: %s", rankmem_last_error());
    rankmem_resource_t *stats;
    rankmem_stats_create(mr, &stats);
    is_status(rankmem_arena_dump(stats, f), RANKMEM_SUCCESS, "dump: finds the arena under an adaptor");
    is_status(rankmem_arena_forget_stream(NULL, SA), RANKMEM_ERR_INVALID_ARGUMENT, "forget_stream: NULL resource");
    is_status(rankmem_arena_forget_stream(&up->base, SA), RANKMEM_ERR_INVALID_ARGUMENT, "forget_stream: no arena in the chain");
    is_status(rankmem_arena_forget_stream(mr, NULL), RANKMEM_SUCCESS, "forget_stream: the default stream (nothing to do)");
    is_status(rankmem_arena_forget_stream(stats, SE), RANKMEM_SUCCESS, "forget_stream: through an adaptor, a stream never seen");
    rankmem_resource_release(stats);
    fclose(f);

    char buf[128];
    size_t need = 0;
    rankmem_resource_describe(mr, buf, sizeof buf, &need);
    ok(strcmp(buf, "arena(size=1MiB,superblock=64KiB)>counting") == 0, "describe: %s", buf);
    rankmem_resource_t *d = make_arena(&up->base, 256 * MiB, 0, 1);
    rankmem_resource_describe(d, buf, sizeof buf, &need);
    ok(strcmp(buf, "arena(size=256MiB,dump=1)>counting") == 0, "describe, default superblock: %s", buf);
    rankmem_resource_release(d);

    /* Released with live blocks: BUSY, and everything goes back anyway. */
    rankmem_allocate(mr, 5000, 0, &p);
    rankmem_allocate(mr, 3 * SB, 0, &big);
    rankmem_allocate_async(mr, 700, 0, SA, &out);
    is_status(rankmem_resource_release(mr), RANKMEM_ERR_BUSY, "released with live blocks: busy");
    ok(strstr(rankmem_last_error(), "3 live allocations") != NULL, "says how many: %s", rankmem_last_error());
    ok(up->base.refcount == 1, "the arena let go of its upstream");
    ok(upstream_clean(up, &finalized), "its memory went back upstream anyway; chain gone");
}

int main(int argc, char **argv)
{
    long_run = (argc > 1 && strcmp(argv[1], "--long") == 0) ||
               (getenv("RANKMEM_TEST_LONG") && atoi(getenv("RANKMEM_TEST_LONG")) > 0);
    test_placement();
    test_superblocks();
    test_streams();
    test_used_high_arenas();
    test_cross_thread();
    test_random();
    stress_steps = long_run ? 400000 : 20000;
    stress("roomy arena", 32 * MiB);
    stress("tight arena", 2 * MiB); /* out of memory and defragmentation under load */
    test_fragmentation();
    test_bad_inputs();
    return tap_done();
}
