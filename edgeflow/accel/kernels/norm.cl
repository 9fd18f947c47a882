// batch_norm in inference form, as the numpy kernel computes it: x * a + (bias - mean * a)
// with a = scale / sqrt(var + eps). Work-items: (element within a channel plane, n * C + c).

__kernel void batch_norm(__global const float* x, __global const float* scale, __global const float* bias,
                         __global const float* mean, __global const float* var, __global float* out,
                         const int inner, const int C, const float eps) {
    const int i = get_global_id(0), plane = get_global_id(1), c = plane % C;
    if (i >= inner) return;
    const float a = scale[c] / sqrt(var[c] + eps);
    const size_t k = (size_t)plane * inner + i;
    out[k] = x[k] * a + (bias[c] - mean[c] * a);
}
