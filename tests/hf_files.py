#!/usr/bin/python3
"""Hugging Face model directories for tests/cli/hf_import.sh, from the safetensors format's definition
(struct, json, numpy; not tools/ckpt and not xuanxue):

  same A B                  config.json equal, and every tensor of A's model.safetensors equal to B's in
                            name, dtype, shape and bytes (the __metadata__ may differ: it names the checkpoint)
  fp8 IN OUT BR BC          OUT: IN with every *_proj weight in float8_e4m3fn (scaled per BR x BC block,
                            the scale as weight_scale_inv, DeepSeek-V3's layout), every other tensor in bf16,
                            and config.json's quantization_config saying so
  dequantized OUT EXPORT    every tensor of EXPORT (an F32 export of what xuanxue imported from OUT) equals
                            OUT's dequantized: fp8 x its block's scale, in float32, and bf16 widened; exactly
  edit DIR KEY=JSON...      sets (or, with KEY=, deletes) top-level config.json keys
  add-head DIR same|other   adds lm_head.weight to a tied DIR: model.embed_tokens.weight's bytes (same), or
                            them with one value changed (other)
"""
import json
import os
import struct
import sys

import numpy as np

DTYPES = {"F32": np.float32, "BF16": np.uint16, "F8_E4M3": np.uint8}


def read(path):
    """{name: (dtype, shape, raw bytes)}, __metadata__ left out, in file order."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        begin, end = t["data_offsets"]
        out[name] = (t["dtype"], tuple(t["shape"]), data[begin:end])
    return out


def write(path, tensors):
    """tensors: [(name, dtype, shape, raw bytes)]."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(raw for _, _, _, raw in tensors))


def e4m3_values():
    """The float value of every e4m3fn code (NaN for the two NaN codes)."""
    v = np.zeros(256, np.float64)
    for b in range(256):
        sign, exponent, mantissa = b >> 7, (b >> 3) & 15, b & 7
        if exponent == 15 and mantissa == 7:
            v[b] = np.nan
        elif exponent == 0:
            v[b] = mantissa / 8 * 2.0 ** -6
        else:
            v[b] = (1 + mantissa / 8) * 2.0 ** (exponent - 7)
        v[b] = -v[b] if sign else v[b]
    return v


def to_e4m3(x):
    """Nearest e4m3fn code of each value (|x| <= 448)."""
    values = e4m3_values()
    finite = np.where(np.isnan(values), np.inf, values)
    return np.abs(x.reshape(-1, 1) - finite.reshape(1, -1)).argmin(axis=1).astype(np.uint8).reshape(x.shape)


def to_bf16(x):
    """bf16 bits of float32 values, rounded to nearest even."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def as_float(dtype, shape, raw):
    a = np.frombuffer(raw, DTYPES[dtype]).reshape(shape)
    if dtype == "BF16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    if dtype == "F8_E4M3":
        return e4m3_values()[a].astype(np.float32)
    return a


def fp8(src, dst, br, bc):
    os.makedirs(dst, exist_ok=True)
    tensors = read(os.path.join(src, "model.safetensors"))
    out = []
    for name, (dtype, shape, raw) in tensors.items():
        w = np.frombuffer(raw, np.float32).reshape(shape)
        if name.endswith("_proj.weight") and len(shape) == 2 and w.size:
            rows, cols = shape
            sr, sc = -(-rows // br), -(-cols // bc)
            scale = np.zeros((sr, sc), np.float32)
            q = np.zeros(shape, np.uint8)
            for i in range(sr):
                for j in range(sc):
                    block = w[i * br:(i + 1) * br, j * bc:(j + 1) * bc]
                    s = np.float32(max(float(np.abs(block).max()), 1e-12) / 448.0)
                    scale[i, j] = s
                    q[i * br:(i + 1) * br, j * bc:(j + 1) * bc] = to_e4m3(block / s)
            out.append((name, "F8_E4M3", shape, q.tobytes()))
            out.append((name + "_scale_inv", "F32", (sr, sc), scale.tobytes()))
        else:
            out.append((name, "BF16", shape, to_bf16(w).tobytes()))
    write(os.path.join(dst, "model.safetensors"), out)
    config = json.load(open(os.path.join(src, "config.json")))
    config["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                     "weight_block_size": [br, bc]}
    json.dump(config, open(os.path.join(dst, "config.json"), "w"), indent=2)
    fp8_count = sum(dtype == "F8_E4M3" for _, dtype, _, _ in out)
    print(f"{dst}: {fp8_count} FP8 tensors in {br}x{bc} blocks, {len(tensors) - fp8_count} bf16")


def dequantized(fp8_dir, export_dir):
    quant = read(os.path.join(fp8_dir, "model.safetensors"))
    got = read(os.path.join(export_dir, "model.safetensors"))
    bad, checked = [], 0
    for name, (dtype, shape, raw) in got.items():
        if dtype != "F32":
            bad.append(f"{name}: exported as {dtype}")
            continue
        value = np.frombuffer(raw, np.float32).reshape(shape)
        qd, qs, qr = quant[name]
        want = as_float(qd, qs, qr)
        if qd == "F8_E4M3":
            sd, ss, sr = quant[name + "_scale_inv"]
            scale = as_float(sd, ss, sr)
            br, bc = -(-shape[0] // ss[0]), -(-shape[1] // ss[1])
            block = np.repeat(np.repeat(scale, br, axis=0), bc, axis=1)[:shape[0], :shape[1]]
            want = (want * block).astype(np.float32)
        if want.shape != value.shape or not np.array_equal(want.view(np.uint32), value.view(np.uint32)):
            bad.append(f"{name}: max |diff| {np.abs(want - value).max() if want.shape == value.shape else 'shape'}")
        checked += 1
    if bad:
        print("FAILED: " + "; ".join(bad[:5]))
        return 1
    print(f"OK: {checked} tensors equal their dequantized FP8 or bf16 values bit for bit")
    return 0


def same(a, b):
    ca, cb = (json.load(open(os.path.join(d, "config.json"))) for d in (a, b))
    if ca != cb:
        keys = sorted(k for k in set(ca) | set(cb) if ca.get(k) != cb.get(k))
        print(f"FAILED: config.json differs in {keys}: {[ (ca.get(k), cb.get(k)) for k in keys]}")
        return 1
    ta, tb = (read(os.path.join(d, "model.safetensors")) for d in (a, b))
    if list(ta) != list(tb):
        print(f"FAILED: tensor names or order differ ({len(ta)} against {len(tb)})")
        return 1
    diff = [n for n in ta if ta[n] != tb[n]]
    if diff:
        print(f"FAILED: {len(diff)} tensors differ, first {diff[0]}")
        return 1
    print(f"OK: config.json and {len(ta)} tensors identical (dtype, shape, bytes)")
    return 0


def edit(directory, pairs):
    path = os.path.join(directory, "config.json")
    config = json.load(open(path))
    for pair in pairs:
        key, value = pair.split("=", 1)
        if value == "":
            config.pop(key, None)
        else:
            config[key] = json.loads(value)
    json.dump(config, open(path, "w"), indent=2)


def add_head(directory, how):
    path = os.path.join(directory, "model.safetensors")
    tensors = read(path)
    dtype, shape, raw = tensors["model.embed_tokens.weight"]
    if how == "other":
        values = np.frombuffer(raw, dtype=DTYPES[dtype]).copy()
        values[-1] += 1
        raw = values.tobytes()
    write(path, [(n, d, sh, r) for n, (d, sh, r) in tensors.items()] + [("lm_head.weight", dtype, shape, raw)])


def main(argv):
    if argv[:1] == ["same"] and len(argv) == 3:
        return same(argv[1], argv[2])
    if argv[:1] == ["fp8"] and len(argv) == 5:
        return fp8(argv[1], argv[2], int(argv[3]), int(argv[4])) or 0
    if argv[:1] == ["dequantized"] and len(argv) == 3:
        return dequantized(argv[1], argv[2])
    if argv[:1] == ["add-head"] and len(argv) == 3 and argv[2] in ("same", "other"):
        return add_head(argv[1], argv[2]) or 0
    if argv[:1] == ["edit"] and len(argv) >= 3:
        return edit(argv[1], argv[2:]) or 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
