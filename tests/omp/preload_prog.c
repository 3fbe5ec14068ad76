/* An OpenMP program that knows nothing of rankmem (it does not link it):
 * tests/omp/preload.ompsh runs it with and without LD_PRELOAD of
 * librankmem_omp.so. rankmem's symbols are looked up with dlsym.
 *   preload_prog plain      rankmem absent; the runtime's allocators work
 *   preload_prog preload    rankmem present and in use; both kinds work
 *   preload_prog default    RANKMEM_OMP_DEFAULT_ALLOCATOR=managed is in effect
 *   preload_prog baddefault a bad RANKMEM_OMP_DEFAULT_ALLOCATOR was ignored
 * Exit status 0 when every check passed; failures are printed. */
#define _GNU_SOURCE 1
#include <dlfcn.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>

static int failures;
#define CHECK(c, what)                                                                       \
    do {                                                                                     \
        if (!(c)) {                                                                          \
            printf("FAIL: %s\n", what);                                                      \
            failures++;                                                                      \
        }                                                                                    \
    } while (0)

typedef int (*block_info_fn)(const void *, size_t *, void **);
static block_info_fn block_info;

static int ours(const void *p) { return block_info && p && block_info(p, NULL, NULL) == 0; }

/* The runtime's own allocators, exactly as without rankmem. */
static void runtime_allocators(void)
{
    unsigned char *p = omp_alloc(1000, omp_default_mem_alloc);
    CHECK(p && !ours(p), "omp_alloc(omp_default_mem_alloc)");
    if (p)
        memset(p, 9, 1000);
    unsigned char *q = omp_realloc(p, 5000, omp_default_mem_alloc, omp_default_mem_alloc);
    CHECK(q && q[999] == 9, "omp_realloc keeps contents");
    omp_free(q, omp_default_mem_alloc);
    unsigned char *c = omp_calloc(10, 10, omp_default_mem_alloc);
    CHECK(c && c[0] == 0 && c[99] == 0, "omp_calloc(omp_default_mem_alloc)");
    omp_free(c, omp_null_allocator);
    omp_alloctrait_t t[1] = {{omp_atk_alignment, 256}};
    omp_allocator_handle_t u = omp_init_allocator(omp_default_mem_space, 1, t);
    void *a = omp_alloc(10, u);
    CHECK(a && ((size_t)a & 255) == 0 && !ours(a), "user allocator on omp_default_mem_space");
    omp_free(a, u);
    omp_destroy_allocator(u);
    int n = 0;
    double x[8];
#pragma omp parallel num_threads(4) private(x) allocate(omp_low_lat_mem_alloc : x) reduction(+ : n)
    {
        x[0] = 1;
        n += !ours(x) && x[0] == 1;
    }
    (void)x;
    CHECK(n == 4, "allocate clause with omp_low_lat_mem_alloc");
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "plain";
    const omp_allocator_handle_t *dev = dlsym(RTLD_DEFAULT, "rankmem_omp_device_mem_alloc");
    const omp_allocator_handle_t *man = dlsym(RTLD_DEFAULT, "rankmem_omp_managed_mem_alloc");
    int (*active)(int *) = (int (*)(int *))dlsym(RTLD_DEFAULT, "rankmem_omp_active");
    block_info = (block_info_fn)dlsym(RTLD_DEFAULT, "rankmem_omp_block_info");

    runtime_allocators();
    if (strcmp(mode, "plain") == 0) {
        CHECK(!dev && !block_info, "rankmem is absent");
    } else if (!dev || !man || !active || !block_info) {
        CHECK(0, "rankmem's symbols are present");
    } else if (strcmp(mode, "preload") == 0) {
        int on = 0;
        CHECK(active(&on) == 0 && on == 1, "rankmem_omp_active says our omp_alloc is in use");
        void *p = omp_alloc(4096, *dev);
        CHECK(ours(p), "omp_alloc(rankmem_omp_device_mem_alloc) is served by rankmem");
        volatile size_t pa = (size_t)p;
        omp_free(p, *dev);
        CHECK(!ours((const void *)pa), "omp_free forgets it");
        omp_allocator_handle_t h = *dev;
        int n = 0;
        double x[8];
#pragma omp parallel num_threads(4) private(x) allocate(h : x) reduction(+ : n)
        n += ours(x);
        (void)x;
        CHECK(n == 4, "allocate clause with rankmem's allocator");
        CHECK(omp_get_default_allocator() == omp_default_mem_alloc, "default unchanged");
    } else if (strcmp(mode, "default") == 0) {
        CHECK(omp_get_default_allocator() == *man, "the environment's default is managed");
        int n = 0;
#pragma omp parallel num_threads(4) reduction(+ : n)
        {
            void *p = omp_alloc(100, omp_null_allocator);
            n += ours(p);
            omp_free(p, omp_null_allocator);
        }
        CHECK(n == 4, "omp_alloc(omp_null_allocator) is rankmem's in every thread");
    } else if (strcmp(mode, "baddefault") == 0) {
        CHECK(omp_get_default_allocator() == omp_default_mem_alloc,
              "a bad value leaves the runtime's default");
    } else {
        CHECK(0, "known mode");
    }
    return failures != 0;
}
