/* rankmem internals for configuration: spec strings (spec.c), RANKMEM_*
 * options (options.c) and the helpers they share. Never installed; every
 * symbol here is hidden. */
#ifndef RANKMEM_CONFIG_INTERNAL_H
#define RANKMEM_CONFIG_INTERNAL_H

#include "internal.h"

#include <stddef.h>

/* rankmem_resource_from_spec() for a spec that came from somewhere the user
 * should be told about: every error message starts with "origin: " (e.g.
 * "RANKMEM_RESOURCE: at 12: unknown option ..."). origin NULL: no prefix. */
RK_HIDDEN rankmem_status_t rk_resource_from_spec_named(const char *origin, const char *spec,
                                                       rankmem_resource_t **mr_p);

/* Parse and check a spec (names, options, values, the shape of the chain)
 * without building anything: what from_spec would say short of the
 * constructors' own failures. Makes no CUDA call (% is checked for syntax). */
RK_HIDDEN rankmem_status_t rk_spec_check_named(const char *origin, const char *spec);

/* ---- typed getters of the RANKMEM_* options (full names: "RANKMEM_BIND").
 * The environment is read once, on first use, thread-safely. A value that
 * does not parse is RANKMEM_ERR_CONFIG naming the variable (never a silent
 * default); an unknown name or a getter of the wrong type is
 * RANKMEM_ERR_INVALID_ARGUMENT (a bug in the caller). Strings stay valid for
 * the life of the process. ---- */
RK_HIDDEN rankmem_status_t rk_option_size(const char *name, size_t *value_p);
RK_HIDDEN rankmem_status_t rk_option_bool(const char *name, int *value_p);
RK_HIDDEN rankmem_status_t rk_option_int(const char *name, long *value_p);
/* Any type: the value once it has been checked against the option's type
 * (an enum is one of its choices, e.g. "list:0,1" for RANKMEM_BIND). */
RK_HIDDEN rankmem_status_t rk_option_string(const char *name, const char **value_p);

/* ---- parsers shared by options and specs ---- */

/* Parse text[0..len) as a size. On failure returns RANKMEM_ERR_CONFIG and sets
 * *why_p to a static phrase ("not a number", "% not allowed here", ...) WITHOUT
 * recording an error: callers word the message with their own context. */
RK_HIDDEN rankmem_status_t rk_parse_size(const char *text, size_t len, size_t percent_base,
                                         size_t *bytes_p, const char **why_p);
RK_HIDDEN rankmem_status_t rk_parse_bool(const char *text, size_t len, int *value_p);

/* Write bytes the way a spec string would say it, exactly: "2GiB", "384MiB",
 * "1000" (the largest binary unit that divides it). snprintf-style. */
RK_HIDDEN int rk_format_size(char *buf, size_t len, size_t bytes);

/* User text fit for a message: at most 48 bytes (then "..."), non-printable
 * bytes as \xNN. buf needs 256 bytes. Returns buf. */
RK_HIDDEN const char *rk_quote(char *buf, size_t cap, const char *s, size_t len);

/* Levenshtein distance between a[0..alen) and b (case-insensitive), capped:
 * anything above cap is reported as cap + 1. */
RK_HIDDEN size_t rk_edit_distance(const char *a, size_t alen, const char *b, size_t cap);

/* What N% means in a spec string: the current GPU's total memory when
 * `device` is nonzero and there is a GPU, else physical host memory. 0 when
 * it cannot be found (with *why_p saying why). */
RK_HIDDEN size_t rk_percent_base(int device, const char **why_p);

#endif
