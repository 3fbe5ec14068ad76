/* rankmem-info: what this rankmem was built with, the GPUs it sees, and every
 * RANKMEM_* option with its current value.
 *
 *   rankmem-info            version, build configuration, devices
 *   rankmem-info -c         every option: current value, default, help
 *   rankmem-info --json     all of the above as one JSON object (for scripts)
 *
 * Exit status: 0; 1 when an option has a bad value (it is reported); 2 on a
 * bad command line. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <rankmem.h>

#if HAVE_CUDA
#include <cuda_runtime_api.h>
#endif
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

typedef struct {
    int have_cuda;
    char cuda[128]; /* "yes (runtime 12.4, driver 12.6, built with 12.4)" or "no (...)" */
    char openmp[64];
    int ndev;
    char no_gpu[256]; /* why there is no GPU; "" when there is one */
    device_t dev[MAX_DEVICES];
} info_t;

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
        printf("%-*s   %s; %s, default: \"%s\"%s%s\n", (int)width, "", o.help, type_name(o.type),
               o.default_value, o.choices ? ", one of " : "", o.choices ? o.choices : "");
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
    printf("  MPI plugin:  not built yet\n");
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

static int print_json(const info_t *in)
{
    int ma, mi, pa, bad = 0;
    rankmem_version(&ma, &mi, &pa);
    printf("{\n  \"version\": \"%d.%d.%d\",\n", ma, mi, pa);
    printf("  \"build\": {\"cuda\": %s, \"cuda_detail\": ", in->have_cuda ? "true" : "false");
    json_string(in->cuda);
    printf(", \"hip\": %s, \"mpi_plugin\": false, \"openmp\": ",
           rankmem_have_hip() ? "true" : "false");
    json_string(in->openmp);
    printf("},\n  \"devices\": [");
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
            "  (none)   version, build configuration (CUDA, HIP, MPI, OpenMP) and devices\n"
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
