/* The MPI plugin's core: the PMPI hooks of MPI_Init, MPI_Init_thread and
 * MPI_Finalize, the binding of each rank to a GPU, the rank's resource, and
 * the record the report is made of.
 *
 * Order at MPI_Init:
 *   1. before PMPI_Init: read RANKMEM_BIND, RANKMEM_RESOURCE and
 *      RANKMEM_MPI_VERBOSE; take the node-local rank from the launcher's
 *      environment and select the device, so that the MPI library's own
 *      GPU resources land on it;
 *      then start observation (mpi/observe/observe.c: the recorder, CUPTI), so
 *      that allocations made around MPI_Init are seen, and configure
 *      serving (mpi/observe/intercept.c);
 *   2. PMPI_Init;
 *   3. the node-local rank from MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)
 *      (it wins over the environment: the device is selected again if they
 *      differ, and the record says so); the rank's resource is built from
 *      RANKMEM_RESOURCE, wrapped in timing and stats, and installed as the
 *      device's resource;
 *   4. one MPI_Allreduce tells every rank whether any rank found a bad
 *      setting: then every rank says why (or that another rank failed),
 *      finalizes MPI and exits with status 1. All ranks decide together,
 *      so that no rank waits in a collective for one that left. The same
 *      reduction counts the ranks where observation was wanted and does
 *      not run (CUPTI absent or taken): world rank 0 says so in one line
 *      for the job;
 *   5. serving starts (RANKMEM_INTERCEPT=cuda).
 *
 * At MPI_Finalize: serving stops (frees of served blocks are still
 * served), the report is written (it reads the recorder), then
 * observation stops.
 *
 * Our only collectives run inside MPI_Init, MPI_Finalize and the report,
 * which every rank enters; nothing of ours waits on another rank at any
 * other time, so a rank that calls MPI_Abort leaves nobody stuck here.
 *
 * The rank's resource is never released: the application may free memory
 * after MPI_Finalize (destructors at exit), and the registry keeps it as the
 * device's resource until the process ends. */
#define _GNU_SOURCE
#include "plugin.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* What the plugin uses when RANKMEM_RESOURCE says nothing is the option
 * table's default ("stats>pool>cuda": a pool over cudaMalloc; why in
 * docs/mpi.md). With no GPU, a device chain cannot be built and the rank
 * gets this instead. */
#define HOST_FALLBACK_SPEC "pool>system"

/* ---- state: written by the thread that calls MPI_Init, read after ---- */

static int pre_done, post_done, fini_done;
static int active;
static int verbose;

static rk_bind_spec_t bind;
static char bind_text[64] = "auto";
static char bad_setting[512]; /* first bad setting seen on this rank ("" none) */

/* Observation and serving (issue 19), read before PMPI_Init. */
static int observe_mode = RK_OBSERVE_AUTO;
static int observe_backtrace = 8;
static size_t observe_max_blocks;
static int intercept_mode;

static int env_local_rank = -1;
static const char *env_var;
static int pre_device = -1; /* selected before PMPI_Init, -1 none */
static MPI_Comm report_comm = MPI_COMM_NULL; /* dup of MPI_COMM_WORLD for the report */

/* Staging (mpi/staging/base.c, issue 6) is optional: weak, so the plugin links
 * without it. */
#pragma weak rk_mpi_staging_init
#pragma weak rk_mpi_staging_finalize
#pragma weak rk_stg_want_multiple
#pragma weak rk_mpi_staging_counters

static int world_rank = -1, world_size = 0;
static int local_rank = -1, local_size = 0;
static int ndev;
static int device = -1;
static uint32_t flags;
static char host[64];
static char dev_name[96];
static char dev_busid[32];
static char spec_text[256];

static rankmem_resource_t *stats_mr;  /* the rank's resource (top) */
static rankmem_resource_t *timing_mr; /* right below stats */
static uint64_t dev_total_init, dev_free_init;
static uint64_t init_ns;

/* ---- messages ---- */

static void vsay(const char *fmt, va_list ap)
{
    char line[1024];
    int n;
    if (world_rank >= 0) {
        n = snprintf(line, sizeof line, "rankmem-mpi[rank %d]: ", world_rank);
    } else {
        /* Before init: the launcher's rank when it says one. */
        const char *r = getenv("OMPI_COMM_WORLD_RANK");
        if (!r)
            r = getenv("PMI_RANK");
        if (!r)
            r = getenv("PMIX_RANK");
        if (!r)
            r = getenv("SLURM_PROCID");
        n = r ? snprintf(line, sizeof line, "rankmem-mpi[rank %.16s]: ", r)
              : snprintf(line, sizeof line, "rankmem-mpi[pid %ld]: ", (long)getpid());
    }
    if (n < 0 || (size_t)n >= sizeof line)
        n = 0;
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof line - 2)
        len = sizeof line - 2;
    line[len++] = '\n';
    /* One write per line: ranks sharing a terminal do not interleave mid-line. */
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}

void rk_mpi_warn(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsay(fmt, ap);
    va_end(ap);
}

void rk_mpi_verbose(const char *fmt, ...)
{
    if (!verbose)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsay(fmt, ap);
    va_end(ap);
}

/* Keep the first bad setting for the message after init; say it now too. */
static void bad(const char *fmt, ...) RK_MPI_PRINTF(1, 2);
static void bad(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (!bad_setting[0])
        vsnprintf(bad_setting, sizeof bad_setting, fmt, ap);
    va_end(ap);
}

/* ---- options ---- */

/* An option of librankmem's table (RANKMEM_BIND, RANKMEM_RESOURCE): its
 * value, checked by the table's own rules. NULL with the table's message
 * in bad_setting when it does not pass. */
static const char *table_option(const char *name)
{
    size_t n = 0;
    if (rankmem_option_count(&n) != RANKMEM_SUCCESS)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        rankmem_option_info_t info;
        if (rankmem_option_info(i, &info) != RANKMEM_SUCCESS || strcmp(info.name, name) != 0)
            continue;
        if (rankmem_option_check(i) != RANKMEM_SUCCESS) {
            bad("%s", rankmem_last_error());
            return NULL;
        }
        return info.value;
    }
    return NULL;
}

const char *rk_mpi_table_option(const char *name) { return table_option(name); }

void rk_mpi_bad_setting(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (!bad_setting[0])
        vsnprintf(bad_setting, sizeof bad_setting, fmt, ap);
    va_end(ap);
}

/* An option the plugin reads itself when librankmem's table lacks it, with
 * the same strictness for booleans. */
static int bool_option(const char *name, int def)
{
    const char *v = NULL;
    if (rankmem_option_get(name, &v) != RANKMEM_SUCCESS) {
        rankmem_clear_error(); /* not in the table: read the environment */
        v = getenv(name);
    } else {
        (void)table_option(name); /* the table's check and message */
    }
    if (!v)
        return def;
    int b;
    if (rankmem_parse_bool(v, &b) != RANKMEM_SUCCESS) {
        bad("%s: bad boolean '%.48s': expected 1/0, on/off, yes/no or true/false", name, v);
        return def;
    }
    return b;
}

/* ---- the resource ---- */

static rankmem_status_t build_chain(const char *spec, rankmem_resource_t **chain_p)
{
    rankmem_resource_t *mr;
    rankmem_status_t st = rankmem_resource_from_spec(spec, &mr);
    if (st != RANKMEM_SUCCESS)
        return st;
    /* The plugin puts stats on top itself (with timing below it): a stats
     * the user wrote at the top would only count the same thing twice. */
    const char *name = NULL;
    rankmem_resource_t *up = NULL;
    if (rankmem_resource_name(mr, &name) == RANKMEM_SUCCESS && strcmp(name, "stats") == 0 &&
        rankmem_resource_upstream(mr, &up) == RANKMEM_SUCCESS && up) {
        rankmem_resource_retain(up);
        rankmem_resource_release(mr);
        mr = up;
    }
    *chain_p = mr;
    return RANKMEM_SUCCESS;
}

/* Build stats>timing>chain and install it. 0 or -1 (bad() called). */
static int make_resource(const char *spec)
{
    rankmem_resource_t *chain = NULL;
    rankmem_status_t st = build_chain(spec, &chain);
    if (st != RANKMEM_SUCCESS && ndev == 0 &&
        (st == RANKMEM_ERR_NO_DEVICE || st == RANKMEM_ERR_NOT_SUPPORTED ||
         st == RANKMEM_ERR_DEVICE)) {
        /* No GPU: host memory, as documented; the record is flagged. */
        rk_mpi_verbose("RANKMEM_RESOURCE '%s' needs a GPU (%s); using %s", spec,
                       rankmem_last_error(), HOST_FALLBACK_SPEC);
        st = build_chain(HOST_FALLBACK_SPEC, &chain);
    }
    if (st != RANKMEM_SUCCESS) {
        bad("RANKMEM_RESOURCE='%.160s': %s: %s", spec, rankmem_status_string(st),
            rankmem_last_error());
        return -1;
    }
    size_t need = 0;
    char desc[sizeof spec_text - 8];
    if (rankmem_resource_describe(chain, desc, sizeof desc, &need) != RANKMEM_SUCCESS) {
        /* Too long for the record: keep the start, say it was cut. */
        snprintf(desc + sizeof desc - 4, 4, "...");
        rankmem_clear_error();
    }
    snprintf(spec_text, sizeof spec_text, "stats>%s", desc);

    rankmem_resource_t *timing = NULL, *stats = NULL;
    st = rk_mpi_timing_create(chain, &timing);
    rankmem_resource_release(chain); /* timing holds it now (or it is freed) */
    const char *sample = table_option("RANKMEM_TIMING_SAMPLE");
    if (st == RANKMEM_SUCCESS && sample &&
        (st = rk_mpi_timing_set_period(timing, (unsigned)strtoul(sample, NULL, 10))) !=
            RANKMEM_SUCCESS)
        rankmem_resource_release(timing); /* checked by the table: not expected */
    if (st == RANKMEM_SUCCESS) {
        st = rankmem_stats_create(timing, &stats);
        if (st == RANKMEM_SUCCESS) /* timing takes its call count from stats: a cheaper layer */
            (void)rk_mpi_timing_count_from(timing, stats);
        rankmem_resource_release(timing);
    }
    if (st != RANKMEM_SUCCESS) {
        bad("cannot wrap the rank's resource: %s", rankmem_status_string(st));
        return -1;
    }
    st = device >= 0 ? rankmem_set_device_resource(device, stats)
                     : rankmem_set_current_resource(stats);
    if (st != RANKMEM_SUCCESS) {
        bad("cannot install the rank's resource: %s: %s", rankmem_status_string(st),
            rankmem_last_error());
        rankmem_resource_release(stats);
        return -1;
    }
    /* Our own reference stays: see the top of this file. */
    stats_mr = stats;
    timing_mr = timing;
    return 0;
}

/* ---- observation and serving options (issue 19) ---- */

/* table_option has checked each value against the table (the words of an
 * enum, the integer range, the size): what is left is to read it. */
static void observe_options(void)
{
    const char *v = table_option("RANKMEM_OBSERVE");
    if (v && rk_observe_parse_mode(v) >= 0)
        observe_mode = rk_observe_parse_mode(v);
    if ((v = table_option("RANKMEM_OBSERVE_BACKTRACE")) != NULL)
        observe_backtrace = (int)strtol(v, NULL, 10);
    size_t n = 0;
    if ((v = table_option("RANKMEM_OBSERVE_MAX_BLOCKS")) != NULL &&
        rankmem_parse_size(v, 0, &n) == RANKMEM_SUCCESS)
        observe_max_blocks = n;
    if ((v = table_option("RANKMEM_INTERCEPT")) != NULL)
        intercept_mode = rk_icpt_parse_mode(v) == 1;
#if !HAVE_CUDA
    if (intercept_mode) {
        rk_mpi_warn("RANKMEM_INTERCEPT=cuda: rankmem was built without CUDA; nothing is served");
        intercept_mode = 0;
    }
#endif
}

/* ---- the hooks ---- */

static void pre_bind(const char *b);
static void observe_job_line(int failed_here, int nfail, const char *why_here);

void rk_mpi_pre_init(void)
{
    if (pre_done)
        return;
    pre_done = 1;
    verbose = bool_option("RANKMEM_MPI_VERBOSE", 0);
    observe_options();
    rk_fail_options(); /* RANKMEM_ON_FAILURE, RANKMEM_REPORT_INTERVAL (failure.c) */

    const char *b = table_option("RANKMEM_BIND");
    if (b) {
        char why[160];
        snprintf(bind_text, sizeof bind_text, "%s", b);
        if (rk_bind_parse(b, &bind, why, sizeof why) != 0) {
            bad("RANKMEM_BIND='%.48s': %s", b, why);
            b = NULL;
        }
    }
    /* Checked now so that a typo is reported before MPI starts; built after. */
    (void)table_option("RANKMEM_RESOURCE");

    env_local_rank = rk_bind_env_local_rank(&env_var);
    ndev = rk_mpi_gpu_count();
    pre_bind(b);
    /* Right after the device is chosen: what the program and the MPI
     * library allocate from here on is seen. Not with a bad setting: the
     * job stops after PMPI_Init. */
    if (!bad_setting[0]) {
        rk_observe_start(observe_mode, ndev > 0, observe_backtrace, observe_max_blocks);
        rk_icpt_configure(intercept_mode);
    }
}

/* Select the device from the launcher's local rank, before PMPI_Init, so
 * that the MPI library's own GPU resources land on it. */
static void pre_bind(const char *b)
{
    if (!b || bind.mode == RK_BIND_NONE || ndev == 0 || env_local_rank < 0)
        return;
    int overlap[RK_BIND_LIST_MAX];
    if (bind.mode == RK_BIND_NEAREST)
        rk_mpi_gpu_overlap(ndev < RK_BIND_LIST_MAX ? ndev : RK_BIND_LIST_MAX, overlap);
    char why[160];
    int d = rk_bind_choose(&bind, env_local_rank, ndev < RK_BIND_LIST_MAX ? ndev : RK_BIND_LIST_MAX,
                           overlap, why, sizeof why);
    if (d < 0) {
        bad("RANKMEM_BIND='%s': %s", bind_text, why);
        return;
    }
    if (rk_mpi_gpu_set(d) == 0)
        pre_device = d;
}

/* Devices of the ranks on this node: is ours used by another one? */
static int device_shared(MPI_Comm node)
{
    int *all = malloc((size_t)local_size * sizeof *all);
    int shared = 0;
    if (!all)
        return local_size > ndev;
    if (PMPI_Allgather(&device, 1, MPI_INT, all, 1, MPI_INT, node) != MPI_SUCCESS) {
        free(all);
        return local_size > ndev;
    }
    for (int r = 0; r < local_size; r++)
        shared |= r != local_rank && all[r] == device;
    free(all);
    return shared;
}

void rk_mpi_post_init(int rc)
{
    if (post_done)
        return;
    post_done = 1;
    rk_mpi_pre_init(); /* a no-op unless init came by a path we did not hook */
    if (rc != MPI_SUCCESS) {
        rk_mpi_warn("MPI_Init failed (error %d); rankmem stays out of the way", rc);
        return;
    }
    init_ns = rk_mpi_now_ns();
    PMPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    PMPI_Comm_size(MPI_COMM_WORLD, &world_size);
    if (gethostname(host, sizeof host - 1) != 0)
        snprintf(host, sizeof host, "unknown");
    host[sizeof host - 1] = '\0';
    int pretend = rk_mpi_pretend_node();
    if (pretend >= 0) {
        /* A pretend node is a node of its own in the report too. */
        size_t hl = strlen(host);
        if (hl > sizeof host - 12)
            hl = sizeof host - 12;
        snprintf(host + hl, sizeof host - hl, ".node%d", pretend);
    }

    MPI_Comm node = MPI_COMM_NULL;
    if (rk_mpi_node_comm(MPI_COMM_WORLD, 0, &node) == MPI_SUCCESS && node != MPI_COMM_NULL) {
        PMPI_Comm_rank(node, &local_rank);
        PMPI_Comm_size(node, &local_size);
    } else {
        /* Cannot happen with a working MPI; every rank then counts as alone. */
        rk_mpi_warn("MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) failed; local rank 0 assumed");
        local_rank = 0;
        local_size = 1;
    }
    if (env_local_rank >= 0 && env_local_rank != local_rank) {
        flags |= RK_MPI_BIND_MISMATCH;
        rk_mpi_verbose("%s=%d but the shared-memory communicator says local rank %d: using %d",
                       env_var, env_local_rank, local_rank, local_rank);
    }

    /* The device: the communicator's local rank decides. */
    if (bad_setting[0]) {
        /* Stop below; choose nothing. */
    } else if (ndev == 0) {
        flags |= RK_MPI_HOST_FALLBACK;
        device = -1;
    } else if (bind.mode == RK_BIND_NONE) {
        flags |= RK_MPI_BIND_NONE;
        device = rk_mpi_gpu_current();
    } else {
        int overlap[RK_BIND_LIST_MAX];
        int n = ndev < RK_BIND_LIST_MAX ? ndev : RK_BIND_LIST_MAX;
        if (bind.mode == RK_BIND_NEAREST)
            rk_mpi_gpu_overlap(n, overlap);
        char why[160];
        int d = rk_bind_choose(&bind, local_rank, n, overlap, why, sizeof why);
        if (d < 0)
            bad("RANKMEM_BIND='%s': %s", bind_text, why);
        else if (d != pre_device && rk_mpi_gpu_set(d) != 0)
            bad("cannot select device %d for local rank %d", d, local_rank);
        else
            device = d;
    }
    if (!bad_setting[0] && device >= 0) {
        rk_mpi_gpu_describe(device, dev_name, sizeof dev_name, dev_busid, sizeof dev_busid);
        rk_mpi_gpu_meminfo(device, &dev_total_init, &dev_free_init);
    }
    if (node != MPI_COMM_NULL) {
        /* Collective on the node: every rank takes this path. */
        if (ndev > 0 && device_shared(node))
            flags |= RK_MPI_SHARED_GPU;
        PMPI_Comm_free(&node);
    }

    if (!bad_setting[0]) {
        const char *spec = table_option("RANKMEM_RESOURCE");
        if (spec)
            (void)make_resource(spec);
    }

    /* Every rank learns whether any rank has a bad setting, and how many
     * ranks cannot observe (one reduction for both). */
    char obs_why[200] = "";
    int mine[2] = {bad_setting[0] != 0, rk_observe_unavailable(obs_why, sizeof obs_why)};
    int sum[2] = {0, 0};
    if (PMPI_Allreduce(mine, sum, 2, MPI_INT, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS) {
        sum[0] = mine[0];
        sum[1] = mine[1];
    }
    int nbad = sum[0];
    if (nbad > 0) {
        if (mine[0])
            rk_mpi_warn("%s", bad_setting);
        else
            rk_mpi_warn("stopping: %d rank%s found a bad rankmem setting (see %s message)", nbad,
                        nbad == 1 ? "" : "s", nbad == 1 ? "its" : "their");
        if (world_rank == 0)
            rk_mpi_warn("fix the setting, or unset it for the default; every rank exits with "
                        "status 1 (docs/mpi.md)");
        fflush(stdout);
        fflush(stderr);
        PMPI_Finalize();
        exit(1);
    }
    /* The report's communicator, made now: at MPI_Finalize a dup would be
     * one more collective on the way out (tens of ms at scale). Ours: the
     * application's traffic on MPI_COMM_WORLD cannot meet the report's. */
    if (PMPI_Comm_dup(MPI_COMM_WORLD, &report_comm) != MPI_SUCCESS) {
        report_comm = MPI_COMM_NULL;
        rk_mpi_warn("MPI_Comm_dup failed: no report at MPI_Finalize");
    }
    active = 1;
    if (sum[1] > 0)
        observe_job_line(mine[1], sum[1], obs_why);
    rk_observe_after_init();
    if (rk_mpi_staging_init)
        rk_mpi_staging_init(); /* decides RANKMEM_STAGING once (mpi/staging/base.c) */
    char devtext[160];
    if (device >= 0)
        snprintf(devtext, sizeof devtext, "device %d (%s, %s)", device,
                 dev_name[0] ? dev_name : "?", dev_busid[0] ? dev_busid : "?");
    else
        snprintf(devtext, sizeof devtext, "no device");
    rk_mpi_verbose("active: rank %d/%d on %s, local rank %d/%d (%s=%d), %s, bind %s, "
                   "resource %s%s%s%s",
                   world_rank, world_size, host, local_rank, local_size,
                   env_var ? env_var : "launcher variable", env_local_rank, devtext, bind_text,
                   spec_text, flags & RK_MPI_HOST_FALLBACK ? ", host fallback (no GPU)" : "",
                   flags & RK_MPI_SHARED_GPU ? ", device shared with another rank" : "",
                   flags & RK_MPI_BIND_MISMATCH ? ", launcher and communicator disagree" : "");
    /* The record of a failure (failure.c): signal handlers after the MPI
     * library's, so that they chain to its own. */
    rk_fail_start(world_rank, world_size);
    /* Last: the rank's resource, device and communicator are all set. */
    if (intercept_mode)
        rk_icpt_set_active(1);
}

/* One line for the job when observation does not run on some ranks: their
 * count (nfail, from the reduction every rank took part in) and the reason
 * of the lowest such rank, which world rank 0 prints. Collective on every
 * rank (all know nfail > 0). */
static void observe_job_line(int failed_here, int nfail, const char *why_here)
{
    MPI_Comm comm = report_comm != MPI_COMM_NULL ? report_comm : MPI_COMM_WORLD;
    int me = failed_here ? world_rank : world_size, first = world_size;
    char why[200];
    snprintf(why, sizeof why, "%s", failed_here ? why_here : "");
    if (PMPI_Allreduce(&me, &first, 1, MPI_INT, MPI_MIN, comm) != MPI_SUCCESS ||
        first >= world_size ||
        (first != 0 && PMPI_Bcast(why, (int)sizeof why, MPI_CHAR, first, comm) != MPI_SUCCESS)) {
        first = world_rank; /* say what this rank knows */
        snprintf(why, sizeof why, "%s", failed_here ? why_here : "reason unknown");
    }
    why[sizeof why - 1] = '\0';
    if (world_rank == 0)
        rk_mpi_warn("device allocations not observed on %d of %d ranks: %s", nfail, world_size,
                    why[0] ? why : "reason unknown");
}

void rk_mpi_pre_finalize(void)
{
    if (fini_done)
        return;
    fini_done = 1;
    /* From here an exit() is not a failure; the interval thread stops. */
    rk_fail_finishing();
    /* Blocks served until now are still served back when freed. */
    rk_icpt_set_active(0);
    if (active) {
        if (rk_mpi_staging_finalize)
            rk_mpi_staging_finalize();
        if (report_comm != MPI_COMM_NULL) {
            rk_mpi_verbose("MPI_Finalize: writing the report");
            (void)rk_mpi_report_write(report_comm, NULL);
            PMPI_Comm_free(&report_comm);
        }
        rk_fail_finished(); /* the rank's failure file is in the report now */
    }
    if (intercept_mode) {
        uint64_t live = 0, served = 0, fwd[RK_ICPT_NREASONS];
        rk_icpt_counters(&live, &served, fwd);
        rk_mpi_verbose("RANKMEM_INTERCEPT=cuda: %llu allocations served (%llu still live), %llu "
                       "sent to CUDA (other device %llu, refused by the resource %llu)",
                       (unsigned long long)served, (unsigned long long)live,
                       (unsigned long long)(fwd[RK_ICPT_FWD_INACTIVE] + fwd[RK_ICPT_FWD_INTERNAL] +
                                            fwd[RK_ICPT_FWD_OURS] + fwd[RK_ICPT_FWD_BAD_ARGS] +
                                            fwd[RK_ICPT_FWD_NO_RESOURCE] +
                                            fwd[RK_ICPT_FWD_OTHER_DEVICE] + fwd[RK_ICPT_SERVE]),
                       (unsigned long long)fwd[RK_ICPT_FWD_OTHER_DEVICE],
                       (unsigned long long)fwd[RK_ICPT_SERVE]);
    }
    /* After the report, which read the recorder. */
    rk_observe_stop();
}

/* ---- for the report ---- */

int rk_mpi_active(void) { return active; }

static void copy_str(char *dst, size_t cap, const char *src)
{
    /* Plain bytes for the gather: the rest of the field zeroed. */
    memset(dst, 0, cap);
    if (src)
        memcpy(dst, src, strnlen(src, cap - 1));
}

void rk_mpi_fill_record(rk_mpi_record_t *rec)
{
    memset(rec, 0, sizeof *rec);
    rec->version = RK_MPI_RECORD_VERSION;
    rec->flags = flags;
    rec->rank = world_rank;
    rec->size = world_size;
    rec->local_rank = local_rank;
    rec->local_size = local_size;
    rec->env_local_rank = env_local_rank;
    rec->device = device;
    rec->node_devices = ndev;
    copy_str(rec->host, sizeof rec->host, host);
    copy_str(rec->device_name, sizeof rec->device_name, dev_name);
    copy_str(rec->pci_bus_id, sizeof rec->pci_bus_id, dev_busid);
    copy_str(rec->bind_mode, sizeof rec->bind_mode, bind_text);
    copy_str(rec->spec, sizeof rec->spec, spec_text);
    if (stats_mr) {
        rankmem_stats_t s = {.size = sizeof s};
        if (rankmem_stats_get(stats_mr, &s) == RANKMEM_SUCCESS) {
            rec->bytes_peak = s.bytes_peak;
            rec->bytes_current = s.bytes_current;
            rec->bytes_total = s.bytes_total;
            rec->count_total = s.count_total;
            rec->count_peak = s.count_peak;
            rec->count_current = s.count_current;
        }
        size_t v = 0;
        if (rankmem_resource_query(timing_mr, RANKMEM_QUERY_RESERVED_HIGH, &v) == RANKMEM_SUCCESS)
            rec->reserved_peak = v;
        else
            rankmem_clear_error(); /* not every chain knows: 0 says so */
        rec->alloc_ns = rk_mpi_timing_ns(timing_mr);
    }
    rec->dev_total_init = dev_total_init;
    rec->dev_free_init = dev_free_init;
    rk_mpi_gpu_meminfo(device, &rec->dev_total_final, &rec->dev_free_final);
    if (init_ns)
        rec->wall_s = (double)(rk_mpi_now_ns() - init_ns) * 1e-9;
    if (rk_mpi_staging_counters)
        rk_mpi_staging_counters(&rec->staged_bytes, &rec->staged_messages, &rec->staged_ns);
    rk_fail_fill(&rec->fail); /* an out-of-memory the rank lived through */
}

/* ---- nodes ---- */

/* Test-only: RANKMEM_TEST_NODE_RANKS=K splits each host into pretend nodes
 * of K consecutive world ranks, so that what depends on ranks sharing a
 * node (CUDA IPC, the fd service, shared pools, the report's node table) is
 * tested across nodes on one machine. -1: not set (or not a number >= 1). */
int rk_mpi_pretend_node(void)
{
    static int k = -2;
    if (k == -2) {
        const char *v = rk_mpi_table_option("RANKMEM_TEST_NODE_RANKS");
        char *end = NULL;
        long n = v ? strtol(v, &end, 10) : 0;
        k = v && end != v && !*end && n >= 1 && n <= 1 << 20 ? (int)n : -1;
    }
    if (k < 0)
        return -1;
    int wr = 0;
    PMPI_Comm_rank(MPI_COMM_WORLD, &wr);
    return wr / k;
}

int rk_mpi_node_comm(MPI_Comm comm, int key, MPI_Comm *node)
{
    *node = MPI_COMM_NULL;
    int rc = PMPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, key, MPI_INFO_NULL, node);
    int pretend = rk_mpi_pretend_node();
    if (rc != MPI_SUCCESS || pretend < 0 || *node == MPI_COMM_NULL)
        return rc;
    MPI_Comm sub = MPI_COMM_NULL;
    rc = PMPI_Comm_split(*node, pretend, key, &sub);
    PMPI_Comm_free(node);
    *node = sub;
    return rc;
}

/* ---- public ---- */

int rk_mpi_world_rank(void) { return world_rank; }

int rankmem_mpi_local_rank(void) { return local_rank; }

int rankmem_mpi_device(void) { return device; }

rankmem_resource_t *rankmem_mpi_resource(void) { return stats_mr; }

/* ---- the C hooks ---- */

/* Under MPICH, staging's helper thread calls MPI (mpi/staging/base.c):
 * MPI_THREAD_MULTIPLE is asked for; a level above the one required is what
 * MPI_Init_thread may give anyway. */
static int thread_level(int required)
{
    if (required < MPI_THREAD_MULTIPLE && rk_stg_want_multiple &&
        rk_stg_want_multiple(pre_device >= 0))
        return MPI_THREAD_MULTIPLE;
    return required;
}

RK_MPI_EXPORT int MPI_Init(int *argc, char ***argv)
{
    rk_mpi_pre_init();
    int rc, level = thread_level(MPI_THREAD_SINGLE), provided = 0;
    if (level == MPI_THREAD_SINGLE)
        rc = PMPI_Init(argc, argv);
    else
        rc = PMPI_Init_thread(argc, argv, level, &provided);
    rk_mpi_post_init(rc);
    return rc;
}

RK_MPI_EXPORT int MPI_Init_thread(int *argc, char ***argv, int required, int *provided)
{
    rk_mpi_pre_init();
    int rc = PMPI_Init_thread(argc, argv, thread_level(required), provided);
    rk_mpi_post_init(rc);
    return rc;
}

RK_MPI_EXPORT int MPI_Finalize(void)
{
    rk_mpi_pre_finalize();
    return PMPI_Finalize();
}
