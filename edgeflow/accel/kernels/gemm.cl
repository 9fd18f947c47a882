// Batched matrix product C = act(op(A) @ op(B)), tiled through local memory.
// A work-group computes a TM x TN tile of C, walking K in steps of TK: its work-items
// stage the TK-deep slices of A and B in local memory (zero past the edges, so no size
// need divide a tile), then each work-item accumulates an RM x RN block of C in
// registers. Blocks are interleaved (rows ty, ty + TM/RM, ...) so neighbouring
// work-items touch neighbouring addresses. Tile sizes are -D defines chosen by gemm.py
// from the device's local memory and work-group limits; transposes and the activation
// are run-time arguments, uniform across the launch, so one build serves every matmul.

#ifdef TM
#define WX (TN / RN)
#define WY (TM / RM)

__kernel __attribute__((reqd_work_group_size(WX, WY, 1)))
void matmul(__global const store_t* A, __global const store_t* B, __global store_t* C,
            const int M, const int N, const int K, __global const int* offsets,
            const int trans_a, const int trans_b, const int act) {
    __local float As[TK][TM + 1];
    __local float Bs[TK][TN + 1];
    const int tx = get_local_id(0), ty = get_local_id(1), tid = ty * WX + tx;
    const int n0 = get_group_id(0) * TN, m0 = get_group_id(1) * TM, batch = get_global_id(2);
    A += offsets[2 * batch];
    B += offsets[2 * batch + 1];
    C += (long)batch * M * N;
    float acc[RM][RN];
    for (int r = 0; r < RM; ++r)
        for (int c = 0; c < RN; ++c) acc[r][c] = 0.0f;

    for (int k0 = 0; k0 < K; k0 += TK) {
        // Consecutive work-items load consecutive addresses of whichever layout A has.
        for (int i = tid; i < TK * TM; i += WX * WY) {
            const int kk = trans_a ? i / TM : i % TK, mm = trans_a ? i % TM : i / TK;
            const int m = m0 + mm, k = k0 + kk;
            As[kk][mm] = (m < M && k < K) ? LOAD(A, trans_a ? k * M + m : m * K + k) : 0.0f;
        }
        for (int i = tid; i < TK * TN; i += WX * WY) {
            const int kk = trans_b ? i % TK : i / TN, nn = trans_b ? i / TK : i % TN;
            const int n = n0 + nn, k = k0 + kk;
            Bs[kk][nn] = (n < N && k < K) ? LOAD(B, trans_b ? n * K + k : k * N + n) : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int kk = 0; kk < TK; ++kk) {
            float a[RM], b[RN];
            for (int r = 0; r < RM; ++r) a[r] = As[kk][ty + r * WY];
            for (int c = 0; c < RN; ++c) b[c] = Bs[kk][tx + c * WX];
            for (int r = 0; r < RM; ++r)
                for (int c = 0; c < RN; ++c) acc[r][c] = mad(a[r], b[c], acc[r][c]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    for (int r = 0; r < RM; ++r) {
        const int m = m0 + ty + r * WY;
        if (m >= M) break;
        for (int c = 0; c < RN; ++c) {
            const int n = n0 + tx + c * WX;
            if (n >= N) break;
            STORE(C, m * N + n, fused_activation(acc[r][c], act));
        }
    }
}
#endif

// ---- The CPU path: register blocking, no local memory, no barriers -----------------------
// Where local memory is emulated in global memory (CPU runtimes such as PoCL), staging
// tiles and synchronising work-groups costs more than it saves. Instead each work-item
// computes an BM x BN block of C on its own: for every k it broadcasts BM values of A
// against one BN-wide vector of B (a vector load from B's row k, or BN strided loads
// when B is transposed), so the accumulators are BM registers of BN floats. Blocks that
// cross the edge of C clamp their reads and guard their writes. TA and TB (the
// transposes) are -D defines so the inner loop has no branches. A bias per row of C
// (conv's output channels) is added before the activation; `offsets` holds three ints
// per batch: the element offsets into A, B and the bias.
#ifdef BM
#define VEC_(n) float##n
#define VEC(n) VEC_(n)
#define VLOAD_(n) vload##n
#define VLOAD(n) VLOAD_(n)
#define VSTORE_(n) vstore##n
#define VSTORE(n) VSTORE_(n)
#define VN VEC(BN)

__kernel void matmul_blocked(__global const store_t* A, __global const store_t* B, __global store_t* C,
                             const int M, const int N, const int K, __global const int* offsets,
                             __global const store_t* bias, const int has_bias, const int act) {
    const int n0 = get_global_id(0) * BN, m0 = get_global_id(1) * BM, batch = get_global_id(2);
    if (n0 >= N || m0 >= M) return;
    A += offsets[3 * batch];
    B += offsets[3 * batch + 1];
    C += (long)batch * M * N;
    const bool full_n = n0 + BN <= N, full_m = m0 + BM <= M;
    VN acc[BM];
    for (int r = 0; r < BM; ++r) acc[r] = (VN)(0.0f);
#if TA
    // A is K x M: the block's BM values of A at k are contiguous.
    __global const store_t* a = A + m0;
#define A_AT(r, k) LOAD(a, (k) * M + min(r, M - 1 - m0))
#else
    __global const store_t* arow[BM];
    for (int r = 0; r < BM; ++r) arow[r] = A + (long)min(m0 + r, M - 1) * K;
#define A_AT(r, k) LOAD(arow[r], k)
#endif
#if TB
    // B is N x K: BN rows, each read along k.
    __global const store_t* brow[BN];
    for (int c = 0; c < BN; ++c) brow[c] = B + (long)min(n0 + c, N - 1) * K;
#endif

    if (full_n && full_m) {
        int k0 = 0;
#if EF_HALF
        // Half storage: the strided operands are read 4 k's at a time (vload_half4), as CPU
        // runtimes convert a scalar vload_half in a library call, a vector one in a few
        // instructions (PoCL: ~2x the GFLOP/s); the loop below finishes K % 4.
        for (; k0 + 4 <= K; k0 += 4) {
#if !TA
            float a4[BM][4];
            for (int r = 0; r < BM; ++r) VSTORE(4)(LOADN(4)(0, arow[r] + k0), 0, a4[r]);
#endif
#if TB
            float b4[BN][4];
            for (int c = 0; c < BN; ++c) VSTORE(4)(LOADN(4)(0, brow[c] + k0), 0, b4[c]);
#endif
            for (int kk = 0; kk < 4; ++kk) {
                const int k = k0 + kk;
#if TB
                float bs[BN];
                for (int c = 0; c < BN; ++c) bs[c] = b4[c][kk];
                const VN bv = VLOAD(BN)(0, bs);
#else
                const VN bv = LOADN(BN)(0, B + (long)k * N + n0);
#endif
#if TA
                float av[BM];
                VSTORE(BM)(LOADN(BM)(0, a + (long)k * M), 0, av);
                for (int r = 0; r < BM; ++r) acc[r] += av[r] * bv;
#else
                for (int r = 0; r < BM; ++r) acc[r] += a4[r][kk] * bv;
#endif
            }
        }
#endif
#pragma unroll 4
        for (int k = k0; k < K; ++k) {
#if TB
            float bs[BN];
            for (int c = 0; c < BN; ++c) bs[c] = LOAD(brow[c], k);
            const VN bv = VLOAD(BN)(0, bs);
#else
            const VN bv = LOADN(BN)(0, B + (long)k * N + n0);
#endif
#if TA
            float av[BM];
            for (int r = 0; r < BM; ++r) av[r] = LOAD(a, (long)k * M + r);
#endif
            for (int r = 0; r < BM; ++r) {
#if TA
                acc[r] += av[r] * bv;
#else
                acc[r] += LOAD(arow[r], k) * bv;
#endif
            }
        }
    } else {
        for (int k = 0; k < K; ++k) {
            float bs[BN];
            for (int c = 0; c < BN; ++c) {
#if TB
                bs[c] = LOAD(brow[c], k);
#else
                bs[c] = LOAD(B, (long)k * N + min(n0 + c, N - 1));
#endif
            }
            const VN bv = VLOAD(BN)(0, bs);
            for (int r = 0; r < BM; ++r) acc[r] += A_AT(r, k) * bv;
        }
    }

    for (int r = 0; r < BM; ++r) {
        const int m = m0 + r;
        if (m >= M) break;
        VN v = acc[r];
        if (has_bias) v += (VN)(LOAD(bias, offsets[3 * batch + 2] + m));
        if (act == 1) v = fmax(v, (VN)(0.0f));
        else if (act == 2) v = clamp(v, (VN)(0.0f), (VN)(6.0f));
        else if (act == 3) v = v / ((VN)(1.0f) + exp(-v));
        else if (act == 4) v = v * clamp(v + (VN)(3.0f), (VN)(0.0f), (VN)(6.0f)) / (VN)(6.0f);
        __global store_t* crow = C + (long)m * N + n0;
        if (full_n) {
            STOREN(BN)(v, 0, crow);
        } else {
            float vs[BN];
            VSTORE(BN)(v, 0, vs);
            for (int c = 0; c < BN && n0 + c < N; ++c) STORE(crow, c, vs[c]);
        }
    }
}
#endif
