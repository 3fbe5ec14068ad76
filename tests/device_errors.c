/* The device constructors' bad inputs and their answers on machines without
 * a GPU (or builds without CUDA): a clear status, nothing written, nothing
 * leaked. Runs everywhere; with a GPU it checks the constructors succeed. */
#include <stdint.h>
#include <string.h>
#include <rankmem.h>
#include "tap.h"

typedef rankmem_status_t (*ctor_t)(rankmem_resource_t **);

int main(void)
{
    int ndev = 0;
    rankmem_device_count(&ndev);
    const struct { const char *name; ctor_t fn; } ctors[] = {
        {"cuda", rankmem_cuda_create},
        {"managed", rankmem_managed_create},
        {"pinned", rankmem_pinned_create},
    };
    for (int i = 0; i < 3; i++) {
        is_status(ctors[i].fn(NULL), RANKMEM_ERR_INVALID_ARGUMENT, "%s: NULL output", ctors[i].name);
        rankmem_resource_t *mr = (rankmem_resource_t *)0x1;
        rankmem_status_t st = ctors[i].fn(&mr);
        if (ndev == 0) {
            ok(st == RANKMEM_ERR_NO_DEVICE || st == RANKMEM_ERR_NOT_SUPPORTED,
               "%s without a GPU: %s (%s)", ctors[i].name, rankmem_status_string(st), rankmem_last_error());
            ok(mr == (rankmem_resource_t *)0x1, "%s: output untouched on failure", ctors[i].name);
        } else {
            is_status(st, RANKMEM_SUCCESS, "%s with a GPU", ctors[i].name);
            ok(st != RANKMEM_SUCCESS || rankmem_resource_release(mr) == RANKMEM_SUCCESS, "%s released", ctors[i].name);
        }
    }
    is_status(rankmem_async_create(NULL, NULL), RANKMEM_ERR_INVALID_ARGUMENT, "async: NULL output");
    rankmem_async_params_t prm;
    is_status(rankmem_async_params_default(&prm), RANKMEM_SUCCESS, "async params default");
    ok(prm.size == sizeof prm && prm.release_threshold == SIZE_MAX && prm.handle_type == RANKMEM_HANDLE_NONE,
       "defaults: a new pool that keeps everything, no export handle");
    is_status(rankmem_async_params_default(NULL), RANKMEM_ERR_INVALID_ARGUMENT, "async params default: NULL");
    rankmem_resource_t *mr = NULL;
    rankmem_async_params_t bad = prm;
    bad.size = 4;
    is_status(rankmem_async_create(&bad, &mr), RANKMEM_ERR_INVALID_ARGUMENT, "async: params.size not set");
    bad = prm;
    bad.handle_type = 0x40;
    is_status(rankmem_async_create(&bad, &mr), RANKMEM_ERR_INVALID_ARGUMENT, "async: unknown handle type");
    ok(prm.reuse_follow_event_dependencies == -1 && prm.reuse_allow_opportunistic == -1 &&
           prm.reuse_allow_internal_dependencies == -1,
       "defaults: the runtime's reuse policies");
    bad = prm;
    bad.reuse_allow_opportunistic = 2;
    is_status(rankmem_async_create(&bad, &mr), RANKMEM_ERR_INVALID_ARGUMENT, "async: reuse policy 2");
    ok(strstr(rankmem_last_error(), "reuse_allow_opportunistic") != NULL,
       "the message names the policy: %s", rankmem_last_error());
    bad = prm;
    bad.reuse_follow_event_dependencies = -2;
    is_status(rankmem_async_create(&bad, &mr), RANKMEM_ERR_INVALID_ARGUMENT, "async: reuse policy -2");
    is_status(rankmem_async_view_create(NULL, &mr), RANKMEM_ERR_INVALID_ARGUMENT, "async_view: NULL pool");
    rankmem_mempool_t h;
    is_status(rankmem_async_pool_handle(NULL, &h), RANKMEM_ERR_INVALID_ARGUMENT, "async_pool_handle: NULL resource");
    rankmem_resource_t *sys;
    rankmem_system_create(&sys);
    is_status(rankmem_async_pool_handle(sys, &h), RANKMEM_ERR_INVALID_ARGUMENT, "async_pool_handle: not an async resource");
    rankmem_resource_release(sys);
    rankmem_status_t st = rankmem_async_create(&prm, &mr);
    if (ndev == 0)
        ok(st == RANKMEM_ERR_NO_DEVICE || st == RANKMEM_ERR_NOT_SUPPORTED, "async without a GPU: %s", rankmem_last_error());
    else {
        is_status(st, RANKMEM_SUCCESS, "async with a GPU");
        if (st == RANKMEM_SUCCESS)
            rankmem_resource_release(mr);
    }
    ok(mr == NULL || ndev > 0, "async: output untouched on failure");
    return tap_done();
}
