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

from fastrun_algorithms._opencl_common import ANY_TYPE_PRELUDE

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


def gather_elements(rank: int) -> str:
    """``dst[gid] = src[...]`` at the output's coordinates with the axis' one replaced by the
    index (negative ones from the end): ``s_k`` are data's strides over the indices' shape
    with the axis' set to 0, ``axis_stride`` the axis' own; an index outside [-len, len)
    yields zero bits (the kernel cannot raise)."""
    return rf"""
__kernel void gather_elements(__global T* dst, __global const T* src, const long src_base,
                              __global const IDX* idx, const long idx_base,
                              const long len, const long axis_stride,
                              {_args(rank, "n", "s")}) {{
    const long gid = get_global_id(0);
    long si = src_base;
{_decompose(rank, "si += c * s{k};")}
    long k = (long)idx[idx_base + gid];
    if (k < 0) k += len;
    dst[gid] = (k >= 0 && k < len) ? src[si + k * axis_stride] : (T)0;
}}
"""


#: ScatterND on a copy of data: work-item e updates element e of every index row's block, the
#: rows in order (so a repeated row keeps ONNX's sequential result without atomics).  R is
#: the element's OpenCL type (``ANY_TYPE_PRELUDE``), IDX the indices' type, RED the reduction
#: (0 none, 1 add, 2 mul, 3 max, 4 min; max and min let NaN win, as numpy's maximum does);
#: a row outside data is skipped (the kernel cannot raise).  ``geo`` holds data's first q
#: sizes, then their (element) strides.
SCATTER_ND = ANY_TYPE_PRELUDE + r"""
__kernel void scatter_nd(__global R* out, __global const IDX* rows, const long rows_base,
                         const long q, __global const long* geo,
                         __global const R* upd, const long upd_base, const long count,
                         const long block) {
    const long e = get_global_id(0);
    if (e >= block) return;
    for (long r = 0; r < count; ++r) {
        long at = 0;
        int inside = 1;
        for (long j = 0; j < q; ++j) {
            long i = (long)rows[rows_base + r * q + j];
            if (i < 0) i += geo[j];
            if (i < 0 || i >= geo[j]) inside = 0;
            at += i * geo[q + j];
        }
        if (!inside) continue;
        const R u = upd[upd_base + r * block + e];
        const R o = out[at + e];
#if RED == 0
        out[at + e] = u;
#elif RED == 1
        out[at + e] = o + u;
#elif RED == 2
        out[at + e] = o * u;
#elif RED == 3
        out[at + e] = IS_NAN(o) ? o : (IS_NAN(u) ? u : (o > u ? o : u));
#else
        out[at + e] = IS_NAN(o) ? o : (IS_NAN(u) ? u : (o < u ? o : u));
#endif
    }
}
"""
