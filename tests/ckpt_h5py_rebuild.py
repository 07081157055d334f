#!/usr/bin/python3
# Rebuilds one rank's parameters and AdamW moments from a `mode diff`
# checkpoint with h5py and numpy alone, following docs/CHECKPOINT.md (Layout,
# Codecs, "Rebuilding a rank by hand"), and checks that `tools/ckpt export`
# writes the same bits. Deliberately imports nothing from tools/ckpt: the
# point is that the documentation is enough.
#
# usage: ckpt_h5py_rebuild.py CHECKPOINT RANK TOOLS_CKPT
# exit 0: every tensor matches bit for bit; 1: a mismatch (or a failed export), with a message.

import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np


def flat_base(f, group):
    """A /model-like group as one float32 buffer, each tensor at its `offset` (the order of /model)."""
    model = f["model"]
    n = sum(ds.size for ds in model.values())
    flat = np.empty(n, dtype=np.float32)
    for name, ds in model.items():
        start = int(ds.attrs["offset"])
        values = f[group][name][()].ravel()
        if values.dtype == np.uint16:  # moments kept in bf16 (encoding "bfloat16"): a float's top 16 bits
            values = (values.astype(np.uint32) << 16).view(np.float32)
        flat[start:start + ds.size] = values
    return flat


def rebuild(f, rank, name, base):
    """/ranks/<rank>/<name> (params, adam_m or adam_v) decoded against the base, by its codec."""
    g = f[f"ranks/{rank}"]
    codec = g.attrs[name + ".codec"]
    codec = codec.decode() if isinstance(codec, bytes) else codec
    if codec == "lossless":  # bits(base) XOR diff
        value = (base.view(np.uint32) ^ g[name][()]).view(np.float32)
    elif codec == "int8":  # base + code * scale, block size B = ceil(n / number of scales); base where code is 0
        codes, scales = g[name + ".codes"][()], g[name + ".scales"][()]
        block = -(-base.size // scales.size)
        scale = scales[np.arange(base.size) // block]
        value = np.where(codes == 0, base, base + codes.astype(np.float32) * scale)
    elif codec == "topk":  # base, then the kept values at their indices
        value = base.copy()
        value[g[name + ".index"][()]] = g[name + ".kept"][()]
    else:
        raise ValueError(f"unknown codec {codec!r}")
    if name == "adam_v" and codec != "lossless":
        value = np.where(value < 0, np.float32(0), value)  # a lossy second moment is clamped at zero
    return value.astype(np.float32), codec


def main():
    if len(sys.argv) != 4:
        print("usage: ckpt_h5py_rebuild.py CHECKPOINT RANK TOOLS_CKPT", file=sys.stderr)
        return 1
    path, rank, tool = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    groups = {"params": "model", "adam_m": "optimizer/m", "adam_v": "optimizer/v"}
    with h5py.File(path, "r") as f:
        mode = f.attrs["mode"]
        if (mode.decode() if isinstance(mode, bytes) else mode) != "diff":
            print(f"FAIL: {path}: mode is {mode!r} (this test wants a mode diff checkpoint)")
            return 1
        offsets = {name: int(ds.attrs["offset"]) for name, ds in f["model"].items()}
        rebuilt = {}
        for name, group in groups.items():
            rebuilt[name], codec = rebuild(f, rank, name, flat_base(f, group))
            print(f"rebuilt /ranks/{rank}/{name} ({codec}, {rebuilt[name].size} values)")

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "export.h5")
        run = subprocess.run(["/usr/bin/python3", tool, "export", path, "--rank", str(rank), "-o", out],
                             capture_output=True, text=True)
        if run.returncode != 0:
            print(f"FAIL: tools/ckpt export exited {run.returncode}: {run.stderr.strip()}")
            return 1
        bad = 0
        with h5py.File(out, "r") as e:
            for name, group in groups.items():
                for tensor, start in sorted(offsets.items(), key=lambda t: t[1]):
                    exported = e[group][tensor][()]
                    if exported.dtype == np.uint16:  # bf16 moments (encoding "bfloat16"): a float's top 16 bits
                        exported = (exported.astype(np.uint32) << 16).view(np.float32)
                    mine = rebuilt[name][start:start + exported.size].reshape(exported.shape)
                    # bit for bit: compare the patterns, so NaN, -0 and rounding all count
                    if exported.dtype != np.float32 or not np.array_equal(exported.view(np.uint32),
                                                                          mine.view(np.uint32)):
                        differ = int(np.count_nonzero(exported.view(np.uint32) != mine.view(np.uint32)))
                        print(f"FAIL: /{group}/{tensor}: {differ} of {exported.size} values differ from the "
                              f"h5py rebuild of /ranks/{rank}/{name}")
                        bad += 1
    if bad:
        return 1
    print(f"ok: rank {rank} of {path}: params, adam_m, adam_v match tools/ckpt export bit for bit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
