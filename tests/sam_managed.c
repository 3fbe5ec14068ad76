/* sam_headroom and async_managed on any machine: bad input gets a clear
 * status and leaves outputs alone; without a GPU (or CUDA) creation says
 * why; the spec strings know both. The GPU side is tests/gpu_sam.c and
 * tests/gpu_async_managed.c. */
#include "config.h"

#include <stdint.h>
#include <string.h>

#include <rankmem.h>

#include "tap.h"

static int mentions(const char *what)
{
    return strstr(rankmem_last_error(), what) != NULL;
}

static void test_sam_bad_input(void)
{
    is_status(rankmem_sam_headroom_create(0, NULL), RANKMEM_ERR_INVALID_ARGUMENT,
              "sam_headroom_create: NULL output");
    ok(mentions("NULL mr_p"), "  says so: %s", rankmem_last_error());

    rankmem_resource_t *sys;
    if (rankmem_system_create(&sys) != RANKMEM_SUCCESS)
        BAIL_OUT("system resource: %s", rankmem_last_error());
    size_t bytes = 12345;
    is_status(rankmem_sam_headroom_device_bytes(NULL, &bytes), RANKMEM_ERR_INVALID_ARGUMENT,
              "sam_headroom_device_bytes: NULL resource");
    is_status(rankmem_sam_headroom_device_bytes(sys, NULL), RANKMEM_ERR_INVALID_ARGUMENT,
              "sam_headroom_device_bytes: NULL output");
    is_status(rankmem_sam_headroom_device_bytes(sys, &bytes), RANKMEM_ERR_INVALID_ARGUMENT,
              "sam_headroom_device_bytes: a system resource is refused");
    ok(mentions("'system' is not sam_headroom"), "  names it: %s", rankmem_last_error());
    ok(bytes == 12345, "  output untouched");
    rankmem_resource_release(sys);
}

static void test_managed_bad_input(void)
{
    rankmem_async_managed_params_t prm;
    is_status(rankmem_async_managed_params_default(NULL), RANKMEM_ERR_INVALID_ARGUMENT,
              "async_managed_params_default: NULL");
    memset(&prm, 0xab, sizeof prm);
    is_status(rankmem_async_managed_params_default(&prm), RANKMEM_SUCCESS,
              "async_managed_params_default");
    ok(prm.size == sizeof prm && prm.initial_pool_size == 0 && prm.release_threshold == SIZE_MAX &&
           prm.preferred_location == RANKMEM_MANAGED_PREFER_DEVICE,
       "  defaults: size %zu, initial 0, release unbounded, prefer device", prm.size);

    rankmem_resource_t *mr = (rankmem_resource_t *)&mr;
    is_status(rankmem_async_managed_create(NULL, NULL), RANKMEM_ERR_INVALID_ARGUMENT,
              "async_managed_create: NULL output");
    prm.size = sizeof prm - 1;
    is_status(rankmem_async_managed_create(&prm, &mr), RANKMEM_ERR_INVALID_ARGUMENT,
              "async_managed_create: params->size too small");
    ok(mentions("rankmem_async_managed_params_default"), "  says what to call: %s",
       rankmem_last_error());
    rankmem_async_managed_params_default(&prm);
    prm.preferred_location = 3;
    is_status(rankmem_async_managed_create(&prm, &mr), RANKMEM_ERR_INVALID_ARGUMENT,
              "async_managed_create: preferred_location 3");
    prm.preferred_location = -1;
    is_status(rankmem_async_managed_create(&prm, &mr), RANKMEM_ERR_INVALID_ARGUMENT,
              "async_managed_create: preferred_location -1");
    ok(mentions("unknown preferred_location -1"), "  says which: %s", rankmem_last_error());
    ok(mr == (rankmem_resource_t *)&mr, "  output untouched");

    rankmem_mempool_t h = (rankmem_mempool_t)&h;
    rankmem_resource_t *sys;
    if (rankmem_system_create(&sys) != RANKMEM_SUCCESS)
        BAIL_OUT("system resource: %s", rankmem_last_error());
    is_status(rankmem_async_managed_pool_handle(NULL, &h), RANKMEM_ERR_INVALID_ARGUMENT,
              "async_managed_pool_handle: NULL resource");
    is_status(rankmem_async_managed_pool_handle(sys, NULL), RANKMEM_ERR_INVALID_ARGUMENT,
              "async_managed_pool_handle: NULL output");
    is_status(rankmem_async_managed_pool_handle(sys, &h), RANKMEM_ERR_INVALID_ARGUMENT,
              "async_managed_pool_handle: a system resource is refused");
    ok(h == (rankmem_mempool_t)&h, "  output untouched");
    rankmem_resource_release(sys);
}

/* No GPU here (or no CUDA): both constructors refuse, saying why. */
static void test_without_gpu(void)
{
    rankmem_resource_t *mr = (rankmem_resource_t *)&mr;
    is_status(rankmem_sam_headroom_create((size_t)1 << 30, &mr), RANKMEM_ERR_NOT_SUPPORTED,
              "sam_headroom_create without a GPU: not supported");
    ok(mentions("no GPU") || mentions("without CUDA"), "  says why: %s", rankmem_last_error());
    ok(mr == (rankmem_resource_t *)&mr, "  output untouched");

    rankmem_status_t want = rankmem_have_cuda() ? RANKMEM_ERR_NO_DEVICE : RANKMEM_ERR_NOT_SUPPORTED;
    is_status(rankmem_async_managed_create(NULL, &mr), want,
              "async_managed_create without a GPU: %s", rankmem_status_string(want));
    ok(mentions("no GPU") || mentions("without CUDA") || mentions("older than 13.0") ||
           mentions("no managed memory pools"),
       "  says why: %s", rankmem_last_error());
    ok(mr == (rankmem_resource_t *)&mr, "  output untouched");

    /* A spec that names them fails with the constructor's status and words. */
    is_status(rankmem_resource_from_spec("stats>sam_headroom(headroom=1GiB)", &mr),
              RANKMEM_ERR_NOT_SUPPORTED, "spec sam_headroom without a GPU: not supported");
    ok(mentions("at 7: cannot build sam_headroom: "), "  says where: %s", rankmem_last_error());
    is_status(rankmem_resource_from_spec("pool>async_managed(prefer=host)", &mr), want,
              "spec async_managed without a GPU: %s", rankmem_status_string(want));
    ok(mentions("at 6: cannot build async_managed: "), "  says where: %s", rankmem_last_error());
    ok(mr == (rankmem_resource_t *)&mr, "  output untouched");
}

/* Spec mistakes are caught before anything is built, GPU or not. */
static void test_spec_errors(void)
{
    static const struct {
        const char *spec, *error;
    } bad[] = {
        {"sam_headroom", "at 1: sam_headroom needs headroom=<size>"},
        {"sam_headroom(head=1GiB)", "at 14: unknown option 'head' for sam_headroom"},
        {"sam_headroom(headroom=lots)", "at 23: bad size 'lots' for sam_headroom.headroom"},
        {"pool>sam_headroom(headroom=1GiB)>system", "at 33: 'sam_headroom' cannot have an upstream"},
        {"async_managed(prefer=gpu)",
         "at 22: bad value 'gpu' for async_managed.prefer: expected device, host or none"},
        {"async_managed(prefer=hots)", "(did you mean 'host'?)"},
        {"async_managed(export=fabric)",
         "at 15: unknown option 'export' for async_managed (it takes initial, release or prefer)"},
        {"async_manged", "at 1: unknown resource 'async_manged' (did you mean 'async_managed'?)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rankmem_resource_t *mr = (rankmem_resource_t *)&mr;
        is_status(rankmem_resource_from_spec(bad[i].spec, &mr), RANKMEM_ERR_CONFIG, "spec '%s'",
                  bad[i].spec);
        ok(mentions(bad[i].error) && mr == (rankmem_resource_t *)&mr,
           "  '%s' in: %s", bad[i].error, rankmem_last_error());
    }
}

int main(void)
{
    test_sam_bad_input();
    test_managed_bad_input();
    int n = 0;
    rankmem_device_count(&n);
    if (n == 0)
        test_without_gpu();
    else
        tap_skip(11, "a GPU is present: tests/gpu_sam.t and tests/gpu_async_managed.t cover it");
    test_spec_errors();
    return tap_done();
}
