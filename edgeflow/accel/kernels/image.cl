// pad, any mode, any rank up to 8: `source` holds, per axis (concatenated, axis d from
// offsets[d]), the input index each output index copies, or -1 where `value` goes. The
// host builds those tables once, so constant, reflect and edge are one kernel.

__kernel void pad(__global const store_t* x, __global store_t* out, const int total, const int rank,
                  __constant const int* out_dims, __constant const int* in_strides,
                  __constant const int* offsets, __global const int* source, const float value) {
    int gid = get_global_id(0);
    if (gid >= total) return;
    int rest = gid;
    size_t at = 0;
    for (int d = rank - 1; d >= 0; --d) {
        const int k = rest % out_dims[d];
        rest /= out_dims[d];
        const int s = source[offsets[d] + k];
        if (s < 0) {
            STORE(out, gid, value);
            return;
        }
        at += (size_t)s * in_strides[d];
    }
    STORE(out, gid, LOAD(x, at));
}
