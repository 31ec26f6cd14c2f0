// The batch-invariant matrix product (`--batch-invariant`): y[n, m] = x[n, k] · w[m, k]ᵀ,
// x and w act_t, y f32. cuBLAS picks its algorithm (tiles, split-K, tensor-core path) by
// the shape, so a row's result can change with how many rows share the product; here every
// element is one thread's sum over k in ascending order, whatever n, m, the tile or the
// element's place in it, so a token's logits are bitwise the same alone or in any batch.
// The cost is speed: CUDA cores instead of tensor cores (`cuda_score check` measures it).
//
// Grid: (ceil(m / MM_TILE_M), ceil(n / MM_TILE_N)); block: 256 threads. The block stages
// MM_TILE_K columns of its x rows and w rows in shared memory at a time (as f32); thread
// (r, c) of the 16 x 16 grid accumulates the outputs (r, c + 16 j), j < 4.

#define MM_TILE_N 16
#define MM_TILE_M 64
#define MM_TILE_K 32

extern "C" __global__ void matmul_fixed(const act_t* x, const act_t* w, float* y, int n, int m,
                                        int k) {
    __shared__ float xs[MM_TILE_N][MM_TILE_K + 1];
    __shared__ float ws[MM_TILE_M][MM_TILE_K + 1];
    int tr = threadIdx.x / 16; // output row within the tile
    int tc = threadIdx.x % 16; // first output column within the tile
    int row0 = blockIdx.y * MM_TILE_N;
    int col0 = blockIdx.x * MM_TILE_M;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int k0 = 0; k0 < k; k0 += MM_TILE_K) {
        int kn = min(MM_TILE_K, k - k0);
        for (int e = threadIdx.x; e < MM_TILE_N * MM_TILE_K; e += blockDim.x) {
            int r = e / MM_TILE_K;
            int c = e % MM_TILE_K;
            int gr = row0 + r;
            xs[r][c] = gr < n && c < kn ? load_act(x, (i64)gr * k + k0 + c) : 0.0f;
        }
        for (int e = threadIdx.x; e < MM_TILE_M * MM_TILE_K; e += blockDim.x) {
            int r = e / MM_TILE_K;
            int c = e % MM_TILE_K;
            int gr = col0 + r;
            ws[r][c] = gr < m && c < kn ? load_act(w, (i64)gr * k + k0 + c) : 0.0f;
        }
        __syncthreads();
        for (int c = 0; c < kn; ++c) {
            float a = xs[tr][c];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                acc[j] += a * ws[tc + 16 * j][c];
            }
        }
        __syncthreads();
    }
    int gr = row0 + tr;
    if (gr < n) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            int gc = col0 + tc + 16 * j;
            if (gc < m) {
                y[(i64)gr * m + gc] = acc[j];
            }
        }
    }
}
