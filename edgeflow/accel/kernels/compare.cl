// equal, less and greater with numpy broadcasting (broadcast_offsets, in common.cl):
// T is the operands' type (float, int or uchar for bool), OP the comparison (0 equal,
// 1 less, 2 greater); out is bool as uchar.

__kernel void compare(__global const T* a, __global const T* b, __global uchar* out, const int n,
                      const int rank, __constant const int* dims, __constant const int* stride_a,
                      __constant const int* stride_b) {
    int i = get_global_id(0);
    if (i >= n) return;
    int ia, ib;
    broadcast_offsets(i, rank, dims, stride_a, stride_b, &ia, &ib);
#if OP == 0
    out[i] = a[ia] == b[ib];
#elif OP == 1
    out[i] = a[ia] < b[ib];
#else
    out[i] = a[ia] > b[ib];
#endif
}
