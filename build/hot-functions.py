#!/usr/bin/env python3
"""Write build/hot-functions.txt: the symbols of the functions a `sup run` executes, for the
linker to lay out together (build.rs says why).

    SUP_BENCH_CALLGRIND=/tmp/cg SUP_BENCH_STEPS=60 cargo bench --bench agent_loop
    build/hot-functions.py target/release/sup /tmp/cg/callgrind.* > build/hot-functions.txt

The callgrind outputs must hold instruction addresses (the bench runs callgrind with
--dump-instr=yes); each address is named by the binary's symbol table (`nm`). A release
build and `cargo bench` give some crates other features, so other symbol names: run it on
both builds' outputs and keep the names of both (`--add OLD_LIST` appends what a list has
that this run did not find).
"""
import bisect
import re
import subprocess
import sys


def executed(binary, outputs):
    """Offsets in `binary` of the instructions callgrind saw run."""
    name = binary.split("/")[-1]
    found = set()
    for path in outputs:
        objects, current, last = {}, None, 0
        for line in open(path):
            if line.startswith(("ob=", "cob=")):
                m = re.match(r"\((\d+)\)(?: (.*))?", line.split("=", 1)[1].strip())
                if m and m.group(2):
                    objects[m.group(1)] = m.group(2)
                if line.startswith("ob=") and m:
                    current = objects.get(m.group(1))
                continue
            if not line or line[0] not in "0123456789+-*":
                continue
            tok = line.split()[0]
            if tok.startswith("0x"):
                last = int(tok, 16)
            elif tok[0] in "+-":
                last += int(tok)
            elif tok != "*":
                continue
            if current and current.endswith(name):
                found.add(last)
    return found


def main():
    args = sys.argv[1:]
    old = []
    if len(args) > 1 and args[0] == "--add":
        old = open(args[1]).read().split()
        args = args[2:]
    binary, outputs = args[0], args[1:]
    nm = subprocess.run(["nm", "-n", "--defined-only", binary], capture_output=True, text=True)
    symbols = [
        (int(p[0], 16), p[2])
        for p in (l.split() for l in nm.stdout.splitlines())
        if len(p) == 3 and p[1] in "tTwW"
    ]
    starts = [a for a, _ in symbols]
    names, seen = [], set()
    for offset in sorted(executed(binary, outputs)):
        i = bisect.bisect_right(starts, offset) - 1
        if i >= 0 and symbols[i][1] not in seen:
            seen.add(symbols[i][1])
            names.append(symbols[i][1])
    names += [n for n in old if n not in seen]
    print("\n".join(names))


main()
