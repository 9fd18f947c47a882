// equal, less and greater with numpy broadcasting (as elementwise.cl's binary_broadcast):
// T is the operands' type (float, int or uchar for bool), OP the comparison (0 equal,
// 1 less, 2 greater); out is bool as uchar.

__kernel void compare(__global const T* a, __global const T* b, __global uchar* out, const int n,
                      const int rank, __constant const int* dims, __constant const int* stride_a,
                      __constant const int* stride_b) {
    int i = get_global_id(0);
    if (i >= n) return;
    int rest = i, ia = 0, ib = 0;
    for (int d = rank - 1; d >= 0; --d) {
        int k = rest % dims[d];
        rest /= dims[d];
        ia += k * stride_a[d];
        ib += k * stride_b[d];
    }
#if OP == 0
    out[i] = a[ia] == b[ib];
#elif OP == 1
    out[i] = a[ia] < b[ib];
#else
    out[i] = a[ia] > b[ib];
#endif
}
