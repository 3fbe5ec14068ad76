/* A program that is a CUPTI subscriber itself (as a profiler or a tracing
 * library would make it), subscribed before MPI_Init. CUPTI takes one
 * subscriber: rankmem's observation cannot have it, and must say so once
 * for the job, while the program runs as without rankmem and its own
 * callbacks keep coming. Knows nothing of rankmem; links libcupti. */
#include <cupti.h>

#include "app.h"

static volatile long callbacks;

static void CUPTIAPI on_call(void *user, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                             const void *data)
{
    (void)user;
    (void)domain;
    (void)cbid;
    (void)data;
    callbacks++;
}

int main(int argc, char **argv)
{
    /* Subscribed before MPI_Init (no CUDA call yet: CUPTI needs none). */
    CUpti_SubscriberHandle sub;
    CUptiResult cr = cuptiSubscribe(&sub, (CUpti_CallbackFunc)on_call, NULL);
    if (cr == CUPTI_SUCCESS)
        cr = cuptiEnableDomain(1, sub, CUPTI_CB_DOMAIN_RUNTIME_API);
    MK(MPI_Init(&argc, &argv));
    int rank = 0;
    MK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    if (!app_have_gpu()) {
        MPI_Finalize();
        return 0;
    }
    if (cr != CUPTI_SUCCESS) {
        const char *s = "?";
        cuptiGetResultString(cr, &s);
        fprintf(stderr, "cupti2: our own subscription failed: %s\n", s);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    void *d = NULL, *h = NULL;
    CK(cudaMalloc(&d, 2 * MiB));
    CK(cudaMallocHost(&h, MiB));
    CK(cudaMemset(d, 7, 2 * MiB));
    CK(cudaMemcpy(h, d, MiB, cudaMemcpyDeviceToHost));
    int good = ((unsigned char *)h)[MiB - 1] == 7;
    CK(cudaFreeHost(h));
    CK(cudaFree(d));
    long mine = callbacks;
    int all = 0;
    good = good && mine > 0;
    MK(MPI_Allreduce(&good, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    if (rank == 0)
        printf("%s - cupti2: the job ran and its own CUPTI callbacks came (%ld on rank 0)\n",
               all ? "ok" : "not ok", mine);
    cuptiUnsubscribe(sub);
    MPI_Finalize();
    return 0;
}
