// Probe: how close can a Q8_0 matrix-vector product (decode: one activation column) come to the
// memory bandwidth on this GPU if the weights are repacked at load time?
//
// ggml's Q8_0 block is 34 bytes (fp16 scale + 32 int8), so its mul_mat_vec_q reads weights with
// 4-byte loads; on the H200 it streams the 27B model's weights at ~2.4 TB/s (docs/benchmarks.md).
// Here each row's int8 quants are stored contiguously (16-byte aligned) and the per-32 scales in a
// separate fp16 array, so a warp reads a row in 512-byte coalesced 16-byte loads. The activation is
// quantized to int8 per 32 values (scale d_x) as ggml's q8_1 does, and the dot products use dp4a:
// y[r] = sum_b d_w[r,b] * d_x[b] * sum_{i<32} q_w[r,32b+i] * q_x[32b+i].
//
// A second kernel reads ggml's own Q8_0 layout (34-byte blocks) the same way, staging 16-block
// chunks of a row through shared memory with aligned 16-byte loads (no new tensor type needed).
// A third kernel takes 16 activation columns at once (a 16-token verify) with dp4a and several
// rows per warp, reading each weight once: its time relative to the 1-column kernel says what a
// verify's matmuls could cost relative to a decode step's.
//
// Prints, for the Qwen3.6-27B matrix shapes, the kernel time, the bytes read per second, and the
// max relative error against a CPU reference. Not part of the build; run on the GPU machine:
//     nvcc -O3 -arch=sm_90a -o /tmp/q8_gemv_probe bench/probes/q8_gemv_probe.cu && /tmp/q8_gemv_probe
#include "../../tests/cpp/cuda_check.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>


constexpr int WARP = 32;

// One warp per row (ROWS_PER_BLOCK warps per block). qw: [n_rows, K] int8, row-major, K % 512 == 0;
// dw: [n_rows, K/32] fp16; qx: [K] int8; dx: [K/32] float (in shared memory). y: [n_rows] float.
template <int ROWS_PER_BLOCK>
__global__ void __launch_bounds__(ROWS_PER_BLOCK * WARP)
q8_gemv(const int8_t * __restrict__ qw, const half * __restrict__ dw, const int8_t * __restrict__ qx,
        const float * __restrict__ dx, float * __restrict__ y, int K, int n_rows) {
    extern __shared__ int4 smem[];  // qx (K bytes) then dx (K/32 floats)
    int4 * sx = smem;
    float * sdx = reinterpret_cast<float *>(reinterpret_cast<int8_t *>(smem) + K);
    for (int i = threadIdx.x; i < K / 16; i += blockDim.x) sx[i] = reinterpret_cast<const int4 *>(qx)[i];
    for (int i = threadIdx.x; i < K / 32; i += blockDim.x) sdx[i] = dx[i];
    __syncthreads();
    const int lane = threadIdx.x % WARP;
    const int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP;
    if (row >= n_rows) return;
    const int4 * wrow = reinterpret_cast<const int4 *>(qw + size_t(row) * K);
    const half * drow = dw + size_t(row) * (K / 32);
    float acc = 0.0f;
    // each iteration: the warp reads 512 bytes (16 blocks); lane l holds bytes 16l..16l+15 = half
    // of block l/2
#pragma unroll 4
    for (int c = lane; c < K / 16; c += WARP) {
        const int4 w = __ldg(wrow + c);
        const int4 x = sx[c];
        int s = __dp4a(w.x, x.x, 0);
        s = __dp4a(w.y, x.y, s);
        s = __dp4a(w.z, x.z, s);
        s = __dp4a(w.w, x.w, s);
        const int b = c / 2;
        acc += __half2float(drow[b]) * sdx[b] * float(s);
    }
    for (int o = WARP / 2; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) y[row] = acc;
}

// NC activation columns at once (a verify of NC tokens), R rows per warp, so each weight byte is
// read from memory once and each activation byte from shared memory once per R rows.
// qx: [NC, K] int8 (column-major over K); dx: [NC, K/32]. y: [NC, n_rows]. K is walked in chunks
// of KC bytes staged in shared memory (KC % 512 == 0).
template <int NC, int R, int WARPS, int KC>
__global__ void __launch_bounds__(WARPS * WARP)
q8_gemm_skinny(const int8_t * __restrict__ qw, const half * __restrict__ dw, const int8_t * __restrict__ qx,
               const float * __restrict__ dx, float * __restrict__ y, int K, int n_rows) {
    __shared__ int4 sx[NC][KC / 16];
    __shared__ float sdx[NC][KC / 32];
    const int lane = threadIdx.x % WARP;
    const int row0 = (blockIdx.x * WARPS + threadIdx.x / WARP) * R;
    float acc[R][NC];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int c = 0; c < NC; ++c) acc[r][c] = 0.0f;
    for (int k0 = 0; k0 < K; k0 += KC) {
        __syncthreads();
        for (int i = threadIdx.x; i < NC * KC / 16; i += blockDim.x) {
            const int c = i / (KC / 16), j = i % (KC / 16);
            sx[c][j] = reinterpret_cast<const int4 *>(qx + size_t(c) * K + k0)[j];
        }
        for (int i = threadIdx.x; i < NC * KC / 32; i += blockDim.x) {
            const int c = i / (KC / 32), j = i % (KC / 32);
            sdx[c][j] = dx[size_t(c) * (K / 32) + k0 / 32 + j];
        }
        __syncthreads();
        for (int j = lane; j < KC / 16; j += WARP) {
            int4 w[R];
            float dwv[R];
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const int row = min(row0 + r, n_rows - 1);
                w[r] = __ldg(reinterpret_cast<const int4 *>(qw + size_t(row) * K + k0) + j);
                dwv[r] = __half2float(dw[size_t(row) * (K / 32) + (k0 + 16 * j) / 32]);
            }
#pragma unroll
            for (int c = 0; c < NC; ++c) {
                const int4 x = sx[c][j];
                const float d = sdx[c][j / 2];
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    int s = __dp4a(w[r].x, x.x, 0);
                    s = __dp4a(w[r].y, x.y, s);
                    s = __dp4a(w[r].z, x.z, s);
                    s = __dp4a(w[r].w, x.w, s);
                    acc[r][c] += dwv[r] * d * float(s);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int c = 0; c < NC; ++c) {
            float a = acc[r][c];
            for (int o = WARP / 2; o > 0; o /= 2) a += __shfl_xor_sync(0xffffffffu, a, o);
            if (lane == 0 && row0 + r < n_rows) y[size_t(c) * n_rows + row0 + r] = a;
        }
}

// The same product over ggml's own Q8_0 layout (34-byte blocks: fp16 scale, 32 int8), so no new
// tensor type would be needed: each warp copies 16 blocks of its row (544 bytes = 34 aligned
// 16-byte loads; needs K % 512 == 0 so rows stay 16-byte aligned) into its shared-memory slot, two
// chunks in flight, then each lane decodes half a block from shared memory (funnel shifts undo the
// 2-byte offset of the quants). qx/dx as above, in shared memory.
template <int WARPS>
__global__ void __launch_bounds__(WARPS * WARP)
q8_0_gemv_staged(const uint8_t * __restrict__ w, const int8_t * __restrict__ qx, const float * __restrict__ dx,
                 float * __restrict__ y, int K, int n_rows) {
    extern __shared__ int4 smem[];  // qx (K bytes), dx (K/32 floats), then per warp 2 x 544 (+16) bytes
    int4 * sx = smem;
    float * sdx = reinterpret_cast<float *>(reinterpret_cast<int8_t *>(smem) + K);
    const int nb = K / 32;
    int4 * stage_all = reinterpret_cast<int4 *>(sdx + nb);
    for (int i = threadIdx.x; i < K / 16; i += blockDim.x) sx[i] = reinterpret_cast<const int4 *>(qx)[i];
    for (int i = threadIdx.x; i < nb; i += blockDim.x) sdx[i] = dx[i];
    __syncthreads();
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const int row = blockIdx.x * WARPS + warp;
    if (row >= n_rows) return;
    int4 * stage = stage_all + warp * 69;  // two chunks of 34 x 16 bytes + 16 bytes the last funnel shift may read
    const int4 * src = reinterpret_cast<const int4 *>(w + size_t(row) * nb * 34);
    const int n_chunks = nb / 16;
    float acc = 0.0f;
    for (int c = 0; c < n_chunks; c += 2) {
        const int nc = min(2, n_chunks - c);
        int4 r0 = make_int4(0, 0, 0, 0), r1 = r0, r2 = r0;
        // 68 loads for two chunks: lanes take 0..31, 32..63, 64..67
        if (lane < 34 * nc) r0 = __ldg(src + c * 34 + lane);
        if (lane + 32 < 34 * nc) r1 = __ldg(src + c * 34 + lane + 32);
        if (lane + 64 < 34 * nc) r2 = __ldg(src + c * 34 + lane + 64);
        __syncwarp();
        stage[lane] = r0;
        stage[lane + 32] = r1;
        if (lane < 4) stage[lane + 64] = r2;
        __syncwarp();
        const uint8_t * bytes = reinterpret_cast<const uint8_t *>(stage);
        for (int k = 0; k < nc; ++k) {
            const int b = lane / 2, h = lane % 2;       // block in the chunk, half of the block
            const int o = k * 544 + b * 34;             // block start (even)
            const float d = __half2float(*reinterpret_cast<const half *>(bytes + o));
            const int q = o + 2 + 16 * h;               // quants: 16 bytes at an even offset
            const uint32_t * wv = reinterpret_cast<const uint32_t *>(bytes + (q & ~3));
            const int sh = (q & 3) * 8;                 // 0 or 16
            int v[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) v[j] = int(__funnelshift_r(wv[j], wv[j + 1], sh));
            const int gb = (c + k) * 16 + b;            // block index in the row
            const int4 x = sx[gb * 2 + h];
            int si = __dp4a(v[0], x.x, 0);
            si = __dp4a(v[1], x.y, si);
            si = __dp4a(v[2], x.z, si);
            si = __dp4a(v[3], x.w, si);
            acc += d * sdx[gb] * float(si);
        }
        __syncwarp();
    }
    for (int o = WARP / 2; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) y[row] = acc;
}

int main() {
    struct shape { int K, N; const char * what; };
    const shape shapes[] = {{5120, 17408, "ffn_gate / ffn_up (5120 -> 17408)"},
                            {17408, 5120, "ffn_down (17408 -> 5120)"},
                            {5120, 10240, "attn_qkv of a DeltaNet layer (5120 -> 10240)"},
                            {5120, 6144, "attn_gate / ssm_out sized (5120 -> 6144)"}};
    std::mt19937 rng(1);
    cudaEvent_t t0, t1;
    CHECK_CUDA(cudaEventCreate(&t0));
    CHECK_CUDA(cudaEventCreate(&t1));
    for (const shape & s : shapes) {
        const int K = s.K, N = s.N, nb = K / 32;
        // many copies of the matrix so the timed loop reads from HBM, not from the 50 MB L2
        const int copies = 8;
        std::vector<int8_t> qw(size_t(N) * K);
        std::vector<half> dw(size_t(N) * nb);
        std::vector<int8_t> qx(K);
        std::vector<float> dx(nb);
        for (auto & v : qw) v = int8_t(int(rng() % 255) - 127);
        for (auto & v : dw) v = __float2half(0.001f + float(rng() % 1000) * 1e-5f);
        for (auto & v : qx) v = int8_t(int(rng() % 255) - 127);
        for (auto & v : dx) v = 0.01f + float(rng() % 1000) * 1e-5f;
        std::vector<double> ref(N);
        for (int r = 0; r < N; ++r) {
            double a = 0;
            for (int b = 0; b < nb; ++b) {
                long long si = 0;
                for (int i = 0; i < 32; ++i) si += int(qw[size_t(r) * K + b * 32 + i]) * int(qx[b * 32 + i]);
                a += double(__half2float(dw[size_t(r) * nb + b])) * dx[b] * double(si);
            }
            ref[r] = a;
        }
        int8_t * d_qw; half * d_dw; int8_t * d_qx; float * d_dx; float * d_y;
        const size_t wbytes = size_t(N) * K, sbytes = size_t(N) * nb * sizeof(half);
        CHECK_CUDA(cudaMalloc(&d_qw, wbytes * copies));
        CHECK_CUDA(cudaMalloc(&d_dw, sbytes * copies));
        CHECK_CUDA(cudaMalloc(&d_qx, K));
        CHECK_CUDA(cudaMalloc(&d_dx, nb * sizeof(float)));
        CHECK_CUDA(cudaMalloc(&d_y, N * sizeof(float)));
        for (int c = 0; c < copies; ++c) {
            CHECK_CUDA(cudaMemcpy(d_qw + c * wbytes, qw.data(), wbytes, cudaMemcpyHostToDevice));
            CHECK_CUDA(cudaMemcpy(reinterpret_cast<int8_t *>(d_dw) + c * sbytes, dw.data(), sbytes, cudaMemcpyHostToDevice));
        }
        CHECK_CUDA(cudaMemcpy(d_qx, qx.data(), K, cudaMemcpyHostToDevice));
        CHECK_CUDA(cudaMemcpy(d_dx, dx.data(), nb * sizeof(float), cudaMemcpyHostToDevice));
        constexpr int RPB = 8;
        const size_t smem = size_t(K) + nb * sizeof(float);
        const dim3 grid((N + RPB - 1) / RPB), block(RPB * WARP);
        auto launch = [&](int c) {
            q8_gemv<RPB><<<grid, block, smem>>>(d_qw + c * wbytes,
                                                reinterpret_cast<half *>(reinterpret_cast<int8_t *>(d_dw) + c * sbytes),
                                                d_qx, d_dx, d_y, K, N);
        };
        for (int c = 0; c < copies; ++c) launch(c);
        CHECK_CUDA(cudaDeviceSynchronize());
        std::vector<float> y(N);
        CHECK_CUDA(cudaMemcpy(y.data(), d_y, N * sizeof(float), cudaMemcpyDeviceToHost));
        double err = 0;
        for (int r = 0; r < N; ++r) err = std::max(err, std::fabs(y[r] - ref[r]) / (std::fabs(ref[r]) + 1e-3));
        const int reps = 50;
        CHECK_CUDA(cudaEventRecord(t0));
        for (int i = 0; i < reps; ++i) launch(i % copies);
        CHECK_CUDA(cudaEventRecord(t1));
        CHECK_CUDA(cudaEventSynchronize(t1));
        float ms = 0;
        CHECK_CUDA(cudaEventElapsedTime(&ms, t0, t1));
        const double us = 1e3 * ms / reps;
        const double q8_0_bytes = double(N) * nb * 34;  // what the same matrix costs as ggml Q8_0
        std::printf("%-46s %8.1f us  %5.2f TB/s of repacked bytes (%5.2f TB/s Q8_0-equivalent)  max rel err %.2e\n",
                    s.what, us, (wbytes + sbytes) / us / 1e6, q8_0_bytes / us / 1e6, err);
        {  // ggml's Q8_0 layout, staged through shared memory (q8_0_gemv_staged)
            std::vector<uint8_t> blocks(size_t(N) * nb * 34);
            for (int r = 0; r < N; ++r)
                for (int b = 0; b < nb; ++b) {
                    uint8_t * dst = blocks.data() + (size_t(r) * nb + b) * 34;
                    const half d = dw[size_t(r) * nb + b];
                    std::memcpy(dst, &d, 2);
                    std::memcpy(dst + 2, qw.data() + size_t(r) * K + b * 32, 32);
                }
            uint8_t * d_blocks;
            const size_t bbytes = blocks.size();
            CHECK_CUDA(cudaMalloc(&d_blocks, bbytes * copies));
            for (int c = 0; c < copies; ++c)
                CHECK_CUDA(cudaMemcpy(d_blocks + c * bbytes, blocks.data(), bbytes, cudaMemcpyHostToDevice));
            constexpr int WARPS = 8;
            const size_t smem_q = size_t(K) + nb * sizeof(float) + WARPS * 69 * sizeof(int4);
            CHECK_CUDA(cudaFuncSetAttribute(q8_0_gemv_staged<WARPS>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_q)));
            auto launch_q = [&](int c) {
                q8_0_gemv_staged<WARPS><<<(N + WARPS - 1) / WARPS, WARPS * WARP, smem_q>>>(d_blocks + c * bbytes, d_qx, d_dx,
                                                                                         d_y, K, N);
            };
            launch_q(0);
            CHECK_CUDA(cudaDeviceSynchronize());
            std::vector<float> yq(N);
            CHECK_CUDA(cudaMemcpy(yq.data(), d_y, N * sizeof(float), cudaMemcpyDeviceToHost));
            double errq = 0;
            for (int r = 0; r < N; ++r) errq = std::max(errq, std::fabs(yq[r] - ref[r]) / (std::fabs(ref[r]) + 1e-3));
            CHECK_CUDA(cudaEventRecord(t0));
            for (int i = 0; i < reps; ++i) launch_q(i % copies);
            CHECK_CUDA(cudaEventRecord(t1));
            CHECK_CUDA(cudaEventSynchronize(t1));
            float msq = 0;
            CHECK_CUDA(cudaEventElapsedTime(&msq, t0, t1));
            const double usq = 1e3 * msq / reps;
            std::printf("%-46s %8.1f us  ggml Q8_0 layout, staged: %5.2f TB/s  max rel err %.2e\n", "", usq,
                        double(bbytes) / usq / 1e6, errq);
            cudaFree(d_blocks);
        }
        {  // 16 columns: the same weights against 16 activation columns (column 0 = qx above)
            constexpr int NC = 16, R = 4, WARPS = 4, KC = 1024;
            std::vector<int8_t> qx16(size_t(NC) * K);
            std::vector<float> dx16(size_t(NC) * nb);
            for (int c = 0; c < NC; ++c)
                for (int k = 0; k < K; ++k) qx16[size_t(c) * K + k] = c == 0 ? qx[k] : int8_t(int(rng() % 255) - 127);
            for (int c = 0; c < NC; ++c)
                for (int b = 0; b < nb; ++b) dx16[size_t(c) * nb + b] = c == 0 ? dx[b] : 0.01f;
            int8_t * d_qx16; float * d_dx16; float * d_y16;
            CHECK_CUDA(cudaMalloc(&d_qx16, qx16.size()));
            CHECK_CUDA(cudaMalloc(&d_dx16, dx16.size() * sizeof(float)));
            CHECK_CUDA(cudaMalloc(&d_y16, size_t(NC) * N * sizeof(float)));
            CHECK_CUDA(cudaMemcpy(d_qx16, qx16.data(), qx16.size(), cudaMemcpyHostToDevice));
            CHECK_CUDA(cudaMemcpy(d_dx16, dx16.data(), dx16.size() * sizeof(float), cudaMemcpyHostToDevice));
            const dim3 grid16((N + R * WARPS - 1) / (R * WARPS)), block16(WARPS * WARP);
            auto launch16 = [&](int c) {
                q8_gemm_skinny<NC, R, WARPS, KC><<<grid16, block16>>>(
                    d_qw + c * wbytes, reinterpret_cast<half *>(reinterpret_cast<int8_t *>(d_dw) + c * sbytes),
                    d_qx16, d_dx16, d_y16, K, N);
            };
            launch16(0);
            CHECK_CUDA(cudaDeviceSynchronize());
            std::vector<float> y16(N);  // column 0 only: against the same reference
            CHECK_CUDA(cudaMemcpy(y16.data(), d_y16, N * sizeof(float), cudaMemcpyDeviceToHost));
            double err16 = 0;
            for (int r = 0; r < N; ++r) err16 = std::max(err16, std::fabs(y16[r] - ref[r]) / (std::fabs(ref[r]) + 1e-3));
            CHECK_CUDA(cudaEventRecord(t0));
            for (int i = 0; i < reps; ++i) launch16(i % copies);
            CHECK_CUDA(cudaEventRecord(t1));
            CHECK_CUDA(cudaEventSynchronize(t1));
            float ms16 = 0;
            CHECK_CUDA(cudaEventElapsedTime(&ms16, t0, t1));
            const double us16 = 1e3 * ms16 / reps;
            std::printf("%-46s %8.1f us  16 columns: %.2fx the 1-column time  max rel err (column 0) %.2e\n", "",
                        us16, us16 / us, err16);
            cudaFree(d_qx16); cudaFree(d_dx16); cudaFree(d_y16);
        }
        cudaFree(d_qw); cudaFree(d_dw); cudaFree(d_qx); cudaFree(d_dx); cudaFree(d_y);
    }
    return 0;
}
