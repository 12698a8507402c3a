#!/usr/bin/env python3
"""Check a `ckpt export --to safetensors` file against `ckpt inspect --json` output.

Usage: check_export.py EXPORT.safetensors INSPECT.json [--with-optim]

Loads the export with the reference Python package (`safetensors.numpy.load_file`) and checks
that it holds exactly the model tensors (plus the optimizer's under `optim.` with
--with-optim) with the names, shapes, dtypes and leading values that `inspect` reported.
Exits 0 when everything matches, 1 with one line per mismatch otherwise.
"""

import json
import math
import sys

import numpy as np
from safetensors.numpy import load_file

DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8,
    "BOOL": np.bool_,
}


def expected(report, with_optim):
    out = {}
    for f in report["files"]:
        if f["file"] == "model.bpk":
            prefix = ""
        elif with_optim and f["file"].startswith("optim") and f["file"].endswith(".bpk"):
            prefix = "optim."
        else:
            continue
        for t in f["tensors"]:
            out[prefix + t["name"]] = t
    return out


def same(a, b):
    if b is None:  # JSON null stands for NaN or an infinity
        return not math.isfinite(a)
    return a == b or (math.isnan(a) and math.isnan(b))


def main(argv):
    if len(argv) < 3:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    with_optim = "--with-optim" in argv[3:]
    tensors = load_file(argv[1])
    with open(argv[2]) as f:
        want = expected(json.load(f), with_optim)
    problems = []
    if sorted(tensors) != sorted(want):
        problems.append(f"names differ: export {sorted(tensors)} vs inspect {sorted(want)}")
    for name, t in sorted(want.items()):
        if name not in tensors:
            continue
        arr = tensors[name]
        if list(arr.shape) != list(t["shape"]):
            problems.append(f"{name}: shape {list(arr.shape)} vs {t['shape']}")
        dt = DTYPES.get(t["dtype"])
        if dt is not None and arr.dtype != np.dtype(dt):
            problems.append(f"{name}: dtype {arr.dtype} vs {t['dtype']}")
        if t["dtype"] == "BF16":
            continue  # numpy has no bfloat16; the shape check above still applies
        got = [float(x) for x in arr.reshape(-1)[: len(t["leading"])]]
        if len(got) != len(t["leading"]) or not all(
            same(a, b) for a, b in zip(got, t["leading"])
        ):
            problems.append(f"{name}: leading values {got} vs {t['leading']}")
    for p in problems:
        print(p, file=sys.stderr)
    if not problems:
        print(f"ok: {len(want)} tensors match")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
