/* The observed-memory report's test program (issue 19; run by
 * tests/mpi_report/observe.mpish under $MPIRUN with 4 ranks, with
 * RANKMEM_OBSERVE=on; observe_check.py reads the report it leaves).
 *
 * Each rank feeds the recorder known allocations through the plugin's
 * public feeding calls (fake pointers: nothing is dereferenced), so that
 * every observed number of the report has one right value per rank:
 *   phase "setup":  device A = (r + 1) MiB, device B = 2 MiB,
 *                   managed 512 KiB, pinned 256 KiB (pinned is not GPU)
 *   phase "solve":  device T = 4 (r + 1) MiB, freed; then A, B, the
 *                   managed and the pinned blocks freed
 *   MPI_Pcontrol(3, "checkpoint"): a mid-run report and a phase mark
 *   phase "finish": leak_a() leaks 2 x 64 KiB on every rank, leak_b()
 *                   leaks 1 MiB on even ranks: two call sites
 *   a free of a pointer never seen (an unmatched free).
 * Pauses between the steps give the timeline its shape. Bad input is
 * checked here; each rank prints "RESULT rank=R bad_input=ok|FAILED ...".
 *
 * Built with the plugin's sources (as tests/mpi/record is), so that where
 * nothing started the recorder at MPI_Init (a plugin whose RANKMEM_OBSERVE
 * does not start it without a GPU) the program starts it itself: the
 * report is what is tested here, whoever fed the recorder. With
 * RKT_OBS_ON=1 the state is "on" (the headline is then the observed
 * memory). */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include <rankmem.h>
#include <rankmem_mpi.h>

#include "recorder.h"

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

static void *fake(uintptr_t k)
{
    return (void *)(k * 0x1000u);
}

static int failed;

static void must(rankmem_status_t st, const char *what)
{
    if (st != RANKMEM_SUCCESS) {
        fprintf(stderr, "observe_prog: %s: %s\n", what, rankmem_status_string(st));
        failed = 1;
    }
}

static void pause_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Two distinct call sites for the leaks: not inlined, so that each has
 * its own frame. */
__attribute__((noinline)) static void leak_a(void)
{
    /* volatile: one call instruction for both blocks, however the loop is compiled */
    for (volatile uintptr_t k = 0; k < 2; k++)
        must(rankmem_mpi_observe_alloc(fake(0x100 + k), 64 * KIB, RANKMEM_MPI_MEM_DEVICE), /* leak site A */
             "leak_a");
}

__attribute__((noinline)) static void leak_b(void)
{
    must(rankmem_mpi_observe_alloc(fake(0x200), MIB, RANKMEM_MPI_MEM_DEVICE), "leak_b"); /* leak site B */
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    size_t r1 = (size_t)rank + 1;

    int started_here = 0;
    if (!rk_obs_enabled()) {
        rk_obs_config_t cfg = {0};
        cfg.backtrace_depth = 8;
        started_here = rk_obs_init(&cfg) == 0;
        rk_obs_set_state(RK_OBS_UNAVAILABLE, "no GPU (recorder started by observe_prog)");
    }
    /* RKT_OBS_ON=1: the state CUPTI gives on a GPU, so that the report's
     * headline is the observed memory (issue 29, "one story"); nothing
     * here goes through rankmem's chain, so what it served stays 0. */
    if (getenv("RKT_OBS_ON"))
        rk_obs_set_state(RK_OBS_ON, "");

    /* Bad input: a clear status, nothing recorded. */
    int bad_ok = rankmem_mpi_observe_alloc(NULL, 100, RANKMEM_MPI_MEM_DEVICE) != RANKMEM_SUCCESS &&
                 rankmem_mpi_phase(NULL) != RANKMEM_SUCCESS;

    pause_ms(40);
    must(rankmem_mpi_phase("setup"), "phase setup");
    must(rankmem_mpi_observe_alloc(fake(1), r1 * MIB, RANKMEM_MPI_MEM_DEVICE), "A");
    must(rankmem_mpi_observe_alloc(fake(2), 2 * MIB, RANKMEM_MPI_MEM_DEVICE), "B");
    must(rankmem_mpi_observe_alloc(fake(3), 512 * KIB, RANKMEM_MPI_MEM_MANAGED), "managed");
    must(rankmem_mpi_observe_alloc(fake(4), 256 * KIB, RANKMEM_MPI_MEM_PINNED), "pinned");
    pause_ms(40);
    must(rankmem_mpi_phase("solve"), "phase solve");
    must(rankmem_mpi_observe_alloc(fake(5), 4 * r1 * MIB, RANKMEM_MPI_MEM_DEVICE), "T");
    pause_ms(40);
    must(rankmem_mpi_observe_free(fake(5)), "free T");
    must(rankmem_mpi_observe_free(fake(1)), "free A");
    must(rankmem_mpi_observe_free(fake(2)), "free B");
    must(rankmem_mpi_observe_free(fake(3)), "free managed");
    must(rankmem_mpi_observe_free(fake(4)), "free pinned");
    pause_ms(40);
    MPI_Pcontrol(3, "checkpoint");
    pause_ms(20);
    must(rankmem_mpi_phase("finish"), "phase finish");
    leak_a();
    if (rank % 2 == 0)
        leak_b();
    (void)rankmem_mpi_observe_free(fake(0x999)); /* never seen: unmatched */
    pause_ms(60);

    fprintf(stderr, "RESULT rank=%d bad_input=%s feeding=%s started_here=%d\n", rank,
            bad_ok ? "ok" : "FAILED", failed ? "FAILED" : "ok", started_here);
    MPI_Finalize();
    return 0;
}
