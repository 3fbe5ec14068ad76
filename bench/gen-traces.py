#!/usr/bin/env python3
"""Generate rankmem's synthetic allocation traces (bench/traces/*.csv).

    python3 bench/gen-traces.py [OUTDIR]        (default: the traces/ next to this script)

Writes, deterministically (fixed seeds, the standard library only):

  powerlaw.csv  power-law sizes from 256 B to 64 MiB, mixed lifetimes: most
                blocks die within a few allocations, some live for hundreds
                or thousands, a few for the whole run; one thread.
  threads.csv   8 threads, each with its own stream, interleaved at random;
                each keeps a working set of its own, and now and then hands a
                block to another thread, which frees it on its own stream.
  growing.csv   a working set that grows slowly (a cache of 2 MiB pages and
                tables that are reallocated 25% larger) with bursts of many
                short-lived temporaries; one thread.

The format is the logging adaptor's (docs/adaptors-stats.md):
Thread,Time,Action,Pointer,Size,Stream with Time in integer microseconds,
increasing. Pointers come from a toy address allocator (exact-size reuse of
freed addresses, else a bump pointer), so an address is never live twice at
once and freed addresses come back, as in a real log. bench/traces/README.md
describes the traces and their peaks; rankmem-replay reads them.
"""

import heapq
import os
import random
import sys

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30


class Trace:
    """Lines of one trace, with the bookkeeping that keeps it well formed."""

    def __init__(self, path, seed, base=0x7000000000):
        self.path = path
        self.rng = random.Random(seed)
        self.lines = ["Thread,Time,Action,Pointer,Size,Stream"]
        self.time = 0
        self.bump = base
        self.reuse = {}  # rounded size -> freed addresses
        self.live = {}  # ptr -> size
        self.live_bytes = 0
        self.peak = 0
        self.allocs = 0

    def tick(self, lo=1, hi=12):
        self.time += self.rng.randint(lo, hi)

    def alloc(self, size, thread=0, stream=0):
        rounded = (size + 511) // 512 * 512
        free = self.reuse.get(rounded)
        if free:
            ptr = free.pop()
        else:
            ptr = self.bump
            self.bump += rounded
        assert ptr not in self.live
        self.live[ptr] = size
        self.live_bytes += size
        self.peak = max(self.peak, self.live_bytes)
        self.allocs += 1
        self.tick()
        self.lines.append("%d,%d,allocate,0x%x,%d,0x%x" % (thread, self.time, ptr, size, stream))
        return ptr

    def free(self, ptr, thread=0, stream=0):
        size = self.live.pop(ptr)
        self.live_bytes -= size
        self.reuse.setdefault((size + 511) // 512 * 512, []).append(ptr)
        self.tick()
        self.lines.append("%d,%d,free,0x%x,%d,0x%x" % (thread, self.time, ptr, size, stream))

    def write(self):
        with open(self.path, "w") as f:
            f.write("\n".join(self.lines) + "\n")
        size = os.path.getsize(self.path)
        print("%s: %d events, peak live %.2f GiB, %d blocks live at the end, %.2f MB"
              % (os.path.basename(self.path), len(self.lines) - 1, self.peak / GiB,
                 len(self.live), size / 1e6))


def powerlaw_size(rng, lo=256, hi=64 * MiB, alpha=1.25):
    """Inverse CDF of p(s) ~ s^-alpha on [lo, hi]."""
    a = 1.0 - alpha
    u = rng.random()
    s = (lo ** a + u * (hi ** a - lo ** a)) ** (1.0 / a)
    return max(lo, min(hi, int(s)))


def gen_powerlaw(path):
    t = Trace(path, seed=1)
    rng = t.rng
    due = []  # (allocation index at which to free, tiebreak, ptr)
    n_allocs = 17000
    for i in range(n_allocs):
        while due and due[0][0] <= i:
            _, _, ptr = heapq.heappop(due)
            t.free(ptr)
        size = powerlaw_size(rng)
        ptr = t.alloc(size)
        r = rng.random()
        if r < 0.70:  # short: a few allocations
            life = 1 + int(rng.expovariate(1 / 4.0))
        elif r < 0.92:  # medium: hundreds
            life = 1 + int(rng.expovariate(1 / 300.0))
        elif r < 0.997:  # long: thousands
            life = 1 + int(rng.expovariate(1 / 4000.0))
        else:  # for the whole run, and still live at its end
            continue
        heapq.heappush(due, (i + life, i, ptr))
    # The others die at the end, in random order; the permanent blocks stay
    # live, as model weights do in the recorded traces.
    rest = [p for _, _, p in due]
    rng.shuffle(rest)
    for ptr in rest:
        t.free(ptr)
    t.write()


def gen_threads(path):
    t = Trace(path, seed=2)
    rng = t.rng
    nthreads = 8
    streams = [0x55d0c8a3b000 + 0x1000 * k for k in range(nthreads)]
    sets = [[] for _ in range(nthreads)]  # each thread's live blocks
    target = [rng.randint(20, 60) for _ in range(nthreads)]  # working-set sizes
    mailbox = []  # (ptr) handed over, freed by whichever thread takes it
    weights = [1.0 + 0.15 * k for k in range(nthreads)]  # some threads busier
    events = 32000
    while len(t.lines) - 1 < events:
        k = rng.choices(range(nthreads), weights)[0]
        mine = sets[k]
        r = rng.random()
        if mailbox and r < 0.04:
            t.free(mailbox.pop(rng.randrange(len(mailbox))), k, streams[k])
        elif mine and r < 0.07 and len(mailbox) < 16:
            mailbox.append(mine.pop(rng.randrange(len(mine))))
        elif len(mine) < target[k] and (not mine or r < 0.55):
            # Log-uniform 512 B .. 4 MiB, plus a few large buffers.
            if rng.random() < 0.02:
                size = rng.randint(8, 32) * MiB
            else:
                size = int(2 ** rng.uniform(9, 22))
            mine.append(t.alloc(size, k, streams[k]))
        elif mine:
            # Mostly the youngest (stack-like temporaries), sometimes any.
            j = len(mine) - 1 - min(len(mine) - 1, int(rng.expovariate(1 / 3.0)))
            if rng.random() < 0.2:
                j = rng.randrange(len(mine))
            t.free(mine.pop(j), k, streams[k])
        if rng.random() < 0.001:  # phases: working sets change size
            target[k] = rng.randint(10, 80)
    for k in range(nthreads):
        while sets[k]:
            t.free(sets[k].pop(), k, streams[k])
    while mailbox:
        k = rng.randrange(nthreads)
        t.free(mailbox.pop(), k, streams[k])
    t.write()


def gen_growing(path):
    t = Trace(path, seed=3)
    rng = t.rng
    pages = []  # a growing cache of 2 MiB pages (like a KV cache)
    tables = []  # (ptr, size): reallocated 25% larger now and then
    for _ in range(6):
        size = rng.randint(1, 8) * MiB + rng.randint(0, 4095)
        tables.append((t.alloc(size), size))
    step = 0
    while len(t.lines) - 1 < 30000:
        step += 1
        r = rng.random()
        if r < 0.60:
            # Steady state: a small temporary, freed at once.
            p = t.alloc(int(2 ** rng.uniform(8, 20)))
            t.free(p)
        elif r < 0.80:
            pages.append(t.alloc(2 * MiB))
        elif r < 0.995:
            # Evictions: a little slower than insertions, so the cache grows.
            if pages:
                t.free(pages.pop(rng.randrange(len(pages))))
        else:
            i = rng.randrange(len(tables))
            ptr, size = tables[i]
            new_size = size + size // 4
            new = t.alloc(new_size)  # the copy needs both for a moment
            t.free(ptr)
            tables[i] = (new, new_size)
        if step % 900 == 0:
            # A burst: many temporaries of all sizes, freed mostly in reverse.
            burst = [t.alloc(int(2 ** rng.uniform(12, 24))) for _ in range(rng.randint(100, 300))]
            while burst:
                j = len(burst) - 1 if rng.random() < 0.8 else rng.randrange(len(burst))
                t.free(burst.pop(j))
    for p in pages:
        t.free(p)
    for p, _ in tables:
        t.free(p)
    t.write()


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "traces")
    os.makedirs(out, exist_ok=True)
    gen_powerlaw(os.path.join(out, "powerlaw.csv"))
    gen_threads(os.path.join(out, "threads.csv"))
    gen_growing(os.path.join(out, "growing.csv"))


if __name__ == "__main__":
    main()
