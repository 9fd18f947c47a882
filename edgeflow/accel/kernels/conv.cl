// 2-D convolution over NCHW (1-D arrives lifted to H = 1). One work-item computes a
// register tile: CO output channels of one group by PX neighbouring output pixels of one
// row, so each input value loaded serves CO products and each weight PX. Shapes and the
// window are kernel arguments, so one build serves every conv; only the tile is -D.
// The index is 1-D with the pixel tile fastest: neighbouring work-items read neighbouring
// input, which coalesces on GPUs and vectorizes across the work-group on CPUs.

#ifndef CO
#define CO 4
#endif
#ifndef PX
#define PX 4
#endif

#define activate fused_activation

// geometry: C, H, W, M, OH, OW, KH, KW, stride h, w, dilation h, w, pad h, w (begin), groups
__kernel void conv_direct(__global const store_t* x, __global const store_t* w, __global const store_t* bias,
                          __global store_t* out, __constant const int* geo, const int total,
                          const int has_bias, const int act) {
    int gid = get_global_id(0);
    if (gid >= total) return;
    const int C = geo[0], H = geo[1], W = geo[2], M = geo[3], OH = geo[4], OW = geo[5];
    const int KH = geo[6], KW = geo[7], sh = geo[8], sw = geo[9], dh = geo[10], dw = geo[11];
    const int ph = geo[12], pw = geo[13], G = geo[14];
    const int cpg = C / G, mpg = M / G, mtiles = (mpg + CO - 1) / CO, wtiles = (OW + PX - 1) / PX;
    const int ow0 = (gid % wtiles) * PX;
    int rest = gid / wtiles;
    const int oh = rest % OH;
    rest /= OH;
    const int mt = rest % mtiles;
    rest /= mtiles;
    const int g = rest % G, n = rest / G;
    const int m0 = g * mpg + mt * CO, mend = (g + 1) * mpg;

    float acc[CO][PX];
    for (int j = 0; j < CO; ++j)
        for (int p = 0; p < PX; ++p) acc[j][p] = 0.0f;
    const int ih0 = oh * sh - ph, iw0 = ow0 * sw - pw, taps = KH * KW;
    int wrow[CO];  // each channel's weights; channels past the group re-read the last one
    for (int j = 0; j < CO; ++j) wrow[j] = min(m0 + j, mend - 1) * cpg * taps;
    for (int ci = 0; ci < cpg; ++ci) {
        __global const store_t* xc = x + ((size_t)n * C + g * cpg + ci) * H * W;
        const int wc = ci * taps;
        for (int kh = 0; kh < KH; ++kh) {
            const int ih = ih0 + kh * dh;
            if (ih < 0 || ih >= H) continue;
            __global const store_t* row = xc + ih * W;
            for (int kw = 0; kw < KW; ++kw) {
                float xv[PX];
                for (int p = 0; p < PX; ++p) {
                    const int iw = iw0 + p * sw + kw * dw;
                    xv[p] = (iw >= 0 && iw < W) ? LOAD(row, iw) : 0.0f;
                }
                const int t = wc + kh * KW + kw;
                for (int j = 0; j < CO; ++j) {
                    const float wv = LOAD(w, wrow[j] + t);
                    for (int p = 0; p < PX; ++p) acc[j][p] = fma(wv, xv[p], acc[j][p]);
                }
            }
        }
    }
    for (int j = 0; j < CO && m0 + j < mend; ++j) {
        const float b = has_bias ? LOAD(bias, m0 + j) : 0.0f;
        __global store_t* o = out + (((size_t)n * M + m0 + j) * OH + oh) * OW;
        for (int p = 0; p < PX && ow0 + p < OW; ++p) STORE(o, ow0 + p, activate(acc[j][p] + b, act));
    }
}

// One channel per group (group == C): output channel m reads input channel m / (M / C).
__kernel void conv_depthwise(__global const store_t* x, __global const store_t* w, __global const store_t* bias,
                             __global store_t* out, __constant const int* geo, const int total,
                             const int has_bias, const int act) {
    int gid = get_global_id(0);
    if (gid >= total) return;
    const int C = geo[0], H = geo[1], W = geo[2], M = geo[3], OH = geo[4], OW = geo[5];
    const int KH = geo[6], KW = geo[7], sh = geo[8], sw = geo[9], dh = geo[10], dw = geo[11];
    const int ph = geo[12], pw = geo[13];
    const int wtiles = (OW + PX - 1) / PX;
    const int ow0 = (gid % wtiles) * PX;
    int rest = gid / wtiles;
    const int oh = rest % OH;
    rest /= OH;
    const int m = rest % M, n = rest / M;
    __global const store_t* xc = x + ((size_t)n * C + m / (M / C)) * H * W;
    __global const store_t* wm = w + m * KH * KW;

    float acc[PX];
    for (int p = 0; p < PX; ++p) acc[p] = 0.0f;
    const int ih0 = oh * sh - ph, iw0 = ow0 * sw - pw;
    for (int kh = 0; kh < KH; ++kh) {
        const int ih = ih0 + kh * dh;
        if (ih < 0 || ih >= H) continue;
        __global const store_t* row = xc + ih * W;
        for (int kw = 0; kw < KW; ++kw) {
            const float wv = LOAD(wm, kh * KW + kw);
            for (int p = 0; p < PX; ++p) {
                const int iw = iw0 + p * sw + kw * dw;
                acc[p] = fma(wv, (iw >= 0 && iw < W) ? LOAD(row, iw) : 0.0f, acc[p]);
            }
        }
    }
    const float b = has_bias ? LOAD(bias, m) : 0.0f;
    __global store_t* o = out + (((size_t)n * M + m) * OH + oh) * OW;
    for (int p = 0; p < PX && ow0 + p < OW; ++p) STORE(o, ow0 + p, activate(acc[p] + b, act));
}

// 1x1, stride 1, no padding: per image and group, out (M/g, P) = w (M/g, C/g) @ x (C/g, P).
// Work-groups of TILE x TILE items stage TILE x (TILE * PX) of x and (TILE * CO) x TILE of w
// in local memory, then each item multiplies its CO x PX tile out of them.
#ifndef TILE
#define TILE 8
#endif
__kernel __attribute__((reqd_work_group_size(TILE * TILE, 1, 1)))
void conv_pointwise(__global const store_t* x, __global const store_t* w, __global const store_t* bias,
                    __global store_t* out, __constant const int* geo, const int total,
                    const int has_bias, const int act) {
    const int C = geo[0], P = geo[1], M = geo[2], G = geo[3];
    const int cpg = C / G, mpg = M / G;
    const int pblocks = (P + TILE * PX - 1) / (TILE * PX), mblocks = (mpg + TILE * CO - 1) / (TILE * CO);
    const int lid = get_local_id(0), tp = lid % TILE, tm = lid / TILE;
    int block = get_group_id(0);
    const int pb = block % pblocks;
    block /= pblocks;
    const int mb = block % mblocks;
    block /= mblocks;
    const int g = block % G, n = block / G;
    const int p0 = pb * TILE * PX, mbase = mb * TILE * CO;
    __local float xs[TILE][TILE * PX];
    __local float ws[TILE * CO][TILE + 1];
    __global const store_t* xg = x + ((size_t)n * C + g * cpg) * P;
    __global const store_t* wg = w + (size_t)g * mpg * cpg;

    float acc[CO][PX];
    for (int j = 0; j < CO; ++j)
        for (int p = 0; p < PX; ++p) acc[j][p] = 0.0f;
    for (int c0 = 0; c0 < cpg; c0 += TILE) {
        for (int e = lid; e < TILE * TILE * PX; e += TILE * TILE) {
            const int c = e / (TILE * PX), p = e % (TILE * PX);
            xs[c][p] = (c0 + c < cpg && p0 + p < P) ? LOAD(xg, (size_t)(c0 + c) * P + p0 + p) : 0.0f;
        }
        for (int e = lid; e < TILE * TILE * CO; e += TILE * TILE) {
            const int m = e / TILE, c = e % TILE;
            ws[m][c] = (c0 + c < cpg && mbase + m < mpg) ? LOAD(wg, (size_t)(mbase + m) * cpg + c0 + c) : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int c = 0; c < TILE; ++c) {
            float xv[PX];
            for (int p = 0; p < PX; ++p) xv[p] = xs[c][p * TILE + tp];
            for (int j = 0; j < CO; ++j) {
                const float wv = ws[j * TILE + tm][c];
                for (int p = 0; p < PX; ++p) acc[j][p] = fma(wv, xv[p], acc[j][p]);
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    for (int j = 0; j < CO; ++j) {
        const int m = mbase + j * TILE + tm;
        if (m >= mpg) break;
        const float b = has_bias ? LOAD(bias, g * mpg + m) : 0.0f;
        __global store_t* o = out + ((size_t)n * M + g * mpg + m) * P;
        for (int p = 0; p < PX; ++p) {
            const int q = p0 + p * TILE + tp;
            if (q < P) STORE(o, q, activate(acc[j][p] + b, act));
        }
    }
}

// The CPU path's lowering of a conv to a GEMM (gemm.cl's matmul_blocked): per image and
// group, cols (C/G * KH * KW, OH * OW) with row (ci, kh, kw) holding the input under that
// tap for every output pixel (zero in the padding), so out (M/G, P) = w (M/G, C/G*KH*KW)
// @ cols. One work-item per element of cols, output pixels fastest.
__kernel void im2col(__global const raw_t* x, __global raw_t* cols, __constant const int* geo,
                     const int total) {
    int gid = get_global_id(0);
    if (gid >= total) return;
    const int C = geo[0], H = geo[1], W = geo[2], OH = geo[4], OW = geo[5];
    const int KH = geo[6], KW = geo[7], sh = geo[8], sw = geo[9], dh = geo[10], dw = geo[11];
    const int ph = geo[12], pw = geo[13];
    const int ow = gid % OW;
    int rest = gid / OW;
    const int oh = rest % OH;
    rest /= OH;
    const int kw = rest % KW;
    rest /= KW;
    const int kh = rest % KH;
    const int nc = rest / KH;  // image * C + channel
    const int ih = oh * sh - ph + kh * dh, iw = ow * sw - pw + kw * dw;
    cols[gid] = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? x[((size_t)nc * H + ih) * W + iw] : (raw_t)0;  // +0.0
}
