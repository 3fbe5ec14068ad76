/* main() of tests/cxx/thrust.t: the test itself is tests/cxx/thrust.cu
 * (nvcc); a build without CUDA has no nvcc and prints a skip. */
#include "config.h"

#include <rankmem.h>

#include "../tap.h"

#if HAVE_CUDA
int rk_cxx_thrust_main(void);
int main(void) { return rk_cxx_thrust_main(); }
#else
int main(void) { return tap_skip_all("rankmem was built without CUDA: no nvcc to build the test"); }
#endif
