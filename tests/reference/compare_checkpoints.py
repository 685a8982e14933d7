#!/usr/bin/python3
"""compare_checkpoints.py A B [TOL] — every parameter of two ffrun checkpoints (safetensors) agrees:
‖a − b‖ / ‖b‖ ≤ TOL (default 1e-5) per tensor, and both hold the same tensors. Exit 1 otherwise."""
import json
import math
import struct
import sys


def read(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, t in header.items():
        if name.startswith(("adam_", "grad.")):
            continue
        a, b = t["data_offsets"]
        out[name] = struct.unpack("<%df" % ((b - a) // 4), blob[8 + n + a:8 + n + b])
    return out


def main():
    a, b = read(sys.argv[1]), read(sys.argv[2])
    tol = float(sys.argv[3]) if len(sys.argv) > 3 else 1e-5
    if set(a) != set(b):
        print("tensors differ: %s" % sorted(set(a) ^ set(b)))
        sys.exit(1)
    worst, worst_name = 0.0, ""
    for name in sorted(a):
        diff = math.sqrt(sum((x - y) ** 2 for x, y in zip(a[name], b[name])))
        scale = math.sqrt(sum(y * y for y in b[name])) or 1.0
        if diff / scale > worst:
            worst, worst_name = diff / scale, name
    print("%d tensors, largest relative difference %.2g (%s)" % (len(a), worst, worst_name))
    sys.exit(0 if worst <= tol else 1)


if __name__ == "__main__":
    main()
