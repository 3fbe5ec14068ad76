/* TAP: the JSON reader of rankmem's tools (report/json.c): values, exact
 * 64-bit integers, strings and escapes, and every kind of bad input refused
 * with its line and column, without a crash (also under ASan). */
#include "../../report/json.h"
#include "../tap.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static json_value_t *parse(const char *s, json_error_t *e)
{
    return json_parse(s, strlen(s), e);
}

/* A document that must be refused at line:col with msg in the message. */
static void refused(const char *doc, int line, int col, const char *msg, const char *what)
{
    json_error_t e;
    json_value_t *v = parse(doc, &e);
    int good = !v && e.line == line && e.column == col && strstr(e.msg, msg) != NULL;
    ok(good, "refused: %s (%d:%d %s)", what, line, col, msg);
    if (!good)
        diag("got %s at %d:%d: %s", v ? "a value" : "an error", e.line, e.column, e.msg);
    json_free(v);
}

int main(void)
{
    tap_plan(40);
    json_error_t e;

    json_value_t *v = parse(" {\"a\": [1, -2, 3.5, 1e3, true, false, null, \"x\"], \"b\": {}}\n", &e);
    ok(v && v->type == JSON_OBJECT && v->count == 2, "an object with two members");
    const json_value_t *a = json_get(v, "a");
    ok(a && a->type == JSON_ARRAY && a->count == 8, "an array of eight");
    ok(a && a->items[0]->is_int && a->items[0]->u64 == 1 && !a->items[0]->negative, "1");
    ok(a && a->items[1]->is_int && a->items[1]->u64 == 2 && a->items[1]->negative, "-2");
    ok(a && !a->items[2]->is_int && a->items[2]->num == 3.5, "3.5 is not an integer");
    ok(a && !a->items[3]->is_int && a->items[3]->num == 1000.0, "1e3 is a number, not an integer");
    ok(a && a->items[4]->type == JSON_TRUE && a->items[5]->type == JSON_FALSE &&
           a->items[6]->type == JSON_NULL, "true, false, null");
    ok(a && a->items[7]->type == JSON_STRING && strcmp(a->items[7]->str, "x") == 0, "\"x\"");
    ok(json_get(v, "b") && json_get(v, "b")->count == 0 && !json_get(v, "c"), "{} and a missing key");
    ok(a && a->line == 1 && a->column == 8, "positions: the array at 1:8");
    json_free(v);

    v = parse("[18446744073709551615, 18446744073709551616, -9223372036854775808, "
              "-9223372036854775809, 9007199254740993]", &e);
    ok(v && v->items[0]->is_int && v->items[0]->u64 == UINT64_MAX, "2^64-1 exactly");
    ok(v && !v->items[1]->is_int && v->items[1]->num > 1.8e19, "2^64 is a number, not an integer");
    ok(v && v->items[2]->is_int && v->items[2]->negative &&
           v->items[2]->u64 == (uint64_t)INT64_MAX + 1, "-2^63 exactly");
    ok(v && !v->items[3]->is_int, "-2^63-1 is not an integer of 64 bits");
    ok(v && v->items[4]->u64 == 9007199254740993ull, "2^53+1 kept exactly (a double rounds it)");
    json_free(v);

    v = parse("\"a\\\"b\\\\c\\/d\\n\\t\\u0041\\u00e9\\ud83d\\ude00\\ud800x\"", &e);
    ok(v && strcmp(v->str, "a\"b\\c/d\n\tA\xc3\xa9\xf0\x9f\x98\x80\xef\xbf\xbdx") == 0,
       "escapes, \\u to UTF-8, a surrogate pair, a lone surrogate as U+FFFD");
    json_free(v);
    v = parse("\"a\\u0000b\"", &e);
    ok(v && v->len == 3 && v->str[1] == '\0', "\\u0000 kept, the length says so");
    json_free(v);
    v = parse("\xef\xbb\xbf{}", &e);
    ok(v && v->type == JSON_OBJECT, "a byte order mark is tolerated");
    json_free(v);
    v = parse("-0", &e);
    ok(v && v->is_int && v->u64 == 0 && !v->negative, "-0 is 0");
    json_free(v);

    refused("", 1, 1, "empty input", "empty");
    refused("  \n ", 2, 2, "empty input", "blanks only");
    refused("{\"a\": 1,\n \"b\": [1, 2", 2, 12, "truncated", "cut inside an array");
    refused("{\"a\": \"xy", 1, 7, "string not closed", "cut inside a string");
    refused("{\"a\" 1}", 1, 6, "expected ':'", "no colon");
    refused("{\"a\": 1,}", 1, 9, "trailing comma", "a trailing comma in an object");
    refused("[1, 2,]", 1, 7, "trailing comma", "a trailing comma in an array");
    refused("{a: 1}", 1, 2, "member name", "an unquoted name");
    refused("[01]", 1, 2, "leading zero", "a leading zero");
    refused("[1.]", 1, 2, "digit must follow '.'", "1.");
    refused("[1e]", 1, 2, "exponent", "1e");
    refused("[-]", 1, 2, "digit must follow '-'", "-");
    refused("[NaN]", 1, 2, "expected a value", "NaN");
    refused("[tru]", 1, 2, "expected a value", "tru");
    refused("\"a\tb\"", 1, 3, "control character", "a raw tab in a string");
    refused("\"\\x\"", 1, 2, "unknown escape", "\\x");
    refused("\"\\u12g4\"", 1, 2, "4 hex digits", "a bad \\u");
    refused("{} {}", 1, 4, "after the end of the document", "two documents");
    refused("[1 2]", 1, 4, "expected ',' or ']'", "a missing comma");

    /* far deeper than the limit: refused, not a stack overflow */
    size_t n = 1000000;
    char *deep = malloc(n + 1);
    if (deep) {
        memset(deep, '[', n);
        deep[n] = '\0';
    }
    v = deep ? json_parse(deep, n, &e) : NULL;
    ok(deep && !v && strstr(e.msg, "nested more than") != NULL, "a million '[': refused (%s)",
       e.msg);
    free(deep);

    /* not terminated: the reader never reads past len */
    char buf[4] = {'[', '1', ']', 'x'};
    v = json_parse(buf, 3, &e);
    ok(v && v->count == 1, "a buffer without a terminating NUL, read to its length only");
    json_free(v);
    return tap_done();
}
