/* Status strings, the thread-local last error, version. */
#include "config.h"

#include <pthread.h>
#include <string.h>
#include <rankmem.h>
#include "tap.h"

static void *other_thread(void *arg)
{
    (void)arg;
    /* A failure on one thread must not show on another. */
    static char seen[512];
    strncpy(seen, rankmem_last_error(), sizeof seen - 1);
    return seen;
}

int main(void)
{
    int distinct = 1;
    for (int i = 0; i < RANKMEM_STATUS_COUNT; i++) {
        const char *a = rankmem_status_string((rankmem_status_t)i);
        if (!a || !*a)
            distinct = 0;
        for (int j = 0; j < i; j++)
            if (strcmp(a, rankmem_status_string((rankmem_status_t)j)) == 0)
                distinct = 0;
    }
    ok(distinct, "every status has its own non-empty name");
    ok(strcmp(rankmem_status_string((rankmem_status_t)999), "unknown status") == 0,
       "an unknown status is named 'unknown status'");
    ok(strcmp(rankmem_status_string((rankmem_status_t)-1), "unknown status") == 0,
       "a negative status is named 'unknown status'");
    ok(strcmp(rankmem_status_string(RANKMEM_ERR_OUT_OF_MEMORY), "out of memory") == 0,
       "out of memory is named so");

    rankmem_clear_error();
    ok(rankmem_last_error() && rankmem_last_error()[0] == '\0', "no error recorded at start");

    rankmem_resource_t *sys = NULL;
    is_status(rankmem_system_create(&sys), RANKMEM_SUCCESS, "system resource created");
    void *p = NULL;
    is_status(rankmem_allocate(sys, 100, 3, &p), RANKMEM_ERR_INVALID_ARGUMENT,
              "alignment 3 is refused");
    ok(p == NULL, "the output is not written on failure");
    ok(strstr(rankmem_last_error(), "alignment 3") != NULL, "the last error names the alignment: %s",
       rankmem_last_error());
    ok(strstr(rankmem_last_error(), "system") != NULL, "the last error names the resource");

    pthread_t t;
    char *seen = NULL;
    pthread_create(&t, NULL, other_thread, NULL);
    pthread_join(t, (void **)&seen);
    ok(seen && seen[0] == '\0', "the last error is per thread");

    rankmem_clear_error();
    ok(rankmem_last_error()[0] == '\0', "rankmem_clear_error forgets it");

    int ma = -1, mi = -1, pa = -1;
    is_status(rankmem_version(&ma, &mi, &pa), RANKMEM_SUCCESS, "version");
    ok(ma == RANKMEM_VERSION_MAJOR && mi == RANKMEM_VERSION_MINOR && pa == RANKMEM_VERSION_PATCH,
       "library version matches the header (%d.%d.%d)", ma, mi, pa);
    is_status(rankmem_version(NULL, &mi, &pa), RANKMEM_ERR_INVALID_ARGUMENT, "version: NULL out");
    ok(rankmem_have_cuda() == 0 || rankmem_have_cuda() == 1, "have_cuda is a boolean");
    ok(rankmem_have_hip() == 0 || rankmem_have_hip() == 1, "have_hip is a boolean");
    ok(!(rankmem_have_cuda() && rankmem_have_hip()), "at most one GPU runtime (cuda %d, hip %d)",
       rankmem_have_cuda(), rankmem_have_hip());
#if HAVE_HIP
    ok(rankmem_have_hip() == 1, "a HIP build says so");
#elif HAVE_CUDA
    ok(rankmem_have_cuda() == 1, "a CUDA build says so");
#else
    ok(rankmem_have_cuda() == 0 && rankmem_have_hip() == 0, "a build without a GPU runtime says so");
#endif
    is_status(rankmem_resource_release(sys), RANKMEM_SUCCESS, "system resource released");
    return tap_done();
}
