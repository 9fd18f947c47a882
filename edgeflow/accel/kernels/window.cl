// Sliding-window kernels of the CPU path (gemm.cpu_path: PoCL and other CPU runtimes),
// built once per geometry: every size, stride, dilation and pad is a -D constant (G*), so
// index arithmetic divides by constants, window loops unroll and bounds tests fold. On a
// CPU runtime that is what lets the compiler vectorize: PoCL runs a work-group as a loop
// over its work-items and vectorizes that loop only where the kernel body is straight-line
// code, and a division by a run-time value costs tens of cycles per work-item.
// (The run-time-geometry kernels in conv.cl and pool.cl serve GPUs, where neither holds.)
//
// Geometry: GC, GH, GW input channels and size; GM output channels (depthwise); GOH, GOW
// output size; GKH, GKW window; GSH, GSW strides; GDH, GDW dilations; GPH, GPW begin pads;
// GEH, GEW end pads and COUNT_PAD (avg_pool); ACT, HAS_BIAS (depthwise). KIND picks the one
// kernel a build compiles: 1 im2col_fixed, 2 depthwise_fixed, 3 max_pool_fixed, 4 avg_pool_fixed.

#if KIND == 2
inline float activate_fixed(float v) {
    return fused_activation(v, ACT);
}

#endif

#if KIND == 1
// conv.cl's im2col with constant geometry: a 3-D range (OW, OH, rows of cols), a row being
// (image * C + channel) * KH * KW + kh * KW + kw. Same layout of cols.
__kernel void im2col_fixed(__global const raw_t* x, __global raw_t* cols) {
    const int ow = get_global_id(0), oh = get_global_id(1), r = get_global_id(2);
    if (ow >= GOW || oh >= GOH) return;
    const int kw = r % GKW, kh = (r / GKW) % GKH, nc = r / (GKH * GKW);
    const int ih = oh * GSH - GPH + kh * GDH, iw = ow * GSW - GPW + kw * GDW;
    const bool in = ih >= 0 && ih < GH && iw >= 0 && iw < GW;
    const raw_t v = x[(size_t)nc * (GH * GW) + (in ? ih * GW + iw : 0)];  // clamped address, then select
    cols[((size_t)r * GOH + oh) * GOW + ow] = in ? v : (raw_t)0;
}

#endif

#if KIND == 2
// Depthwise conv (group == C; output channel m reads input channel m / (M / C)): one
// work-item per output row of one channel, over `total` rows. For each window row it copies
// the input row, zero-padded, into a private array, then accumulates every tap across the
// whole output row: loops of constant trip count without branches, which the compiler
// unrolls and vectorizes. Products are a * b + c, not fma(): PoCL calls a library
// function for fma() and mad() on x86 instead of vectorizing them.
#define GWP ((GOW - 1) * GSW + (GKW - 1) * GDW + 1)
__kernel void depthwise_fixed(__global const store_t* x, __global const store_t* w, __global const store_t* bias,
                              __global store_t* out, const int total) {
    const int gid = get_global_id(0);
    if (gid >= total) return;
    const int oh = gid % GOH, nm = gid / GOH;
    const int m = nm % GM, n = nm / GM;
    __global const store_t* xc = x + ((size_t)n * GC + m / (GM / GC)) * (GH * GW);
    __global const store_t* wm = w + m * (GKH * GKW);
    float acc[GOW];
    const float b = HAS_BIAS ? LOAD(bias, m) : 0.0f;
    for (int o = 0; o < GOW; ++o) acc[o] = b;
    for (int kh = 0; kh < GKH; ++kh) {
        const int ih = oh * GSH - GPH + kh * GDH;
        if (ih < 0 || ih >= GH) continue;
        float row[GWP];
        for (int j = 0; j < GWP; ++j) {
            const int iw = j - GPW;
            row[j] = (iw >= 0 && iw < GW) ? LOAD(xc, ih * GW + iw) : 0.0f;
        }
        for (int kw = 0; kw < GKW; ++kw) {
            const float wv = LOAD(wm, kh * GKW + kw);
            for (int o = 0; o < GOW; ++o) acc[o] += wv * row[o * GSW + kw * GDW];
        }
    }
    __global store_t* orow = out + ((size_t)nm * GOH + oh) * GOW;
    for (int o = 0; o < GOW; ++o) STORE(orow, o, activate_fixed(acc[o]));
}

#endif

// pool.cl's max_pool and avg_pool with constant geometry: a 3-D range (OW, OH, planes),
// one work-item per output element, the window unrolled.
#define POOL_PREAMBLE                                                                        \
    const int ow = get_global_id(0), oh = get_global_id(1), plane = get_global_id(2);       \
    if (ow >= GOW || oh >= GOH) return;                                                     \
    __global const store_t* xc = x + (size_t)plane * (GH * GW);                             \
    const int ih0 = oh * GSH - GPH, iw0 = ow * GSW - GPW;                                   \
    __global store_t* o = out + ((size_t)plane * GOH + oh) * GOW + ow;

#if KIND == 3
__kernel void max_pool_fixed(__global const store_t* x, __global store_t* out) {
    POOL_PREAMBLE
    float m = -INFINITY;  // padding never wins
#pragma unroll
    for (int kh = 0; kh < GKH; ++kh) {
        const int ih = ih0 + kh * GDH;
#pragma unroll
        for (int kw = 0; kw < GKW; ++kw) {
            const int iw = iw0 + kw * GDW;
            const bool in = ih >= 0 && ih < GH && iw >= 0 && iw < GW;
            const float v = LOAD(xc, in ? ih * GW + iw : 0);
            m = in && (v > m || isnan(v)) ? v : m;  // NaN propagates, as np.maximum's
        }
    }
    STORE(o, 0, m);
}

#endif

#if KIND == 4
__kernel void avg_pool_fixed(__global const store_t* x, __global store_t* out) {
    POOL_PREAMBLE
    float s = 0.0f;
#pragma unroll
    for (int kh = 0; kh < GKH; ++kh) {
        const int ih = ih0 + kh;
#pragma unroll
        for (int kw = 0; kw < GKW; ++kw) {
            const int iw = iw0 + kw;
            const bool in = ih >= 0 && ih < GH && iw >= 0 && iw < GW;
            const float v = LOAD(xc, in ? ih * GW + iw : 0);
            s += in ? v : 0.0f;
        }
    }
    const int lh = COUNT_PAD ? -GPH : 0, hh = COUNT_PAD ? GH + GEH : GH;
    const int lw = COUNT_PAD ? -GPW : 0, hw = COUNT_PAD ? GW + GEW : GW;
    const int count = (min(ih0 + GKH, hh) - max(ih0, lh)) * (min(iw0 + GKW, hw) - max(iw0, lw));
    STORE(o, 0, s * (1.0f / (float)count));
}
#endif
