/* Binding logic: RANKMEM_BIND, the launcher's local rank, cpumasks and the
 * choice of a device. No MPI and no CUDA here, so that the unit test
 * (tests/mpi/bind_unit.c) builds this file alone. */
#include "plugin.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int rk_bind_parse(const char *text, rk_bind_spec_t *spec, char *why, size_t len)
{
    memset(spec, 0, sizeof *spec);
    if (!text) {
        snprintf(why, len, "no value");
        return -1;
    }
    if (strcmp(text, "auto") == 0) {
        spec->mode = RK_BIND_AUTO;
        return 0;
    }
    if (strcmp(text, "none") == 0) {
        spec->mode = RK_BIND_NONE;
        return 0;
    }
    if (strcmp(text, "nearest") == 0) {
        spec->mode = RK_BIND_NEAREST;
        return 0;
    }
    if (strncmp(text, "list:", 5) == 0) {
        spec->mode = RK_BIND_LIST;
        const char *p = text + 5;
        for (;;) {
            if (!isdigit((unsigned char)*p)) {
                snprintf(why, len, "list: expected a device index at '%.32s'", p);
                return -1;
            }
            long v = 0;
            while (isdigit((unsigned char)*p)) {
                v = v * 10 + (*p++ - '0');
                if (v > INT_MAX / 16) {
                    snprintf(why, len, "list: device index too large");
                    return -1;
                }
            }
            if (spec->nlist == RK_BIND_LIST_MAX) {
                snprintf(why, len, "list: more than %d devices", RK_BIND_LIST_MAX);
                return -1;
            }
            spec->list[spec->nlist++] = (int)v;
            if (*p == '\0')
                return 0;
            if (*p != ',') {
                snprintf(why, len, "list: expected ',' or the end at '%.32s'", p);
                return -1;
            }
            p++;
        }
    }
    snprintf(why, len, "expected auto, none, nearest or list:<gpu>,<gpu>,...");
    return -1;
}

/* Checked in this order: Open MPI, MVAPICH, MPICH's hydra, Slurm, other
 * PMI launchers, HPE/Cray PALS, Flux. A launcher-specific variable comes
 * before Slurm's, which is also set when srun starts mpirun. */
static const char *const local_rank_vars[] = {
    "OMPI_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
    "SLURM_LOCALID",              "PMI_LOCAL_RANK",            "PALS_LOCAL_RANKID",
    "FLUX_TASK_LOCAL_ID",
};

int rk_bind_env_local_rank(const char **var_p)
{
    for (size_t i = 0; i < sizeof local_rank_vars / sizeof local_rank_vars[0]; i++) {
        const char *v = getenv(local_rank_vars[i]);
        if (!v || !*v)
            continue;
        char *end;
        errno = 0;
        long r = strtol(v, &end, 10);
        /* A garbled value is skipped: the next launcher's variable, or the
         * communicator after init, decides. */
        if (*end || errno || r < 0 || r > INT_MAX)
            continue;
        if (var_p)
            *var_p = local_rank_vars[i];
        return (int)r;
    }
    if (var_p)
        *var_p = NULL;
    return -1;
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = tolower(c);
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

int rk_bind_parse_cpumask(const char *text, unsigned char *bits, size_t nbits)
{
    memset(bits, 0, (nbits + 7) / 8);
    size_t n = strlen(text);
    while (n && isspace((unsigned char)text[n - 1]))
        n--;
    if (n == 0)
        return -1;
    /* The rightmost hex digit holds CPUs 0-3; commas separate 32-bit words. */
    size_t bit = 0;
    int digits = 0;
    for (size_t i = n; i-- > 0;) {
        char c = text[i];
        if (c == ',') {
            if (digits == 0)
                return -1;
            digits = 0;
            continue;
        }
        int v = hexval((unsigned char)c);
        if (v < 0)
            return -1;
        digits++;
        for (int b = 0; b < 4; b++, bit++)
            if ((v >> b) & 1 && bit < nbits)
                bits[bit / 8] |= (unsigned char)(1u << (bit % 8));
    }
    return digits ? 0 : -1; /* ",ff": an empty leading word */
}

int rk_bind_choose(const rk_bind_spec_t *spec, int local_rank, int ndev, const int *overlap,
                   char *why, size_t len)
{
    if (ndev <= 0 || local_rank < 0) {
        snprintf(why, len, "no device to choose from");
        return -1;
    }
    switch (spec->mode) {
    case RK_BIND_LIST: {
        int d = spec->list[local_rank % spec->nlist];
        if (d >= ndev) {
            snprintf(why, len, "list names device %d, but this node has %d visible device%s", d,
                     ndev, ndev == 1 ? "" : "s");
            return -1;
        }
        return d;
    }
    case RK_BIND_NEAREST: {
        int best = -1, ncand = 0;
        for (int d = 0; d < ndev; d++)
            if (overlap && overlap[d] > best)
                best = overlap[d];
        /* Unknown locality everywhere (or no CPU local to any device):
         * every device is as near as any other. */
        if (best <= 0)
            return local_rank % ndev;
        for (int d = 0; d < ndev; d++)
            ncand += overlap[d] == best;
        int k = local_rank % ncand;
        for (int d = 0; d < ndev; d++)
            if (overlap[d] == best && k-- == 0)
                return d;
        return local_rank % ndev; /* unreachable */
    }
    case RK_BIND_AUTO:
    case RK_BIND_NONE:
    default:
        return local_rank % ndev;
    }
}
