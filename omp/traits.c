/* omp_init_allocator / omp_destroy_allocator: allocators on our memory
 * spaces are built from their traits into a rankmem chain; everything else
 * goes to the runtime. docs/openmp.md lists what each trait does. */
#include "omp_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- runtime allocators created through us: the registry ----
 * Every allocator the runtime made for us on its own memory spaces, with a
 * serial number of its own (never reused, unlike the runtime's addresses).
 * It answers three questions: is a value a live runtime allocator (a
 * destroy twice, or of a value that never was one, is reported and ignored
 * instead of reaching the runtime, which would free its struct twice; an
 * fb_data must be one); is a fallback target still the allocator it named
 * (its serial); and it keeps a destroy from running while a fallback
 * allocates through the allocator (readers hold the lock across the
 * runtime's call). Written only by init and destroy. */
typedef struct foreign {
    rkomp_handle_t h;
    uint64_t serial;
} foreign_t;
static pthread_rwlock_t foreign_lock = PTHREAD_RWLOCK_INITIALIZER;
static foreign_t *foreign_set;
static size_t foreign_count, foreign_cap;
static uint64_t foreign_next = 1; /* under the write lock */

/* Predefined handles of either runtime (libgomp 1..8 and up to 2xx for its
 * extensions, libomp 1..8 and 100..102): never destroyed, passed through. */
#define RKOMP_RUNTIME_PREDEFINED_MAX 1024u

/* h's serial, 0 when it is not registered. Caller holds the lock. */
static uint64_t foreign_find(rkomp_handle_t h)
{
    for (size_t i = 0; i < foreign_count; i++)
        if (foreign_set[i].h == h)
            return foreign_set[i].serial;
    return 0;
}

/* 0: not remembered (no memory); its destroy then passes through
 * unchecked, and it cannot be a fallback target. */
static uint64_t foreign_add(rkomp_handle_t h)
{
    uint64_t serial = 0;
    pthread_rwlock_wrlock(&foreign_lock);
    if (foreign_count == foreign_cap) {
        size_t cap = foreign_cap ? foreign_cap * 2 : 16;
        foreign_t *n = realloc(foreign_set, cap * sizeof *n);
        if (!n) {
            pthread_rwlock_unlock(&foreign_lock);
            return 0;
        }
        foreign_set = n;
        foreign_cap = cap;
    }
    serial = foreign_next++;
    foreign_set[foreign_count++] = (foreign_t){h, serial};
    pthread_rwlock_unlock(&foreign_lock);
    return serial;
}

/* Destroy the runtime's allocator h if it is registered: 1 when it was
 * (now forgotten and destroyed), 0 when unknown. Under the write lock, so
 * that no fallback is inside the runtime with h meanwhile. */
static int foreign_destroy(rkomp_handle_t h)
{
    int found = 0;
    pthread_rwlock_wrlock(&foreign_lock);
    for (size_t i = 0; i < foreign_count; i++)
        if (foreign_set[i].h == h) {
            foreign_set[i] = foreign_set[--foreign_count];
            found = 1;
            break;
        }
    if (found) {
        const rkomp_runtime_t *r = rkomp_rt();
        if (r->destroy_allocator)
            r->destroy_allocator(h);
    }
    pthread_rwlock_unlock(&foreign_lock);
    return found;
}

static uint64_t foreign_serial(rkomp_handle_t h)
{
    pthread_rwlock_rdlock(&foreign_lock);
    uint64_t s = foreign_find(h);
    pthread_rwlock_unlock(&foreign_lock);
    return s;
}

void *rkomp_foreign_fb_alloc(rkomp_handle_t h, uint64_t serial, size_t alignment, size_t size,
                             int zero)
{
    void *p = NULL;
    pthread_rwlock_rdlock(&foreign_lock);
    if (serial && foreign_find(h) == serial)
        p = rkomp_runtime_alloc(h, alignment, size, zero);
    pthread_rwlock_unlock(&foreign_lock);
    return p;
}

int rkomp_runtime_predefined(rkomp_handle_t h)
{
    /* omp_default_mem_alloc .. omp_thread_mem_alloc, in both runtimes. */
    if (h >= 1 && h <= 8)
        return 1;
    /* llvm_omp_target_{host,shared,device}_mem_alloc exist in libomp only
     * (the runtime with __kmpc_alloc); libgomp would read them as pointers.
     * libgomp's own extensions (ompx_gnu_*, 200 and up, GCC 15) are not
     * accepted: an older libgomp reads any value above 8 as a pointer, and
     * which libgomp is loaded cannot be told from its symbols. */
    return h >= 100 && h <= 102 && rkomp_rt()->kmpc_alloc != NULL;
}

/* Whether v may be an fb_data: a live allocator of ours, a predefined one
 * of the runtime's, or one the runtime made through us and not yet
 * destroyed. *tag_p: what identifies it (rkomp_allocator_t.fb_tag). */
static int fb_target(rkomp_handle_t v, uint64_t *tag_p)
{
    if (rkomp_in_range(v)) {
        const rkomp_allocator_t *t = rkomp_lookup(v);
        if (!t)
            return 0;
        *tag_p = __atomic_load_n(&t->gen, __ATOMIC_RELAXED);
        return 1;
    }
    if (rkomp_runtime_predefined(v)) {
        *tag_p = 0;
        return 1;
    }
    return (*tag_p = foreign_serial(v)) != 0;
}

/* ---- traits ---- */

typedef struct parsed {
    unsigned sync_hint, access, pinned, partition;
    int fallback;
    rkomp_handle_t fb_data;
    uint64_t fb_tag; /* see rkomp_allocator_t */
    int has_fb_data;
    size_t alignment, pool_size;
} parsed_t;

static int invalid(const char *why, int key, uintptr_t value)
{
    /* The spec's answer to a bad trait is omp_null_allocator; say why once
     * per call on stderr only when asked (RANKMEM_OMP_VERBOSE), since
     * probing for support with odd values is legitimate. */
    const char *v = getenv("RANKMEM_OMP_VERBOSE");
    if (v && *v && strcmp(v, "0") != 0)
        fprintf(stderr, "rankmem_omp: omp_init_allocator: trait %d = %#lx: %s\n", key,
                (unsigned long)value, why);
    return -1;
}

/* 0 on success, -1 for an invalid trait set (the caller returns
 * omp_null_allocator). */
static int parse(int space, int ntraits, const rkomp_trait_t *traits, parsed_t *p)
{
    memset(p, 0, sizeof *p);
    p->sync_hint = RKOMP_ATV_CONTENDED;
    p->access = RKOMP_ATV_ALL;
    p->pinned = RKOMP_ATV_FALSE;
    p->partition = RKOMP_ATV_ENVIRONMENT;
    p->fallback = RKOMP_ATV_DEFAULT_MEM_FB;
    p->alignment = 1;
    if (ntraits < 0 || (ntraits > 0 && !traits))
        return invalid("bad trait count or NULL trait array", 0, (uintptr_t)ntraits);
    for (int i = 0; i < ntraits; i++) {
        int k = traits[i].key;
        uintptr_t v = traits[i].value;
        int dflt = v == RKOMP_ATV_DEFAULT;
        switch (k) {
        case RKOMP_ATK_SYNC_HINT:
            if (dflt)
                v = RKOMP_ATV_CONTENDED;
            if (v < RKOMP_ATV_CONTENDED || v > RKOMP_ATV_PRIVATE)
                return invalid("sync_hint takes contended, uncontended, serialized or private",
                               k, v);
            p->sync_hint = (unsigned)v;
            break;
        case RKOMP_ATK_ALIGNMENT:
            if (dflt)
                v = 1;
            if (!v || (v & (v - 1)))
                return invalid("alignment must be a power of two", k, v);
            /* What rankmem serves at most: a larger trait would make every
             * allocation fail (runtime spaces: the runtime's business). */
            if (space != RKOMP_SPACE_FOREIGN && v > RANKMEM_MAX_ALIGNMENT)
                return invalid("alignment above 1 GiB, the largest rankmem serves", k, v);
            p->alignment = v;
            break;
        case RKOMP_ATK_ACCESS:
            if (dflt)
                v = RKOMP_ATV_ALL;
            if (v < RKOMP_ATV_ALL || v > RKOMP_ATV_CGROUP)
                return invalid("access takes all, cgroup, pteam or thread", k, v);
            p->access = (unsigned)v;
            break;
        case RKOMP_ATK_POOL_SIZE:
            if (dflt) {
                p->pool_size = 0;
                break;
            }
            if (!v)
                return invalid("pool_size must be a positive number of bytes", k, v);
            p->pool_size = v;
            break;
        case RKOMP_ATK_FALLBACK:
            if (dflt)
                v = RKOMP_ATV_DEFAULT_MEM_FB;
            if (v < RKOMP_ATV_DEFAULT_MEM_FB || v > RKOMP_ATV_ALLOCATOR_FB)
                return invalid("fallback takes default_mem_fb, null_fb, abort_fb or allocator_fb",
                               k, v);
            p->fallback = (int)v;
            break;
        case RKOMP_ATK_FB_DATA:
            /* No default target: the same as not given. */
            if (dflt) {
                p->fb_data = RKOMP_NULL_ALLOCATOR;
                p->has_fb_data = 0;
                break;
            }
            /* Checked now, since a fallback would jump through it: a
             * garbage value read as the runtime's struct crashes there. */
            if (!fb_target(v, &p->fb_tag))
                return invalid("fb_data must be a predefined allocator or a live one made by "
                               "omp_init_allocator",
                               k, v);
            p->fb_data = v;
            p->has_fb_data = 1;
            break;
        case RKOMP_ATK_PINNED:
            if (dflt)
                v = RKOMP_ATV_FALSE;
            if (v != RKOMP_ATV_TRUE && v != RKOMP_ATV_FALSE)
                return invalid("pinned takes true or false", k, v);
            /* Managed memory migrates between host and device: it cannot
             * promise to stay put. Device memory never pages, and the pinned
             * space is pinned by construction. */
            if (v == RKOMP_ATV_TRUE && space == RKOMP_SPACE_MANAGED)
                return invalid("managed memory cannot be pinned", k, v);
            p->pinned = (unsigned)v;
            break;
        case RKOMP_ATK_PARTITION:
            if (dflt)
                v = RKOMP_ATV_ENVIRONMENT;
            if (v < RKOMP_ATV_ENVIRONMENT || v > RKOMP_ATV_INTERLEAVED)
                return invalid("partition takes environment, nearest, blocked or interleaved", k,
                               v);
            p->partition = (unsigned)v;
            break;
        default: return invalid("unknown trait key", k, v);
        }
    }
    if (p->fallback == RKOMP_ATV_ALLOCATOR_FB && !p->has_fb_data)
        return invalid("allocator_fb needs an fb_data allocator", RKOMP_ATK_FALLBACK,
                       RKOMP_ATV_ALLOCATOR_FB);
    return 0;
}

/* The chain an allocator owns: a per-thread cache for sync_hint private, a
 * limit for pool_size on top of everything, so that it counts exactly the
 * bytes handed out through the allocator (a cache below it rounds requests
 * up to its bins and keeps freed blocks, which are not the program's) and a
 * reallocation can count its old block as released
 * (rankmem_limit_allocate_replacing). Device allocators with neither follow
 * the current device's resource on every call instead (chain NULL). */
static rankmem_status_t build_chain(int space, const parsed_t *p, rankmem_resource_t **chain_p)
{
    *chain_p = NULL;
    int own = p->pool_size || p->sync_hint == RKOMP_ATV_PRIVATE;
    if (!own && space == RKOMP_SPACE_DEVICE)
        return RANKMEM_SUCCESS;
    rankmem_resource_t *base, *mr;
    rankmem_status_t st = rkomp_space_resource(space, &base);
    if (st != RANKMEM_SUCCESS)
        return st;
    if ((st = rankmem_resource_retain(base)) != RANKMEM_SUCCESS)
        return st;
    mr = base;
    if (p->sync_hint == RKOMP_ATV_PRIVATE) {
        rankmem_resource_t *cache;
        st = rankmem_caching_create(mr, NULL, &cache);
        rankmem_resource_release(mr);
        if (st != RANKMEM_SUCCESS)
            return st;
        mr = cache;
    }
    if (p->pool_size) {
        rankmem_resource_t *lim;
        st = rankmem_limit_create(mr, p->pool_size, &lim);
        rankmem_resource_release(mr);
        if (st != RANKMEM_SUCCESS)
            return st;
        mr = lim;
    }
    *chain_p = mr;
    return RANKMEM_SUCCESS;
}

static void fill(rkomp_allocator_t *a, int space, const parsed_t *p)
{
    a->space = space;
    a->ent = -1;
    a->fallback = p->fallback;
    a->fb_data = p->fb_data;
    a->fb_tag = p->fb_tag;
    a->alignment = p->alignment;
    a->pool_size = p->pool_size;
    a->sync_hint = p->sync_hint;
    a->access = p->access;
    a->pinned = p->pinned;
    a->partition = p->partition;
}

static rkomp_handle_t publish(rkomp_allocator_t *a)
{
    rkomp_handle_t h = rkomp_handle_of(a);
    __atomic_store_n(&a->state, RKOMP_STATE_LIVE, __ATOMIC_RELEASE);
    return h;
}

/* The traits as the runtime gets them on its own memory spaces, checked
 * by parse() first: each value as parsed (omp_atv_default replaced by the
 * default, which libomp aborts on for some keys), pool_size without a pool
 * left out, and fb_data only where it is one of the runtime's predefined
 * allocators, which it can follow itself; any other target (ours, or an
 * allocator the runtime made through us, which may be destroyed before the
 * fallback runs) stays with our wrapper, the runtime then gets null_fb.
 * *n_p: how many. NULL without memory. */
static rkomp_trait_t *runtime_traits(int ntraits, const rkomp_trait_t *traits, const parsed_t *p,
                                     int wrap, int *n_p)
{
    rkomp_trait_t *t = malloc((size_t)(ntraits > 0 ? ntraits : 1) * sizeof *t);
    if (!t)
        return NULL;
    int n = 0;
    for (int i = 0; i < ntraits; i++) {
        uintptr_t v;
        switch (traits[i].key) {
        case RKOMP_ATK_SYNC_HINT: v = p->sync_hint; break;
        case RKOMP_ATK_ALIGNMENT: v = p->alignment; break;
        case RKOMP_ATK_ACCESS: v = p->access; break;
        case RKOMP_ATK_POOL_SIZE:
            if (!p->pool_size)
                continue;
            v = p->pool_size;
            break;
        case RKOMP_ATK_FALLBACK: v = wrap ? RKOMP_ATV_NULL_FB : (uintptr_t)p->fallback; break;
        case RKOMP_ATK_FB_DATA:
            if (!p->has_fb_data || !rkomp_runtime_predefined(p->fb_data))
                continue;
            v = p->fb_data;
            break;
        case RKOMP_ATK_PINNED: v = p->pinned; break;
        default: v = p->partition; break; /* RKOMP_ATK_PARTITION: parse() took no other key */
        }
        t[n].key = traits[i].key;
        t[n].value = v;
        n++;
    }
    *n_p = n;
    return t;
}

/* omp_init_allocator on one of the runtime's memory spaces, traits parsed.
 * An allocator_fb whose target is not one of the runtime's predefined
 * allocators is applied by a small allocator of ours that wraps the
 * runtime's (RKOMP_SPACE_FOREIGN): the runtime would read our handle as its
 * own struct, and would follow a destroyed allocator of its own. */
static rkomp_handle_t init_foreign(const rkomp_runtime_t *r, rkomp_handle_t memspace,
                                   int ntraits, const rkomp_trait_t *traits, const parsed_t *p)
{
    int wrap = p->fallback == RKOMP_ATV_ALLOCATOR_FB && !rkomp_runtime_predefined(p->fb_data);
    int n;
    rkomp_trait_t *t = runtime_traits(ntraits, traits, p, wrap, &n);
    if (!t)
        return RKOMP_NULL_ALLOCATOR;
    rkomp_handle_t inner = r->init_allocator(memspace, n, t);
    free(t);
    if (inner == RKOMP_NULL_ALLOCATOR)
        return RKOMP_NULL_ALLOCATOR;
    if (!wrap) {
        if (inner > RKOMP_RUNTIME_PREDEFINED_MAX)
            foreign_add(inner);
        return inner;
    }
    rkomp_allocator_t *a = rkomp_slot_get();
    if (!a) {
        r->destroy_allocator(inner);
        return RKOMP_NULL_ALLOCATOR;
    }
    parsed_t w;
    memset(&w, 0, sizeof w);
    w.fallback = RKOMP_ATV_ALLOCATOR_FB;
    w.fb_data = p->fb_data;
    w.fb_tag = p->fb_tag;
    w.alignment = p->alignment;
    fill(a, RKOMP_SPACE_FOREIGN, &w);
    a->foreign = inner;
    return publish(a);
}

RKOMP_EXPORT rkomp_handle_t omp_init_allocator(rkomp_handle_t memspace, int ntraits,
                                               const rkomp_trait_t *traits)
{
    const rkomp_runtime_t *r = rkomp_rt();
    int space = rkomp_space_of(memspace);
    parsed_t p;
    if (space < 0) {
        /* The runtime's memory space: the traits are checked here too (the
         * specification's answer to a bad one is omp_null_allocator; libomp
         * aborts on some, and neither runtime checks fb_data). */
        if (!r->init_allocator || parse(RKOMP_SPACE_FOREIGN, ntraits, traits, &p) != 0)
            return RKOMP_NULL_ALLOCATOR;
        return init_foreign(r, memspace, ntraits, traits, &p);
    }
    if (parse(space, ntraits, traits, &p) != 0)
        return RKOMP_NULL_ALLOCATOR;
    rkomp_allocator_t *a = rkomp_slot_get();
    if (!a) {
        fprintf(stderr, "rankmem_omp: omp_init_allocator: %u allocators are live, the most "
                        "librankmem_omp keeps at once\n",
                RKOMP_MAX_ALLOCATORS);
        return RKOMP_NULL_ALLOCATOR;
    }
    rankmem_resource_t *chain;
    if (build_chain(space, &p, &chain) != RANKMEM_SUCCESS) {
        rkomp_slot_put(a);
        return RKOMP_NULL_ALLOCATOR;
    }
    fill(a, space, &p);
    a->chain = chain;
    /* Its blocks are counted by an entry holding one reference on the chain
     * (no entry left: each block holds its own). */
    a->ent = chain ? rkomp_ent_create(chain) : -1;
    return publish(a);
}

RKOMP_EXPORT void omp_destroy_allocator(rkomp_handle_t allocator)
{
    if (allocator == RKOMP_NULL_ALLOCATOR)
        return;
    if (!rkomp_in_range(allocator)) {
        /* libgomp frees whatever it is given, predefined handles included. */
        if (allocator <= RKOMP_RUNTIME_PREDEFINED_MAX)
            return;
        /* An allocator that names this one as its fallback then gets NULL
         * from that fallback (its serial is gone), as null_fb would. */
        if (!foreign_destroy(allocator))
            fprintf(stderr,
                    "rankmem_omp: omp_destroy_allocator(%#lx): not a live allocator (destroyed "
                    "twice?); ignored\n",
                    (unsigned long)allocator);
        return;
    }
    rkomp_allocator_t *a = rkomp_lookup(allocator);
    unsigned idx = a ? (unsigned)((rkomp_slot_t *)a - rkomp_slots) : 0;
    if (a && idx < RKOMP_NPREDEFINED) {
        fprintf(stderr, "rankmem_omp: omp_destroy_allocator: rankmem's predefined allocators "
                        "cannot be destroyed; ignored\n");
        return;
    }
    unsigned live = RKOMP_STATE_LIVE;
    /* Only one of two racing destroys wins the slot. */
    if (!a || !__atomic_compare_exchange_n(&a->state, &live, RKOMP_STATE_DYING, 0,
                                           __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
        fprintf(stderr,
                "rankmem_omp: omp_destroy_allocator(%#lx): not a live allocator (destroyed "
                "twice?); ignored\n",
                (unsigned long)allocator);
        return;
    }
    /* Blocks still live keep the chain (through its entry, or their own
     * references): freeing them later stays safe, and the chain goes when
     * the last of them does. */
    if (a->chain) {
        /* Its blocks waiting for a device sync go back now, so that the
         * chain does not outlive the allocator because of them. */
        rkomp_map_flush(a->chain, NULL);
        rkomp_ent_retire(a->ent);
        rankmem_resource_release(a->chain);
    }
    if (a->space == RKOMP_SPACE_FOREIGN && a->foreign) {
        const rkomp_runtime_t *r = rkomp_rt();
        if (r->destroy_allocator)
            r->destroy_allocator(a->foreign);
    }
    /* Its generation moves on: an allocator whose fallback it was finds
     * another generation there (rkomp_allocator_t.fb_tag) and gets NULL. */
    rkomp_slot_put(a);
}

/* ---- public extras (rankmem_omp.h) ---- */

RKOMP_EXPORT rankmem_status_t rankmem_omp_allocator_resource(rkomp_handle_t allocator,
                                                             rankmem_resource_t **mr_p)
{
    if (!mr_p)
        return RANKMEM_ERR_INVALID_ARGUMENT;
    rkomp_allocator_t *a = rkomp_lookup(allocator);
    if (!a || a->space == RKOMP_SPACE_FOREIGN)
        return RANKMEM_ERR_INVALID_ARGUMENT;
    if (a->chain) {
        *mr_p = a->chain;
        return RANKMEM_SUCCESS;
    }
    return rkomp_space_resource(a->space, mr_p);
}

RKOMP_EXPORT rankmem_status_t rankmem_omp_is_rankmem_allocator(rkomp_handle_t allocator,
                                                               int *ours_p)
{
    if (!ours_p)
        return RANKMEM_ERR_INVALID_ARGUMENT;
    *ours_p = rkomp_lookup(allocator) != NULL;
    return RANKMEM_SUCCESS;
}
