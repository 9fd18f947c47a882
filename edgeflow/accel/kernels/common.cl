// Prepended to every program (Runtime.program): helpers several kernels share.

// Float tensors live in device buffers as `store_t` and are read and written only through
// these macros, so one kernel source serves both precisions. fp32 (the default): store_t
// is float and LOAD/STORE are plain indexing, the code the kernels had before. fp16
// (-DEF_HALF=1, OpenCLDelegate(precision="fp16")): half storage, converted to float on
// load and rounded to nearest even on store by vload_half/vstore_half, core OpenCL since
// 1.0 (no cl_khr_fp16 needed); arithmetic and accumulators stay float.
//   LOAD(p, i) -> float      STORE(p, i, v)        element i of p
//   LOADN(n)(i, p) -> floatn STOREN(n)(v, i, p)    elements n*i .. n*i+n-1 (vloadn/vstoren)
// Kernels that only move values copy them as `raw_t`, the storage's bits (no conversion).
#if EF_HALF
typedef half store_t;
typedef ushort raw_t;
#define LOAD(p, i) vload_half((i), (p))
#define STORE(p, i, v) vstore_half((v), (i), (p))
#define LOADN_(n) vload_half##n
#define STOREN_(n) vstore_half##n
#else
typedef float store_t;
typedef float raw_t;
#define LOAD(p, i) ((p)[i])
#define STORE(p, i, v) ((p)[i] = (v))
#define LOADN_(n) vload##n
#define STOREN_(n) vstore##n
#endif
#define LOADN(n) LOADN_(n)
#define STOREN(n) STOREN_(n)

// A fused activation (the `activation` attr of conv, matmul, add; elementwise.ACTIVATIONS):
// 0 none, 1 relu, 2 relu6, 3 swish x sigmoid(x), 4 hard_swish x min(max(x + 3, 0), 6) / 6.
// `act` is a constant where the kernel has one (-DACT), so the compiler keeps one branch.
inline float fused_activation(float v, int act) {
    if (act == 1) return fmax(v, 0.0f);
    if (act == 2) return clamp(v, 0.0f, 6.0f);
    if (act == 3) return v / (1.0f + exp(-v));
    if (act == 4) return v * clamp(v + 3.0f, 0.0f, 6.0f) / 6.0f;
    return v;
}

// Offsets into two operands read at output element i of a broadcast (numpy's rule): the
// output index split into coordinates, each weighted by the operand's stride along that
// dimension (0 where the operand broadcasts).
inline void broadcast_offsets(int i, const int rank, __constant const int* dims,
                              __constant const int* stride_a, __constant const int* stride_b,
                              int* ia, int* ib) {
    int rest = i, a = 0, b = 0;
    for (int d = rank - 1; d >= 0; --d) {
        int k = rest % dims[d];
        rest /= dims[d];
        a += k * stride_a[d];
        b += k * stride_b[d];
    }
    *ia = a;
    *ib = b;
}
