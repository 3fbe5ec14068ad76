/* A small JSON reader (json.h): recursive descent over a buffer, a tree of
 * values with their positions. Strict RFC 8259: no comments, no trailing
 * commas, no NaN, no leading zeros, no raw control characters in strings. */
#include "json.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The tree lives in an arena: values, strings and member arrays are carved
 * from large blocks, freed all at once with the document. A report of
 * 100,000 ranks is some 15 million values: a malloc each would double the
 * memory (headers, rounding) and the time. */
typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    max_align_t data[]; /* cap bytes */
} chunk_t;

#define CHUNK_BYTES ((size_t)1 << 20)

/* What json_parse returns: the root, with the arena it owns. */
typedef struct {
    chunk_t *chunks;
    json_value_t root;
} doc_t;

/* A container's members wait here until it closes; then they are copied
 * to the arena at their exact number (nested containers stack up). */
typedef struct {
    json_value_t **items;
    char **keys;
    size_t n, cap;
} stack_t_;

typedef struct {
    const char *p, *end;
    const char *line_start;
    int line;
    int depth;
    json_error_t *err;
    int failed;
    chunk_t *chunks;
    stack_t_ st;
    char *sb;          /* a string being read (reused) */
    size_t sb_cap;
} parser_t;

static void *arena_alloc(parser_t *ps, size_t n)
{
    n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    chunk_t *c = ps->chunks;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > CHUNK_BYTES / 4 ? n : CHUNK_BYTES;
        c = malloc(sizeof *c + cap);
        if (!c)
            return NULL;
        c->cap = cap;
        c->used = 0;
        if (n > CHUNK_BYTES / 4 && ps->chunks) {
            /* a large block: behind the current chunk, which keeps filling */
            c->next = ps->chunks->next;
            ps->chunks->next = c;
            c->used = n;
            return c->data;
        }
        c->next = ps->chunks;
        ps->chunks = c;
    }
    void *p = (char *)c->data + c->used;
    c->used += n;
    return p;
}

static void arena_free(chunk_t *c)
{
    while (c) {
        chunk_t *next = c->next;
        free(c);
        c = next;
    }
}

static void fail_at(parser_t *ps, const char *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Records the first error only: later ones are consequences. */
static void fail_at(parser_t *ps, const char *at, const char *fmt, ...)
{
    if (ps->failed)
        return;
    ps->failed = 1;
    ps->err->line = ps->line;
    ps->err->column = (int)(at - ps->line_start) + 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ps->err->msg, sizeof ps->err->msg, fmt, ap);
    va_end(ap);
}

/* "'x'" for a printable byte, "end of input", or "byte 0x07". */
static const char *what_is(parser_t *ps, const char *at, char *buf, size_t cap)
{
    if (at >= ps->end)
        snprintf(buf, cap, "the end of the input (truncated?)");
    else if ((unsigned char)*at >= 0x20 && (unsigned char)*at < 0x7f)
        snprintf(buf, cap, "'%c'", *at);
    else
        snprintf(buf, cap, "byte 0x%02x", (unsigned char)*at);
    return buf;
}

static void skip_ws(parser_t *ps)
{
    while (ps->p < ps->end) {
        char c = *ps->p;
        if (c == '\n') {
            ps->line++;
            ps->line_start = ps->p + 1;
        } else if (c != ' ' && c != '\t' && c != '\r') {
            break;
        }
        ps->p++;
    }
}

static json_value_t *new_value(parser_t *ps, json_type_t t, const char *at)
{
    json_value_t *v = arena_alloc(ps, sizeof *v);
    if (!v) {
        fail_at(ps, at, "out of memory");
        return NULL;
    }
    memset(v, 0, sizeof *v);
    v->type = t;
    v->line = ps->line;
    v->column = (int)(at - ps->line_start) + 1;
    return v;
}

void json_free(json_value_t *v)
{
    if (!v)
        return;
    doc_t *d = (doc_t *)(void *)((char *)v - offsetof(doc_t, root));
    arena_free(d->chunks);
    free(d);
}

/* Appends one byte to a growing string. */
typedef struct {
    char *s;
    size_t len, cap;
} sbuf_t;

static int sb_add(sbuf_t *b, char c)
{
    if (b->len + 2 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 32;
        char *s = realloc(b->s, cap);
        if (!s)
            return -1;
        b->s = s;
        b->cap = cap;
    }
    b->s[b->len++] = c;
    b->s[b->len] = '\0';
    return 0;
}

static int hex4(const char *p, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return -1;
    }
    *out = v;
    return 0;
}

static int sb_utf8(sbuf_t *b, unsigned cp)
{
    int r = 0;
    if (cp < 0x80) {
        r |= sb_add(b, (char)cp);
    } else if (cp < 0x800) {
        r |= sb_add(b, (char)(0xc0 | (cp >> 6)));
        r |= sb_add(b, (char)(0x80 | (cp & 0x3f)));
    } else if (cp < 0x10000) {
        r |= sb_add(b, (char)(0xe0 | (cp >> 12)));
        r |= sb_add(b, (char)(0x80 | ((cp >> 6) & 0x3f)));
        r |= sb_add(b, (char)(0x80 | (cp & 0x3f)));
    } else {
        r |= sb_add(b, (char)(0xf0 | (cp >> 18)));
        r |= sb_add(b, (char)(0x80 | ((cp >> 12) & 0x3f)));
        r |= sb_add(b, (char)(0x80 | ((cp >> 6) & 0x3f)));
        r |= sb_add(b, (char)(0x80 | (cp & 0x3f)));
    }
    return r;
}

/* At the opening quote. Returns the string (in the arena) and its length. */
static char *parse_string_raw(parser_t *ps, size_t *len_out)
{
    const char *start = ps->p;
    sbuf_t b = {ps->sb, 0, ps->sb_cap}; /* the parser's buffer, reused */
    ps->p++; /* the quote */
    if (sb_add(&b, '\0') != 0) /* an empty string is still an allocated "" */
        goto oom;
    b.len = 0;
    for (;;) {
        if (ps->p >= ps->end) {
            fail_at(ps, start, "string not closed before the end of the input (truncated?)");
            goto bad;
        }
        unsigned char c = (unsigned char)*ps->p;
        if (c == '"') {
            ps->p++;
            break;
        }
        if (c < 0x20) {
            fail_at(ps, ps->p, "control character (byte 0x%02x) inside a string", c);
            goto bad;
        }
        if (c != '\\') {
            if (sb_add(&b, (char)c) != 0)
                goto oom;
            ps->p++;
            continue;
        }
        const char *esc = ps->p;
        if (ps->p + 1 >= ps->end) {
            fail_at(ps, esc, "string not closed before the end of the input (truncated?)");
            goto bad;
        }
        char e = ps->p[1];
        ps->p += 2;
        char out = 0;
        switch (e) {
        case '"': out = '"'; break;
        case '\\': out = '\\'; break;
        case '/': out = '/'; break;
        case 'b': out = '\b'; break;
        case 'f': out = '\f'; break;
        case 'n': out = '\n'; break;
        case 'r': out = '\r'; break;
        case 't': out = '\t'; break;
        case 'u': {
            unsigned cp;
            if (ps->end - ps->p < 4 || hex4(ps->p, &cp) != 0) {
                fail_at(ps, esc, "\\u must be followed by 4 hex digits");
                goto bad;
            }
            ps->p += 4;
            if (cp >= 0xd800 && cp < 0xdc00) {
                unsigned lo;
                /* A high surrogate must pair with a low one; alone it is
                 * not a character, so it becomes U+FFFD. */
                if (ps->end - ps->p >= 6 && ps->p[0] == '\\' && ps->p[1] == 'u' &&
                    hex4(ps->p + 2, &lo) == 0 && lo >= 0xdc00 && lo < 0xe000) {
                    ps->p += 6;
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                } else {
                    cp = 0xfffd;
                }
            } else if (cp >= 0xdc00 && cp < 0xe000) {
                cp = 0xfffd;
            }
            if (sb_utf8(&b, cp) != 0)
                goto oom;
            continue;
        }
        default:
            fail_at(ps, esc, "unknown escape '\\%c' in a string",
                    (unsigned char)e >= 0x20 && (unsigned char)e < 0x7f ? e : '?');
            goto bad;
        }
        if (sb_add(&b, out) != 0)
            goto oom;
    }
    ps->sb = b.s;
    ps->sb_cap = b.cap;
    {
        char *out = arena_alloc(ps, b.len + 1);
        if (!out)
            goto oom;
        memcpy(out, b.s, b.len + 1);
        *len_out = b.len;
        return out;
    }
oom:
    fail_at(ps, start, "out of memory");
bad:
    ps->sb = b.s;
    ps->sb_cap = b.cap;
    return NULL;
}

static json_value_t *parse_value(parser_t *ps);

static json_value_t *parse_number(parser_t *ps)
{
    const char *start = ps->p, *q = ps->p;
    int neg = 0, integral = 1;
    if (q < ps->end && *q == '-') {
        neg = 1;
        q++;
    }
    if (q >= ps->end || *q < '0' || *q > '9') {
        fail_at(ps, start, "invalid number: a digit must follow '-'");
        return NULL;
    }
    if (*q == '0' && q + 1 < ps->end && q[1] >= '0' && q[1] <= '9') {
        fail_at(ps, start, "invalid number: leading zero");
        return NULL;
    }
    while (q < ps->end && *q >= '0' && *q <= '9')
        q++;
    if (q < ps->end && *q == '.') {
        integral = 0;
        q++;
        if (q >= ps->end || *q < '0' || *q > '9') {
            fail_at(ps, start, "invalid number: a digit must follow '.'");
            return NULL;
        }
        while (q < ps->end && *q >= '0' && *q <= '9')
            q++;
    }
    if (q < ps->end && (*q == 'e' || *q == 'E')) {
        integral = 0;
        q++;
        if (q < ps->end && (*q == '+' || *q == '-'))
            q++;
        if (q >= ps->end || *q < '0' || *q > '9') {
            fail_at(ps, start, "invalid number: a digit must follow the exponent");
            return NULL;
        }
        while (q < ps->end && *q >= '0' && *q <= '9')
            q++;
    }
    json_value_t *v = new_value(ps, JSON_NUMBER, start);
    if (!v)
        return NULL;
    v->negative = neg;
    /* strtod needs a terminated copy; the input need not be terminated. */
    size_t n = (size_t)(q - start);
    char tmp[64];
    char *copy = n < sizeof tmp ? tmp : malloc(n + 1);
    if (!copy) {
        fail_at(ps, start, "out of memory");
        return NULL;
    }
    memcpy(copy, start, n);
    copy[n] = '\0';
    v->num = strtod(copy, NULL);
    if (copy != tmp)
        free(copy);
    if (integral) {
        uint64_t m = 0;
        int over = 0;
        for (const char *d = start + neg; d < q; d++) {
            unsigned dig = (unsigned)(*d - '0');
            if (m > (UINT64_MAX - dig) / 10)
                over = 1;
            else
                m = m * 10 + dig;
        }
        /* A negative integer must fit int64_t; a positive one uint64_t. */
        if (!over && (!neg || m <= (uint64_t)INT64_MAX + 1)) {
            v->is_int = 1;
            v->u64 = m;
            if (m == 0)
                v->negative = 0; /* -0 is 0 */
        }
    }
    ps->p = q;
    return v;
}

static int literal(parser_t *ps, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) >= n && memcmp(ps->p, word, n) == 0) {
        ps->p += n;
        return 1;
    }
    return 0;
}

static int push(parser_t *ps, json_value_t *item, char *key)
{
    stack_t_ *st = &ps->st;
    if (st->n == st->cap) {
        size_t ncap = st->cap ? st->cap * 2 : 256;
        json_value_t **items = realloc(st->items, ncap * sizeof *items);
        if (!items)
            goto oom;
        st->items = items;
        char **keys = realloc(st->keys, ncap * sizeof *keys);
        if (!keys)
            goto oom;
        st->keys = keys;
        st->cap = ncap;
    }
    st->items[st->n] = item;
    st->keys[st->n] = key;
    st->n++;
    return 0;
oom:
    fail_at(ps, ps->p, "out of memory");
    return -1;
}

/* The members pushed since `base` become c's, copied to the arena. */
static int close_container(parser_t *ps, json_value_t *c, size_t base)
{
    size_t n = ps->st.n - base;
    ps->st.n = base;
    c->count = n;
    if (!n)
        return 0;
    c->items = arena_alloc(ps, n * sizeof *c->items);
    if (!c->items)
        goto oom;
    memcpy(c->items, ps->st.items + base, n * sizeof *c->items);
    if (c->type == JSON_OBJECT) {
        c->keys = arena_alloc(ps, n * sizeof *c->keys);
        if (!c->keys)
            goto oom;
        memcpy(c->keys, ps->st.keys + base, n * sizeof *c->keys);
    }
    return 0;
oom:
    c->count = 0;
    fail_at(ps, ps->p, "out of memory");
    return -1;
}

static json_value_t *parse_container(parser_t *ps, int object)
{
    const char *start = ps->p;
    char close = object ? '}' : ']';
    char buf[48];
    if (++ps->depth > JSON_MAX_DEPTH) {
        fail_at(ps, start, "nested more than %d deep", JSON_MAX_DEPTH);
        return NULL;
    }
    json_value_t *c = new_value(ps, object ? JSON_OBJECT : JSON_ARRAY, start);
    if (!c)
        return NULL;
    size_t base = ps->st.n;
    ps->p++;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        ps->depth--;
        return c;
    }
    for (;;) {
        char *key = NULL;
        if (object) {
            if (ps->p >= ps->end || *ps->p != '"') {
                fail_at(ps, ps->p, "expected a member name (a string) in an object, found %s",
                        what_is(ps, ps->p, buf, sizeof buf));
                goto bad;
            }
            size_t klen;
            key = parse_string_raw(ps, &klen);
            if (!key)
                goto bad;
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':') {
                fail_at(ps, ps->p, "expected ':' after the member name \"%.40s\", found %s", key,
                        what_is(ps, ps->p, buf, sizeof buf));
                goto bad;
            }
            ps->p++;
            skip_ws(ps);
        }
        json_value_t *item = parse_value(ps);
        if (!item)
            goto bad;
        if (push(ps, item, key) != 0)
            goto bad;
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            skip_ws(ps);
            if (ps->p < ps->end && *ps->p == close) {
                fail_at(ps, ps->p, "trailing comma before '%c'", close);
                goto bad;
            }
            continue;
        }
        if (ps->p < ps->end && *ps->p == close) {
            ps->p++;
            break;
        }
        fail_at(ps, ps->p, "expected ',' or '%c' in %s that starts at line %d column %d, found %s",
                close, object ? "an object" : "an array", c->line, c->column,
                what_is(ps, ps->p, buf, sizeof buf));
        goto bad;
    }
    ps->depth--;
    if (close_container(ps, c, base) != 0)
        return NULL;
    return c;
bad:
    ps->st.n = base; /* the arena is freed with the failed parse */
    return NULL;
}

static json_value_t *parse_value(parser_t *ps)
{
    char buf[48];
    skip_ws(ps);
    const char *at = ps->p;
    if (at >= ps->end) {
        fail_at(ps, at, "expected a value, found the end of the input (truncated?)");
        return NULL;
    }
    switch (*at) {
    case '{':
        return parse_container(ps, 1);
    case '[':
        return parse_container(ps, 0);
    case '"': {
        size_t len;
        json_value_t *v = new_value(ps, JSON_STRING, at);
        if (!v)
            return NULL;
        v->str = parse_string_raw(ps, &len);
        if (!v->str)
            return NULL;
        v->len = len;
        return v;
    }
    case 't':
        if (literal(ps, "true"))
            return new_value(ps, JSON_TRUE, at);
        break;
    case 'f':
        if (literal(ps, "false"))
            return new_value(ps, JSON_FALSE, at);
        break;
    case 'n':
        if (literal(ps, "null"))
            return new_value(ps, JSON_NULL, at);
        break;
    default:
        if (*at == '-' || (*at >= '0' && *at <= '9'))
            return parse_number(ps);
        break;
    }
    fail_at(ps, at, "expected a value, found %s", what_is(ps, at, buf, sizeof buf));
    return NULL;
}

json_value_t *json_parse(const char *text, size_t len, json_error_t *err)
{
    json_error_t dummy;
    if (!err)
        err = &dummy;
    memset(err, 0, sizeof *err);
    if (!text) {
        snprintf(err->msg, sizeof err->msg, "no input");
        return NULL;
    }
    parser_t ps;
    memset(&ps, 0, sizeof ps);
    ps.p = ps.line_start = text;
    ps.end = text + len;
    ps.line = 1;
    ps.err = err;
    /* A UTF-8 byte order mark is tolerated (editors on some systems add it). */
    if (len >= 3 && memcmp(text, "\xef\xbb\xbf", 3) == 0) {
        ps.p += 3;
        ps.line_start = ps.p;
    }
    doc_t *d = NULL;
    skip_ws(&ps);
    if (ps.p >= ps.end) {
        fail_at(&ps, ps.p, "empty input: no JSON value");
        goto out;
    }
    json_value_t *v = parse_value(&ps);
    if (!v)
        goto out;
    skip_ws(&ps);
    if (ps.p < ps.end) {
        char buf[48];
        fail_at(&ps, ps.p, "unexpected %s after the end of the document",
                what_is(&ps, ps.p, buf, sizeof buf));
        goto out;
    }
    /* Nothing points to the root: it moves next to the arena it owns. */
    d = malloc(sizeof *d);
    if (!d) {
        fail_at(&ps, ps.p, "out of memory");
        goto out;
    }
    d->root = *v;
    d->chunks = ps.chunks;
    ps.chunks = NULL;
out:
    arena_free(ps.chunks);
    free(ps.st.items);
    free(ps.st.keys);
    free(ps.sb);
    return d ? &d->root : NULL;
}

const json_value_t *json_get(const json_value_t *obj, const char *key)
{
    if (!obj || obj->type != JSON_OBJECT)
        return NULL;
    for (size_t i = 0; i < obj->count; i++)
        if (strcmp(obj->keys[i], key) == 0)
            return obj->items[i];
    return NULL;
}

const char *json_type_name(json_type_t t)
{
    switch (t) {
    case JSON_NULL: return "null";
    case JSON_FALSE: return "false";
    case JSON_TRUE: return "true";
    case JSON_NUMBER: return "a number";
    case JSON_STRING: return "a string";
    case JSON_ARRAY: return "an array";
    case JSON_OBJECT: return "an object";
    }
    return "?";
}
