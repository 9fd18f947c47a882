// 2-D max and average pooling over NCHW (1-D arrives lifted to H = 1): one work-item per
// output element, its window walked directly; taps in the padding are skipped.

// geometry: H, W, OH, OW, KH, KW, stride h, w, dilation h, w, pad begin h, w, pad end h, w
#define GEOMETRY                                                                           \
    const int H = geo[0], W = geo[1], OH = geo[2], OW = geo[3], KH = geo[4], KW = geo[5];   \
    const int sh = geo[6], sw = geo[7], dh = geo[8], dw = geo[9], ph = geo[10], pw = geo[11]; \
    const int ow = gid % OW, oh = (gid / OW) % OH, plane = gid / (OW * OH);                 \
    __global const store_t* xc = x + (size_t)plane * H * W;                                 \
    const int ih0 = oh * sh - ph, iw0 = ow * sw - pw;

__kernel void max_pool(__global const store_t* x, __global store_t* out, __constant const int* geo,
                       const int total) {
    int gid = get_global_id(0);
    if (gid >= total) return;
    GEOMETRY
    float m = -INFINITY;  // padding never wins
    for (int kh = 0; kh < KH; ++kh) {
        const int ih = ih0 + kh * dh;
        if (ih < 0 || ih >= H) continue;
        for (int kw = 0; kw < KW; ++kw) {
            const int iw = iw0 + kw * dw;
            if (iw < 0 || iw >= W) continue;
            const float v = LOAD(xc, ih * W + iw);
            m = (v > m || isnan(v)) ? v : m;  // NaN propagates, as np.maximum's
        }
    }
    STORE(out, gid, m);
}

// Divides by the window's elements inside the input, or inside the padded input with
// count_include_pad (never the part a ceil_mode window hangs past the end padding).
__kernel void avg_pool(__global const store_t* x, __global store_t* out, __constant const int* geo,
                       const int total, const int count_include_pad) {
    int gid = get_global_id(0);
    if (gid >= total) return;
    GEOMETRY
    float s = 0.0f;
    for (int kh = 0; kh < KH; ++kh) {
        const int ih = ih0 + kh;
        if (ih < 0 || ih >= H) continue;
        for (int kw = 0; kw < KW; ++kw) {
            const int iw = iw0 + kw;
            if (iw >= 0 && iw < W) s += LOAD(xc, ih * W + iw);
        }
    }
    const int lh = count_include_pad ? -ph : 0, hh = count_include_pad ? H + geo[12] : H;
    const int lw = count_include_pad ? -pw : 0, hw = count_include_pad ? W + geo[13] : W;
    const int count = (min(ih0 + KH, hh) - max(ih0, lh)) * (min(iw0 + KW, hw) - max(iw0, lw));
    STORE(out, gid, s * (1.0f / (float)count));
}
