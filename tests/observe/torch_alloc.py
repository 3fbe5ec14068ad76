"""PyTorch tensors of known sizes on the GPU, in an MPI job (mpi4py), with
no knowledge of rankmem (it comes by LD_PRELOAD). PyTorch's caching
allocator asks CUDA for segments larger than the tensors (rounded, and
blocks of 1 to 10 MiB share 20 MiB segments): what the report must show as
the device peak is what PyTorch reserved at most, not the tensors' bytes.
Prints EXPECT lines for tests/observe/check.py:
  observed.device.peak >= the tensors' bytes
  observed.device.peak ~  torch.cuda.max_memory_reserved() (within 2 MiB)
Exit status 77 (and a line "SKIP why") when torch, CUDA or mpi4py is missing."""
import sys

MiB = 1 << 20
try:
    import torch
except ImportError as e:
    print("SKIP no torch (%s)" % e)
    sys.exit(77)
try:
    from mpi4py import MPI
except ImportError as e:
    print("SKIP no mpi4py (%s)" % e)
    sys.exit(77)

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
if not torch.cuda.is_available():
    print("SKIP torch sees no GPU")
    sys.exit(77)

sizes = [3 * MiB, 5 * MiB, 12 * MiB, 40 * MiB + 4096]
tensors = [torch.ones(s, dtype=torch.uint8, device="cuda") for s in sizes]
torch.cuda.synchronize()
total = sum(t.numel() for t in tensors)
good = all(int(t.sum().item()) == t.numel() for t in tensors)
reserved = torch.cuda.max_memory_reserved()
del tensors
torch.cuda.synchronize()
torch.cuda.empty_cache()

print("EXPECT %d observed.device.peak >= %d" % (rank, total))
print("EXPECT %d observed.device.peak ~ %d:%d" % (rank, reserved, 2 * MiB))
print("# rank %d: tensors %d bytes, PyTorch reserved at most %d bytes" % (rank, total, reserved))
ok = comm.allreduce(1 if good else 0, op=MPI.MIN)
if rank == 0:
    print("%s - torch: the tensors hold what was written on every rank" %
          ("ok" if ok else "not ok"))
sys.stdout.flush()
