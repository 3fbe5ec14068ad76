/* rankmem: resource spec strings and RANKMEM_* options. */
#ifndef RANKMEM_CONFIG_H
#define RANKMEM_CONFIG_H

#include <stddef.h>
#include <stdio.h>
#include <rankmem/export.h>
#include <rankmem/status.h>
#include <rankmem/resource.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Build a chain from a spec string such as "stats>pool(initial=2GiB,max=90%)>async".
 * Resources are named left to right, each the upstream of the one before it.
 * A bad spec is RANKMEM_ERR_CONFIG with the position and what was expected in
 * rankmem_last_error(). */
RANKMEM_API rankmem_status_t rankmem_resource_from_spec(const char *spec,
                                                        rankmem_resource_t **mr_p);

/* The same chain over a resource of the caller's (a counting or simulated
 * upstream, a tracking adaptor, ...) instead of a leaf the spec would make:
 * the spec's leaf, if it ends in one, is replaced by upstream (its options
 * are checked; it is not built), so "pool>cuda" and "pool" both give a pool
 * over upstream, and one spec string serves both ways. A spec that is only a
 * leaf gives upstream itself, with one more reference. The chain retains
 * upstream; the caller still releases its own reference. N% in a size is of
 * what upstream can hold: its RANKMEM_QUERY_LIMIT, or its finite
 * RANKMEM_QUERY_POOL_MAX, when it answers; else the device's memory when it
 * is device-accessible, else physical host memory. Errors as
 * rankmem_resource_from_spec; a NULL upstream or mr_p is
 * RANKMEM_ERR_INVALID_ARGUMENT. */
RANKMEM_API rankmem_status_t rankmem_resource_from_spec_upstream(const char *spec,
                                                                 rankmem_resource_t *upstream,
                                                                 rankmem_resource_t **mr_p);

/* Print a chain back in the spec syntax; parsing the result gives the same
 * chain. Writes at most len bytes (always NUL-terminated when len > 0);
 * *needed_p (may be NULL) is the length without the NUL; a buffer too small
 * gives RANKMEM_ERR_INVALID_ARGUMENT with *needed_p set. */
RANKMEM_API rankmem_status_t rankmem_resource_describe(const rankmem_resource_t *mr, char *buf,
                                                       size_t len, size_t *needed_p);

/* ---- options: RANKMEM_<NAME> environment variables, read once ---- */

typedef enum rankmem_option_type {
    RANKMEM_OPTION_STRING = 0,
    RANKMEM_OPTION_SIZE = 1, /* bytes: K/M/G/T[iB], 2^N, N% where documented */
    RANKMEM_OPTION_BOOL = 2, /* 1/0/on/off/yes/no/true/false */
    RANKMEM_OPTION_ENUM = 3, /* one of a list of words */
    RANKMEM_OPTION_LIST = 4, /* comma-separated values */
    RANKMEM_OPTION_INT = 5
} rankmem_option_type_t;

typedef struct rankmem_option_info {
    const char *name;    /* "RANKMEM_RESOURCE" */
    rankmem_option_type_t type;
    const char *default_value;
    const char *value;   /* current value (the environment's, or the default) */
    int from_environment;
    const char *help;    /* one line */
    const char *choices; /* enums: "auto|none|nearest|list:..."; lists: what each item may be
                            ("text|json|csv|timeline", any case); else NULL */
} rankmem_option_info_t;

RANKMEM_API rankmem_status_t rankmem_option_count(size_t *count_p);
RANKMEM_API rankmem_status_t rankmem_option_info(size_t index, rankmem_option_info_t *info_p);
/* Check option index's current value against its type, its choices and
 * range (and, for RANKMEM_RESOURCE, the spec syntax and each resource's
 * parameters, without building anything): RANKMEM_SUCCESS, or
 * RANKMEM_ERR_CONFIG naming the variable in rankmem_last_error(). Bad index:
 * INVALID_ARGUMENT. */
RANKMEM_API rankmem_status_t rankmem_option_check(size_t index);
/* Current string value of an option, by its full name. Unknown name: INVALID_ARGUMENT. */
RANKMEM_API rankmem_status_t rankmem_option_get(const char *name, const char **value_p);

/* Typed parsers, as the options and spec strings use them. */
/* percent_base: what N% is a share of (0: % not allowed). */
RANKMEM_API rankmem_status_t rankmem_parse_size(const char *text, size_t percent_base,
                                                size_t *bytes_p);
RANKMEM_API rankmem_status_t rankmem_parse_bool(const char *text, int *value_p);

#ifdef __cplusplus
}
#endif
#endif
