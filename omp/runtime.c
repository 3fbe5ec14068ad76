/* The OpenMP runtime's own allocator functions, found once with
 * dlsym(RTLD_NEXT, ...), and start-up: RANKMEM_OMP_DEFAULT_ALLOCATOR,
 * RANKMEM_OMP_FREE_SYNC, RANKMEM_OMP_DEFER_BYTES, and a warning when the runtime's omp_alloc comes
 * before ours in the search order (our allocators would not be in use). */
#define _GNU_SOURCE 1
#include "omp_internal.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

rkomp_runtime_t rkomp_rt_table;
static pthread_once_t rt_once = PTHREAD_ONCE_INIT;
int rkomp_free_sync_v = 1;
static size_t defer_bytes = (size_t)256 << 20;
/* RKOMP_TEST_DEFER=1 (tests only, deliberately not a RANKMEM_* option):
 * without a GPU, host blocks of ours take the deferred-release path with a
 * no-op wait, so that the CPU tests exercise it. */
static int test_defer;

/* Never resolve to ourselves (which RTLD_NEXT cannot do, but a fallback
 * lookup could): that would recurse forever. */
static void *next_sym(const char *name)
{
    void *f = dlsym(RTLD_NEXT, name);
    Dl_info self, other;
    if (f && dladdr((void *)rkomp_self_omp_alloc, &self) && dladdr(f, &other) &&
        self.dli_fbase == other.dli_fbase)
        return NULL;
    return f;
}

static void *runtime_lib; /* dlopen'ed runtime, when none came with the program */

static void *find_sym(const char *name)
{
    return runtime_lib ? dlsym(runtime_lib, name) : next_sym(name);
}

#define RESOLVE(member, name) *(void **)&rkomp_rt_table.member = find_sym(name)

/* A program whose only OpenMP calls are allocator calls resolves all of them
 * to us at link time, so a linker running --as-needed (Debian's and
 * Ubuntu's gcc do) drops the runtime from it. Without us the program would
 * have had it: load one, so that the runtime's handles keep working. */
static void load_runtime(void)
{
    static const char *const names[] = {"libgomp.so.1", "libomp.so.5", "libomp.so",
                                        "libiomp5.so"};
    if (next_sym("omp_alloc"))
        return;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !runtime_lib; i++)
        runtime_lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
}

static void apply_env_default(void);

static int interposed;

static void check_order(void)
{
    void *first = dlsym(RTLD_DEFAULT, "omp_alloc");
    interposed = !first || first == (void *)rkomp_self_omp_alloc;
    if (interposed)
        return;
    Dl_info who;
    const char *lib = dladdr(first, &who) && who.dli_fname ? who.dli_fname : "another library";
    fprintf(stderr,
            "rankmem_omp: omp_alloc resolves to %s, which comes before librankmem_omp: "
            "rankmem's OpenMP allocators are not in use (link -lrankmem_omp before the OpenMP "
            "runtime, or LD_PRELOAD librankmem_omp.so)\n",
            lib);
}

static void resolve(void)
{
    load_runtime();
    RESOLVE(alloc, "omp_alloc");
    RESOLVE(aligned_alloc, "omp_aligned_alloc");
    RESOLVE(calloc, "omp_calloc");
    RESOLVE(aligned_calloc, "omp_aligned_calloc");
    RESOLVE(realloc, "omp_realloc");
    RESOLVE(free, "omp_free");
    RESOLVE(init_allocator, "omp_init_allocator");
    RESOLVE(destroy_allocator, "omp_destroy_allocator");
    RESOLVE(set_default_allocator, "omp_set_default_allocator");
    RESOLVE(get_default_allocator, "omp_get_default_allocator");
    RESOLVE(gomp_alloc, "GOMP_alloc");
    RESOLVE(gomp_free, "GOMP_free");
    RESOLVE(kmpc_alloc, "__kmpc_alloc");
    RESOLVE(kmpc_aligned_alloc, "__kmpc_aligned_alloc");
    RESOLVE(kmpc_calloc, "__kmpc_calloc");
    RESOLVE(kmpc_realloc, "__kmpc_realloc");
    RESOLVE(kmpc_free, "__kmpc_free");

    const char *v = getenv("RANKMEM_OMP_FREE_SYNC");
    if (v && *v) {
        int b;
        if (rankmem_parse_bool(v, &b) == RANKMEM_SUCCESS)
            rkomp_free_sync_v = b;
        else
            fprintf(stderr,
                    "rankmem_omp: RANKMEM_OMP_FREE_SYNC: bad boolean '%s' (expected 1/0, on/off, "
                    "yes/no, true/false); keeping the default (on)\n",
                    v);
    }
    v = getenv("RANKMEM_OMP_DEFER_BYTES");
    if (v && *v) {
        size_t n;
        if (rankmem_parse_size(v, 0, &n) == RANKMEM_SUCCESS)
            defer_bytes = n;
        else
            fprintf(stderr,
                    "rankmem_omp: RANKMEM_OMP_DEFER_BYTES: bad size '%s' (expected bytes, or "
                    "with a unit: 64MiB, 1G; 0 = a wait per free); keeping the default (256 MiB)\n",
                    v);
    }
    v = getenv("RKOMP_TEST_DEFER");
    test_defer = v && !strcmp(v, "1");
    check_order();
    apply_env_default();
}

int rkomp_rt_ready; /* atomic: resolve() finished (saves the once on hot paths) */

static void resolve_once(void)
{
    resolve();
    __atomic_store_n(&rkomp_rt_ready, 1, __ATOMIC_RELEASE);
}

const rkomp_runtime_t *rkomp_rt_slow(void)
{
    pthread_once(&rt_once, resolve_once);
    return &rkomp_rt_table;
}

int rkomp_interposed(void)
{
    rkomp_rt();
    return interposed;
}

size_t rkomp_defer_bytes(void)
{
    rkomp_rt();
    return defer_bytes;
}

int rkomp_test_defer(void)
{
    rkomp_rt();
    return test_defer;
}

/* Without a runtime (a program using only our allocators, built without
 * -fopenmp) the default allocator is a plain per-thread value. */
static _Thread_local rkomp_handle_t own_default;

rkomp_handle_t rkomp_get_default(void)
{
    const rkomp_runtime_t *r = rkomp_rt();
    if (RKOMP_LIKELY(r->get_default_allocator != NULL))
        return r->get_default_allocator();
    return own_default ? own_default : RKOMP_DEFAULT_MEM_ALLOC;
}

void rkomp_set_default(rkomp_handle_t h)
{
    const rkomp_runtime_t *r = rkomp_rt();
    if (r->set_default_allocator)
        r->set_default_allocator(h);
    else
        own_default = h;
}

/* RANKMEM_OMP_DEFAULT_ALLOCATOR=device|managed|pinned (or the full names
 * rankmem_omp_*_mem_alloc) makes one of ours the initial thread's default
 * allocator; threads of parallel regions inherit it through the runtime's
 * ICV as they would OMP_ALLOCATOR's. */
static void apply_env_default(void)
{
    const char *v = getenv("RANKMEM_OMP_DEFAULT_ALLOCATOR");
    if (!v || !*v)
        return;
    static const char *const names[RKOMP_NPREDEFINED] = {"device", "managed", "pinned"};
    for (unsigned i = 0; i < RKOMP_NPREDEFINED; i++) {
        char full[40];
        snprintf(full, sizeof full, "rankmem_omp_%s_mem_alloc", names[i]);
        if (strcasecmp(v, names[i]) == 0 || strcasecmp(v, full) == 0) {
            /* Inside resolve(): rkomp_set_default would re-enter the once. */
            rkomp_handle_t h = rkomp_handle_of(&rkomp_slots[i].a);
            if (rkomp_rt_table.set_default_allocator)
                rkomp_rt_table.set_default_allocator(h);
            else
                own_default = h;
            return;
        }
    }
    fprintf(stderr,
            "rankmem_omp: RANKMEM_OMP_DEFAULT_ALLOCATOR: unknown allocator '%s' (expected "
            "device, managed or pinned); ignored\n",
            v);
}

/* Start-up: resolve now, so that the environment's default allocator is in
 * place before main and a bad link order is reported once, early. */
__attribute__((constructor)) static void rkomp_startup(void) { rkomp_rt(); }
