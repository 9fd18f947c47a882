// Normalizing functions, reductions and data movement (launched through layout.py from the
// modules of their ops: nn.py, norm.py, reduce.py, array.py, math.py).
//
// Shapes arrive as a geometry table `geo` of GEO_SETS rows of MAX_RANK ints:
//   row 0: dims of the index space a work-item (or work-group) walks,
//   rows 1..: element strides into each operand for those dims (0 where it broadcasts).
// Row ops (softmax, layer_norm, reductions) run one work-group per output row over two
// tables: `kept` (which row) and `red` (which element of the row). layout.py merges
// adjacent dims first, so the common cases walk rank 1 or 2.
// Data movement copies elements as WORD (-D, layout.py picks it by the element size: uint
// for float32 and int32, ushort for fp16 mode's half-stored floats).

#define MAX_RANK 8

inline int offset_of(int i, const int rank, __constant const int* dims, __constant const int* strides) {
    int off = 0;
    for (int d = rank - 1; d >= 0; --d) {
        off += (i % dims[d]) * strides[d];
        i /= dims[d];
    }
    return off;
}

// Tree reduction of one value per work-item over the work-group (size a power of 2).
#define OP_SUM 0
#define OP_MAX 1
inline float group_reduce(float v, const int op, __local float* scratch) {
    const int lid = get_local_id(0);
    scratch[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = get_local_size(0) / 2; h > 0; h /= 2) {
        if (lid < h) {
            const float o = scratch[lid + h];
            scratch[lid] = op == OP_SUM ? scratch[lid] + o : ((o > scratch[lid] || isnan(o)) ? o : scratch[lid]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float r = scratch[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

// mode 0: sum, 1: mean, 2: max.
__kernel void reduce_rows(__global const store_t* x, __global store_t* out, const int R,
                          const int kr, __constant const int* kept, const int rr, __constant const int* red,
                          const int mode, __local float* scratch) {
    const int row = get_group_id(0);
    const __global store_t* base = x + offset_of(row, kr, kept, kept + MAX_RANK);
    float acc = mode == 2 ? -INFINITY : 0.0f;
    for (int r = get_local_id(0); r < R; r += get_local_size(0)) {
        const float v = LOAD(base, offset_of(r, rr, red, red + MAX_RANK));
        acc = mode == 2 ? ((v > acc || isnan(v)) ? v : acc) : acc + v;
    }
    acc = group_reduce(acc, mode == 2 ? OP_MAX : OP_SUM, scratch);
    if (get_local_id(0) == 0) STORE(out, row, mode == 1 ? acc / R : acc);
}

// log_mode 0: softmax, 1: log_softmax; max subtracted first, so exp never overflows.
__kernel void softmax_rows(__global const store_t* x, __global store_t* out, const int R,
                           const int kr, __constant const int* kept, const int rr, __constant const int* red,
                           const int log_mode, __local float* scratch) {
    const int row_off = offset_of(get_group_id(0), kr, kept, kept + MAX_RANK);
    x += row_off;
    out += row_off;
    const int lid = get_local_id(0), step = get_local_size(0);
    float m = -INFINITY;
    for (int r = lid; r < R; r += step) m = fmax(m, LOAD(x, offset_of(r, rr, red, red + MAX_RANK)));
    m = group_reduce(m, OP_MAX, scratch);
    float s = 0.0f;
    for (int r = lid; r < R; r += step) s += exp(LOAD(x, offset_of(r, rr, red, red + MAX_RANK)) - m);
    s = group_reduce(s, OP_SUM, scratch);
    const float shift = log(s), scale = 1.0f / s;
    for (int r = lid; r < R; r += step) {
        const int o = offset_of(r, rr, red, red + MAX_RANK);
        const float v = LOAD(x, o) - m;
        STORE(out, o, log_mode ? v - shift : exp(v) * scale);
    }
}

// red rows: dims, x strides, scale strides, bias strides.
__kernel void layer_norm_rows(__global const store_t* x, __global const store_t* scale, __global const store_t* bias,
                              __global store_t* out, const int R, const int kr, __constant const int* kept,
                              const int rr, __constant const int* red, const int has_bias, const float eps,
                              __local float* scratch) {
    const int row_off = offset_of(get_group_id(0), kr, kept, kept + MAX_RANK);
    x += row_off;
    out += row_off;
    const int lid = get_local_id(0), step = get_local_size(0);
    float s = 0.0f;
    for (int r = lid; r < R; r += step) s += LOAD(x, offset_of(r, rr, red, red + MAX_RANK));
    const float mean = group_reduce(s, OP_SUM, scratch) / R;
    float q = 0.0f;
    for (int r = lid; r < R; r += step) {
        const float d = LOAD(x, offset_of(r, rr, red, red + MAX_RANK)) - mean;
        q += d * d;
    }
    const float inv = 1.0f / sqrt(group_reduce(q, OP_SUM, scratch) / R + eps);
    for (int r = lid; r < R; r += step) {
        const int o = offset_of(r, rr, red, red + MAX_RANK);
        float v = (LOAD(x, o) - mean) * inv * LOAD(scale, offset_of(r, rr, red, red + 2 * MAX_RANK));
        if (has_bias) v += LOAD(bias, offset_of(r, rr, red, red + 3 * MAX_RANK));
        STORE(out, o, v);
    }
}

// Data movement works on whole elements (WORD): floats and int32 alike.
// geo rows: out dims, source strides. transpose and slice.
__kernel void gather_strided(__global const WORD* x, __global WORD* out, const int n, const int base,
                             const int rank, __constant const int* geo) {
    const int i = get_global_id(0);
    if (i < n) out[i] = x[base + offset_of(i, rank, geo, geo + MAX_RANK)];
}

// A (rows, cols) block into out, rows `pitch` apart, starting at `at` (concat).
__kernel void copy_block(__global const WORD* x, __global WORD* out, const int rows, const int cols,
                         const int pitch, const int at) {
    const int i = get_global_id(0);
    if (i < rows * cols) out[at + (i / cols) * pitch + i % cols] = x[i];
}

// params viewed as (outer, n, inner), out as (outer, count, inner). An index outside
// [-n, n) yields `fill` (NaN for floats): the device cannot raise as numpy does.
#define GATHER(NAME, INDEX)                                                                          \
__kernel void NAME(__global const WORD* params, __global const INDEX* indices, __global WORD* out,   \
                   const int total, const int n, const int count, const int inner, const WORD fill) { \
    const int i = get_global_id(0);                                                                  \
    if (i >= total) return;                                                                          \
    const int k = i % inner, j = (i / inner) % count, o = i / (inner * count);                       \
    long idx = indices[j];                                                                           \
    if (idx < 0) idx += n;                                                                           \
    out[i] = (idx >= 0 && idx < n) ? params[((long)o * n + idx) * inner + k] : fill;                \
}
GATHER(gather_i32, int)
GATHER(gather_i64, long)

// geo rows: out dims, cond strides, x strides, y strides.
__kernel void where_select(__global const uchar* cond, __global const WORD* x, __global const WORD* y,
                           __global WORD* out, const int n, const int rank, __constant const int* geo) {
    const int i = get_global_id(0);
    if (i >= n) return;
    out[i] = cond[offset_of(i, rank, geo, geo + MAX_RANK)] ? x[offset_of(i, rank, geo, geo + 2 * MAX_RANK)]
                                                           : y[offset_of(i, rank, geo, geo + 3 * MAX_RANK)];
}

__kernel void cast_to_int(__global const store_t* x, __global int* out, const int n) {
    const int i = get_global_id(0);
    if (i < n) out[i] = (int)LOAD(x, i);  // truncates toward zero, as numpy's unsafe cast
}

__kernel void cast_to_float(__global const int* x, __global store_t* out, const int n) {
    const int i = get_global_id(0);
    if (i < n) STORE(out, i, (float)x[i]);
}

// bool (one byte, 0 or 1) to float: the masks of gradient graphs (ties, one-hot labels).
__kernel void bool_to_float(__global const uchar* x, __global store_t* out, const int n) {
    const int i = get_global_id(0);
    if (i < n) STORE(out, i, x[i] ? 1.0f : 0.0f);
}
