/* Sharing pools and allocations between processes (src/share.c): bad
 * inputs and their statuses, with or without a GPU; with one, pools that
 * cannot be exported. Sharing itself needs two processes:
 * tests/mpi/share.mpish does it between ranks. */
#include <stdint.h>
#include <string.h>
#include <rankmem.h>
#include "tap.h"

int main(void)
{
    int ndev = 0;
    rankmem_device_count(&ndev);
    rankmem_resource_t *sys = NULL;
    if (rankmem_system_create(&sys) != RANKMEM_SUCCESS)
        BAIL_OUT("system resource: %s", rankmem_last_error());
    rankmem_pool_share_t sh = {.handle_type = -7, .fd = -9};
    rankmem_ptr_export_t data;
    memset(&data, 0xa5, sizeof data);
    ok(sizeof data == 64 && sizeof(rankmem_pool_share_t) == 2 * sizeof(int),
       "export data is 64 plain bytes, the share two ints");

    /* export_pool */
    is_status(rankmem_async_export_pool(NULL, &sh), RANKMEM_ERR_INVALID_ARGUMENT, "export_pool: NULL resource");
    is_status(rankmem_async_export_pool(sys, NULL), RANKMEM_ERR_INVALID_ARGUMENT, "export_pool: NULL output");
    is_status(rankmem_async_export_pool(sys, &sh), RANKMEM_ERR_INVALID_ARGUMENT, "export_pool: not async");
    ok(strstr(rankmem_last_error(), "not async") != NULL, "  says so: %s", rankmem_last_error());
    ok(sh.handle_type == -7 && sh.fd == -9, "export_pool: output untouched on failure");

    /* export_pointer */
    int x;
    is_status(rankmem_async_export_pointer(NULL, &x, &data), RANKMEM_ERR_INVALID_ARGUMENT, "export_pointer: NULL resource");
    is_status(rankmem_async_export_pointer(sys, NULL, &data), RANKMEM_ERR_INVALID_ARGUMENT, "export_pointer: NULL ptr");
    is_status(rankmem_async_export_pointer(sys, &x, NULL), RANKMEM_ERR_INVALID_ARGUMENT, "export_pointer: NULL output");
    is_status(rankmem_async_export_pointer(sys, &x, &data), RANKMEM_ERR_INVALID_ARGUMENT, "export_pointer: not async");

    /* import_pool */
    rankmem_resource_t *imp = (rankmem_resource_t *)0x1;
    rankmem_pool_share_t good = {.handle_type = RANKMEM_HANDLE_POSIX_FD, .fd = 0};
    is_status(rankmem_async_import_pool(NULL, &imp), RANKMEM_ERR_INVALID_ARGUMENT, "import_pool: NULL share");
    is_status(rankmem_async_import_pool(&good, NULL), RANKMEM_ERR_INVALID_ARGUMENT, "import_pool: NULL output");
    rankmem_pool_share_t fab = {.handle_type = RANKMEM_HANDLE_FABRIC, .fd = 0};
    is_status(rankmem_async_import_pool(&fab, &imp), RANKMEM_ERR_NOT_SUPPORTED, "import_pool: fabric handle");
    rankmem_pool_share_t badfd = {.handle_type = RANKMEM_HANDLE_POSIX_FD, .fd = -1};
    is_status(rankmem_async_import_pool(&badfd, &imp), RANKMEM_ERR_INVALID_ARGUMENT, "import_pool: fd -1");
    if (ndev == 0) {
        rankmem_status_t st = rankmem_async_import_pool(&good, &imp);
        ok(st == RANKMEM_ERR_NO_DEVICE || st == RANKMEM_ERR_NOT_SUPPORTED,
           "import_pool without a GPU: %s (%s)", rankmem_status_string(st), rankmem_last_error());
    }
    ok(imp == (rankmem_resource_t *)0x1, "import_pool: output untouched on failure");

    /* import_pointer, free_imported */
    void *p = (void *)0x1;
    is_status(rankmem_async_import_pointer(NULL, &data, &p), RANKMEM_ERR_INVALID_ARGUMENT, "import_pointer: NULL resource");
    is_status(rankmem_async_import_pointer(sys, NULL, &p), RANKMEM_ERR_INVALID_ARGUMENT, "import_pointer: NULL data");
    is_status(rankmem_async_import_pointer(sys, &data, NULL), RANKMEM_ERR_INVALID_ARGUMENT, "import_pointer: NULL output");
    is_status(rankmem_async_import_pointer(sys, &data, &p), RANKMEM_ERR_INVALID_ARGUMENT, "import_pointer: not async_import");
    ok(strstr(rankmem_last_error(), "async_import") != NULL, "  says so: %s", rankmem_last_error());
    ok(p == (void *)0x1, "import_pointer: output untouched on failure");
    is_status(rankmem_async_free_imported(NULL, &x), RANKMEM_ERR_INVALID_ARGUMENT, "free_imported: NULL resource");
    is_status(rankmem_async_free_imported(sys, NULL), RANKMEM_ERR_INVALID_ARGUMENT, "free_imported: NULL ptr");
    is_status(rankmem_async_free_imported(sys, &x), RANKMEM_ERR_INVALID_ARGUMENT, "free_imported: not async_import");

    if (ndev > 0) {
        /* A pool made without an export handle type, and the default pool. */
        rankmem_async_params_t prm;
        rankmem_async_params_default(&prm);
        rankmem_resource_t *as = NULL;
        rankmem_status_t st = rankmem_async_create(&prm, &as);
        is_status(st, RANKMEM_SUCCESS, "async without export handle");
        if (st == RANKMEM_SUCCESS) {
            is_status(rankmem_async_export_pool(as, &sh), RANKMEM_ERR_NOT_SUPPORTED, "  export_pool: not supported");
            ok(strstr(rankmem_last_error(), "RANKMEM_HANDLE_POSIX_FD") != NULL, "  names the fix: %s", rankmem_last_error());
            rankmem_resource_release(as);
        }
        st = rankmem_async_create(NULL, &as);
        is_status(st, RANKMEM_SUCCESS, "async on the default pool");
        if (st == RANKMEM_SUCCESS) {
            is_status(rankmem_async_export_pool(as, &sh), RANKMEM_ERR_NOT_SUPPORTED, "  export_pool: not supported");
            rankmem_resource_release(as);
        }
    }
    rankmem_resource_release(sys);
    return tap_done();
}
