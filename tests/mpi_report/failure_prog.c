/* A rank that fails, for failure_check.py (issue 29): built with the
 * plugin's sources, so that its malloc can see the signal path's flag.
 *
 *   failure_prog MODE [RANK [ARG]]
 *
 * Every rank allocates (rank + 1) x 256 KiB through the rank's resource
 * and keeps it; then rank RANK (default 1) does MODE while the others wait
 * in a barrier:
 *   oom            asks for 64 MiB more (refused by a limit in the chain),
 *                  then carries on to MPI_Finalize
 *   oom-abort      the same, then MPI_Abort(MPI_COMM_WORLD, 3)
 *   signal N       raise(N)
 *   segv           a real fault (a write into a page mapped without access:
 *                  a null pointer would be caught first by UBSan)
 *   abort N        MPI_Abort(MPI_COMM_WORLD, N)
 *   exit N         exit(N) without MPI_Finalize
 *   kill           sleeps ARG ms, then SIGKILL
 *   finish         nothing (a job that finishes)
 *   report-fault DIR  every rank: rankmem_mpi_report() into DIR once to
 *                  count the plugin's allocations on rank RANK, then once
 *                  per allocation with that one failing there (and one
 *                  more with none failing), once with every one failing,
 *                  and MPI_Finalize with every one failing; each rank
 *                  prints "rank N finished" after MPI_Finalize (only
 *                  without a sanitizer, whose malloc this cannot replace)
 * RKT_FAIL_DELAY_MS=N: rank RANK waits N ms before MODE.
 * "handlers" as an extra last argument installs a SIGTERM and a SIGSEGV
 * handler before MPI_Init that prints "user handler N" and _exit(42). */
#define _GNU_SOURCE
#include <mpi.h>
#include <rankmem.h>
#include <rankmem_mpi.h>

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* The signal path must not allocate: malloc dies while its flag is up. */
extern volatile sig_atomic_t rk_fail_in_handler __attribute__((visibility("hidden")));
#if !defined(__SANITIZE_ADDRESS__) && !defined(__has_feature)
#define RK_CHECK_MALLOC 1
#elif defined(__has_feature)
#if !__has_feature(address_sanitizer)
#define RK_CHECK_MALLOC 1
#endif
#endif
#ifdef RK_CHECK_MALLOC
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
static void malloc_in_handler(void)
{
    static const char m[] = "failure_prog: malloc called in the signal path\n";
    ssize_t w = write(2, m, sizeof m - 1);
    (void)w;
    _exit(99);
}
/* Faults in the report (issue 31): while a report is built on this
 * thread, the allocations the plugin's code makes (called from this
 * program's text, into which the plugin is built; MPI's and libc's own
 * are left alone) are counted, and the one numbered rf_fail_at fails
 * (-1: every one). */
extern _Thread_local int rk_report_busy __attribute__((visibility("hidden")));
extern char __executable_start[], etext[];
static long rf_count, rf_fail_at;
static int report_fault(const void *caller)
{
    if (!rk_report_busy || (const char *)caller < __executable_start ||
        (const char *)caller >= etext)
        return 0;
    long k = ++rf_count;
    if (rf_fail_at < 0 || k == rf_fail_at) {
        errno = ENOMEM;
        return 1;
    }
    return 0;
}
void *malloc(size_t n)
{
    if (rk_fail_in_handler)
        malloc_in_handler();
    if (report_fault(__builtin_return_address(0)))
        return NULL;
    return __libc_malloc(n);
}
void *calloc(size_t a, size_t b)
{
    if (rk_fail_in_handler)
        malloc_in_handler();
    if (report_fault(__builtin_return_address(0)))
        return NULL;
    return __libc_calloc(a, b);
}
void *realloc(void *p, size_t n)
{
    if (rk_fail_in_handler)
        malloc_in_handler();
    if (report_fault(__builtin_return_address(0)))
        return NULL;
    return __libc_realloc(p, n);
}
#endif

/* report-fault: see the top. Prints "report allocations K" (rank 0) and
 * any status other than success or RANKMEM_ERR_INTERNAL. */
static void report_faults(int rank, int who, const char *dir)
{
#ifdef RK_CHECK_MALLOC
    char p[4096];
    long k = 0;
    snprintf(p, sizeof p, "%s/count", dir);
    rf_count = 0;
    rf_fail_at = 0;
    (void)rankmem_mpi_report(MPI_COMM_WORLD, p);
    k = rf_count;
    MPI_Bcast(&k, 1, MPI_LONG, who, MPI_COMM_WORLD);
    if (rank == 0)
        printf("report allocations %ld\n", k);
    for (long n = 1; n <= k + 2; n++) {
        snprintf(p, sizeof p, "%s/fault-%ld", dir, n);
        rf_count = 0;
        rf_fail_at = rank == who ? (n == k + 2 ? -1 : n) : 0;
        rankmem_status_t st = rankmem_mpi_report(MPI_COMM_WORLD, p);
        rf_fail_at = 0;
        if (st != RANKMEM_SUCCESS && st != RANKMEM_ERR_INTERNAL)
            printf("rank %d: fault %ld: status %d\n", rank, n, (int)st);
    }
    fflush(stdout);
    rf_count = 0;
    rf_fail_at = rank == who ? -1 : 0; /* and in the finalize report */
#else
    (void)rank, (void)who, (void)dir;
    printf("report-fault: skipped (a sanitizer's malloc)\n");
#endif
}

static void user_handler(int sig)
{
    char m[32];
    int n = snprintf(m, sizeof m, "user handler %d\n", sig);
    ssize_t w = write(1, m, (size_t)n);
    (void)w;
    _exit(42);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "finish";
    int who = argc > 2 ? atoi(argv[2]) : 1;
    int arg = argc > 3 ? atoi(argv[3]) : 0;
    if (strcmp(argv[argc - 1], "handlers") == 0) {
        signal(SIGTERM, user_handler);
        signal(SIGSEGV, user_handler);
    }
    MPI_Init(&argc, &argv);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    rankmem_resource_t *mr = rankmem_mpi_resource();
    void *keep = NULL;
    if (mr && rankmem_allocate(mr, (size_t)(rank + 1) << 18, 256, &keep) != RANKMEM_SUCCESS)
        fprintf(stderr, "rank %d: the first allocation failed\n", rank);
    MPI_Barrier(MPI_COMM_WORLD);
    if (strcmp(mode, "report-fault") == 0)
        report_faults(rank, who, argc > 3 ? argv[3] : ".");
    const char *delay = getenv("RKT_FAIL_DELAY_MS"); /* a wait first (periodic records) */
    if (delay && rank == who) {
        long ms = atol(delay);
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (rank == who) {
        if (strncmp(mode, "oom", 3) == 0) {
            void *p = NULL;
            rankmem_status_t st = rankmem_allocate(mr, (size_t)64 << 20, 256, &p);
            /* The caller still reads the chain's own detail. */
            printf("oom status %d detail '%s'\n", (int)st, rankmem_last_error());
            fflush(stdout);
            if (strcmp(mode, "oom-abort") == 0)
                MPI_Abort(MPI_COMM_WORLD, 3);
        } else if (strcmp(mode, "signal") == 0) {
            raise(arg);
        } else if (strcmp(mode, "segv") == 0) {
            void *page = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (page == MAP_FAILED)
                MPI_Abort(MPI_COMM_WORLD, 99);
            *(volatile int *)page = 1;
        } else if (strcmp(mode, "abort") == 0) {
            MPI_Abort(MPI_COMM_WORLD, arg);
        } else if (strcmp(mode, "exit") == 0) {
            exit(arg);
        } else if (strcmp(mode, "kill") == 0) {
            struct timespec ts = {arg / 1000, (long)(arg % 1000) * 1000000L};
            nanosleep(&ts, NULL);
            raise(SIGKILL);
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (keep)
        rankmem_deallocate(mr, keep, (size_t)(rank + 1) << 18, 256);
    MPI_Finalize();
    printf("rank %d finished\n", rank);
    return 0;
}
