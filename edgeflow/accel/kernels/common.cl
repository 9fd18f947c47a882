// Prepended to every program (Runtime.program): helpers several kernels share.

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
