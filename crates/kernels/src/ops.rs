//! Element-wise and row-wise operations of the transformer: RMSNorm, SwiGLU, softmax, RoPE.
