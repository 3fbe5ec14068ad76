/* libFuzzer target for the spec parser and the option parsers. Not built by
 * `make`, not run in CI: build it by hand with clang, linking the library's
 * sources directly (docs/configuration.md, "Fuzzing"):
 *
 *   mkdir -p /tmp/fuzz && cd /tmp/fuzz && /path/to/rankmem/configure -q   # for config.h
 *   src=/path/to/rankmem
 *   clang -g -O1 -mcx16 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
 *       -I$src/include -I$src/src -I. -I/usr/local/cuda/include \
 *       $src/tests/fuzz_spec.c $src/src/[a-z]*.c -L/usr/local/cuda/lib64 -lcudart -lpthread \
 *       -Wl,-rpath,/usr/local/cuda/lib64 -o fuzz_spec
 *   sed -n 's/^ \* dict: //p' $src/tests/fuzz_spec.c > spec.dict
 *   mkdir -p corpus
 *   export ASAN_OPTIONS=protect_shadow_gap=0:allocator_may_return_null=1:max_allocation_size_mb=1024
 *   ./fuzz_spec -dict=spec.dict -runs=1000000 -rss_limit_mb=2048 corpus
 *
 * (max_allocation_size_mb: specs such as pool(initial=90%)>system ask the
 * host for most of its memory; ASan would map and poison all of it. Refused
 * at 1 GiB, they fail cleanly instead.) Without CUDA, configure
 * --without-cuda and drop the CUDA flags. -mcx16: the stats adaptor uses
 * 16-byte compare-and-swap.
 *
 * Each input, NUL-terminated, goes through rankmem_parse_size (three percent
 * bases), rankmem_parse_bool, the parse-only spec check and
 * rankmem_resource_from_spec. A chain that builds is described, the
 * description parsed again and described again (it must be the same), one
 * small allocation goes through it, and it is released; LeakSanitizer checks
 * that failures half-way released what they built. Specs naming `logging`
 * are checked but not built: they would write files wherever the input says.
 *
 * dict: "system"
 * dict: "cuda"
 * dict: "managed"
 * dict: "pinned"
 * dict: "async"
 * dict: "async_view"
 * dict: "callback"
 * dict: "pool"
 * dict: "stats"
 * dict: "tracking"
 * dict: "limit"
 * dict: "aligned"
 * dict: "retry"
 * dict: "threadsafe"
 * dict: "prefetch"
 * dict: "initial="
 * dict: "max="
 * dict: "growth="
 * dict: "default="
 * dict: "release="
 * dict: "export="
 * dict: "posix_fd"
 * dict: "fabric"
 * dict: "backtraces="
 * dict: "bytes="
 * dict: "alignment="
 * dict: "threshold="
 * dict: "file="
 * dict: ">"
 * dict: "("
 * dict: ")"
 * dict: ","
 * dict: "\""
 * dict: "KiB"
 * dict: "MiB"
 * dict: "GiB"
 * dict: "TiB"
 * dict: "KB"
 * dict: "%"
 * dict: "2^"
 * dict: "."
 * dict: "yes"
 * dict: "off"
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <rankmem.h>

/* Hidden in the shared library; visible here, where the sources are linked in. */
rankmem_status_t rk_spec_check_named(const char *origin, const char *spec);

static void describe_or_die(rankmem_resource_t *mr, char *buf, size_t len, const char *what)
{
    size_t need = 0;
    rankmem_status_t st = rankmem_resource_describe(mr, buf, len, &need);
    if (st != RANKMEM_SUCCESS || strlen(buf) != need) {
        fprintf(stderr, "describe of %s failed: %s\n", what, rankmem_last_error());
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s)
        return 0;
    memcpy(s, data, size);
    s[size] = '\0';

    size_t bytes;
    int b;
    rankmem_parse_size(s, 0, &bytes);
    rankmem_parse_size(s, (size_t)80 << 30, &bytes);
    rankmem_parse_size(s, SIZE_MAX, &bytes);
    rankmem_parse_bool(s, &b);

    rankmem_status_t checked = rk_spec_check_named("fuzz", s);
    if (!strstr(s, "logging")) {
        rankmem_resource_t *mr = NULL;
        rankmem_status_t st = rankmem_resource_from_spec(s, &mr);
        /* A spec the check refuses must not build, and every failure says why. */
        if ((checked != RANKMEM_SUCCESS && st == RANKMEM_SUCCESS) ||
            (st != RANKMEM_SUCCESS && rankmem_last_error()[0] == '\0')) {
            fprintf(stderr, "check %d but from_spec %d for \"%s\"\n", checked, st, s);
            abort();
        }
        if (st == RANKMEM_SUCCESS) {
            static char d1[8192], d2[8192];
            describe_or_die(mr, d1, sizeof d1, s);
            rankmem_resource_t *again = NULL;
            if (rankmem_resource_from_spec(d1, &again) != RANKMEM_SUCCESS) {
                fprintf(stderr, "\"%s\" describes as \"%s\", which does not build: %s\n", s, d1,
                        rankmem_last_error());
                abort();
            }
            describe_or_die(again, d2, sizeof d2, d1);
            if (strcmp(d1, d2) != 0) {
                fprintf(stderr, "\"%s\" -> \"%s\" -> \"%s\"\n", s, d1, d2);
                abort();
            }
            rankmem_resource_release(again);
            void *p;
            if (rankmem_allocate(mr, 64, 0, &p) == RANKMEM_SUCCESS)
                rankmem_deallocate(mr, p, 64, 0);
            rankmem_resource_release(mr);
        }
    }
    free(s);
    return 0;
}
