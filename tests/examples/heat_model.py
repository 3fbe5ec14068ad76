#!/usr/bin/env python3
"""The heat example's stencil in plain Python, for its test.

    heat_model.py NX NY STEPS

prints the line examples/heat prints last ("heat: checksum ... fnv1a ..."),
computed here with the same operations in the same order (Python floats are
IEEE doubles, so the bits must agree). Slow: for small grids only."""
import struct
import sys


def initial(g, c, nx, ny):
    if g == 0:
        return 100.0
    if g == ny - 1 or c == 0 or c == nx - 1:
        return 0.0
    # C's integer division truncates; ny // 4 and nx // 4 are of positives.
    if abs(2 * g - ny) < ny // 4 and abs(2 * c - nx) < nx // 4:
        return 50.0
    return 0.0


def main():
    nx, ny, steps = (int(a) for a in sys.argv[1:4])
    u = [[initial(g, c, nx, ny) for c in range(nx)] for g in range(ny)]
    for _ in range(steps):
        v = [row[:] for row in u]
        for g in range(1, ny - 1):
            a, up, dn, b = u[g], u[g - 1], u[g + 1], v[g]
            for c in range(1, nx - 1):
                b[c] = ((up[c] + dn[c]) + (a[c - 1] + a[c + 1])) * 0.25
        u = v
    total = 0.0
    h = 14695981039346656037
    for row in u:
        for x in row:
            total += x
            for byte in struct.pack("<d", x):
                h = ((h ^ byte) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    print("heat: checksum %.15e fnv1a %016x" % (total, h))


if __name__ == "__main__":
    main()
