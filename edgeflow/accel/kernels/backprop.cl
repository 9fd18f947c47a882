// Gradient ops of edgeflow/ops/backprop.py: one work-item per output element, each
// gathering what reaches it (no float atomics, so every sum is in a fixed order).

#define MAX_RANK 8

// sum_to: out element -> grad offset over the kept dims, then a walk over the reduced dims.
// table rows (MAX_RANK ints each): kept dims, kept grad strides, reduced dims, reduced grad strides
__kernel void sum_to(__global const float* grad, __global float* out, __constant const int* table,
                     const int total, const int n_kept, const int n_reduced, const int count) {
    int gid = get_global_id(0);
    if (gid >= total) return;
    __constant const int *kdims = table, *kstrides = table + MAX_RANK;
    __constant const int *rdims = table + 2 * MAX_RANK, *rstrides = table + 3 * MAX_RANK;
    int rest = gid, base = 0;
    for (int d = n_kept - 1; d >= 0; --d) {
        base += (rest % kdims[d]) * kstrides[d];
        rest /= kdims[d];
    }
    float s = 0.0f;
    for (int r = 0; r < count; ++r) {
        int left = r, offset = base;
        for (int d = n_reduced - 1; d >= 0; --d) {
            offset += (left % rdims[d]) * rstrides[d];
            left /= rdims[d];
        }
        s += grad[offset];
    }
    out[gid] = s;
}

// slice_grad: per axis of out, the slice's first index, step and length, and grad's stride.
// table rows: out dims, first, step, count, grad strides
__kernel void slice_grad(__global const float* grad, __global float* out, __constant const int* table,
                         const int total, const int rank) {
    int gid = get_global_id(0);
    if (gid >= total) return;
    int rest = gid, offset = 0;
    for (int d = rank - 1; d >= 0; --d) {
        const int i = rest % table[d], step = table[2 * MAX_RANK + d];
        rest /= table[d];
        const int from = i - table[MAX_RANK + d], k = from / step;
        if (from % step != 0 || k < 0 || k >= table[3 * MAX_RANK + d]) {
            out[gid] = 0.0f;
            return;
        }
        offset += k * table[4 * MAX_RANK + d];
    }
    out[gid] = grad[offset];
}

// gather_grad over (outer, n, inner): out[o, j, i] = sum over k with indices[k] mod n == j
// of grad[o, k, i], k in index order.
__kernel void gather_grad(__global const float* grad, __global const INDEX* indices, __global float* out,
                          const int total, const int n, const int count, const int inner) {
    int gid = get_global_id(0);
    if (gid >= total) return;
    const int i = gid % inner, j = (gid / inner) % n, o = gid / (inner * n);
    __global const float* g = grad + (size_t)o * count * inner + i;
    float s = 0.0f;
    for (int k = 0; k < count; ++k) {
        const INDEX t = indices[k] % n;
        if ((t < 0 ? t + n : t) == j) s += g[(size_t)k * inner];
    }
    out[gid] = s;
}

// geometry as pool.cl's: H, W, OH, OW, KH, KW, stride h, w, dilation h, w, pad begin h, w, pad end h, w
#define GEOMETRY                                                                              \
    const int H = geo[0], W = geo[1], OH = geo[2], OW = geo[3], KH = geo[4], KW = geo[5];      \
    const int sh = geo[6], sw = geo[7], dh = geo[8], dw = geo[9], ph = geo[10], pw = geo[11];  \
    const int iw = gid % W, ih = (gid / W) % H, plane = gid / (W * H);

// The tap (kh * KW + kw) a max_pool window routes its gradient to: the first maximum in
// kernel order, taps in the padding reading -inf; -1 where the window holds a NaN.
inline int winner(__global const float* xc, int H, int W, int KH, int KW, int ih0, int iw0, int dh, int dw) {
    float m = -INFINITY;
    int best = 0;
    for (int kh = 0; kh < KH; ++kh) {
        const int ih = ih0 + kh * dh;
        for (int kw = 0; kw < KW; ++kw) {
            const int iw = iw0 + kw * dw;
            const float v = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? xc[ih * W + iw] : -INFINITY;
            if (isnan(v)) return -1;
            if (v > m) { m = v; best = kh * KW + kw; }
        }
    }
    return best;
}

// One work-item per element of x: the windows holding it, each adding its dy where it wins.
__kernel void max_pool_grad(__global const float* x, __global const float* dy, __global float* dx,
                            __constant const int* geo, const int total) {
    int gid = get_global_id(0);
    if (gid >= total) return;
    GEOMETRY
    __global const float* xc = x + (size_t)plane * H * W;
    __global const float* dyc = dy + (size_t)plane * OH * OW;
    float s = 0.0f;
    for (int kh = 0; kh < KH; ++kh) {
        const int h = ih + ph - kh * dh;
        if (h < 0 || h % sh || h / sh >= OH) continue;
        for (int kw = 0; kw < KW; ++kw) {
            const int w = iw + pw - kw * dw;
            if (w < 0 || w % sw || w / sw >= OW) continue;
            const int oh = h / sh, ow = w / sw;
            if (winner(xc, H, W, KH, KW, oh * sh - ph, ow * sw - pw, dh, dw) == kh * KW + kw)
                s += dyc[oh * OW + ow];
        }
    }
    dx[gid] = s;
}

// One work-item per element of x: each window holding it gives dy / its count (as avg_pool divides).
__kernel void avg_pool_grad(__global const float* dy, __global float* dx, __constant const int* geo,
                            const int total, const int count_include_pad) {
    int gid = get_global_id(0);
    if (gid >= total) return;
    GEOMETRY
    __global const float* dyc = dy + (size_t)plane * OH * OW;
    const int lh = count_include_pad ? -ph : 0, hh = count_include_pad ? H + geo[12] : H;
    const int lw = count_include_pad ? -pw : 0, hw = count_include_pad ? W + geo[13] : W;
    float s = 0.0f;
    for (int kh = 0; kh < KH; ++kh) {
        const int h = ih + ph - kh;
        if (h < 0 || h % sh || h / sh >= OH) continue;
        const int ih0 = (h / sh) * sh - ph;
        for (int kw = 0; kw < KW; ++kw) {
            const int w = iw + pw - kw;
            if (w < 0 || w % sw || w / sw >= OW) continue;
            const int iw0 = (w / sw) * sw - pw;
            const int count = (min(ih0 + KH, hh) - max(ih0, lh)) * (min(iw0 + KW, hw) - max(iw0, lw));
            s += dyc[(h / sh) * OW + w / sw] * (1.0f / (float)count);
        }
    }
    dx[gid] = s;
}
