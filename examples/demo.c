/* rankmem demo: build a pool on the current device, allocate through it,
 * print what happened. On a machine without a GPU it runs on host memory and
 * says so. */
#include <stdio.h>
#include <string.h>
#include <rankmem.h>

#define CHECK(call)                                                                          \
    do {                                                                                     \
        rankmem_status_t st_ = (call);                                                       \
        if (st_ != RANKMEM_SUCCESS) {                                                        \
            fprintf(stderr, "demo: %s failed: %s\n", #call, rankmem_last_error());          \
            return 1;                                                                        \
        }                                                                                    \
    } while (0)

int main(void)
{
    int ndev = 0, dev = 0;
    CHECK(rankmem_device_count(&ndev));
    CHECK(rankmem_current_device(&dev));

    /* The device's resource: cudaMalloc on a GPU, host memory without one. */
    rankmem_resource_t *base = NULL;
    CHECK(rankmem_get_current_resource(&base));
    const char *base_name = "";
    rankmem_resource_name(base, &base_name);
    if (ndev == 0)
        printf("demo: no GPU here: running on host memory (resource '%s')\n", base_name);
    else
        printf("demo: %d GPU(s); device %d, upstream resource '%s'\n", ndev, dev, base_name);

    /* A pool of 64 MiB over it, installed as the device's resource. */
    rankmem_pool_params_t params;
    rankmem_pool_params_default(&params);
    params.initial_size = (size_t)64 << 20;
    rankmem_resource_t *pool = NULL;
    CHECK(rankmem_pool_create(base, &params, &pool));
    CHECK(rankmem_set_current_resource(pool));

    rankmem_resource_t *mr = NULL;
    CHECK(rankmem_get_current_resource(&mr));
    void *blocks[8];
    size_t sizes[8];
    for (int i = 0; i < 8; i++) {
        sizes[i] = (size_t)1000 << i;
        CHECK(rankmem_allocate(mr, sizes[i], 0, &blocks[i]));
        printf("demo: allocated %8zu bytes at %p\n", sizes[i], blocks[i]);
    }
    size_t used = 0, reserved = 0, live = 0;
    rankmem_resource_query(mr, RANKMEM_QUERY_USED_CURRENT, &used);
    rankmem_resource_query(mr, RANKMEM_QUERY_RESERVED_CURRENT, &reserved);
    rankmem_resource_query(mr, RANKMEM_QUERY_LIVE_COUNT, &live);
    printf("demo: %zu live allocations, %zu bytes in use, %zu bytes reserved by the pool\n", live,
           used, reserved);
    for (int i = 0; i < 8; i++)
        CHECK(rankmem_deallocate(mr, blocks[i], sizes[i], 0));
    void *again = NULL;
    CHECK(rankmem_allocate(mr, sizes[7], 0, &again));
    printf("demo: after freeing everything, %zu bytes came back at %p (reused, no new memory)\n",
           sizes[7], again);
    CHECK(rankmem_deallocate(mr, again, sizes[7], 0));
    size_t high = 0;
    rankmem_resource_query(mr, RANKMEM_QUERY_USED_HIGH, &high);
    printf("demo: peak in use %zu bytes; %s memory\n", high, ndev ? "device" : "host");

    /* Put the first resource back and drop ours: the pool returns its memory. */
    CHECK(rankmem_set_current_resource(base));
    CHECK(rankmem_resource_release(pool));
    printf("demo: done\n");
    return 0;
}
