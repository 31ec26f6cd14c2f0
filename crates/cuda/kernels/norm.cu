// RMSNorm kernels: one thread block per row. Element i of a normed row is
// x[i] * scale * weight[i] with scale = 1 / sqrt(mean(x^2) + eps), as on the CPU.

// Sum of squares of one row of `x` ([width] floats), shared by the norm kernels.
__device__ float row_sum_squares(const float* x, int width, float* scratch) {
    float acc = 0.0f;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        acc += x[i] * x[i];
    }
    return block_sum(acc, scratch);
}

// x: [n, width] f32 residual stream; delta: [n, width] f32 or null (then no add);
// weight: [width]; out: [n, width] act_t. With delta, x += delta first (the residual add of
// the previous sub-layer), and the updated x is written back.
extern "C" __global__ void add_rms_norm(float* x, const float* delta, const float* weight,
                                        act_t* out, int width, float eps) {
    __shared__ float scratch[32];
    i64 row = blockIdx.x;
    float* xr = x + row * width;
    if (delta != 0) {
        const float* dr = delta + row * width;
        for (int i = threadIdx.x; i < width; i += blockDim.x) {
            xr[i] = xr[i] + dr[i];
        }
        __syncthreads();
    }
    float scale = 1.0f / sqrtf(row_sum_squares(xr, width, scratch) / (float)width + eps);
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        store_act(out, row * width + i, xr[i] * scale * weight[i]);
    }
}

// The final norm: x += delta, then the normed row (f32) is stored in the per-slot hidden
// store at slots[row] ([num_slots, width]), where the LM head reads it from.
extern "C" __global__ void final_norm_store(float* x, const float* delta, const float* weight,
                                            const i64* slots, float* hidden_store, int width,
                                            float eps) {
    __shared__ float scratch[32];
    i64 row = blockIdx.x;
    float* xr = x + row * width;
    const float* dr = delta + row * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        xr[i] = xr[i] + dr[i];
    }
    __syncthreads();
    float scale = 1.0f / sqrtf(row_sum_squares(xr, width, scratch) / (float)width + eps);
    float* dst = hidden_store + slots[row] * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        dst[i] = xr[i] * scale * weight[i];
    }
}

// x: [n, width] f32 = rms_norm(x) * weight, in place: Gemma 3's norms of a sub-layer's output
// before the residual add.
extern "C" __global__ void rms_norm_rows(float* x, const float* weight, int width, float eps) {
    __shared__ float scratch[32];
    float* xr = x + (i64)blockIdx.x * width;
    float scale = 1.0f / sqrtf(row_sum_squares(xr, width, scratch) / (float)width + eps);
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        xr[i] = xr[i] * scale * weight[i];
    }
}
