/* rankmem_resource_describe: a chain back in spec syntax. Each resource
 * describes itself (ops->describe, "pool(initial=1GiB)"), or is its ops
 * name; the chain is joined with '>' from mr down its upstreams, so that
 * rankmem_resource_from_spec() of the result builds the same chain. */
#include "config_internal.h"

#include <stdlib.h>
#include <string.h>

#define HAS_DESCRIBE(mr)                                                                        \
    ((mr)->ops->size >= offsetof(rankmem_resource_ops_t, describe) +                           \
                            sizeof((mr)->ops->describe) &&                                      \
     (mr)->ops->describe)

rankmem_status_t rankmem_resource_describe(const rankmem_resource_t *mr, char *buf, size_t len,
                                           size_t *needed_p)
{
    if (!mr)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_resource_describe: NULL resource");
    if (!buf && len)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_resource_describe: NULL buffer of %zu bytes", len);
    size_t total = 0; /* bytes the whole description needs, without the NUL */
    for (const rankmem_resource_t *r = mr; r; r = r->upstream) {
        if (r != mr) {
            if (total + 1 < len)
                buf[total] = '>';
            total++;
        }
        size_t room = total < len ? len - total : 0;
        int n;
        if (HAS_DESCRIBE(r)) {
            /* snprintf-style: writes what fits (NUL-terminated) and says what it needed. */
            n = r->ops->describe(r, room ? buf + total : NULL, room);
            if (n < 0)
                return rk_error(RANKMEM_ERR_INTERNAL,
                                "rankmem_resource_describe: %s could not describe itself",
                                r->ops->name ? r->ops->name : "unnamed");
        } else {
            const char *name = r->ops->name ? r->ops->name : "unnamed";
            n = (int)strlen(name);
            if (room)
                snprintf(buf + total, room, "%s", name);
        }
        total += (size_t)n;
    }
    if (len)
        buf[total < len ? total : len - 1] = '\0';
    if (needed_p)
        *needed_p = total;
    if (total >= len)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_resource_describe: needs %zu bytes, the buffer has %zu",
                        total + 1, len);
    return RANKMEM_SUCCESS;
}
