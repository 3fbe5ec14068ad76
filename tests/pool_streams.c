/* Stream ordering of the pool, on a host upstream with stand-in stream
 * handles (no CUDA calls happen for host memory): per-stream free lists,
 * taking blocks from another stream, merging lists before growing, and
 * forgetting a stream. */
#include <stdint.h>
#include <string.h>
#include <rankmem.h>
#include "tap.h"
#include "counting.h"

#define SA ((rankmem_stream_t)(uintptr_t)0x1000)
#define SB ((rankmem_stream_t)(uintptr_t)0x2000)
#define SC ((rankmem_stream_t)(uintptr_t)0x3000)

static size_t q(rankmem_resource_t *mr, rankmem_query_t what)
{
    size_t v = (size_t)-1;
    rankmem_resource_query(mr, what, &v);
    return v;
}

int main(void)
{
    int finalized;
    counting_t *up = counting_new(&finalized);
    rankmem_pool_params_t prm;
    rankmem_pool_params_default(&prm);
    prm.initial_size = 1 << 20;
    prm.maximum_size = 1 << 20;
    rankmem_resource_t *pool;
    if (rankmem_pool_create(&up->base, &prm, &pool) != RANKMEM_SUCCESS)
        BAIL_OUT("pool_create: %s", rankmem_last_error());
    unsigned props = 0;
    rankmem_resource_properties(pool, &props);
    ok(props & RANKMEM_PROP_STREAM_ORDERED, "the pool is stream-ordered");
    ok(props & RANKMEM_PROP_HOST_ACCESSIBLE, "and host-accessible over a host upstream");

    void *q4[4];
    int good = 1;
    for (int i = 0; i < 4; i++)
        good &= rankmem_allocate_async(pool, 256 << 10, 0, SA, &q4[i]) == RANKMEM_SUCCESS;
    ok(good, "four quarters on stream A (taken from the default stream's initial block)");

    /* Same stream: reused at once. */
    rankmem_deallocate_async(pool, q4[0], 256 << 10, 0, SA);
    void *again = NULL;
    rankmem_allocate_async(pool, 256 << 10, 0, SA, &again);
    ok(again == q4[0], "a block freed on A is reused on A");

    /* Blocks freed on different streams do not coalesce with each other. */
    rankmem_deallocate_async(pool, again, 256 << 10, 0, SA);
    rankmem_deallocate_async(pool, q4[1], 256 << 10, 0, SA);
    rankmem_deallocate_async(pool, q4[2], 256 << 10, 0, SB);
    ok(q(pool, RANKMEM_QUERY_FREE_BLOCKS) == 2,
       "A's two neighbours coalesced, B's neighbour stayed apart (%zu free blocks)",
       q(pool, RANKMEM_QUERY_FREE_BLOCKS));

    /* C has no free list of its own: it takes from another stream's. */
    void *c = NULL;
    is_status(rankmem_allocate_async(pool, 128 << 10, 0, SC, &c), RANKMEM_SUCCESS,
              "stream C takes a block freed on another stream");
    ok(c == q4[2] || c == q4[0], "from one of the freed blocks");
    rankmem_deallocate_async(pool, c, 128 << 10, 0, SC);

    /* No single list fits 768 KiB, but A + B + C together do: merge, no growth. */
    void *big = NULL;
    is_status(rankmem_allocate_async(pool, 768 << 10, 0, SC, &big), RANKMEM_SUCCESS,
              "lists are merged and coalesced before the pool would grow");
    ok(big == q4[0], "the merged block starts at the first quarter");
    ok(up->allocs == 1, "the upstream was not asked again");
    rankmem_deallocate_async(pool, big, 768 << 10, 0, SC);
    rankmem_deallocate_async(pool, q4[3], 256 << 10, 0, SB);

    is_status(rankmem_pool_forget_stream(pool, SC), RANKMEM_SUCCESS, "forget stream C");
    is_status(rankmem_pool_forget_stream(pool, SC), RANKMEM_SUCCESS, "forgetting it twice is harmless");
    is_status(rankmem_pool_forget_stream(pool, NULL), RANKMEM_SUCCESS, "forgetting the default stream is a no-op");
    is_status(rankmem_pool_forget_stream(pool, SB), RANKMEM_SUCCESS, "forget stream B");
    ok(q(pool, RANKMEM_QUERY_FREE_BLOCKS) == 1, "forgotten lists merged into one block (%zu)",
       q(pool, RANKMEM_QUERY_FREE_BLOCKS));
    void *all = NULL;
    is_status(rankmem_allocate(pool, 1 << 20, 0, &all), RANKMEM_SUCCESS, "the whole pool on the default stream");
    is_status(rankmem_deallocate_async(pool, all, 1 << 20, 0, SB), RANKMEM_SUCCESS,
              "freeing on a stream the pool forgot starts a new list");

    /* Many streams: each gets its list, lookups stay correct past the first slots. */
    void *ps[40];
    good = 1;
    for (int i = 0; i < 40; i++)
        good &= rankmem_allocate_async(pool, 8 << 10, 0, (rankmem_stream_t)(uintptr_t)(0x10000 + i * 16), &ps[i]) == RANKMEM_SUCCESS;
    for (int i = 0; i < 40; i++)
        good &= rankmem_deallocate_async(pool, ps[i], 8 << 10, 0, (rankmem_stream_t)(uintptr_t)(0x10000 + i * 16)) == RANKMEM_SUCCESS;
    ok(good, "40 streams allocate and free");
    is_status(rankmem_allocate(pool, 1 << 20, 0, &all), RANKMEM_SUCCESS, "and all their blocks merge back into the whole pool");
    rankmem_deallocate(pool, all, 1 << 20, 0);
    ok(q(pool, RANKMEM_QUERY_LIVE_COUNT) == 0, "nothing live");
    rankmem_resource_release(&up->base);
    is_status(rankmem_resource_release(pool), RANKMEM_SUCCESS, "released");
    ok(finalized, "chain gone");
    return tap_done();
}
