/* Fortran hooks: mpi_init, mpi_init_thread and mpi_finalize in the four
 * manglings compilers use (mpi_init_ for gfortran and most others,
 * mpi_init__ with -fsecond-underscore, mpi_init and MPI_INIT for the rest).
 *
 * Open MPI's Fortran library calls PMPI_Init directly, so the C hooks never
 * see a Fortran program's init: these hooks are needed. MPICH's calls the C
 * MPI_Init, which is hooked too; the hooks are idempotent, so whichever runs
 * first does the work once.
 *
 * The MPI's Fortran PMPI routine (pmpi_init_ ...) is looked up at run time
 * with dlsym instead of being linked: the plugin then works for C programs
 * without the MPI's Fortran library, and preloads without it. Both Open MPI
 * and MPICH define every mangling of the pmpi_ names (nm -D on
 * libmpi_mpifh.so and libmpichfort.so). */
#define _GNU_SOURCE
#include "plugin.h"

#include <dlfcn.h>
#include <stddef.h>

typedef void (*f_init_t)(MPI_Fint *ierr);
typedef void (*f_init_thread_t)(MPI_Fint *required, MPI_Fint *provided, MPI_Fint *ierr);
typedef void (*f_finalize_t)(MPI_Fint *ierr);

/* The first of names the process defines (we define none of the pmpi_ ones). */
static void *find(const char *const *names)
{
    for (; *names; names++) {
        void *f = dlsym(RTLD_DEFAULT, *names);
        if (f)
            return f;
    }
    return NULL;
}

static const char *const init_names[] = {"pmpi_init_", "pmpi_init", "pmpi_init__", "PMPI_INIT",
                                         NULL};
static const char *const init_thread_names[] = {"pmpi_init_thread_", "pmpi_init_thread",
                                                "pmpi_init_thread__", "PMPI_INIT_THREAD", NULL};
static const char *const finalize_names[] = {"pmpi_finalize_", "pmpi_finalize",
                                             "pmpi_finalize__", "PMPI_FINALIZE", NULL};

static void f_init(MPI_Fint *ierr)
{
    rk_mpi_pre_init();
    f_init_t f = (f_init_t)find(init_names);
    int rc;
    if (f) {
        f(ierr);
        rc = (int)*ierr;
    } else {
        /* No Fortran MPI library in the process: cannot happen for a
         * Fortran caller, but the C routine does the same job. */
        rc = PMPI_Init(NULL, NULL);
        *ierr = (MPI_Fint)rc;
    }
    rk_mpi_post_init(rc);
}

static void f_init_thread(MPI_Fint *required, MPI_Fint *provided, MPI_Fint *ierr)
{
    rk_mpi_pre_init();
    f_init_thread_t f = (f_init_thread_t)find(init_thread_names);
    int rc;
    if (f) {
        f(required, provided, ierr);
        rc = (int)*ierr;
    } else {
        int prov = 0;
        rc = PMPI_Init_thread(NULL, NULL, (int)*required, &prov);
        *provided = (MPI_Fint)prov;
        *ierr = (MPI_Fint)rc;
    }
    rk_mpi_post_init(rc);
}

static void f_finalize(MPI_Fint *ierr)
{
    rk_mpi_pre_finalize();
    f_finalize_t f = (f_finalize_t)find(finalize_names);
    if (f)
        f(ierr);
    else
        *ierr = (MPI_Fint)PMPI_Finalize();
}

/* Prototypes keep -Wmissing-prototypes quiet; these are only called from Fortran. */
#define RK_F_INIT(name)                                                                         \
    RK_MPI_EXPORT void name(MPI_Fint *ierr);                                                    \
    RK_MPI_EXPORT void name(MPI_Fint *ierr) { f_init(ierr); }
#define RK_F_INIT_THREAD(name)                                                                  \
    RK_MPI_EXPORT void name(MPI_Fint *required, MPI_Fint *provided, MPI_Fint *ierr);            \
    RK_MPI_EXPORT void name(MPI_Fint *required, MPI_Fint *provided, MPI_Fint *ierr)             \
    {                                                                                           \
        f_init_thread(required, provided, ierr);                                                \
    }
#define RK_F_FINALIZE(name)                                                                     \
    RK_MPI_EXPORT void name(MPI_Fint *ierr);                                                    \
    RK_MPI_EXPORT void name(MPI_Fint *ierr) { f_finalize(ierr); }

RK_F_INIT(mpi_init_)
RK_F_INIT(mpi_init__)
RK_F_INIT(mpi_init)
RK_F_INIT(MPI_INIT)
RK_F_INIT_THREAD(mpi_init_thread_)
RK_F_INIT_THREAD(mpi_init_thread__)
RK_F_INIT_THREAD(mpi_init_thread)
RK_F_INIT_THREAD(MPI_INIT_THREAD)
RK_F_FINALIZE(mpi_finalize_)
RK_F_FINALIZE(mpi_finalize__)
RK_F_FINALIZE(mpi_finalize)
RK_F_FINALIZE(MPI_FINALIZE)
