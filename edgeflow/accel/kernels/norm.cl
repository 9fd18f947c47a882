// batch_norm in inference form, as the numpy kernel computes it: x * a + (bias - mean * a)
// with a = scale / sqrt(var + eps). Work-items: (element within a channel plane, n * C + c).

__kernel void batch_norm(__global const store_t* x, __global const store_t* scale, __global const store_t* bias,
                         __global const store_t* mean, __global const store_t* var, __global store_t* out,
                         const int inner, const int C, const float eps) {
    const int i = get_global_id(0), plane = get_global_id(1), c = plane % C;
    if (i >= inner) return;
    const float a = LOAD(scale, c) / sqrt(LOAD(var, c) + eps);
    const size_t k = (size_t)plane * inner + i;
    STORE(out, k, LOAD(x, k) * a + (LOAD(bias, c) - LOAD(mean, c) * a));
}
