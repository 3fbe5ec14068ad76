/* rankmem: symbol visibility. The library is built with -fvisibility=hidden;
 * only what is marked RANKMEM_API is exported. */
#ifndef RANKMEM_EXPORT_H
#define RANKMEM_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define RANKMEM_API __attribute__((visibility("default")))
#else
#define RANKMEM_API
#endif

#endif
