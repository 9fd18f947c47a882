// Batched matrix product C = act(op(A) @ op(B)), tiled through local memory.
// A work-group computes a TM x TN tile of C, walking K in steps of TK: its work-items
// stage the TK-deep slices of A and B in local memory (zero past the edges, so no size
// need divide a tile), then each work-item accumulates an RM x RN block of C in
// registers. Blocks are interleaved (rows ty, ty + TM/RM, ...) so neighbouring
// work-items touch neighbouring addresses. Tile sizes are -D defines chosen by gemm.py
// from the device's local memory and work-group limits; transposes and the activation
// are run-time arguments, uniform across the launch, so one build serves every matmul.

#define WX (TN / RN)
#define WY (TM / RM)

__kernel __attribute__((reqd_work_group_size(WX, WY, 1)))
void matmul(__global const float* A, __global const float* B, __global float* C,
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
            As[kk][mm] = (m < M && k < K) ? A[trans_a ? k * M + m : m * K + k] : 0.0f;
        }
        for (int i = tid; i < TK * TN; i += WX * WY) {
            const int kk = trans_b ? i % TK : i / TN, nn = trans_b ? i / TK : i % TN;
            const int n = n0 + nn, k = k0 + kk;
            Bs[kk][nn] = (n < N && k < K) ? B[trans_b ? n * K + k : k * N + n] : 0.0f;
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
            float v = acc[r][c];
            if (act == 1) v = fmax(v, 0.0f);
            else if (act == 2) v = clamp(v, 0.0f, 6.0f);
            C[m * N + n] = v;
        }
    }
}
