#!/usr/bin/env python3
"""unlaunch.py IN OUT — a CUDA source made plain C++ for the CPU emulation (cuda_emu/): every
kernel launch `kernel<<<grid, block[, shared[, stream]]>>>(args)` becomes
`emu_launch(dim3(grid), dim3(block), shared, stream, [&] { kernel(args); })`, which runs the
kernel as cuda_emu.h describes. Nothing else changes; a #line keeps compiler messages on the original."""
import sys


def split_top(text):
    """text split at its top-level commas"""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    return parts


def name_start(src, end):
    """where the kernel expression ending at `end` (template arguments included) begins"""
    i = end
    if src[i - 1] == ">":
        depth = 0
        while True:
            i -= 1
            depth += {">": 1, "<": -1}.get(src[i], 0)
            if depth == 0:
                break
    while i > 0 and (src[i - 1].isalnum() or src[i - 1] in "_:"):
        i -= 1
    return i


def unlaunch(src, path):
    out, pos = "", 0
    while True:
        at = src.find("<<<", pos)
        if at < 0:
            return out + src[pos:]
        close = src.find(">>>", at)
        start = name_start(src, at)
        name = src[start:at]
        cfg = split_top(src[at + 3:close])
        if not name or len(cfg) < 2 or len(cfg) > 4:
            sys.exit("unlaunch: %s: a launch it cannot read at offset %d" % (path, at))
        i = close + 3
        while src[i].isspace():
            i += 1
        if src[i] != "(":
            sys.exit("unlaunch: %s: no arguments after the launch at offset %d" % (path, at))
        depth, j = 0, i
        while True:
            depth += {"(": 1, ")": -1}.get(src[j], 0)
            j += 1
            if depth == 0:
                break
        shared = cfg[2] if len(cfg) > 2 else "0"
        stream = cfg[3] if len(cfg) > 3 else "0"
        out += src[pos:start]
        out += "emu_launch(dim3(%s), dim3(%s), (size_t)(%s), %s, [&] { %s%s; })" % (
            cfg[0], cfg[1], shared, stream, name, src[i:j])
        pos = j


def main():
    src = open(sys.argv[1]).read()
    text = '#line 1 "%s"\n' % sys.argv[1] + unlaunch(src, sys.argv[1])
    with open(sys.argv[2], "w") as f:
        f.write(text)


main()
