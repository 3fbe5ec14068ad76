/* record-trace: record an allocation trace through the logging adaptor.
 *
 *     examples/record-trace [FILE]      (default: example-recorded.csv)
 *
 * Builds logging(file=FILE) > pool > system, runs a small simulated
 * workload through it and releases the chain, which writes the log. The
 * log is in the format rankmem-replay reads (docs/replay.md); the
 * repository's bench/traces/example-recorded.csv was made with
 *
 *     examples/record-trace bench/traces/example-recorded.csv
 *
 * The workload, shaped like a stencil code's time loop:
 *   1. setup: the main thread allocates the long-lived fields;
 *   2. time steps: two threads, each on its own stream, allocate halo
 *      buffers and scratch space every step and free them by the end of
 *      the step; every few steps each hands a result buffer to the other
 *      thread, which frees it on its own stream;
 *   3. regrid: the main thread swaps two fields for larger ones and
 *      stages a checkpoint through a large temporary buffer;
 *   4. teardown: every field is freed.
 * Streams are stand-ins (labels): the pool is over host memory, so no GPU
 * is needed. With a GPU, use real cudaStream_t values and a device
 * upstream the same way. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <rankmem.h>

#define NFIELDS 8
#define NSTEPS 120
#define NTEMP 12

#define CHECK(call)                                                                          \
    do {                                                                                     \
        rankmem_status_t st_ = (call);                                                       \
        if (st_ != RANKMEM_SUCCESS) {                                                        \
            fprintf(stderr, "record-trace: %s failed: %s\n", #call, rankmem_last_error());  \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

static rankmem_resource_t *mr;

/* Deterministic generator (xorshift64*): the workload is the same each run;
 * only the addresses and times in the log differ. */
static uint64_t rng(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

/* Log-uniform in [lo, hi]. */
static size_t log_size(uint64_t *s, size_t lo, size_t hi)
{
    int blo = 63 - __builtin_clzll(lo), bhi = 63 - __builtin_clzll(hi);
    int b = blo + (int)(rng(s) % (uint64_t)(bhi - blo + 1));
    size_t n = ((size_t)1 << b) + (size_t)(rng(s) % ((uint64_t)1 << b));
    return n < lo ? lo : n > hi ? hi : n;
}

typedef struct {
    void *p;
    size_t n;
} buf_t;

/* Mailboxes between the two workers: a result buffer each may hand over. */
static pthread_mutex_t box_lock = PTHREAD_MUTEX_INITIALIZER;
static buf_t box[2];

typedef struct {
    int id;
    rankmem_stream_t stream;
} worker_t;

static void *worker(void *arg)
{
    worker_t *w = arg;
    uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(w->id + 1);
    buf_t tmp[NTEMP];
    for (int step = 0; step < NSTEPS; step++) {
        /* Halo buffers (small, 6 faces) and scratch (larger). */
        int n = 0;
        for (int f = 0; f < 6; f++) {
            tmp[n].n = log_size(&s, 4 << 10, 256 << 10);
            CHECK(rankmem_allocate_async(mr, tmp[n].n, 0, w->stream, &tmp[n].p));
            n++;
        }
        int scratch = 1 + (int)(rng(&s) % 4);
        for (int k = 0; k < scratch; k++) {
            tmp[n].n = log_size(&s, 512 << 10, 8 << 20);
            CHECK(rankmem_allocate_async(mr, tmp[n].n, 0, w->stream, &tmp[n].p));
            n++;
        }
        /* Free in a shuffled order, as kernels finish. */
        for (int k = n - 1; k > 0; k--) {
            int j = (int)(rng(&s) % (uint64_t)(k + 1));
            buf_t t = tmp[k];
            tmp[k] = tmp[j];
            tmp[j] = t;
        }
        for (int k = 0; k < n; k++)
            CHECK(rankmem_deallocate_async(mr, tmp[k].p, tmp[k].n, 0, w->stream));

        /* Every 8 steps: hand a result to the other thread; free what it
         * handed us, on our stream. */
        if (step % 8 == 7) {
            buf_t out = {NULL, log_size(&s, 64 << 10, 2 << 20)};
            CHECK(rankmem_allocate_async(mr, out.n, 0, w->stream, &out.p));
            pthread_mutex_lock(&box_lock);
            buf_t in = box[w->id];
            box[w->id].p = NULL;
            buf_t old = box[1 - w->id];
            box[1 - w->id] = out;
            pthread_mutex_unlock(&box_lock);
            if (in.p)
                CHECK(rankmem_deallocate_async(mr, in.p, in.n, 0, w->stream));
            if (old.p) /* the other thread has not taken the last one yet */
                CHECK(rankmem_deallocate_async(mr, old.p, old.n, 0, w->stream));
        }
    }
    return NULL;
}

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : "example-recorded.csv";
    rankmem_resource_t *sys, *pool;
    CHECK(rankmem_system_create(&sys));
    CHECK(rankmem_pool_create(sys, NULL, &pool));
    rankmem_resource_release(sys); /* the pool holds it */
    CHECK(rankmem_logging_create(pool, path, &mr));
    rankmem_resource_release(pool);

    /* 1. setup */
    uint64_t s = 42;
    buf_t field[NFIELDS];
    for (int i = 0; i < NFIELDS; i++) {
        field[i].n = log_size(&s, 1 << 20, 32 << 20);
        CHECK(rankmem_allocate(mr, field[i].n, 0, &field[i].p));
    }

    /* 2. time steps */
    pthread_t tid[2];
    worker_t w[2] = {{0, (rankmem_stream_t)(uintptr_t)0x1000},
                     {1, (rankmem_stream_t)(uintptr_t)0x2000}};
    for (int i = 0; i < 2; i++)
        if (pthread_create(&tid[i], NULL, worker, &w[i])) {
            fprintf(stderr, "record-trace: pthread_create failed\n");
            return 1;
        }
    for (int i = 0; i < 2; i++)
        pthread_join(tid[i], NULL);
    for (int i = 0; i < 2; i++) /* results nobody took */
        if (box[i].p)
            CHECK(rankmem_deallocate_async(mr, box[i].p, box[i].n, 0, w[i].stream));

    /* 3. regrid and checkpoint */
    for (int i = 0; i < 2; i++) {
        CHECK(rankmem_deallocate(mr, field[i].p, field[i].n, 0));
        field[i].n = field[i].n * 3 / 2;
        CHECK(rankmem_allocate(mr, field[i].n, 0, &field[i].p));
    }
    buf_t stage = {NULL, (size_t)64 << 20};
    CHECK(rankmem_allocate(mr, stage.n, 0, &stage.p));
    CHECK(rankmem_deallocate(mr, stage.p, stage.n, 0));

    /* 4. teardown */
    for (int i = NFIELDS - 1; i >= 0; i--)
        CHECK(rankmem_deallocate(mr, field[i].p, field[i].n, 0));

    /* Releasing the logging adaptor writes what is buffered and closes the file. */
    CHECK(rankmem_resource_release(mr));
    printf("record-trace: wrote %s\n", path);
    return 0;
}
