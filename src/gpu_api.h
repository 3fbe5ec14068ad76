/* The GPU runtime API as the library's C code writes it: the CUDA runtime's
 * names. A CUDA build (HAVE_CUDA) includes cuda_runtime_api.h and nothing
 * more; a HIP build (HAVE_HIP) maps each name used in src/ and mpi/ onto the
 * HIP runtime's, so that every resource keeps a single code path.
 *
 * Where the two runtimes differ in more than the name, the difference is a
 * feature macro or a small inline function here, not an #if in a resource:
 *   RK_GPU_RUNTIME, RK_GPU_PREFIX  "CUDA" / "cuda" or "HIP" / "hip", for
 *                                  messages that name the runtime or a call
 *   RK_GPU_MEMLOCATION_ADVISE      cudaMemAdvise/cudaMemPrefetchAsync take a
 *                                  cudaMemLocation (CUDA 13) instead of an int
 *   RK_GPU_POOL_HANDLE_TYPES_ATTR  the device reports which handle types its
 *                                  pools can export (HIP 5.x does not)
 *   RK_GPU_MANAGED_POOLS           pools of managed memory (CUDA 13 only)
 *   rk_gpu_pointer_kind()          what cudaPointerGetAttributes says of a
 *                                  pointer (the struct differs: .type in CUDA,
 *                                  .memoryType and .isManaged in HIP 5.x)
 *
 * Only the library's own sources include this file; it is never installed. */
#ifndef RANKMEM_GPU_API_H
#define RANKMEM_GPU_API_H

#include "config.h"

#if HAVE_CUDA && HAVE_HIP
#error "rankmem: HAVE_CUDA and HAVE_HIP are exclusive (configure enforces it)"
#endif

#if HAVE_CUDA

#include <cuda_runtime_api.h>

#define RK_GPU_RUNTIME "CUDA"
#define RK_GPU_PREFIX "cuda"
#define RK_GPU_MEMLOCATION_ADVISE (CUDART_VERSION >= 13000)
#define RK_GPU_POOL_HANDLE_TYPES_ATTR 1
#define RK_GPU_MANAGED_POOLS (CUDART_VERSION >= 13000)

#elif HAVE_HIP

/* The C headers need the platform named; configure passes it too. */
#ifndef __HIP_PLATFORM_AMD__
#define __HIP_PLATFORM_AMD__ 1
#endif
#include <hip/hip_runtime_api.h>

#define RK_GPU_RUNTIME "HIP"
#define RK_GPU_PREFIX "hip"
#define RK_GPU_MEMLOCATION_ADVISE 0
/* hipDeviceGetAttribute has no "supported handle types" in HIP 5.x: only
 * POSIX file descriptors exist there (no fabric handles). */
#define RK_GPU_POOL_HANDLE_TYPES_ATTR 0
/* HIP's pools hold device memory only (hipMemAllocationTypePinned). */
#define RK_GPU_MANAGED_POOLS 0

/* ---- types ---- */
#define cudaError_t hipError_t
#define cudaStream_t hipStream_t
#define cudaEvent_t hipEvent_t
#define cudaMemPool_t hipMemPool_t
#define cudaMemPoolProps hipMemPoolProps         /* struct tag and typedef */
#define cudaMemPoolAttr hipMemPoolAttr           /* enum tag and typedef */
#define cudaMemAllocationHandleType hipMemAllocationHandleType
#define cudaMemLocation hipMemLocation
#define cudaMemAccessDesc hipMemAccessDesc
#define cudaMemAccessFlags hipMemAccessFlags       /* enum tag and typedef */
#define cudaMemPoolPtrExportData hipMemPoolPtrExportData
#define cudaDeviceProp hipDeviceProp_t           /* struct tag */

/* ---- errors ---- */
#define cudaSuccess hipSuccess
#define cudaErrorMemoryAllocation hipErrorOutOfMemory
#define cudaErrorNoDevice hipErrorNoDevice
#define cudaErrorInsufficientDriver hipErrorInsufficientDriver
#define cudaErrorNotSupported hipErrorNotSupported
#define cudaErrorInvalidValue hipErrorInvalidValue
#define cudaErrorNotReady hipErrorNotReady
/* What a call answers while the runtime is torn down at exit. */
#define cudaErrorCudartUnloading hipErrorDeinitialized
#define cudaGetLastError hipGetLastError
#define cudaGetErrorString hipGetErrorString
#define cudaGetErrorName hipGetErrorName

/* ---- devices ---- */
#define cudaGetDeviceCount hipGetDeviceCount
#define cudaGetDevice hipGetDevice
#define cudaSetDevice hipSetDevice
#define cudaDeviceSynchronize hipDeviceSynchronize
#define cudaDeviceGetAttribute hipDeviceGetAttribute
#define cudaGetDeviceProperties hipGetDeviceProperties
#define cudaDeviceGetPCIBusId hipDeviceGetPCIBusId
#define cudaDriverGetVersion hipDriverGetVersion
#define cudaRuntimeGetVersion hipRuntimeGetVersion
#define cudaMemGetInfo hipMemGetInfo
#define cudaDevAttrMemoryPoolsSupported hipDeviceAttributeMemoryPoolsSupported
#define cudaDevAttrManagedMemory hipDeviceAttributeManagedMemory
#define cudaDevAttrConcurrentManagedAccess hipDeviceAttributeConcurrentManagedAccess
#define cudaDevAttrPageableMemoryAccess hipDeviceAttributePageableMemoryAccess

/* ---- plain, managed and pinned memory ---- */
#define cudaMalloc hipMalloc
#define cudaFree hipFree
#define cudaMallocManaged hipMallocManaged
#define cudaMemAttachGlobal hipMemAttachGlobal
#define cudaHostAlloc hipHostMalloc
#define cudaFreeHost hipHostFree
#define cudaHostAllocPortable hipHostMallocPortable
#define cudaHostAllocMapped hipHostMallocMapped
#define cudaMemcpy hipMemcpy
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemcpy2DAsync hipMemcpy2DAsync
#define cudaMemcpyDefault hipMemcpyDefault
#define cudaMemset hipMemset
#define cudaMemAdvise hipMemAdvise
#define cudaMemAdviseSetPreferredLocation hipMemAdviseSetPreferredLocation
#define cudaMemAdviseUnsetPreferredLocation hipMemAdviseUnsetPreferredLocation
#define cudaMemPrefetchAsync hipMemPrefetchAsync
#define cudaCpuDeviceId hipCpuDeviceId

/* ---- streams and events ---- */
#define cudaStreamCreate hipStreamCreate
#define cudaStreamCreateWithFlags hipStreamCreateWithFlags
#define cudaStreamDestroy hipStreamDestroy
#define cudaStreamSynchronize hipStreamSynchronize
#define cudaStreamWaitEvent hipStreamWaitEvent
#define cudaStreamDefault hipStreamDefault
#define cudaStreamNonBlocking hipStreamNonBlocking
#define cudaEventCreate hipEventCreate
#define cudaEventCreateWithFlags hipEventCreateWithFlags
#define cudaEventDisableTiming hipEventDisableTiming
#define cudaEventRecord hipEventRecord
#define cudaEventQuery hipEventQuery
#define cudaEventSynchronize hipEventSynchronize
#define cudaEventDestroy hipEventDestroy

/* ---- the stream-ordered allocator and its pools ---- */
#define cudaMallocAsync hipMallocAsync
#define cudaMallocFromPoolAsync hipMallocFromPoolAsync
#define cudaFreeAsync hipFreeAsync
#define cudaDeviceGetDefaultMemPool hipDeviceGetDefaultMemPool
#define cudaMemPoolCreate hipMemPoolCreate
#define cudaMemPoolDestroy hipMemPoolDestroy
#define cudaMemPoolTrimTo hipMemPoolTrimTo
#define cudaMemPoolSetAttribute hipMemPoolSetAttribute
#define cudaMemPoolGetAttribute hipMemPoolGetAttribute
#define cudaMemPoolSetAccess hipMemPoolSetAccess
#define cudaMemPoolGetAccess hipMemPoolGetAccess
#define cudaMemPoolReuseFollowEventDependencies hipMemPoolReuseFollowEventDependencies
#define cudaMemPoolReuseAllowOpportunistic hipMemPoolReuseAllowOpportunistic
#define cudaMemPoolReuseAllowInternalDependencies hipMemPoolReuseAllowInternalDependencies
#define cudaMemPoolAttrReleaseThreshold hipMemPoolAttrReleaseThreshold
#define cudaMemPoolAttrReservedMemCurrent hipMemPoolAttrReservedMemCurrent
#define cudaMemPoolAttrReservedMemHigh hipMemPoolAttrReservedMemHigh
#define cudaMemPoolAttrUsedMemCurrent hipMemPoolAttrUsedMemCurrent
#define cudaMemPoolAttrUsedMemHigh hipMemPoolAttrUsedMemHigh
#define cudaMemAllocationTypePinned hipMemAllocationTypePinned
#define cudaMemHandleTypeNone hipMemHandleTypeNone
#define cudaMemHandleTypePosixFileDescriptor hipMemHandleTypePosixFileDescriptor
#define cudaMemLocationTypeDevice hipMemLocationTypeDevice
#define cudaMemAccessFlagsProtReadWrite hipMemAccessFlagsProtReadWrite
#define cudaMemAccessFlagsProtNone hipMemAccessFlagsProtNone
/* Sharing pools and single allocations between processes. */
#define cudaMemPoolExportToShareableHandle hipMemPoolExportToShareableHandle
#define cudaMemPoolImportFromShareableHandle hipMemPoolImportFromShareableHandle
#define cudaMemPoolExportPointer hipMemPoolExportPointer
#define cudaMemPoolImportPointer hipMemPoolImportPointer

#endif /* HAVE_HIP */

#if HAVE_CUDA || HAVE_HIP

/* What a pointer is, as far as the runtime knows. */
enum rk_gpu_ptr_kind {
    RK_GPU_PTR_UNKNOWN = 0, /* not the runtime's (plain host memory), or the query failed */
    RK_GPU_PTR_HOST,        /* registered or pinned host memory */
    RK_GPU_PTR_DEVICE,
    RK_GPU_PTR_MANAGED,
};

/* Classify p; *device_p (may be NULL) gets the owning device, or -1. Leaves
 * no error behind in the runtime's per-thread slot. */
static inline enum rk_gpu_ptr_kind rk_gpu_pointer_kind(const void *p, int *device_p)
{
    enum rk_gpu_ptr_kind kind = RK_GPU_PTR_UNKNOWN;
    int dev = -1;
#if HAVE_CUDA
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) == cudaSuccess) {
        dev = a.device;
        kind = a.type == cudaMemoryTypeDevice    ? RK_GPU_PTR_DEVICE
               : a.type == cudaMemoryTypeManaged ? RK_GPU_PTR_MANAGED
               : a.type == cudaMemoryTypeHost    ? RK_GPU_PTR_HOST
                                                 : RK_GPU_PTR_UNKNOWN;
    }
    (void)cudaGetLastError();
#else
    /* HIP 5.x: .memoryType (not .type) and a separate isManaged flag; an
     * unknown pointer is an error (hipErrorInvalidValue), not a type. */
    hipPointerAttribute_t a;
    if (hipPointerGetAttributes(&a, p) == hipSuccess) {
        dev = a.device;
        kind = a.isManaged                          ? RK_GPU_PTR_MANAGED
               : a.memoryType == hipMemoryTypeDevice ? RK_GPU_PTR_DEVICE
               : a.memoryType == hipMemoryTypeHost   ? RK_GPU_PTR_HOST
                                                     : RK_GPU_PTR_UNKNOWN;
    }
    (void)hipGetLastError();
#endif
    if (device_p)
        *device_p = kind == RK_GPU_PTR_UNKNOWN ? -1 : dev;
    return kind;
}

#endif /* HAVE_CUDA || HAVE_HIP */

#endif
