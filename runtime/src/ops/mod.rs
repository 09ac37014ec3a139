//! Primitive operations of the forward pass, one file per op. Shapes are in the comments;
//! matrices are row-major, activations `[tokens, features]`.

pub mod attention;
pub mod block32_gemm;
pub mod down_sum;
pub mod interleaved;
pub mod kquant_dot;
pub mod kquant_gemm;
pub mod layernorm;
pub mod matmul;
pub mod qdot;
pub mod qmatmul;
pub mod qmatvec;
pub mod record_sum;
pub mod rmsnorm;
pub mod rope;
#[cfg(target_arch = "aarch64")]
pub mod sdot;
pub mod simd;
pub mod sketch_dot;
pub mod softmax;
pub mod swiglu;
