#!/usr/bin/env python3
"""Unpacks a tools/device-bundle file with Python's standard library alone (the GPU machine may
lack xz and zstd): python3 tools/device/unpack.py BUNDLE.tar.xz DEST  ->  DEST/xx/"""
import os
import sys
import tarfile
import time

if len(sys.argv) != 3:
    sys.exit("usage: unpack.py BUNDLE.tar.xz DEST")
t0 = time.time()
os.makedirs(sys.argv[2], exist_ok=True)
with tarfile.open(sys.argv[1], "r:*") as t:
    names = t.getnames()
    bad = [n for n in names if n.startswith("/") or ".." in n.split("/") or not (n == "xx" or n.startswith("xx/"))]
    if bad:
        sys.exit(f"unpack: {sys.argv[1]}: entry {bad[0]!r} lies outside xx/ (expected a tools/device-bundle file)")
    t.extractall(sys.argv[2], **({"filter": "tar"} if hasattr(tarfile, "data_filter") else {}))
print(f"unpack: {len(names)} entries of {sys.argv[1]} into {os.path.join(sys.argv[2], 'xx')} "
      f"in {time.time() - t0:.1f} s")
