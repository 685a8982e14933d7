#!/usr/bin/python3
"""compare_checkpoints.py A B [TOL] — every parameter of two ffrun checkpoints (safetensors) agrees:
both hold the same tensors, each of the same dtype (F32), shape and length, every value finite,
and ‖a − b‖ / ‖b‖ ≤ TOL (default 1e-5) per tensor. Exit 1 otherwise, saying why.

compare_checkpoints.py --like REF A   A holds REF's tensors with REF's shapes, each whole and finite
                                     (values not compared: a checkpoint of another schedule).
compare_checkpoints.py --self-test   checks that each of those differences is caught."""
import json
import math
import os
import struct
import sys
import tempfile


class Bad(Exception):
    pass


def read(path):
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise Bad("%s: shorter than a safetensors header" % path)
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        raise Bad("%s: header runs past the end of the file" % path)
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, t in header.items():
        if name.startswith(("adam_", "grad.")):
            continue
        if t.get("dtype") != "F32":
            raise Bad("%s: %s is %s, not F32" % (path, name, t.get("dtype")))
        a, b = t["data_offsets"]
        count = 1
        for d in t["shape"]:
            count *= d
        if b - a != 4 * count or 8 + n + b > len(blob):
            raise Bad("%s: %s holds %d bytes, its shape %s needs %d" %
                      (path, name, b - a, t["shape"], 4 * count))
        values = struct.unpack("<%df" % count, blob[8 + n + a:8 + n + b])
        bad = next((i for i, x in enumerate(values) if not math.isfinite(x)), None)
        if bad is not None:
            raise Bad("%s: %s[%d] is %r" % (path, name, bad, values[bad]))
        out[name] = (tuple(t["shape"]), values)
    return out


def compare(path_a, path_b, tol, values=True):
    """(True or False, the line to print); with values False only the tensors and shapes."""
    a, b = read(path_a), read(path_b)
    if set(a) != set(b):
        return False, "tensors differ: %s" % sorted(set(a) ^ set(b))
    worst, worst_name = 0.0, ""
    for name in sorted(a):
        if a[name][0] != b[name][0]:
            return False, "%s: shape %s against %s" % (name, list(a[name][0]), list(b[name][0]))
        if not values:
            continue
        diff = math.sqrt(sum((x - y) ** 2 for x, y in zip(a[name][1], b[name][1])))
        scale = math.sqrt(sum(y * y for y in b[name][1])) or 1.0
        if diff / scale > worst:
            worst, worst_name = diff / scale, name
    if not values:
        return True, "%d tensors, each whole and finite, shaped like %s" % (len(a), path_b)
    line = "%d tensors, largest relative difference %.2g (%s)" % (len(a), worst, worst_name)
    return worst <= tol, line


def like(path_ref, path):
    return compare(path, path_ref, 0.0, values=False)


def write(path, tensors):
    header, data = {}, b""
    for name, (shape, values) in tensors.items():
        raw = struct.pack("<%df" % len(values), *values)
        header[name] = {"dtype": "F32", "shape": list(shape),
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def self_test():
    base = {"w": ((2, 2), [1.0, 2.0, 3.0, 4.0]), "b": ((3,), [0.5, -0.5, 0.25])}
    cases = [
        ("the same", base, True),
        ("within tolerance", {**base, "w": ((2, 2), [1.0, 2.0, 3.0, 4.00001])}, True),
        ("a value far off", {**base, "w": ((2, 2), [1.0, 2.0, 3.0, 5.0])}, False),
        ("a NaN", {**base, "w": ((2, 2), [1.0, float("nan"), 3.0, 4.0])}, False),
        ("an infinity", {**base, "b": ((3,), [0.5, float("inf"), 0.25])}, False),
        ("another shape", {**base, "w": ((4, 1), [1.0, 2.0, 3.0, 4.0])}, False),
        ("a shorter tensor", {**base, "b": ((2,), [0.5, -0.5])}, False),
        ("a missing tensor", {"w": base["w"]}, False),
    ]
    failures = 0
    with tempfile.TemporaryDirectory() as d:
        ref = os.path.join(d, "ref.safetensors")
        write(ref, base)
        for what, tensors, want in cases:
            other = os.path.join(d, "other.safetensors")
            write(other, tensors)
            for x, y in ((other, ref), (ref, other)):
                try:
                    ok, line = compare(x, y, 1e-5)
                except Bad as e:
                    ok, line = False, str(e)
                if ok != want:
                    failures += 1
                    print("FAIL: %s: %s (%s)" % (what, "accepted" if ok else "refused", line))
        lying = os.path.join(d, "lying.safetensors")  # a header whose shape needs more bytes
        write(lying, base)
        with open(lying, "rb") as f:
            blob = f.read()
        blob = blob.replace(b'"shape": [3]', b'"shape": [4]', 1)
        with open(lying, "wb") as f:
            f.write(blob)
        try:
            compare(lying, ref, 1e-5)
            failures += 1
            print("FAIL: a header whose shape does not match its bytes was read")
        except Bad:
            pass
        far = os.path.join(d, "far.safetensors")  # other values, same tensors: alike
        write(far, {**base, "w": ((2, 2), [9.0, 8.0, 7.0, 6.0])})
        odd = os.path.join(d, "odd.safetensors")
        write(odd, {**base, "w": ((4, 1), [1.0, 2.0, 3.0, 4.0])})
        if not like(ref, far)[0] or like(ref, odd)[0]:
            failures += 1
            print("FAIL: --like")
    print("compare_checkpoints self-test: %d cases, %d failed" % (len(cases) + 2, failures))
    return 1 if failures else 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(self_test())
    if len(sys.argv) == 4 and sys.argv[1] == "--like":
        try:
            ok, line = like(sys.argv[2], sys.argv[3])
        except (Bad, OSError, ValueError, KeyError) as e:
            ok, line = False, str(e)
        print(line)
        sys.exit(0 if ok else 1)
    if len(sys.argv) not in (3, 4):
        print(__doc__.strip(), file=sys.stderr)
        sys.exit(2)
    tol = float(sys.argv[3]) if len(sys.argv) > 3 else 1e-5
    try:
        ok, line = compare(sys.argv[1], sys.argv[2], tol)
    except (Bad, OSError, ValueError, KeyError) as e:
        print(e)
        sys.exit(1)
    print(line)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
