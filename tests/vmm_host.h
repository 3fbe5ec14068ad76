/* The vmm tests over the host backend (tests/vmm.c, tests/vmm_policy.c): a
 * vmm of 64 KiB granules in a 1 GiB range, and its counters. */
#ifndef RANKMEM_TESTS_VMM_HOST_H
#define RANKMEM_TESTS_VMM_HOST_H

#include <string.h>
#include <rankmem.h>
#include "tap.h"

#define G ((size_t)64 << 10)

/* handle 0: one granule per handle (the host backend's default). */
static inline rankmem_resource_t *host_vmm_of(size_t maximum, size_t release, size_t handle)
{
    rankmem_vmm_params_t prm;
    rankmem_vmm_params_default(&prm);
    prm.backend = RANKMEM_VMM_BACKEND_HOST;
    prm.granule = G;
    prm.reserve = (size_t)1 << 30;
    prm.maximum = maximum;
    prm.release = release;
    prm.handle = handle;
    rankmem_resource_t *mr = NULL;
    if (rankmem_vmm_create(&prm, &mr) != RANKMEM_SUCCESS)
        BAIL_OUT("rankmem_vmm_create: %s", rankmem_last_error());
    return mr;
}

static inline rankmem_vmm_stats_t stats(rankmem_resource_t *mr)
{
    rankmem_vmm_stats_t s;
    memset(&s, 0, sizeof s);
    s.size = sizeof s;
    if (rankmem_vmm_get_stats(mr, &s) != RANKMEM_SUCCESS)
        BAIL_OUT("rankmem_vmm_get_stats: %s", rankmem_last_error());
    return s;
}

#endif
