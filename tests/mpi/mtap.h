/* Collective TAP for MPI test programs: every rank evaluates each check,
 * rank 0 prints one "ok - ..." / "not ok - ..." line for all of them (no
 * numbers: the calling .mpish script numbers nothing and prints the plan at
 * the end). A rank whose check failed says so on stderr. Every rank must
 * make the same checks in the same order (they are collectives). */
#ifndef RANKMEM_MTAP_H
#define RANKMEM_MTAP_H

#include <limits.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>

#define MTAP_UNUSED_ __attribute__((unused))

MTAP_UNUSED_ static int mtap_rank_ = -1, mtap_failed_ = 0;

MTAP_UNUSED_ __attribute__((format(printf, 2, 3))) static int mok(int pass, const char *fmt, ...)
{
    char desc[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(desc, sizeof desc, fmt, ap);
    va_end(ap);
    if (mtap_rank_ < 0)
        MPI_Comm_rank(MPI_COMM_WORLD, &mtap_rank_);
    int fail = !pass, nfail = 0, first = pass ? INT_MAX : mtap_rank_, first_all = INT_MAX;
    MPI_Allreduce(&fail, &nfail, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&first, &first_all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!pass) {
        fprintf(stderr, "# rank %d: FAILED: %s\n", mtap_rank_, desc);
        fflush(stderr);
    }
    if (nfail)
        mtap_failed_++;
    if (mtap_rank_ == 0) {
        if (nfail)
            printf("not ok - %s (failed on %d rank%s, first: rank %d)\n", desc, nfail,
                   nfail == 1 ? "" : "s", first_all);
        else
            printf("ok - %s\n", desc);
        fflush(stdout);
    }
    return pass;
}

/* One rank's note, as a TAP comment (rank 0 only prints). */
MTAP_UNUSED_ __attribute__((format(printf, 1, 2))) static void mdiag(const char *fmt, ...)
{
    if (mtap_rank_ < 0)
        MPI_Comm_rank(MPI_COMM_WORLD, &mtap_rank_);
    if (mtap_rank_ != 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    printf("# ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
}

/* Skip line (rank 0). */
MTAP_UNUSED_ static void mskip(const char *why)
{
    if (mtap_rank_ < 0)
        MPI_Comm_rank(MPI_COMM_WORLD, &mtap_rank_);
    if (mtap_rank_ == 0) {
        printf("ok - # SKIP %s\n", why);
        fflush(stdout);
    }
}

#endif
