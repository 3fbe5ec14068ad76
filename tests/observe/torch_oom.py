"""PyTorch out of device memory in an MPI job (issue 29), knowing nothing of
rankmem (it comes by LD_PRELOAD). Every rank keeps a 256 MiB tensor; then
the last rank asks for more than the device holds and PyTorch raises
torch.cuda.OutOfMemoryError, which nothing catches: run as
`python -m mpi4py torch_oom.py`, mpi4py turns it into MPI_Abort, as it does
for any uncaught exception in an MPI job. Prints "ASKED BYTES" first.
Exit status 77 (and a line "SKIP why") when torch, CUDA or mpi4py is missing."""
import sys

MiB = 1 << 20
try:
    import torch
    from mpi4py import MPI
except ImportError as e:
    print("SKIP %s" % e)
    sys.exit(77)
if not torch.cuda.is_available():
    print("SKIP torch sees no GPU")
    sys.exit(77)

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
keep = torch.ones(256 * MiB, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
comm.Barrier()
if rank == size - 1:
    total = torch.cuda.get_device_properties(0).total_memory
    ask = total + (1 << 30)
    print("ASKED %d" % ask, flush=True)
    huge = torch.empty(ask, dtype=torch.uint8, device="cuda")
    print("unexpected: the tensor was granted", flush=True)
comm.Barrier()
