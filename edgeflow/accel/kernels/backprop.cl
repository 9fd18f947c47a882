// Gradient ops (sum_to, slice_grad, gather_grad, pooling and conv gradients; launched from
// reduce.py, array.py, pool.py and conv.py): one work-item per output element, each
// gathering what reaches it (no float atomics, so every sum is in a fixed order).

#define MAX_RANK 8

// sum_to: out element -> grad offset over the kept dims, then a walk over the reduced dims.
// table rows (MAX_RANK ints each): kept dims, kept grad strides, reduced dims, reduced grad strides
__kernel void sum_to(__global const store_t* grad, __global store_t* out, __constant const int* table,
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
        s += LOAD(grad, offset);
    }
    STORE(out, gid, s);
}

// slice_grad: per axis of out, the slice's first index, step and length, and grad's stride.
// table rows: out dims, first, step, count, grad strides
__kernel void slice_grad(__global const store_t* grad, __global store_t* out, __constant const int* table,
                         const int total, const int rank) {
    int gid = get_global_id(0);
    if (gid >= total) return;
    int rest = gid, offset = 0;
    for (int d = rank - 1; d >= 0; --d) {
        const int i = rest % table[d], step = table[2 * MAX_RANK + d];
        rest /= table[d];
        const int from = i - table[MAX_RANK + d], k = from / step;
        if (from % step != 0 || k < 0 || k >= table[3 * MAX_RANK + d]) {
            STORE(out, gid, 0.0f);
            return;
        }
        offset += k * table[4 * MAX_RANK + d];
    }
    STORE(out, gid, LOAD(grad, offset));
}

// gather_grad over (outer, n, inner): out[o, j, i] = sum over k with indices[k] mod n == j
// of grad[o, k, i], k in index order.
__kernel void gather_grad(__global const store_t* grad, __global const INDEX* indices, __global store_t* out,
                          const int total, const int n, const int count, const int inner) {
    int gid = get_global_id(0);
    if (gid >= total) return;
    const int i = gid % inner, j = (gid / inner) % n, o = gid / (inner * n);
    __global const store_t* g = grad + (size_t)o * count * inner + i;
    float s = 0.0f;
    for (int k = 0; k < count; ++k) {
        const INDEX t = indices[k] % n;
        if ((t < 0 ? t + n : t) == j) s += LOAD(g, (size_t)k * inner);
    }
    STORE(out, gid, s);
}

// geometry as pool.cl's: H, W, OH, OW, KH, KW, stride h, w, dilation h, w, pad begin h, w, pad end h, w
#define GEOMETRY                                                                              \
    const int H = geo[0], W = geo[1], OH = geo[2], OW = geo[3], KH = geo[4], KW = geo[5];      \
    const int sh = geo[6], sw = geo[7], dh = geo[8], dw = geo[9], ph = geo[10], pw = geo[11];  \
    const int iw = gid % W, ih = (gid / W) % H, plane = gid / (W * H);

// The tap (kh * KW + kw) a max_pool window routes its gradient to: the first maximum in
// kernel order, taps in the padding reading -inf; -1 where the window holds a NaN.
inline int winner(__global const store_t* xc, int H, int W, int KH, int KW, int ih0, int iw0, int dh, int dw) {
    float m = -INFINITY;
    int best = 0;
    for (int kh = 0; kh < KH; ++kh) {
        const int ih = ih0 + kh * dh;
        for (int kw = 0; kw < KW; ++kw) {
            const int iw = iw0 + kw * dw;
            const float v = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? LOAD(xc, ih * W + iw) : -INFINITY;
            if (isnan(v)) return -1;
            if (v > m) { m = v; best = kh * KW + kw; }
        }
    }
    return best;
}

// One work-item per element of x: the windows holding it, each adding its dy where it wins.
__kernel void max_pool_grad(__global const store_t* x, __global const store_t* dy, __global store_t* dx,
                            __constant const int* geo, const int total) {
    int gid = get_global_id(0);
    if (gid >= total) return;
    GEOMETRY
    __global const store_t* xc = x + (size_t)plane * H * W;
    __global const store_t* dyc = dy + (size_t)plane * OH * OW;
    float s = 0.0f;
    for (int kh = 0; kh < KH; ++kh) {
        const int h = ih + ph - kh * dh;
        if (h < 0 || h % sh || h / sh >= OH) continue;
        for (int kw = 0; kw < KW; ++kw) {
            const int w = iw + pw - kw * dw;
            if (w < 0 || w % sw || w / sw >= OW) continue;
            const int oh = h / sh, ow = w / sw;
            if (winner(xc, H, W, KH, KW, oh * sh - ph, ow * sw - pw, dh, dw) == kh * KW + kw)
                s += LOAD(dyc, oh * OW + ow);
        }
    }
    STORE(dx, gid, s);
}

// One work-item per element of x: each window holding it gives dy / its count (as avg_pool divides).
__kernel void avg_pool_grad(__global const store_t* dy, __global store_t* dx, __constant const int* geo,
                            const int total, const int count_include_pad) {
    int gid = get_global_id(0);
    if (gid >= total) return;
    GEOMETRY
    __global const store_t* dyc = dy + (size_t)plane * OH * OW;
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
            s += LOAD(dyc, (h / sh) * OW + w / sw) * (1.0f / (float)count);
        }
    }
    STORE(dx, gid, s);
}

// conv geometry as conv.cl's: C, H, W, M, OH, OW, KH, KW, stride h, w, dilation h, w,
// pad h, w (begin), groups. 2-D NCHW; w is (M, C / groups, KH, KW).
#define CONV_GEOMETRY                                                                           \
    const int C = geo[0], H = geo[1], W = geo[2], M = geo[3], OH = geo[4], OW = geo[5];          \
    const int KH = geo[6], KW = geo[7], sh = geo[8], sw = geo[9], dh = geo[10], dw = geo[11];    \
    const int ph = geo[12], pw = geo[13], G = geo[14], cpg = C / G, mpg = M / G;

// One work-item per element of dx: the filters of its group and the output positions whose
// windows read it, summed in (m, kh, kw) order.
__kernel void conv_input_grad(__global const store_t* dy, __global const store_t* w, __global store_t* dx,
                              __constant const int* geo, const int total) {
    int gid = get_global_id(0);
    if (gid >= total) return;
    CONV_GEOMETRY
    const int iw = gid % W, ih = (gid / W) % H, c = (gid / (W * H)) % C, n = gid / (W * H * C);
    const int g = c / cpg, ci = c % cpg;
    float s = 0.0f;
    for (int m = g * mpg; m < (g + 1) * mpg; ++m) {
        __global const store_t* dym = dy + ((size_t)n * M + m) * OH * OW;
        __global const store_t* wm = w + ((size_t)m * cpg + ci) * KH * KW;
        for (int kh = 0; kh < KH; ++kh) {
            const int h = ih + ph - kh * dh;
            if (h < 0 || h % sh || h / sh >= OH) continue;
            for (int kw = 0; kw < KW; ++kw) {
                const int x = iw + pw - kw * dw;
                if (x < 0 || x % sw || x / sw >= OW) continue;
                s = fma(LOAD(dym, (h / sh) * OW + x / sw), LOAD(wm, kh * KW + kw), s);
            }
        }
    }
    STORE(dx, gid, s);
}

// One work-item per element of dw: x under that tap times dy, summed over the batch and
// the output positions in (n, oh, ow) order.
__kernel void conv_filter_grad(__global const store_t* x, __global const store_t* dy, __global store_t* dw_,
                               __constant const int* geo, const int total, const int N) {
    int gid = get_global_id(0);
    if (gid >= total) return;
    CONV_GEOMETRY
    const int kw = gid % KW, kh = (gid / KW) % KH, ci = (gid / (KW * KH)) % cpg, m = gid / (KW * KH * cpg);
    const int c = (m / mpg) * cpg + ci;
    // output rows/cols whose tap stays inside x: oh * sh - ph + kh * dh in [0, H)
    float s = 0.0f;
    for (int n = 0; n < N; ++n) {
        __global const store_t* xc = x + ((size_t)n * C + c) * H * W;
        __global const store_t* dym = dy + ((size_t)n * M + m) * OH * OW;
        for (int oh = 0; oh < OH; ++oh) {
            const int ih = oh * sh - ph + kh * dh;
            if (ih < 0 || ih >= H) continue;
            for (int ow = 0; ow < OW; ++ow) {
                const int iw = ow * sw - pw + kw * dw;
                if (iw < 0 || iw >= W) continue;
                s = fma(LOAD(xc, ih * W + iw), LOAD(dym, oh * OW + ow), s);
            }
        }
    }
    STORE(dw_, gid, s);
}
