/* A small JSON reader for rankmem's tools (RFC 8259, whole document in
 * memory). It builds a tree of values that remember where they started in
 * the text (line and column), so that a reader of a document can say where
 * a value has the wrong type, not only that it has.
 *
 * Integers are kept exactly (64 bits) apart from the double, because the
 * reports hold byte counts that a double would round above 2^53. */
#ifndef RANKMEM_TOOLS_JSON_H
#define RANKMEM_TOOLS_JSON_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    JSON_NULL,
    JSON_FALSE,
    JSON_TRUE,
    JSON_NUMBER,
    JSON_STRING,
    JSON_ARRAY,
    JSON_OBJECT
} json_type_t;

typedef struct json_value json_value_t;

struct json_value {
    json_type_t type;
    int line, column;      /* where the value starts, from 1 */
    int is_int;            /* JSON_NUMBER: no fraction, no exponent, fits 64 bits signed or unsigned */
    int negative;
    /* One of these, by type (48 bytes a value: a report of 100,000 ranks
     * holds some 15 million of them). */
    union {
        struct {           /* JSON_NUMBER */
            double num;
            uint64_t u64;  /* the magnitude when is_int */
        };
        struct {           /* JSON_STRING (NUL-terminated, UTF-8; may hold \u0000 as a NUL: len counts) */
            char *str;
            size_t len;
        };
        struct {           /* JSON_ARRAY: items; JSON_OBJECT: items with keys[i] naming items[i] */
            json_value_t **items;
            char **keys;
            size_t count;
        };
    };
};

/* What went wrong, and where (line and column from 1; column counts bytes). */
typedef struct {
    int line, column;
    char msg[160];
} json_error_t;

/* Parses text[0..len) as one JSON document. Returns the tree (free it with
 * json_free) or NULL with *err filled. Nesting deeper than JSON_MAX_DEPTH is
 * refused (a recursive reader must not run off its stack). */
#define JSON_MAX_DEPTH 200
json_value_t *json_parse(const char *text, size_t len, json_error_t *err);

/* Frees a document: the value json_parse returned (the whole tree lives in
 * one arena; a value inside it is not freed alone). NULL is fine. */
void json_free(json_value_t *v);

/* The member named key of an object (the first one), or NULL. */
const json_value_t *json_get(const json_value_t *obj, const char *key);

/* "null", "a number", ... for messages. */
const char *json_type_name(json_type_t t);

#endif
