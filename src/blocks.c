/* blocks: see blocks.h. */
#define _GNU_SOURCE
#include "blocks.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SLAB_BYTES ((size_t)16 << 10) /* descriptors come 16 KiB at a time */

__thread unsigned rk_thread_slot __attribute__((tls_model("initial-exec")));

/* Thread slots are recycled: a thread takes the lowest free one and gives
 * it back when it exits. Runtimes create threads anew (libgomp makes a new
 * team when a smaller one grows again), and a slot counter that only grew
 * would put two live threads in one shard after 32 threads had come and
 * gone; with different streams they would then pass memory back and forth
 * through events on every pair. Lowest free first: n live threads use the
 * first n shards, distinct up to RK_NSHARDS. */
#define SLOT_WORDS 64 /* 4096 recycled slots; later threads share by counter */
static pthread_mutex_t slot_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t slot_used[SLOT_WORDS];
static unsigned overflow_slot = SLOT_WORDS * 64;
static pthread_once_t slot_once = PTHREAD_ONCE_INIT;
static pthread_key_t slot_key;
static int slot_key_ok;

static void slot_exit(void *arg)
{
    unsigned s = (unsigned)(uintptr_t)arg - 1;
    pthread_mutex_lock(&slot_lock);
    slot_used[s / 64] &= ~((uint64_t)1 << (s % 64));
    pthread_mutex_unlock(&slot_lock);
    rk_thread_slot = 0; /* a later call from another destructor takes a new one */
}

static void slot_make_key(void) { slot_key_ok = pthread_key_create(&slot_key, slot_exit) == 0; }

/* If the library is unloaded, exiting threads must not call into unmapped code. */
__attribute__((destructor)) static void slot_unload(void)
{
    if (slot_key_ok)
        pthread_key_delete(slot_key);
    slot_key_ok = 0;
}

unsigned rk_thread_slot_assign(void)
{
    pthread_once(&slot_once, slot_make_key);
    unsigned s = 0;
    pthread_mutex_lock(&slot_lock);
    for (unsigned w = 0; w < SLOT_WORDS && !s; w++)
        if (~slot_used[w]) {
            unsigned b = (unsigned)__builtin_ctzll(~slot_used[w]);
            slot_used[w] |= (uint64_t)1 << b;
            s = w * 64 + b + 1;
        }
    pthread_mutex_unlock(&slot_lock);
    /* Without the exit hook the slot stays taken: correct, only not reused. */
    if (s && slot_key_ok)
        (void)pthread_setspecific(slot_key, (void *)(uintptr_t)s);
    if (!s) /* more than 4096 threads alive at once */
        s = __atomic_add_fetch(&overflow_slot, 1, __ATOMIC_RELAXED);
    return rk_thread_slot = s;
}

rankmem_status_t rk_shards_new(size_t stride, void **shards_p)
{
    void *shards = NULL;
    if (posix_memalign(&shards, RK_SHARD_APART, RK_NSHARDS * stride) != 0)
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "no host memory for %d shards", RK_NSHARDS);
    memset(shards, 0, RK_NSHARDS * stride);
    for (unsigned i = 0; i < RK_NSHARDS; i++)
        rk_block_init(&rk_shard_at(shards, stride, i)->lock, 0); /* claimed on first use */
    *shards_p = shards;
    return RANKMEM_SUCCESS;
}

void rk_shards_free(void *shards, size_t stride)
{
    for (unsigned i = 0; shards && i < RK_NSHARDS; i++) {
        rk_shard_t *sh = rk_shard_at(shards, stride, i);
        rk_lists_clear(sh);
        free(sh->lists);
        while (sh->slabs) {
            rk_slab_t *s = sh->slabs;
            sh->slabs = s->next;
            free(s);
        }
        rk_ptrmap_fini(&sh->live_map);
    }
    free(shards);
}

void rk_shards_lock_all(void *shards, size_t stride)
{
    for (unsigned i = 0; i < RK_NSHARDS; i++)
        rk_shard_lock(rk_shard_at(shards, stride, i));
}

void rk_shards_unlock_all(void *shards, size_t stride)
{
    for (unsigned i = RK_NSHARDS; i-- > 0;)
        rk_shard_unlock(rk_shard_at(shards, stride, i));
}

void *rk_desc_refill(rk_shard_t *sh, size_t size)
{
    /* Descriptors hold pointers: keep them pointer-aligned after the header. */
    size_t head = rk_align_up(sizeof(rk_slab_t), 16);
    size = rk_align_up(size, sizeof(void *));
    rk_slab_t *s = malloc(SLAB_BYTES);
    if (!s)
        return NULL;
    s->next = sh->slabs;
    sh->slabs = s;
    size_t n = (SLAB_BYTES - head) / size;
    char *d = (char *)s + head;
    for (size_t i = 1; i < n; i++) /* the first is handed out */
        rk_desc_free(sh, d + i * size);
    return d;
}

rk_slist_t *rk_list_find(rk_shard_t *sh, rankmem_stream_t stream, size_t create_size)
{
    for (size_t i = 0; i < sh->nlists; i++)
        if (sh->lists[i]->stream == stream)
            return sh->hint = sh->lists[i];
    if (!create_size)
        return NULL;
    if (sh->nlists == sh->cap_lists) {
        size_t cap = sh->cap_lists ? sh->cap_lists * 2 : 8;
        rk_slist_t **l = realloc(sh->lists, cap * sizeof *l);
        if (!l)
            return NULL;
        sh->lists = l;
        sh->cap_lists = cap;
    }
    rk_slist_t *l = calloc(1, create_size);
    if (!l)
        return NULL;
    l->stream = stream;
    sh->lists[sh->nlists++] = l;
    return sh->hint = l;
}

void rk_list_drop(rk_shard_t *sh, rk_slist_t *l)
{
    size_t k = 0;
    while (sh->lists[k] != l)
        k++;
    sh->lists[k] = sh->lists[--sh->nlists];
    rk_gpu_event_destroy(l->event);
    free(l);
    sh->hint = NULL;
}

void rk_lists_clear(rk_shard_t *sh)
{
    for (size_t k = 0; k < sh->nlists; k++) {
        rk_gpu_event_destroy(sh->lists[k]->event);
        free(sh->lists[k]);
    }
    sh->nlists = 0;
    sh->hint = NULL;
}

rk_shard_t *rk_shards_find_live(void *shards, size_t stride, const rk_shard_t *skip,
                                const void *ptr, size_t *slot_p)
{
    for (unsigned i = 0; i < RK_NSHARDS; i++) {
        rk_shard_t *sh = rk_shard_at(shards, stride, i);
        if (sh == skip)
            continue;
        rk_shard_lock(sh);
        size_t slot = rk_live_find(sh, ptr);
        if (slot != SIZE_MAX) {
            *slot_p = slot;
            return sh;
        }
        rk_shard_unlock(sh);
    }
    return NULL;
}

size_t rk_shards_sum(void *shards, size_t stride, rankmem_query_t what)
{
    size_t v = 0;
    for (unsigned i = 0; i < RK_NSHARDS; i++) {
        rk_shard_t *sh = rk_shard_at(shards, stride, i);
        rk_shard_lock(sh);
        if (what == RANKMEM_QUERY_USED_CURRENT)
            v += sh->used;
        else if (what == RANKMEM_QUERY_USED_HIGH)
            v += sh->used_high;
        else if (what == RANKMEM_QUERY_LIVE_COUNT)
            v += sh->live;
        rk_shard_unlock(sh);
    }
    return v;
}

size_t rk_shards_live(void *shards, size_t stride, size_t *bytes_p)
{
    size_t live = 0, used = 0;
    for (unsigned i = 0; shards && i < RK_NSHARDS; i++) {
        live += rk_shard_at(shards, stride, i)->live;
        used += rk_shard_at(shards, stride, i)->used;
    }
    *bytes_p = used;
    return live;
}
