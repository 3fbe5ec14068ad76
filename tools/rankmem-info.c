/* rankmem-info: what this rankmem was built with, the GPUs it sees, what the
 * MPI plugin would do here (staging, observation, serving), and every
 * RANKMEM_* option with its current value.
 *
 *   rankmem-info            version, build configuration, devices, the MPI plugin
 *   rankmem-info -c         every option: current value, default, help
 *   rankmem-info --json     all of the above as one JSON object (for scripts)
 *
 * Exit status: 0; 1 when an option has a bad value (it is reported); 2 on a
 * bad command line. */
/* dladdr, dl_iterate_phdr and dlinfo for mpi/observe/cupti_find.h */
#define _GNU_SOURCE
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <rankmem.h>

#if HAVE_CUDA
#include <cuda_runtime_api.h>
/* The plugin's own way of finding CUPTI, so that what is said here is what
 * the plugin will do. */
#include "cupti_find.h"
#endif
/* MPS is looked for with any GPU runtime: the line is about the job. */
#include "mps.h"

/* From configure (m4/rankmem_mpi_info.m4) and the Makefile; defaults for a
 * build that does not define them. */
#ifndef RANKMEM_MPI_PLUGIN_BUILT
#define RANKMEM_MPI_PLUGIN_BUILT 0
#endif
#ifndef RANKMEM_MPI_PLUGIN_MSG
#define RANKMEM_MPI_PLUGIN_MSG ""
#endif
#ifndef RANKMEM_MPI_LIBRARY
#define RANKMEM_MPI_LIBRARY ""
#endif
#ifndef RANKMEM_MPICC
#define RANKMEM_MPICC ""
#endif
#ifndef RANKMEM_OMPI_INFO
#define RANKMEM_OMPI_INFO ""
#endif
#ifndef RANKMEM_MPI_CUDA_AWARE
#define RANKMEM_MPI_CUDA_AWARE ""
#endif
#ifndef RANKMEM_MPI_CUDA_AWARE_HOW
#define RANKMEM_MPI_CUDA_AWARE_HOW ""
#endif
#ifndef RANKMEM_LIBDIR
#define RANKMEM_LIBDIR ""
#endif
#ifndef RANKMEM_BUILDDIR
#define RANKMEM_BUILDDIR ""
#endif
#define PLUGIN_SO "librankmem_mpi.so"
#ifdef _OPENMP
#include <omp.h>
#endif

#define MAX_DEVICES 64

typedef struct {
    char name[256];
    size_t total;
    int major, minor;
    char pci[32];
    int pools; /* cudaDevAttrMemoryPoolsSupported */
} device_t;

/* What the MPI plugin would do here. Each "why" says how it was decided. */
typedef struct {
    int built;            /* librankmem_mpi is built (configure) */
    char installed[4096]; /* $(libdir)/librankmem_mpi.so when it is there */
    char build_tree[4096]; /* BUILDDIR/mpi/.libs/librankmem_mpi.so when it is there */
    const char *library;  /* "Open MPI 4.1.6", "" unknown */
    const char *aware;    /* "yes", "no", "unknown" */
    char aware_how[512];
    char staging_setting[64];
    char staging[512];    /* what staging would do */
    char mpix[512];       /* what MPIX_Query_cuda_support answers under the plugin */
    int observe_possible;
    char observe_setting[64];
    char cupti[4096];     /* the libcupti the plugin would load, "" none */
    long cupti_version;   /* cuptiGetVersion, -1 unknown */
    char cupti_why[1024]; /* where it was looked for, when not found */
    char observe[1024];
    int serve_possible;
    char serve_setting[64];
    char serve[512];
    int mps;           /* MPS's control pipe is there */
    char mps_pipe[300];
    char mps_effect[400];
} mpi_info_t;

typedef struct {
    int have_cuda;
    char cuda[128]; /* "yes (runtime 12.4, driver 12.6, built with 12.4)" or "no (...)" */
    char openmp[64];
    int ndev;
    char no_gpu[256]; /* why there is no GPU; "" when there is one */
    device_t dev[MAX_DEVICES];
    mpi_info_t mpi;
} info_t;

/* ---- the MPI plugin: staging, observation, serving ---- */

/* An option's current value (from the environment, or its default). */
static void option_value(const char *name, char *out, size_t cap)
{
    size_t n = 0;
    snprintf(out, cap, "?");
    rankmem_option_count(&n);
    for (size_t i = 0; i < n; i++) {
        rankmem_option_info_t o;
        if (rankmem_option_info(i, &o) == RANKMEM_SUCCESS && strcmp(o.name, name) == 0) {
            snprintf(out, cap, "%s", o.value);
            return;
        }
    }
}

static int is_file(const char *path) { return path[0] && access(path, R_OK) == 0; }

/* Whether Open MPI was built with CUDA support, asked of ompi_info now (the
 * library may have been rebuilt or replaced since configure). 1 yes, 0 no,
 * -1 could not tell. */
static int ompi_info_cuda(const char *ompi_info, char *how, size_t cap)
{
    /* A path with a quote is not worth quoting: configure's answer then. */
    if (!ompi_info[0] || strchr(ompi_info, '\'') || access(ompi_info, X_OK) != 0)
        return -1;
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "'%s' --parsable --all 2>/dev/null", ompi_info);
    FILE *f = popen(cmd, "r");
    if (!f)
        return -1;
    static const char key[] = "mca:mpi:base:param:mpi_built_with_cuda_support:value:";
    char line[1024];
    int r = -1;
    while (fgets(line, sizeof line, f)) {
        if (r == -1 && strncmp(line, key, sizeof key - 1) == 0) {
            const char *v = line + sizeof key - 1;
            if (strncmp(v, "true", 4) == 0 || v[0] == '1')
                r = 1;
            else if (strncmp(v, "false", 5) == 0 || v[0] == '0')
                r = 0;
            if (r >= 0)
                snprintf(how, cap, "%s: mpi_built_with_cuda_support = %s", ompi_info,
                         r ? "true" : "false");
        }
    }
    pclose(f);
    return r;
}

static void gather_mpi(info_t *in)
{
    mpi_info_t *m = &in->mpi;
    m->built = RANKMEM_MPI_PLUGIN_BUILT;
    m->library = RANKMEM_MPI_LIBRARY;
    m->cupti_version = -1;
    if (RANKMEM_LIBDIR[0]) {
        snprintf(m->installed, sizeof m->installed, "%s/%s", RANKMEM_LIBDIR, PLUGIN_SO);
        if (!is_file(m->installed))
            m->installed[0] = '\0';
    }
    if (RANKMEM_BUILDDIR[0]) {
        snprintf(m->build_tree, sizeof m->build_tree, "%s/mpi/.libs/%s", RANKMEM_BUILDDIR,
                 PLUGIN_SO);
        if (!is_file(m->build_tree))
            m->build_tree[0] = '\0';
    }

    /* CUDA-aware: ompi_info now, else what configure found. The plugin
     * itself asks the library at MPI_Init (MPIX_Query_cuda_support where
     * the MPI has it) and that is what decides staging. */
    int aware = -1;
    if (m->built)
        aware = ompi_info_cuda(RANKMEM_OMPI_INFO, m->aware_how, sizeof m->aware_how);
    if (aware < 0 && strcmp(RANKMEM_MPI_CUDA_AWARE, "yes") == 0)
        aware = 1;
    else if (aware < 0 && strcmp(RANKMEM_MPI_CUDA_AWARE, "no") == 0)
        aware = 0;
    if (aware >= 0 && !m->aware_how[0])
        snprintf(m->aware_how, sizeof m->aware_how, "%s", RANKMEM_MPI_CUDA_AWARE_HOW);
    if (aware < 0)
        snprintf(m->aware_how, sizeof m->aware_how,
                 "%s; the plugin asks the library at MPI_Init (MPIX_Query_cuda_support or "
                 "MPIX_GPU_query_support where it has one)",
                 m->built ? "not known here" : "no MPI plugin");
    m->aware = aware == 1 ? "yes" : aware == 0 ? "no" : "unknown";

    int gpu = in->ndev > 0;
    option_value("RANKMEM_STAGING", m->staging_setting, sizeof m->staging_setting);
    const char *st = m->staging_setting;
    if (!m->built)
        snprintf(m->staging, sizeof m->staging, "none: staging is done by the MPI plugin, which "
                                                "is not built");
    else if (strcmp(st, "off") == 0)
        snprintf(m->staging, sizeof m->staging, "off: device buffers go straight to MPI%s", aware == 1
                     ? ""
                     : aware == 0 ? ", which is not CUDA-aware and will fail on them (usually a "
                                    "segfault)"
                                  : ", which must then be CUDA-aware");
    else if (strcmp(st, "on") == 0)
        snprintf(m->staging, sizeof m->staging,
                 "on: device buffers passed to MPI are copied through pooled pinned host "
                 "buffers, whatever the MPI%s", gpu ? "" : " (no GPU here: nothing to stage)");
    else if (strcmp(st, "auto") == 0)
        snprintf(m->staging, sizeof m->staging, "%s%s", aware == 1
                     ? "off: this MPI takes device buffers itself"
                     : aware == 0 ? "on: this MPI is not CUDA-aware, so device buffers passed "
                                    "to it are copied through pooled pinned host buffers"
                                  : "decided at MPI_Init: on unless the MPI library says it is "
                                    "CUDA-aware",
                 gpu ? "" : " (no GPU here: nothing to stage)");
    else
        snprintf(m->staging, sizeof m->staging, "a bad value: every rank would stop at MPI_Init");

    /* The run-time awareness query under the plugin (mpi/mpix.c): 1 where
     * the rank stages, else the MPI's own answer. With auto and a GPU that
     * is 1 either way: staging, or an MPI that said it is aware. */
    const char *q = rankmem_have_hip() ? "MPIX_Query_rocm_support()" : "MPIX_Query_cuda_support()";
    int stages = gpu && (strcmp(st, "on") == 0 || (strcmp(st, "auto") == 0 && aware == 0));
    if (!m->built)
        snprintf(m->mpix, sizeof m->mpix, "%s: the MPI's own answer (no plugin)", q);
    else if (stages)
        snprintf(m->mpix, sizeof m->mpix, "%s answers 1: staging takes the device buffers", q);
    else if (gpu && strcmp(st, "auto") == 0)
        snprintf(m->mpix, sizeof m->mpix,
                 "%s answers 1: staging takes the device buffers, or the MPI does", q);
    else if (strcmp(st, "off") == 0 || strcmp(st, "on") == 0 || strcmp(st, "auto") == 0)
        snprintf(m->mpix, sizeof m->mpix, "%s answers %s: the MPI's own answer (%s)", q,
                 aware == 1 ? "1" : aware == 0 ? "0" : "what the MPI says",
                 gpu ? "staging off" : "no GPU here: no rank stages");
    else
        snprintf(m->mpix, sizeof m->mpix, "%s: no answer (a bad RANKMEM_STAGING)", q);

    /* Observation: the plugin, built with CUPTI's header, a GPU, and a
     * libcupti to load (the same search as the plugin's). */
    /* MPS: ranks that share a GPU without it pay a context switch on small
     * device messages (docs/staging.md); the plugin says so at MPI_Init. */
    m->mps = rk_mps_running(m->mps_pipe, sizeof m->mps_pipe);
    snprintf(m->mps_effect, sizeof m->mps_effect, "%s",
             m->mps ? "ranks that share a GPU share one context: small device messages are not slowed"
                    : "ranks that share a GPU pay about 150 us per device message of 1 to 4 KiB "
                      "(and below 4 KiB when not a multiple of 4 bytes); start MPS before the "
                      "job (nvidia-cuda-mps-control -d) or run one rank per GPU");
    option_value("RANKMEM_OBSERVE", m->observe_setting, sizeof m->observe_setting);
    char why[1024] = "";
#if HAVE_CUDA
    char cwhy[2048] = "";
    void *h = rk_cupti_dlopen(m->cupti, sizeof m->cupti, cwhy, sizeof cwhy);
    if (h) {
        typedef int (*get_version_t)(uint32_t *);
        get_version_t gv = (get_version_t)(uintptr_t)dlsym(h, "cuptiGetVersion");
        uint32_t v = 0;
        if (gv && gv(&v) == 0)
            m->cupti_version = (long)v;
        /* kept loaded: CUPTI does not support being unloaded */
    } else {
        m->cupti[0] = '\0';
        snprintf(m->cupti_why, sizeof m->cupti_why, "%.*s", (int)sizeof m->cupti_why - 1, cwhy);
    }
#if HAVE_CUPTI_H
    const int with_cupti = 1;
#else
    const int with_cupti = 0;
#endif
    if (!m->built)
        snprintf(why, sizeof why, "the MPI plugin is not built");
    else if (!with_cupti)
        snprintf(why, sizeof why, "the plugin was built without CUPTI's header (cupti.h)");
    else if (!h)
        snprintf(why, sizeof why, "CUPTI not found (%.900s)", cwhy);
    else if (!gpu)
        snprintf(why, sizeof why, "no GPU here (%.900s)", in->no_gpu);
    else
        m->observe_possible = 1;
#else
    snprintf(why, sizeof why, "rankmem was built without CUDA");
#endif
    if (m->observe_possible)
        snprintf(m->observe, sizeof m->observe,
                 "possible: %s (unless another CUPTI tool, such as Nsight, holds CUPTI)",
                 strcmp(m->observe_setting, "off") == 0
                     ? "but off (RANKMEM_OBSERVE=off)"
                     : "on for every allocation of the program, static or shared CUDA runtime");
    else
        snprintf(m->observe, sizeof m->observe, "not possible here: %.*s",
                 (int)sizeof m->observe - 20, why);

    /* Serving: the plugin and a GPU; the program's own runtime must be the
     * shared one (its cudaMalloc is interposed). */
    option_value("RANKMEM_INTERCEPT", m->serve_setting, sizeof m->serve_setting);
    if (!m->built)
        snprintf(m->serve, sizeof m->serve, "not possible: the MPI plugin is not built");
    else if (!in->have_cuda)
        snprintf(m->serve, sizeof m->serve, "not possible: rankmem was built without CUDA");
    else if (!gpu)
        snprintf(m->serve, sizeof m->serve, "not possible here: no GPU");
    else {
        m->serve_possible = 1;
        snprintf(m->serve, sizeof m->serve,
                 "possible for programs linked with the shared CUDA runtime (nvcc -cudart "
                 "shared; nvcc's default, static, is observed but not served)%s",
                 strcmp(m->serve_setting, "cuda") == 0 ? "; on (RANKMEM_INTERCEPT=cuda)"
                                                       : "; off (RANKMEM_INTERCEPT=cuda turns it on)");
    }
}

static void gather(info_t *in)
{
    memset(in, 0, sizeof *in);
#ifdef _OPENMP
    snprintf(in->openmp, sizeof in->openmp, "yes (OpenMP %d, max %d threads)", _OPENMP,
             omp_get_max_threads());
#else
    snprintf(in->openmp, sizeof in->openmp, "no");
#endif
#if HAVE_CUDA
    in->have_cuda = 1;
    int rt = 0, drv = 0;
    cudaRuntimeGetVersion(&rt);
    cudaDriverGetVersion(&drv); /* 0 when no driver is installed */
    char drvs[32] = "none";
    if (drv)
        snprintf(drvs, sizeof drvs, "%d.%d", drv / 1000, drv % 1000 / 10);
    snprintf(in->cuda, sizeof in->cuda, "yes (runtime %d.%d, driver %s, built with %d.%d)",
             rt / 1000, rt % 1000 / 10, drvs, CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        snprintf(in->no_gpu, sizeof in->no_gpu, "cudaGetDeviceCount: %s (error %d)",
                 cudaGetErrorString(err), (int)err);
        (void)cudaGetLastError();
        n = 0;
    } else if (n == 0) {
        snprintf(in->no_gpu, sizeof in->no_gpu, "no CUDA device");
    }
    if (n > MAX_DEVICES)
        n = MAX_DEVICES;
    for (int d = 0; d < n; d++) {
        device_t *dv = &in->dev[in->ndev];
        struct cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) {
            (void)cudaGetLastError();
            snprintf(dv->name, sizeof dv->name, "(cudaGetDeviceProperties failed)");
        } else {
            snprintf(dv->name, sizeof dv->name, "%s", prop.name);
            dv->total = prop.totalGlobalMem;
            dv->major = prop.major;
            dv->minor = prop.minor;
        }
        if (cudaDeviceGetPCIBusId(dv->pci, sizeof dv->pci, d) != cudaSuccess) {
            (void)cudaGetLastError();
            snprintf(dv->pci, sizeof dv->pci, "unknown");
        }
        if (cudaDeviceGetAttribute(&dv->pools, cudaDevAttrMemoryPoolsSupported, d) !=
            cudaSuccess) {
            (void)cudaGetLastError();
            dv->pools = 0;
        }
        in->ndev++;
    }
#else
    snprintf(in->cuda, sizeof in->cuda, "no (built without CUDA)");
    snprintf(in->no_gpu, sizeof in->no_gpu, "rankmem was built without CUDA");
#endif
    gather_mpi(in);
}

static const char *type_name(rankmem_option_type_t t)
{
    switch (t) {
    case RANKMEM_OPTION_STRING: return "string";
    case RANKMEM_OPTION_SIZE: return "size";
    case RANKMEM_OPTION_BOOL: return "bool";
    case RANKMEM_OPTION_ENUM: return "enum";
    case RANKMEM_OPTION_LIST: return "list";
    case RANKMEM_OPTION_INT: return "int";
    }
    return "?";
}

static void human(char *buf, size_t len, size_t bytes)
{
    double g = (double)bytes / (double)(1ull << 30);
    snprintf(buf, len, "%zu bytes (%.2f GiB)", bytes, g);
}

/* ---- text ---- */

static int print_options_text(void)
{
    size_t n = 0, width = 0;
    int bad = 0;
    rankmem_option_count(&n);
    for (size_t i = 0; i < n; i++) {
        rankmem_option_info_t o;
        if (rankmem_option_info(i, &o) == RANKMEM_SUCCESS && strlen(o.name) > width)
            width = strlen(o.name);
    }
    for (size_t i = 0; i < n; i++) {
        rankmem_option_info_t o;
        if (rankmem_option_info(i, &o) != RANKMEM_SUCCESS)
            continue;
        printf("%-*s = %s%s\n", (int)width, o.name, o.value,
               o.from_environment ? "  (from the environment)" : "");
        /* A list's choices are what each of its items may be. */
        printf("%-*s   %s; %s, default: \"%s\"%s%s\n", (int)width, "", o.help, type_name(o.type),
               o.default_value,
               !o.choices ? "" : o.type == RANKMEM_OPTION_LIST ? ", each one of " : ", one of ",
               o.choices ? o.choices : "");
        if (rankmem_option_check(i) != RANKMEM_SUCCESS) {
            printf("%-*s   ERROR: %s\n", (int)width, "", rankmem_last_error());
            bad = 1;
        }
    }
    return bad;
}

static void print_text(const info_t *in)
{
    int ma, mi, pa;
    rankmem_version(&ma, &mi, &pa);
    printf("rankmem %d.%d.%d (headers %d.%d.%d)\n", ma, mi, pa, RANKMEM_VERSION_MAJOR,
           RANKMEM_VERSION_MINOR, RANKMEM_VERSION_PATCH);
    printf("build:\n");
    printf("  CUDA:        %s\n", in->cuda);
    printf("  HIP:         %s\n",
           rankmem_have_hip() ? "yes (its devices are not listed here yet)" : "no");
    const mpi_info_t *m = &in->mpi;
    if (m->built)
        printf("  MPI plugin:  built (%s), against %s (%s)\n", PLUGIN_SO,
               m->library[0] ? m->library : "an MPI library configure could not name",
               RANKMEM_MPICC);
    else
        printf("  MPI plugin:  not built (configure: %s)\n",
               RANKMEM_MPI_PLUGIN_MSG[0] ? RANKMEM_MPI_PLUGIN_MSG : "off");
    printf("  OpenMP:      %s\n", in->openmp);
    printf("devices:\n");
    if (in->ndev == 0)
        printf("  no GPU: %s\n", in->no_gpu);
    for (int d = 0; d < in->ndev; d++) {
        const device_t *dv = &in->dev[d];
        char mem[64];
        human(mem, sizeof mem, dv->total);
        printf("  %d: %s\n", d, dv->name);
        printf("     memory:             %s\n", mem);
        printf("     compute capability: %d.%d\n", dv->major, dv->minor);
        printf("     PCI bus id:         %s\n", dv->pci);
        printf("     memory pools:       %s\n", dv->pools ? "yes" : "no");
    }
    printf("MPI plugin:\n");
    if (m->built) {
        if (m->installed[0])
            printf("  installed:   %s\n", m->installed);
        else
            printf("  installed:   no (make install puts it in %s)\n",
                   RANKMEM_LIBDIR[0] ? RANKMEM_LIBDIR : "the library directory");
        if (m->build_tree[0])
            printf("  build tree:  %s\n", m->build_tree);
        printf("  use:         LD_PRELOAD=%s (or link -lrankmem_mpi)\n",
               m->installed[0] ? m->installed : m->build_tree[0] ? m->build_tree : PLUGIN_SO);
    }
    printf("  CUDA-aware:  %s (%s)\n", m->aware, m->aware_how);
    printf("  staging:     RANKMEM_STAGING=%s: %s\n", m->staging_setting, m->staging);
    printf("  MPIX query:  %s\n", m->mpix);
    printf("  MPS:         %s (%s %s): %s\n", m->mps ? "running" : "not running",
           m->mps ? "control pipe" : "no control pipe at", m->mps_pipe, m->mps_effect);
    printf("  observation: RANKMEM_OBSERVE=%s: %s\n", m->observe_setting, m->observe);
    if (m->cupti[0]) {
        if (m->cupti_version >= 0)
            printf("  CUPTI:       %s (API version %ld)\n", m->cupti, m->cupti_version);
        else
            printf("  CUPTI:       %s\n", m->cupti);
    } else {
        printf("  CUPTI:       not found (%s)\n",
               m->cupti_why[0] ? m->cupti_why : "rankmem was built without CUDA");
    }
    printf("  serving:     RANKMEM_INTERCEPT=%s: %s\n", m->serve_setting, m->serve);
}

/* ---- JSON ---- */

static void json_string(const char *s)
{
    putchar('"');
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c == '\n')
            printf("\\n");
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

static void json_or_null(const char *s)
{
    if (s && *s)
        json_string(s);
    else
        printf("null");
}

static int print_json(const info_t *in)
{
    int ma, mi, pa, bad = 0;
    rankmem_version(&ma, &mi, &pa);
    printf("{\n  \"version\": \"%d.%d.%d\",\n", ma, mi, pa);
    printf("  \"build\": {\"cuda\": %s, \"cuda_detail\": ", in->have_cuda ? "true" : "false");
    json_string(in->cuda);
    const mpi_info_t *m = &in->mpi;
    printf(", \"hip\": %s, \"mpi_plugin\": %s, \"openmp\": ",
           rankmem_have_hip() ? "true" : "false", m->built ? "true" : "false");
    json_string(in->openmp);
    printf("},\n  \"mpi\": {\"plugin_built\": %s, \"configure\": ", m->built ? "true" : "false");
    json_string(RANKMEM_MPI_PLUGIN_MSG);
    printf(", \"library\": ");
    json_or_null(m->library);
    printf(", \"mpicc\": ");
    json_or_null(RANKMEM_MPICC);
    printf(", \"installed\": ");
    json_or_null(m->installed);
    printf(", \"build_tree\": ");
    json_or_null(m->build_tree);
    printf(",\n          \"cuda_aware\": ");
    json_string(m->aware);
    printf(", \"cuda_aware_how\": ");
    json_string(m->aware_how);
    printf(",\n          \"staging\": {\"setting\": ");
    json_string(m->staging_setting);
    printf(", \"effect\": ");
    json_string(m->staging);
    printf(", \"mpix_query\": ");
    json_string(m->mpix);
    printf("},\n          \"observation\": {\"possible\": %s, \"setting\": ",
           m->observe_possible ? "true" : "false");
    json_string(m->observe_setting);
    printf(", \"cupti\": ");
    json_or_null(m->cupti);
    printf(", \"cupti_not_found\": ");
    json_or_null(m->cupti[0] ? NULL : m->cupti_why);
    printf(", \"cupti_version\": ");
    if (m->cupti_version >= 0)
        printf("%ld", m->cupti_version);
    else
        printf("null");
    printf(", \"effect\": ");
    json_string(m->observe);
    printf("},\n          \"serving\": {\"possible\": %s, \"setting\": ",
           m->serve_possible ? "true" : "false");
    json_string(m->serve_setting);
    printf(", \"effect\": ");
    json_string(m->serve);
    printf("},\n          \"mps\": {\"running\": %s, \"control_pipe\": ", m->mps ? "true" : "false");
    json_string(m->mps_pipe);
    printf(", \"effect\": ");
    json_string(m->mps_effect);
    printf("}},\n  \"devices\": [");
    for (int d = 0; d < in->ndev; d++) {
        const device_t *dv = &in->dev[d];
        printf("%s\n    {\"index\": %d, \"name\": ", d ? "," : "", d);
        json_string(dv->name);
        printf(", \"memory_bytes\": %zu, \"compute_capability\": \"%d.%d\", \"pci_bus_id\": ",
               dv->total, dv->major, dv->minor);
        json_string(dv->pci);
        printf(", \"memory_pools\": %s}", dv->pools ? "true" : "false");
    }
    printf("%s],\n  \"no_gpu\": ", in->ndev ? "\n  " : "");
    if (in->ndev)
        printf("null");
    else
        json_string(in->no_gpu);
    printf(",\n  \"options\": [");
    size_t n = 0;
    rankmem_option_count(&n);
    for (size_t i = 0; i < n; i++) {
        rankmem_option_info_t o;
        if (rankmem_option_info(i, &o) != RANKMEM_SUCCESS)
            continue;
        printf("%s\n    {\"name\": ", i ? "," : "");
        json_string(o.name);
        printf(", \"type\": \"%s\", \"value\": ", type_name(o.type));
        json_string(o.value);
        printf(", \"default\": ");
        json_string(o.default_value);
        printf(", \"from_environment\": %s, \"choices\": ", o.from_environment ? "true" : "false");
        if (o.choices)
            json_string(o.choices);
        else
            printf("null");
        printf(", \"help\": ");
        json_string(o.help);
        printf(", \"error\": ");
        if (rankmem_option_check(i) != RANKMEM_SUCCESS) {
            json_string(rankmem_last_error());
            bad = 1;
        } else {
            printf("null");
        }
        printf("}");
    }
    printf("\n  ]\n}\n");
    return bad;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: rankmem-info [-c] [--json] [-h]\n"
            "  (none)   version, build configuration (CUDA, HIP, MPI, OpenMP), devices, and\n"
            "           what the MPI plugin would do here (staging, observation, serving)\n"
            "  -c       every RANKMEM_* option: current value, default and help\n"
            "  --json   everything above, options included, as one JSON object\n"
            "  -h       this help\n"
            "Exit status: 0, 1 when an option has a bad value, 2 on a bad command line.\n");
}

int main(int argc, char **argv)
{
    int config = 0, json = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-c") == 0 || strcmp(argv[i], "--config") == 0)
            config = 1;
        else if (strcmp(argv[i], "--json") == 0)
            json = 1;
        else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "rankmem-info: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (json) {
        static info_t in;
        gather(&in);
        return print_json(&in);
    }
    if (config)
        return print_options_text();
    static info_t in;
    gather(&in);
    print_text(&in);
    return 0;
}
