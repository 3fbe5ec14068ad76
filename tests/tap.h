/* A small TAP producer for rankmem's tests (read by automake's tap-driver.sh).
 * Header-only: each test program includes it once.
 *
 *   tap_plan(n);  ok(cond, "fmt", ...);  is_status(got, want, "name");
 *   tap_skip_all("no GPU");  return tap_done();
 */
#ifndef RANKMEM_TAP_H
#define RANKMEM_TAP_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#define TAP_UNUSED_ __attribute__((unused))

TAP_UNUSED_ static int tap_count_ = 0, tap_failed_ = 0, tap_planned_ = -1;

TAP_UNUSED_ static void tap_plan(int n)
{
    tap_planned_ = n;
    printf("1..%d\n", n);
    fflush(stdout);
}

TAP_UNUSED_ static void tap_vresult_(int pass, const char *fmt, va_list ap)
{
    ++tap_count_;
    if (!pass)
        ++tap_failed_;
    printf("%sok %d - ", pass ? "" : "not ", tap_count_);
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
}

TAP_UNUSED_ __attribute__((format(printf, 2, 3))) static int ok(int pass, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    tap_vresult_(pass, fmt, ap);
    va_end(ap);
    return pass;
}

/* Diagnostic line, shown by the driver. */
TAP_UNUSED_ __attribute__((format(printf, 1, 2))) static void diag(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("# ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
}

/* Compare two status codes (ints); on mismatch, say both. */
#define is_status(got, want, ...)                                                           \
    do {                                                                                    \
        int tap_g_ = (int)(got), tap_w_ = (int)(want);                                      \
        if (!ok(tap_g_ == tap_w_, __VA_ARGS__))                                             \
            diag("  got status %d (%s), want %d (%s)", tap_g_,                              \
                 rankmem_status_string((rankmem_status_t)tap_g_), tap_w_,                   \
                 rankmem_status_string((rankmem_status_t)tap_w_));                          \
    } while (0)

/* Skip the whole program (e.g. no GPU): a plan of 0 with a reason. */
TAP_UNUSED_ static int tap_skip_all(const char *reason)
{
    printf("1..0 # SKIP %s\n", reason);
    fflush(stdout);
    return 0;
}

TAP_UNUSED_ static void tap_skip(int n, const char *reason)
{
    for (int i = 0; i < n; i++) {
        ++tap_count_;
        printf("ok %d # SKIP %s\n", tap_count_, reason);
    }
    fflush(stdout);
}

/* End of the program: prints the plan when none was given up front. */
TAP_UNUSED_ static int tap_done(void)
{
    if (tap_planned_ < 0)
        printf("1..%d\n", tap_count_);
    else if (tap_planned_ != tap_count_)
        diag("planned %d tests but ran %d", tap_planned_, tap_count_);
    fflush(stdout);
    return tap_failed_ ? 1 : 0;
}

/* Fatal: the rest of the program cannot run. */
#define BAIL_OUT(...)                                                                       \
    do {                                                                                    \
        printf("Bail out! ");                                                               \
        printf(__VA_ARGS__);                                                                \
        printf("\n");                                                                       \
        fflush(stdout);                                                                     \
        exit(1);                                                                            \
    } while (0)

#endif
