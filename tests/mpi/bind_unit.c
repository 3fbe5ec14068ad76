/* The binding logic alone (mpi/bind.c): RANKMEM_BIND parsing, the
 * launcher's local rank, cpumasks, and the device each mode picks. No MPI
 * call, no launcher. */
#include "plugin.h"

#include <stdlib.h>
#include <string.h>

#include "../tap.h"

static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK",
                                   "MPI_LOCALRANKID",            "SLURM_LOCALID",
                                   "PMI_LOCAL_RANK",             "PALS_LOCAL_RANKID",
                                   "FLUX_TASK_LOCAL_ID"};

static void clear_vars(void)
{
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        unsetenv(vars[i]);
}

static int bit(const unsigned char *b, int i) { return (b[i / 8] >> (i % 8)) & 1; }

int main(void)
{
    rk_bind_spec_t s;
    char why[160];

    /* ---- RANKMEM_BIND values ---- */
    ok(rk_bind_parse("auto", &s, why, sizeof why) == 0 && s.mode == RK_BIND_AUTO, "auto");
    ok(rk_bind_parse("none", &s, why, sizeof why) == 0 && s.mode == RK_BIND_NONE, "none");
    ok(rk_bind_parse("nearest", &s, why, sizeof why) == 0 && s.mode == RK_BIND_NEAREST,
       "nearest");
    ok(rk_bind_parse("list:2,3,0,1", &s, why, sizeof why) == 0 && s.mode == RK_BIND_LIST &&
           s.nlist == 4 && s.list[0] == 2 && s.list[1] == 3 && s.list[2] == 0 && s.list[3] == 1,
       "list:2,3,0,1");
    ok(rk_bind_parse("list:7", &s, why, sizeof why) == 0 && s.nlist == 1 && s.list[0] == 7,
       "list:7");
    static const char *const bad[] = {"",         "Auto",       "near",     "list:",
                                      "list:1,",  "list:,1",    "list:a",   "list:1,,2",
                                      "list:-1",  "list:1 ,2",  " auto",    "auto ",
                                      "list:99999999999", "list 1", "list:1;2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        why[0] = '\0';
        ok(rk_bind_parse(bad[i], &s, why, sizeof why) == -1 && why[0],
           "bad value '%s' refused (%s)", bad[i], why);
    }
    ok(rk_bind_parse(NULL, &s, why, sizeof why) == -1, "NULL refused");
    {
        /* One more than the list holds. */
        char big[4 * (RK_BIND_LIST_MAX + 1) + 8] = "list:";
        for (int i = 0; i <= RK_BIND_LIST_MAX; i++)
            strcat(big, i ? ",1" : "1");
        ok(rk_bind_parse(big, &s, why, sizeof why) == -1, "a list of %d devices refused (%s)",
           RK_BIND_LIST_MAX + 1, why);
    }

    /* ---- the launcher's local rank ---- */
    const char *var = "x";
    clear_vars();
    ok(rk_bind_env_local_rank(&var) == -1 && var == NULL, "no launcher variable: -1");
    setenv("FLUX_TASK_LOCAL_ID", "5", 1);
    ok(rk_bind_env_local_rank(&var) == 5 && strcmp(var, "FLUX_TASK_LOCAL_ID") == 0, "Flux: 5");
    setenv("SLURM_LOCALID", "3", 1);
    ok(rk_bind_env_local_rank(&var) == 3 && strcmp(var, "SLURM_LOCALID") == 0,
       "Slurm's comes before Flux's");
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
    ok(rk_bind_env_local_rank(&var) == 1 && strcmp(var, "OMPI_COMM_WORLD_LOCAL_RANK") == 0,
       "Open MPI's comes first");
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "x1", 1);
    ok(rk_bind_env_local_rank(&var) == 3, "a garbled value is skipped");
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "-2", 1);
    ok(rk_bind_env_local_rank(NULL) == 3, "a negative value is skipped");
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "", 1);
    setenv("MPI_LOCALRANKID", "0", 1);
    ok(rk_bind_env_local_rank(&var) == 0 && strcmp(var, "MPI_LOCALRANKID") == 0,
       "an empty value is skipped; hydra's 0 is taken");
    clear_vars();

    /* ---- cpumasks (sysfs local_cpus) ---- */
    unsigned char bits[128];
    ok(rk_bind_parse_cpumask("f\n", bits, 1024) == 0 && bit(bits, 0) && bit(bits, 3) &&
           !bit(bits, 4),
       "'f' is CPUs 0-3");
    ok(rk_bind_parse_cpumask("00000001,00000000", bits, 1024) == 0 && bit(bits, 32) &&
           !bit(bits, 0) && !bit(bits, 31),
       "the second 32-bit word is CPUs 32-63");
    ok(rk_bind_parse_cpumask("ff000000,00000000,0000ff00", bits, 1024) == 0 && bit(bits, 8) &&
           bit(bits, 15) && !bit(bits, 16) && bit(bits, 88) && bit(bits, 95) && !bit(bits, 87),
       "three words");
    ok(rk_bind_parse_cpumask("ffffffff,ffffffff,ffffffff", bits, 40) == 0 && bit(bits, 39),
       "bits past nbits are dropped, not written");
    ok(rk_bind_parse_cpumask("", bits, 64) == -1, "empty mask refused");
    ok(rk_bind_parse_cpumask("fg", bits, 64) == -1, "non-hex refused");
    ok(rk_bind_parse_cpumask("ff,,ff", bits, 64) == -1, "empty word refused");

    /* ---- choosing ---- */
    rk_bind_parse("auto", &s, why, sizeof why);
    int good = 1;
    for (int r = 0; r < 8; r++)
        good &= rk_bind_choose(&s, r, 4, NULL, why, sizeof why) == r % 4;
    ok(good, "auto: local rank round-robin over 4 devices");
    ok(rk_bind_choose(&s, 3, 1, NULL, why, sizeof why) == 0, "auto: 1 device takes everyone");
    ok(rk_bind_choose(&s, 0, 0, NULL, why, sizeof why) == -1, "no device: -1");
    rk_bind_parse("list:2,3,0,1", &s, why, sizeof why);
    ok(rk_bind_choose(&s, 0, 4, NULL, why, sizeof why) == 2 &&
           rk_bind_choose(&s, 1, 4, NULL, why, sizeof why) == 3 &&
           rk_bind_choose(&s, 5, 4, NULL, why, sizeof why) == 3,
       "list: local rank indexes the list, wrapping around");
    why[0] = '\0';
    ok(rk_bind_choose(&s, 0, 2, NULL, why, sizeof why) == -1 && strstr(why, "device 2"),
       "list naming a device past the node's: refused (%s)", why);
    rk_bind_parse("nearest", &s, why, sizeof why);
    {
        int ov[4] = {0, 8, 0, 8};
        ok(rk_bind_choose(&s, 0, 4, ov, why, sizeof why) == 1 &&
               rk_bind_choose(&s, 1, 4, ov, why, sizeof why) == 3 &&
               rk_bind_choose(&s, 2, 4, ov, why, sizeof why) == 1,
           "nearest: round-robin over the devices nearest the rank's CPUs");
        int unk[4] = {-1, -1, -1, -1};
        ok(rk_bind_choose(&s, 2, 4, unk, why, sizeof why) == 2,
           "nearest with unknown locality: as auto");
        int none[4] = {0, 0, 0, 0};
        ok(rk_bind_choose(&s, 5, 4, none, why, sizeof why) == 1,
           "nearest with no local CPU anywhere: as auto");
        int one[4] = {2, 4, -1, 3};
        ok(rk_bind_choose(&s, 7, 4, one, why, sizeof why) == 1, "nearest: the single best");
    }
    return tap_done();
}
