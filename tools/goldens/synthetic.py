"""Deterministic synthetic weights, bit for bit the same as crates/model/src/weights/synthetic.rs.

Every value is an 8-bit integer times a power of two (exact in bf16 and f32), drawn from
SplitMix64's output function over (seed, FNV-1a hash of the tensor name, element index). Keep this
file and synthetic.rs in step; tests/goldens' manifest carries a SHA-256 of every tensor, which the
Rust golden test recomputes, so any drift fails there.
"""

import numpy as np

GOLDEN_GAMMA = np.uint64(0x9E3779B97F4A7C15)
MASK64 = (1 << 64) - 1


def _mix(z):
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _name_hash(name):
    h = 0xCBF29CE484222325
    for b in name.encode("utf-8"):
        h = ((h ^ b) * 0x100000001B3) & MASK64
    return h


def _ceil_log2(n):
    return (max(n, 1) - 1).bit_length()


def kind_of(name):
    if name.endswith("norm.weight"):
        return "norm_weight"
    if name.endswith("norm.bias"):
        return "norm_bias"
    if name.endswith("e_score_correction_bias"):
        return "router_bias"
    return "matrix"


def synthetic_values(seed, name, shape):
    """float32 numpy array of `shape` (row-major), the same values as synthetic_values in Rust."""
    key = np.uint64(_name_hash(name) ^ ((seed * 0x9E3779B97F4A7C15) & MASK64))
    count = int(np.prod(shape)) if len(shape) else 1
    with np.errstate(over="ignore"):
        index = np.arange(1, count + 1, dtype=np.uint64)
        u = _mix(key + index * GOLDEN_GAMMA)
    byte = (u >> np.uint64(56)).astype(np.uint8).view(np.int8).astype(np.float32)
    kind = kind_of(name)
    cols = shape[-1] if len(shape) else 1
    if kind == "matrix":
        exponent = (_ceil_log2(cols) + 1) // 2 - 1
        values = byte * np.float32(2.0 ** (-7 - exponent))
    elif kind == "norm_weight":
        k = (u >> np.uint64(59)).astype(np.int32) - 16
        values = np.float32(1.0) + k.astype(np.float32) / np.float32(128.0)
    elif kind == "norm_bias":
        values = byte * np.float32(2.0**-11)
    else:
        values = byte * np.float32(2.0**-12)
    return values.astype(np.float32).reshape(shape)
