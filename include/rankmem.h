/* rankmem: GPU memory per MPI rank, in plain C. Umbrella header. */
#ifndef RANKMEM_H
#define RANKMEM_H

#include <rankmem/export.h>
#include <rankmem/status.h>
#include <rankmem/resource.h>
#include <rankmem/resources.h>
#include <rankmem/adaptors.h>
#include <rankmem/suballocators.h>
#include <rankmem/config.h>

#define RANKMEM_VERSION_MAJOR 0
#define RANKMEM_VERSION_MINOR 1
#define RANKMEM_VERSION_PATCH 0

#ifdef __cplusplus
extern "C" {
#endif

/* Version of the library actually linked (may differ from the header's). */
RANKMEM_API rankmem_status_t rankmem_version(int *major_p, int *minor_p, int *patch_p);

/* Nonzero when the library was built with CUDA. */
RANKMEM_API int rankmem_have_cuda(void);
/* Nonzero when the library was built with HIP (AMD GPUs). A build has at
 * most one of the two GPU runtimes. */
RANKMEM_API int rankmem_have_hip(void);

#ifdef __cplusplus
}
#endif
#endif
