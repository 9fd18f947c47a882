// Elementwise ops with numpy broadcasting. OP (binary) or UOP (unary) and ACT select the
// arithmetic at build time (-D), so each variant is a straight-line kernel.
// Broadcasting: out index -> per-dimension coordinates -> operand offsets, with stride 0
// along the dimensions an operand broadcasts.

#define MAX_RANK 8

inline float activate(float x) {
    return fused_activation(x, ACT);
}

inline float binary_op(float x, float y) {
#if OP == 0
    return x + y;
#elif OP == 1
    return x - y;
#elif OP == 2
    return x * y;
#elif OP == 3
    return x / y;
#elif OP == 4
    return fmax(x, y);
#elif OP == 5
    return fmin(x, y);
#elif OP == 7
    return x >= 0.0f ? x : y * x;  // prelu: y the slope
#elif OP == 8
    return (y < (LOW) || y > (HIGH)) ? 0.0f : x;  // clip_grad: x the gradient, y clip's input
#elif OP == 9
    return y > 0.0f ? x : 0.0f;  // relu_grad: x the gradient, y relu's input
#else
    return pow(x, y);
#endif
}

inline float unary_op(float x) {
#if UOP == 0
    return -x;
#elif UOP == 1
    return fabs(x);
#elif UOP == 2
    return exp(x);
#elif UOP == 3
    return log(x);
#elif UOP == 4
    return sqrt(x);
#elif UOP == 5
    return fmax(x, 0.0f);
#elif UOP == 6
    return 1.0f / (1.0f + exp(-x));
#elif UOP == 8
    return x / (1.0f + exp(-(ALPHA) * x));  // swish: x * sigmoid(ALPHA x)
#else
    return tanh(x);
#endif
}

__kernel void binary_same(__global const store_t* a, __global const store_t* b, __global store_t* out,
                          const int n) {
    int i = get_global_id(0);
    if (i < n) STORE(out, i, activate(binary_op(LOAD(a, i), LOAD(b, i))));
}

__kernel void binary_broadcast(__global const store_t* a, __global const store_t* b, __global store_t* out,
                               const int n, const int rank, __constant int* dims,
                               __constant int* stride_a, __constant int* stride_b) {
    int i = get_global_id(0);
    if (i >= n) return;
    int ia, ib;
    broadcast_offsets(i, rank, dims, stride_a, stride_b, &ia, &ib);
    STORE(out, i, activate(binary_op(LOAD(a, ia), LOAD(b, ib))));
}

__kernel void unary(__global const store_t* a, __global store_t* out, const int n) {
    int i = get_global_id(0);
    if (i < n) STORE(out, i, unary_op(LOAD(a, i)));
}
