/* Finding and loading CUPTI at run time (issue 19), one way for the MPI
 * plugin's observation (mpi/observe/observe.c) and for rankmem-info, so that what
 * rankmem-info says is what the plugin will do.
 *
 * CUPTI is never a link-time dependency: it ships with the CUDA toolkit, not
 * with the driver, and is often outside the loader's path (extras/CUPTI/lib64
 * on older toolkits). The places tried, in order:
 *   1. RANKMEM_CUPTI_LIB, a file (an explicit choice: when it is set and does
 *      not load, nothing else is tried, so that a typo is not hidden);
 *   2. RANKMEM_CUPTI_SONAME ("libcupti.so.13" for the toolkit configured
 *      against) and "libcupti.so" on the loader's path (LD_LIBRARY_PATH,
 *      rpath, ld.so.cache);
 *   3. next to the libcudart.so the process has loaded (a program linked with
 *      the static runtime has none: then this step finds nothing), in its
 *      directory and in ../extras/CUPTI/lib64;
 *   4. $CUDA_HOME and $CUDA_PATH, then the toolkit rankmem was configured
 *      with (RANKMEM_CUDA_DIR): DIR/lib64, DIR/extras/CUPTI/lib64.
 * A library counts only when it has cuptiSubscribe.
 *
 * Not installed. Header-only (static inline) so that the tools need not link
 * the plugin; needs -ldl (glibc 2.34+ has dlopen in libc). */
#ifndef RANKMEM_MPI_CUPTI_FIND_H
#define RANKMEM_MPI_CUPTI_FIND_H

#ifndef _GNU_SOURCE
#error "cupti_find.h needs _GNU_SOURCE (dladdr, dl_iterate_phdr) defined before any system header"
#endif

#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* From config.h when configure found a toolkit (m4/rankmem_cupti.m4). */
#ifndef RANKMEM_CUPTI_SONAME
#define RANKMEM_CUPTI_SONAME "libcupti.so.13"
#endif

/* Appends s to dst (cap bytes), cutting it where dst is full; always
 * terminated. */
static inline void rk_cupti_append_(char *dst, size_t cap, const char *s)
{
    size_t n = strnlen(dst, cap);
    if (n >= cap)
        return;
    size_t len = strlen(s);
    if (len > cap - 1 - n)
        len = cap - 1 - n;
    memcpy(dst + n, s, len);
    dst[n + len] = '\0';
}

static inline void rk_cupti_copy_(char *dst, size_t cap, const char *s)
{
    if (!dst || !cap)
        return;
    dst[0] = '\0';
    rk_cupti_append_(dst, cap, s);
}

/* Appends "; WHAT: DETAIL" to why (cap bytes, always terminated). */
static inline void rk_cupti_note_(char *why, size_t cap, const char *what, const char *detail)
{
    if (!why || cap == 0)
        return;
    if (why[0])
        rk_cupti_append_(why, cap, "; ");
    rk_cupti_append_(why, cap, what);
    rk_cupti_append_(why, cap, ": ");
    rk_cupti_append_(why, cap, detail ? detail : "not loaded");
}

/* dlopen(file) that counts only a real CUPTI. Returns the handle or NULL,
 * noting why in why. */
static inline void *rk_cupti_try_(const char *file, char *why, size_t wcap)
{
    dlerror();
    void *h = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        /* dlerror() repeats the file name first: keep only the reason. */
        const char *colon = e ? strstr(e, ": ") : NULL;
        rk_cupti_note_(why, wcap, file, colon ? colon + 2 : e);
        return NULL;
    }
    if (!dlsym(h, "cuptiSubscribe")) {
        rk_cupti_note_(why, wcap, file, "has no cuptiSubscribe");
        dlclose(h);
        return NULL;
    }
    return h;
}

typedef struct rk_cupti_cudart_ {
    char dir[4096];
} rk_cupti_cudart_t_;

static inline int rk_cupti_find_cudart_(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    rk_cupti_cudart_t_ *c = (rk_cupti_cudart_t_ *)data;
    const char *name = info->dlpi_name;
    if (!name || !*name)
        return 0;
    const char *base = strrchr(name, '/');
    if (!base || strncmp(base + 1, "libcudart.so", 12) != 0)
        return 0;
    size_t len = (size_t)(base - name);
    if (len >= sizeof c->dir)
        return 0;
    memcpy(c->dir, name, len);
    c->dir[len] = '\0';
    return 1;
}

/* Tries DIR/SUB/libcupti.so for SUB in lib64, extras/CUPTI/lib64 (or the
 * given subs). */
static inline void *rk_cupti_try_dir_(const char *dir, const char *const *subs, char *path,
                                      size_t pcap, char *why, size_t wcap)
{
    char file[4352];
    for (const char *const *s = subs; *s; s++) {
        int n = snprintf(file, sizeof file, "%s%s%s/libcupti.so", dir, **s ? "/" : "", *s);
        if (n < 0 || (size_t)n >= sizeof file)
            continue;
        void *h = rk_cupti_try_(file, why, wcap);
        if (h) {
            rk_cupti_copy_(path, pcap, file);
            return h;
        }
    }
    return NULL;
}

/* Loads CUPTI. Returns the handle (keep it for the life of the process:
 * CUPTI does not support being unloaded) and the file used in path (pcap
 * bytes; the loader's realpath when known); or NULL with every place tried
 * and why it failed in why (wcap bytes). path and why may be NULL. */
static inline void *rk_cupti_dlopen(char *path, size_t pcap, char *why, size_t wcap)
{
    if (path && pcap)
        path[0] = '\0';
    if (why && wcap)
        why[0] = '\0';
    void *h = NULL;

    const char *env = getenv("RANKMEM_CUPTI_LIB");
    if (env && *env) {
        /* An explicit choice: its failure is the answer (noted as
         * RANKMEM_CUPTI_LIB=FILE: reason), nothing else is tried. */
        char what[4096] = "RANKMEM_CUPTI_LIB=";
        rk_cupti_append_(what, sizeof what, env);
        char reason[4352] = "";
        h = rk_cupti_try_(env, reason, sizeof reason);
        if (h) {
            rk_cupti_copy_(path, pcap, env);
        } else if (why && wcap) {
            size_t skip = strlen(env) + 2; /* try_ wrote "FILE: reason" */
            rk_cupti_note_(why, wcap, what, strlen(reason) > skip ? reason + skip : reason);
        }
        return h;
    }

    static const char *const names[] = {RANKMEM_CUPTI_SONAME, "libcupti.so", NULL};
    for (const char *const *n = names; *n && !h; n++) {
        h = rk_cupti_try_(*n, why, wcap);
        if (h && path && pcap) {
            /* The file the loader picked, for the user and for rankmem-info. */
            struct link_map *lm = NULL;
            if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && lm->l_name[0])
                rk_cupti_copy_(path, pcap, lm->l_name);
            else
                rk_cupti_copy_(path, pcap, *n);
        }
    }
    if (h)
        return h;

    static const char *const near_cudart[] = {"", "../extras/CUPTI/lib64", NULL};
    static const char *const toolkit[] = {"lib64", "extras/CUPTI/lib64", NULL};
    rk_cupti_cudart_t_ c;
    c.dir[0] = '\0';
    if (dl_iterate_phdr(rk_cupti_find_cudart_, &c) && c.dir[0])
        h = rk_cupti_try_dir_(c.dir, near_cudart, path, pcap, why, wcap);
    if (h)
        return h;

    const char *dirs[3] = {getenv("CUDA_HOME"), getenv("CUDA_PATH"), NULL};
#ifdef RANKMEM_CUDA_DIR
    dirs[2] = RANKMEM_CUDA_DIR;
#endif
    for (int i = 0; i < 3 && !h; i++) {
        if (!dirs[i] || !*dirs[i])
            continue;
        int seen = 0; /* the same directory twice would only repeat its reasons */
        for (int j = 0; j < i; j++)
            seen |= dirs[j] && strcmp(dirs[j], dirs[i]) == 0;
        if (!seen)
            h = rk_cupti_try_dir_(dirs[i], toolkit, path, pcap, why, wcap);
    }
    return h;
}

#endif
