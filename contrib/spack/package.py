# Spack recipe for rankmem. Copy this file to
# $SPACK_ROOT/var/spack/repos/builtin/packages/rankmem/package.py (or a
# repository of your own: `spack repo create`), then:
#
#   spack install rankmem +cuda cuda_arch=90 +mpi ^openmpi
#   spack install rankmem ~cuda +mpi ^mpich          # host memory only
#
# Each variant maps to configure options (tests/spack.sh checks that every
# option this recipe can emit exists in `configure --help`).
from spack.package import *


class Rankmem(AutotoolsPackage, CudaPackage):
    """GPU memory per MPI rank, in plain C: chainable memory resources
    (stream-ordered pools, suballocators, adaptors), an MPI plugin that binds
    each rank to a GPU, stages device buffers for MPI libraries that are not
    CUDA-aware and reports every rank's memory at MPI_Finalize, and OpenMP
    allocators for device, managed and pinned memory."""

    # Placeholders until the project has a public home: set both.
    homepage = "https://example.org/rankmem"
    git = "https://example.org/rankmem.git"

    version("main", branch="main")

    # CudaPackage adds the variants cuda (default off) and cuda_arch, and
    # depends_on("cuda", when="+cuda").
    variant("mpi", default=True,
            description="Build librankmem_mpi, the MPI plugin (GPU binding, staging, report)")
    variant("openmp", default=True,
            description="Use OpenMP and build librankmem_omp (OpenMP allocators served by rankmem)")
    variant("hip", default=False,
            description="AMD GPUs through HIP instead of CUDA (configure --with-hip)")
    variant("fortran", default=True,
            description="Build and install the Fortran module rankmem (iso_c_binding)")

    # A checkout has no configure script: autogen.sh makes it.
    depends_on("autoconf@2.69:", type="build", when="@main")
    depends_on("automake@1.14:", type="build", when="@main")
    depends_on("libtool@2.4.2:", type="build", when="@main")
    depends_on("m4", type="build", when="@main")
    # man/md2roff.py turns the man page sources into roff in a checkout.
    depends_on("python@3:", type="build", when="@main")

    depends_on("mpi", when="+mpi")
    # RANKMEM_BIND=nearest asks hwloc for the GPUs' locality.
    depends_on("hwloc@2:", when="+mpi")
    depends_on("hip@5.2:", when="+hip")
    # One GPU runtime per build.
    conflicts("+cuda", when="+hip", msg="rankmem builds against CUDA or HIP, not both")

    def autoreconf(self, spec, prefix):
        Executable("./autogen.sh")()

    def configure_args(self):
        spec = self.spec
        args = []

        if spec.satisfies("+cuda"):
            args.append("--with-cuda={0}".format(spec["cuda"].prefix))
            archs = [a for a in spec.variants["cuda_arch"].value if a != "none"]
            if archs:
                flags = " ".join(
                    "-gencode arch=compute_{0},code=sm_{0}".format(a) for a in archs)
                args.append("NVCC_ARCH={0}".format(flags))
        else:
            args.append("--without-cuda")

        # --with-hip turns CUDA off by itself; conflicts() keeps +cuda out.
        if spec.satisfies("+hip"):
            args.append("--with-hip={0}".format(spec["hip"].prefix))
        else:
            args.append("--without-hip")

        if spec.satisfies("+mpi"):
            args.append("--with-mpi")
            args.append("--enable-mpi-plugin")
            args.append("--with-hwloc")
            args.append("MPICC={0}".format(spec["mpi"].mpicc))
            if spec.satisfies("+fortran"):
                args.append("MPIFC={0}".format(spec["mpi"].mpifc))
        else:
            args.append("--without-mpi")
            args.append("--disable-mpi-plugin")

        args.extend(self.enable_or_disable("openmp"))
        if spec.satisfies("~openmp"):
            args.append("--disable-omp-plugin")

        args.extend(self.enable_or_disable("fortran"))
        return args
