"""OpenCL C sources of the tensor (data movement) algorithms, generated per rank.

Moving data never looks at the values, so the kernels move *bits*: the element type ``T`` is
the unsigned integer of the dtype's width (``uchar``, ``ushort``, ``uint``, ``ulong``), chosen
with ``-DT=...``.  One program then serves bool, every integer and every float type of that
width, and float64 data needs no ``cl_khr_fp64`` (a pad value travels as its bit pattern).

Geometry travels as kernel arguments (sizes and element strides per axis), so one program
serves every problem of a rank and width.  The rank is compile-time (the sources below are
generated for it) so that the index arithmetic unrolls into a fixed number of div/mod steps;
the algorithms first merge axes that are contiguous in both source and destination, so most
copies run at rank 1 to 3 whatever the tensor's rank.  Indices are ``long``: tensors past
2**31 elements are common enough on GPUs.
"""

from __future__ import annotations

#: The largest (merged) rank the kernels are generated for.
MAX_RANK = 8

#: OpenCL unsigned integer type moving one element of each width in bytes.
BIT_TYPES = {1: "uchar", 2: "ushort", 4: "uint", 8: "ulong"}


def _decompose(rank: int, extra: str) -> str:
    """Code walking the flat id over axes ``rank-1 .. 0`` (the last axis varies fastest),
    setting ``c`` to each coordinate and running ``extra`` (which reads ``c`` and ``k``)."""
    lines = ["    long rem = gid;", "    long c;"]
    for k in range(rank - 1, -1, -1):
        if k:
            lines.append(f"    c = rem % n{k}; rem /= n{k};")
        else:
            lines.append("    c = rem;")
        lines.append("    " + extra.replace("{k}", str(k)))
    return "\n".join(lines)


def _args(rank: int, *names: str) -> str:
    return ", ".join(f"const long {name}{k}" for name in names for k in range(rank))


def strided_copy(rank: int) -> str:
    """``dst[dst_base + sum c_k * d_k] = src[src_base + sum c_k * s_k]`` over an iteration
    space of sizes ``n_k``: transpose (source strides permuted), slice (source base at the
    starts, strides times the steps) and each input's block of a concat (destination base at
    its offset along the axis)."""
    return rf"""
__kernel void strided_copy(__global T* dst, const long dst_base,
                           __global const T* src, const long src_base,
                           {_args(rank, "n", "d", "s")}) {{
    const long gid = get_global_id(0);
    long di = dst_base, si = src_base;
{_decompose(rank, "di += c * d{k}; si += c * s{k};")}
    dst[di] = src[si];
}}
"""


def where(rank: int) -> str:
    """``dst[gid] = cond[ci] ? x[xi] : y[yi]`` over the (contiguous) output's iteration space,
    each operand read through its own strides, 0 where it is broadcast; ``cond`` is bool, one
    byte per element."""
    return rf"""
__kernel void where(__global T* dst, __global const uchar* cond, const long c_base,
                    __global const T* x, const long x_base, __global const T* y,
                    const long y_base, {_args(rank, "n", "a", "b", "e")}) {{
    const long gid = get_global_id(0);
    long ci = c_base, xi = x_base, yi = y_base;
{_decompose(rank, "ci += c * a{k}; xi += c * b{k}; yi += c * e{k};")}
    dst[gid] = cond[ci] ? x[xi] : y[yi];
}}
"""


def pad(rank: int) -> str:
    """One output element of a pad per work-item, written contiguously.

    Per axis: ``n`` the output size, ``b`` the positive begin pad, ``m`` the length of the
    kept (cropped) input, ``s`` its element stride.  ``j = c - b`` is the position in the kept
    input; outside [0, m) MODE decides: 0 constant (``value``), 1 reflect (mirror about the
    first and last element, period 2 (m - 1)), 2 edge (clamp), 3 wrap (modulo m).  ``src_base``
    already points at the first kept element (negative pads crop there)."""
    per_axis = ("j = c - b{k};"
                " if (j < 0 || j >= m{k}) {"
                " if (MODE == 0) { inside = 0; }"
                " else if (MODE == 2) { j = j < 0 ? 0 : m{k} - 1; }"
                " else if (MODE == 3) { j %= m{k}; if (j < 0) j += m{k}; }"
                " else { long p = 2 * (m{k} - 1);"
                " if (p == 0) { j = 0; } else { j %= p; if (j < 0) j += p;"
                " if (j >= m{k}) j = p - j; } } }"
                " si += j * s{k};")
    return rf"""
__kernel void pad(__global T* dst, __global const T* src, const long src_base, const T value,
                  {_args(rank, "n", "b", "m", "s")}) {{
    const long gid = get_global_id(0);
    long si = src_base, j;
    int inside = 1;
{_decompose(rank, per_axis)}
    dst[gid] = inside ? src[si] : value;
}}
"""


#: Gather over data seen as (outer, n, inner) and indices flattened to ``count``: output
#: element (o, i, r) is data (o, idx[i], r), a negative index counting from the end.  An
#: index still outside [0, n) writes zero bits (the kernel cannot raise; see the algorithm).
GATHER = r"""
__kernel void gather(__global T* dst, __global const T* src, const long src_base,
                     __global const IDX* idx, const long idx_base,
                     const long n, const long inner, const long count) {
    const long gid = get_global_id(0);
    const long r = gid % inner;
    const long rest = gid / inner;
    const long i = rest % count;
    const long o = rest / count;
    long k = (long)idx[idx_base + i];
    if (k < 0) k += n;
    dst[gid] = (k >= 0 && k < n) ? src[src_base + (o * n + k) * inner + r] : (T)0;
}
"""
