// equal, less, greater, less_equal and greater_equal with numpy broadcasting (broadcast_offsets, in common.cl):
// FLOAT=1 for float operands (read through LOAD, so half storage works too), else T is
// the operands' type (int, or uchar for bool); OP the comparison (0 equal, 1 less,
// 2 greater, 3 less or equal, 4 greater or equal); out is bool as uchar.

#if FLOAT
#define OPERAND store_t
#define READ(p, i) LOAD(p, i)
#else
#define OPERAND T
#define READ(p, i) ((p)[i])
#endif

__kernel void compare(__global const OPERAND* a, __global const OPERAND* b, __global uchar* out, const int n,
                      const int rank, __constant const int* dims, __constant const int* stride_a,
                      __constant const int* stride_b) {
    int i = get_global_id(0);
    if (i >= n) return;
    int ia, ib;
    broadcast_offsets(i, rank, dims, stride_a, stride_b, &ia, &ib);
#if OP == 0
    out[i] = READ(a, ia) == READ(b, ib);
#elif OP == 1
    out[i] = READ(a, ia) < READ(b, ib);
#elif OP == 2
    out[i] = READ(a, ia) > READ(b, ib);
#elif OP == 3
    out[i] = READ(a, ia) <= READ(b, ib);
#else
    out[i] = READ(a, ia) >= READ(b, ib);
#endif
}
