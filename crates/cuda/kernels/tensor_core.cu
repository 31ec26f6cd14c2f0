// Tensor-core building blocks (sm_80 and later, bf16): the m16n8k16 product and the loads
// of its operand fragments from shared memory, shared by the tensor-core attention
// (attention_tc.cu) and the experts' products (moe_gemm.cu).
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with .bf16): lane = 4 g + t. A (16 x 16,
// row-major) registers: {A[g][2t], A[g][2t+1]}, {A[g+8][2t], ..}, {A[g][2t+8], ..},
// {A[g+8][2t+8], ..}; B (16 x 8, k x n): {B[2t][g], B[2t+1][g]}, {B[2t+8][g], B[2t+9][g]};
// C (16 x 8): C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1]. The lower 16 bits of a
// register hold the element of the lower index.
//
// ldmatrix (m8n8.x4, b16) reads four 8 x 8 matrices of 16-bit elements in one warp-wide
// instruction, where a fragment would otherwise take a shared load per register: lane l
// names the 16-byte row l % 8 of matrix l / 8 (any 16-byte aligned shared address), and
// register i of lane 4 g + t receives matrix i's elements (g, 2t) and (g, 2t + 1); with
// .trans, its elements (2t, g) and (2t + 1, g). So, for a row-major tile whose rows are
// 16-byte aligned:
//  - an A fragment is rows 0-7 | 8-15 by columns 0-7 | 8-15, matrices in the order of its
//    registers (frag_a_row);
//  - two B fragments of n-major rows (a weight row per output, a key row per position;
//    B = rows^T) are, for outputs [0, 8) then [8, 16), columns 0-7 then 8-15
//    (frag_b_pair_row);
//  - two B fragments of k-major rows (a value row per position; B = rows) are the same
//    matrices transposed: positions 0-7 then 8-15, for columns [0, 8) then [8, 16)
//    (frag_b_pair_col).

// d += a · b for one m16n8k16 tile.
__device__ __forceinline__ void mma_16816(float* d, const u32* a, const u32* b) {
#ifdef TANDEM_EMULATOR
    tandem_emu_mma_bf16_16816(d, a, b);
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// Two floats as a bf16 pair (lo: the lower index), rounded to nearest even.
__device__ __forceinline__ u32 pack_bf16(float lo, float hi) {
    return (u32)f32_to_bf16(lo) | ((u32)f32_to_bf16(hi) << 16);
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 into r[0..4), this lane naming `row`;
// `trans` (a constant at every call, so the branch folds away) transposes each 8 x 8 matrix.
__device__ __forceinline__ void ldmatrix_x4(u32* r, const bf16_bits* row, bool trans) {
#ifdef TANDEM_EMULATOR
    tandem_emu_ldmatrix_x4(r, row, trans);
#else
    unsigned addr = (unsigned)__cvta_generic_to_shared(row);
    if (trans) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(addr));
    } else {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(addr));
    }
#endif
}

// The A fragment of the 16 x 16 tile at `tile` (row-major, `stride` elements a row).
__device__ __forceinline__ void frag_a_row(u32* a, const bf16_bits* tile, int stride) {
    int lane = threadIdx.x & 31;
    ldmatrix_x4(a, tile + (lane & 15) * stride + (lane >> 4) * 8, false);
}

// The B fragments of outputs [0, 8) (b[0..2)) and [8, 16) (b[2..4)) over k in [0, 16),
// from 16 rows at `tile`, row j holding output j's k values: B[k][j] = tile[j][k].
__device__ __forceinline__ void frag_b_pair_row(u32* b, const bf16_bits* tile, int stride) {
    int lane = threadIdx.x & 31;
    ldmatrix_x4(b, tile + ((lane & 7) + (lane >> 4) * 8) * stride + ((lane >> 3) & 1) * 8, false);
}

// The B fragments of outputs [0, 8) (b[0..2)) and [8, 16) (b[2..4)) over k in [0, 16),
// from 16 rows at `tile`, row k holding the 16 outputs' values: B[k][j] = tile[k][j].
__device__ __forceinline__ void frag_b_pair_col(u32* b, const bf16_bits* tile, int stride) {
    int lane = threadIdx.x & 31;
    ldmatrix_x4(b, tile + ((lane & 7) + ((lane >> 3) & 1) * 8) * stride + (lane >> 4) * 8,
                true);
}
