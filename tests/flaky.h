/* A host upstream for regression tests (issue 31), made with the public
 * callback resource: it fails the Nth allocate call on demand, records the
 * largest size it was asked for, can refuse every request above a size
 * without calling the system allocator (so that tests of huge requests ask
 * glibc or AddressSanitizer for nothing absurd), and can hand out memory
 * that is 256-aligned but never 512-aligned when asked for 256 (as an
 * upstream that honours only what it is asked may). */
#ifndef RANKMEM_TEST_FLAKY_H
#define RANKMEM_TEST_FLAKY_H

#include <stdint.h>
#include <stdlib.h>
#include <rankmem.h>

typedef struct {
    size_t calls;       /* allocate calls so far */
    size_t fail_at;     /* fail the call with this number (1 = the next one; 0 = never) */
    rankmem_status_t fail_status; /* what the failed call returns (0: OUT_OF_MEMORY) */
    size_t failed;      /* calls failed on demand */
    size_t refuse_above; /* OUT_OF_MEMORY above this many bytes (0: never) */
    int skew;           /* alignment 256: memory 256- but not 512-aligned */
    size_t largest;     /* largest size asked for, failed or not */
    size_t live_bytes, live_blocks;
} flaky_t;

/* Skewed blocks keep the start of their real allocation just below. */
#define FLAKY_SKEW 256

static rankmem_status_t flaky_alloc(void *arg, size_t bytes, size_t alignment,
                                    rankmem_stream_t stream, void **ptr_p)
{
    (void)stream;
    flaky_t *f = arg;
    f->calls++;
    if (bytes > f->largest)
        f->largest = bytes;
    if (f->fail_at && f->calls == f->fail_at) {
        f->failed++;
        return f->fail_status ? f->fail_status : RANKMEM_ERR_OUT_OF_MEMORY;
    }
    if (f->refuse_above && bytes > f->refuse_above)
        return RANKMEM_ERR_OUT_OF_MEMORY;
    void *p = NULL;
    if (f->skew && alignment == FLAKY_SKEW) {
        if (posix_memalign(&p, 2 * FLAKY_SKEW, bytes + FLAKY_SKEW))
            return RANKMEM_ERR_OUT_OF_MEMORY;
        char *q = (char *)p + FLAKY_SKEW;
        ((void **)q)[-1] = p;
        p = q;
    } else if (posix_memalign(&p, alignment, bytes)) {
        return RANKMEM_ERR_OUT_OF_MEMORY;
    }
    f->live_bytes += bytes;
    f->live_blocks++;
    *ptr_p = p;
    return RANKMEM_SUCCESS;
}

static rankmem_status_t flaky_free(void *arg, void *ptr, size_t bytes, size_t alignment,
                                   rankmem_stream_t stream)
{
    (void)stream;
    flaky_t *f = arg;
    if (f->skew && alignment == FLAKY_SKEW && ((uintptr_t)ptr & (2 * FLAKY_SKEW - 1)))
        ptr = ((void **)ptr)[-1];
    free(ptr);
    f->live_bytes -= bytes;
    f->live_blocks--;
    return RANKMEM_SUCCESS;
}

/* A host-accessible callback resource over f (zeroed by the caller). */
__attribute__((unused)) static rankmem_resource_t *flaky_new(flaky_t *f)
{
    rankmem_resource_t *mr = NULL;
    if (rankmem_callback_create(flaky_alloc, flaky_free, f, RANKMEM_PROP_HOST_ACCESSIBLE, &mr) !=
        RANKMEM_SUCCESS)
        return NULL;
    return mr;
}

#endif
