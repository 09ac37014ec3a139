//! Our own GGML block kernels, where candle-core has no x86 SIMD path: Q4_1 x Q8_1 and
//! Q5_0 x Q8_0 (candle's are scalar on x86-64: 1.1 and 0.9 GB/s one thread on a Qwen-sized
//! row, against 16 GB/s for its Q4_K), and the 8-bit activation blocks Q8_0 and Q8_1
//! quantized exactly as llama.cpp's x86 build does (round half to even, Q8_1's `s` = f16(d x
//! sum q)), so that our products equal its products bit for bit per block.
//!
//! Block layouts (ggml-common.h): Q4_1 `d: f16, m: f16, qs[16]` (x = q d + m, element j in the
//! low nibble of qs[j], j + 16 in the high); Q5_0 `d: f16, qh: u32, qs[16]` (5th bit of element
//! j in bit j of qh; x = (q - 16) d); Q8_0 `d: f16, qs: [i8; 32]`; Q8_1 `d: f16, s: f16, qs`.
//! AVX2 where compiled for it (x86-64-v3, .cargo/config.toml), NEON on aarch64, portable code
//! otherwise; `make test` runs the aarch64 build's kernel tests under qemu-user.

use half::f16;

pub const QK: usize = 32;

/// An activation block for Q4_0/Q5_0/Q8_0 weights (candle's `BlockQ8_0` layout).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; QK],
}

/// An activation block for Q4_1 weights (candle's `BlockQ8_1` layout): `s` = d x sum(qs).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8_1 {
    pub d: f16,
    pub s: f16,
    pub qs: [i8; QK],
}

/// An activation block for the k-quants (candle's `BlockQ8K` layout): 256 values, one f32
/// scale, and the sums of each 16 (the k-quants' minimum terms use them).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}

pub const QK_K: usize = 256;

const _: () = assert!(
    std::mem::size_of::<BlockQ8_0>() == 34
        && std::mem::size_of::<BlockQ8_1>() == 36
        && std::mem::size_of::<BlockQ8K>() == 292
);

/// llama.cpp's quantize_row_q8_K: scale -127 / (the value of largest magnitude), round half to
/// even (its `nearest_int`), at most 127.
pub fn quantize_q8_k(x: &[f32]) -> Vec<BlockQ8K> {
    x.chunks_exact(QK_K)
        .map(|c| {
            let mut b = BlockQ8K { d: 0.0, qs: [0; QK_K], bsums: [0; QK_K / 16] };
            // the largest magnitude, 8 lanes at a time (vectorized), then the first value that
            // has it (llama.cpp's scan keeps the first)
            let mut lanes = [0f32; 8];
            for v in c.chunks_exact(8) {
                lanes.iter_mut().zip(v).for_each(|(m, v)| *m = m.max(v.abs()));
            }
            let amax = lanes.iter().fold(0f32, |m, &v| m.max(v));
            if amax == 0.0 {
                return b;
            }
            let max = *c.iter().find(|v| v.abs() == amax).expect("a value has the largest magnitude");
            let iscale = -127.0 / max;
            for (q, &v) in b.qs.iter_mut().zip(c) {
                // |iscale x v| <= 127 (+ rounding): the float clamp then the cast are exact
                *q = (iscale * v).round_ties_even().min(127.0) as i8;
            }
            for (s, q) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
                *s = q.iter().map(|&v| v as i16).sum();
            }
            b.d = 1.0 / iscale;
            b
        })
        .collect()
}

/// One block's scale and quants: d = max|x| / 127, q = round_half_even(x x 127 / max|x|).
fn quantize_block(x: &[f32], qs: &mut [i8; QK]) -> (f32, i32) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut sum = 0i32;
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = (v * id).round_ties_even() as i8;
        sum += *q as i32;
    }
    (d, sum)
}

pub fn quantize_q8_0(x: &[f32]) -> Vec<BlockQ8_0> {
    x.chunks_exact(QK)
        .map(|c| {
            let mut b = BlockQ8_0 { d: f16::ZERO, qs: [0; QK] };
            let (d, _) = quantize_block(c, &mut b.qs);
            b.d = f16::from_f32(d);
            b
        })
        .collect()
}

pub fn quantize_q8_1(x: &[f32]) -> Vec<BlockQ8_1> {
    x.chunks_exact(QK)
        .map(|c| {
            let mut b = BlockQ8_1 { d: f16::ZERO, s: f16::ZERO, qs: [0; QK] };
            let (d, sum) = quantize_block(c, &mut b.qs);
            b.d = f16::from_f32(d);
            b.s = f16::from_f32(d * sum as f32);
            b
        })
        .collect()
}

const Q4_1_BYTES: usize = 20;
const Q5_0_BYTES: usize = 22;

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// A row of Q4_1 blocks against Q8_1 activation blocks (portable).
#[allow(clippy::needless_range_loop)] // element j and j + 16 share byte j
pub fn dot_q4_1_q8_1_portable(row: &[u8], x: &[BlockQ8_1]) -> f32 {
    let mut sum = 0f32;
    for (b, y) in row.chunks_exact(Q4_1_BYTES).zip(x) {
        let (d, m, qs) = (f16_at(b, 0), f16_at(b, 2), &b[4..20]);
        let mut acc = 0i32;
        for j in 0..16 {
            acc += (qs[j] & 0x0F) as i32 * y.qs[j] as i32 + (qs[j] >> 4) as i32 * y.qs[j + 16] as i32;
        }
        sum += d * y.d.to_f32() * acc as f32 + m * y.s.to_f32();
    }
    sum
}

/// A row of Q5_0 blocks against Q8_0 activation blocks (portable).
#[allow(clippy::needless_range_loop)] // element j and j + 16 share byte j
pub fn dot_q5_0_q8_0_portable(row: &[u8], x: &[BlockQ8_0]) -> f32 {
    let mut sum = 0f32;
    for (b, y) in row.chunks_exact(Q5_0_BYTES).zip(x) {
        let (d, qh, qs) = (f16_at(b, 0), u32::from_le_bytes([b[2], b[3], b[4], b[5]]), &b[6..22]);
        let mut acc = 0i32;
        for j in 0..16 {
            let lo = ((qs[j] & 0x0F) as u32 | ((qh >> j) & 1) << 4) as i32 - 16;
            let hi = ((qs[j] >> 4) as u32 | ((qh >> (j + 16)) & 1) << 4) as i32 - 16;
            acc += lo * y.qs[j] as i32 + hi * y.qs[j + 16] as i32;
        }
        sum += d * y.d.to_f32() * acc as f32;
    }
    sum
}

pub fn dot_q4_1_q8_1(row: &[u8], x: &[BlockQ8_1]) -> f32 {
    assert_eq!(row.len(), x.len() * Q4_1_BYTES);
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
    {
        // SAFETY: compiled only where AVX2/FMA/F16C are target features; sizes checked above.
        unsafe { x86::dot_q4_1_q8_1(row, x) }
    }
    #[cfg(target_arch = "aarch64")]
    {
        // SAFETY: NEON is part of the aarch64 baseline; sizes checked above.
        unsafe { neon::dot_q4_1_q8_1(row, x) }
    }
    #[cfg(not(any(
        all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"),
        target_arch = "aarch64"
    )))]
    dot_q4_1_q8_1_portable(row, x)
}

/// One Q4_1 row against four activation rows (prefill): the row's nibbles are unpacked once.
pub fn dot4_q4_1_q8_1(row: &[u8], xs: [&[BlockQ8_1]; 4]) -> [f32; 4] {
    assert!(xs.iter().all(|x| row.len() == x.len() * Q4_1_BYTES));
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
    {
        // SAFETY: as in dot_q4_1_q8_1.
        unsafe { x86::dot4_q4_1_q8_1(row, xs) }
    }
    #[cfg(target_arch = "aarch64")]
    {
        // SAFETY: as in dot_q4_1_q8_1.
        unsafe { neon::dot4_q4_1_q8_1(row, xs) }
    }
    #[cfg(not(any(
        all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"),
        target_arch = "aarch64"
    )))]
    xs.map(|x| dot_q4_1_q8_1_portable(row, x))
}

pub fn dot_q5_0_q8_0(row: &[u8], x: &[BlockQ8_0]) -> f32 {
    assert_eq!(row.len(), x.len() * Q5_0_BYTES);
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
    {
        // SAFETY: as in dot_q4_1_q8_1.
        unsafe { x86::dot_q5_0_q8_0(row, x) }
    }
    #[cfg(target_arch = "aarch64")]
    {
        // SAFETY: as in dot_q4_1_q8_1.
        unsafe { neon::dot_q5_0_q8_0(row, x) }
    }
    #[cfg(not(any(
        all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"),
        target_arch = "aarch64"
    )))]
    dot_q5_0_q8_0_portable(row, x)
}

#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
mod x86 {
    use super::{f16_at, BlockQ8_0, BlockQ8_1, Q4_1_BYTES, Q5_0_BYTES};
    use std::arch::x86_64::*;

    /// 32 unsigned nibbles of a block's 16 bytes as bytes: low nibbles (elements 0..16), then
    /// high (16..32).
    #[target_feature(enable = "avx,avx2,fma,f16c")]
    fn nibbles(qs: &[u8]) -> __m256i {
        debug_assert!(qs.len() >= 16);
        // SAFETY: qs holds at least 16 bytes; unaligned load.
        let q = unsafe { _mm_loadu_si128(qs.as_ptr() as *const __m128i) };
        let m = _mm_set1_epi8(0x0F);
        _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m))
    }

    /// 0xFF in byte j where bit j of `bits` is set.
    #[target_feature(enable = "avx,avx2,fma,f16c")]
    fn bit_bytes(bits: u32) -> __m256i {
        // byte j of lane group j/8 holds bits 8(j/8)..; OR with all-but-bit-(j%8) masks, then test for all ones
        let spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32(bits as i32),
            _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0),
        );
        let others = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe_u64 as i64);
        _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi64x(-1))
    }

    /// 8 f32 lanes of the 32 products of unsigned bytes `u` x signed bytes `s`, pairwise summed.
    #[target_feature(enable = "avx,avx2,fma,f16c")]
    fn dot_us8(u: __m256i, s: __m256i) -> __m256 {
        _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)))
    }

    #[target_feature(enable = "avx,avx2,fma,f16c")]
    fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }

    /// Two adjacent f16 at `p` (a block's d and m, or an activation block's d and s) as f32
    /// lanes 0 and 1, by F16C.
    ///
    /// # Safety
    /// `p` points at 4 readable bytes.
    #[target_feature(enable = "avx,avx2,fma,f16c")]
    unsafe fn two_f16(p: *const u8) -> __m128 {
        // SAFETY (caller): 4 readable bytes; unaligned read.
        _mm_cvtph_ps(_mm_cvtsi32_si128(unsafe { (p as *const i32).read_unaligned() }))
    }

    /// A Q4_1 block's unpacked nibbles `q` and its `[d, m]` (lanes 0, 1) against one Q8_1
    /// block, into `acc` (the scaled integer product, 8 lanes) and `mins` (lane 1: m x s, the
    /// minimum's term; lane 0 unused).
    #[inline(always)]
    unsafe fn q4_1_block(q: __m256i, dm: __m128, y: &BlockQ8_1, acc: &mut __m256, mins: &mut __m128) {
        // SAFETY (caller): AVX2/FMA/F16C; y's d and s are adjacent (#[repr(C)]); y.qs is 32
        // bytes, unaligned load.
        unsafe {
            let p = _mm_mul_ps(dm, two_f16(y as *const BlockQ8_1 as *const u8)); // [d x yd, m x ys]
            *mins = _mm_add_ps(*mins, p);
            let qy = _mm256_loadu_si256(y.qs.as_ptr() as *const __m256i);
            *acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(p), dot_us8(q, qy), *acc);
        }
    }

    /// Lane 1 of `v`.
    #[target_feature(enable = "avx,avx2,fma,f16c")]
    fn lane1(v: __m128) -> f32 {
        _mm_cvtss_f32(_mm_movehdup_ps(v))
    }

    /// One chain of adds in block order, as llama.cpp's AVX2 kernel sums (a near-tie between
    /// two tokens then parts as it does); [`dot4_q4_1_q8_1`] sums in the same order, so a
    /// token's result does not depend on the batch it is computed in.
    #[target_feature(enable = "avx,avx2,fma,f16c")]
    pub fn dot_q4_1_q8_1(row: &[u8], x: &[BlockQ8_1]) -> f32 {
        let (mut acc, mut mins) = (_mm256_setzero_ps(), _mm_setzero_ps());
        for (b, y) in row.chunks_exact(Q4_1_BYTES).zip(x) {
            // SAFETY: b is a block, d and m at its start; AVX2/FMA/F16C enabled here.
            unsafe { q4_1_block(nibbles(&b[4..]), two_f16(b.as_ptr()), y, &mut acc, &mut mins) };
        }
        hsum(acc) + lane1(mins)
    }

    #[target_feature(enable = "avx,avx2,fma,f16c")]
    pub fn dot4_q4_1_q8_1(row: &[u8], xs: [&[BlockQ8_1]; 4]) -> [f32; 4] {
        let (mut acc, mut mins) = ([_mm256_setzero_ps(); 4], [_mm_setzero_ps(); 4]);
        for (k, b) in row.chunks_exact(Q4_1_BYTES).enumerate() {
            let q = nibbles(&b[4..]);
            // SAFETY: b is a block, d and m at its start.
            let dm = unsafe { two_f16(b.as_ptr()) };
            for t in 0..4 {
                // SAFETY: AVX2/FMA/F16C enabled here.
                unsafe { q4_1_block(q, dm, &xs[t][k], &mut acc[t], &mut mins[t]) };
            }
        }
        [0, 1, 2, 3].map(|t| hsum(acc[t]) + lane1(mins[t]))
    }

    #[target_feature(enable = "avx,avx2,fma,f16c")]
    pub fn dot_q5_0_q8_0(row: &[u8], x: &[BlockQ8_0]) -> f32 {
        let mut acc = _mm256_setzero_ps();
        for (b, y) in row.chunks_exact(Q5_0_BYTES).zip(x) {
            let d = f16_at(b, 0);
            let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
            // q - 16 as a signed byte: the nibble, with 0xF0 where the 5th bit is clear
            let q =
                _mm256_or_si256(nibbles(&b[6..]), _mm256_andnot_si256(bit_bytes(qh), _mm256_set1_epi8(0xF0_u8 as i8)));
            // SAFETY: y.qs is 32 bytes; unaligned load.
            let qy = unsafe { _mm256_loadu_si256(y.qs.as_ptr() as *const __m256i) };
            // |q| x (y with q's sign): unsigned x signed for maddubs
            let p = dot_us8(_mm256_sign_epi8(q, q), _mm256_sign_epi8(qy, q));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d * y.d.to_f32()), p, acc);
        }
        hsum(acc)
    }
}

/// NEON (the aarch64 baseline: Jetson, Raspberry Pi 4/5, phones): the block's integer product
/// by widening multiplies (no dot-product extension needed), one f32 scale per block.
#[cfg(target_arch = "aarch64")]
mod neon {
    use super::{f16_at, BlockQ8_0, BlockQ8_1, Q4_1_BYTES, Q5_0_BYTES};
    use std::arch::aarch64::*;

    /// The 16 low nibbles (elements 0..16) and 16 high nibbles (16..32) of a block's bytes.
    #[inline(always)]
    unsafe fn nibbles(qs: &[u8]) -> (int8x16_t, int8x16_t) {
        debug_assert!(qs.len() >= 16);
        // SAFETY (caller): qs holds at least 16 bytes; unaligned load.
        let q = vld1q_u8(qs.as_ptr());
        (vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0F))), vreinterpretq_s8_u8(vshrq_n_u8(q, 4)))
    }

    /// Sum over 32 lanes of a x y (elements 0..16 in a0/y0, 16..32 in a1/y1), exact in i32.
    #[inline(always)]
    unsafe fn dot32(a0: int8x16_t, a1: int8x16_t, y0: int8x16_t, y1: int8x16_t) -> i32 {
        let p = vpaddlq_s16(vmull_s8(vget_low_s8(a0), vget_low_s8(y0)));
        let p = vpadalq_s16(p, vmull_high_s8(a0, y0));
        let p = vpadalq_s16(p, vmull_s8(vget_low_s8(a1), vget_low_s8(y1)));
        let p = vpadalq_s16(p, vmull_high_s8(a1, y1));
        vaddvq_s32(p)
    }

    #[inline(always)]
    unsafe fn load32(qs: &[i8; 32]) -> (int8x16_t, int8x16_t) {
        // SAFETY (caller): 32 bytes; unaligned loads.
        (vld1q_s8(qs.as_ptr()), vld1q_s8(qs.as_ptr().add(16)))
    }

    pub unsafe fn dot_q4_1_q8_1(row: &[u8], x: &[BlockQ8_1]) -> f32 {
        let mut sum = 0f32;
        for (b, y) in row.chunks_exact(Q4_1_BYTES).zip(x) {
            let (lo, hi) = nibbles(&b[4..]);
            let (y0, y1) = load32(&y.qs);
            sum += f16_at(b, 0) * y.d.to_f32() * dot32(lo, hi, y0, y1) as f32 + f16_at(b, 2) * y.s.to_f32();
        }
        sum
    }

    pub unsafe fn dot4_q4_1_q8_1(row: &[u8], xs: [&[BlockQ8_1]; 4]) -> [f32; 4] {
        let mut sum = [0f32; 4];
        for (k, b) in row.chunks_exact(Q4_1_BYTES).enumerate() {
            let (d, m) = (f16_at(b, 0), f16_at(b, 2));
            let (lo, hi) = nibbles(&b[4..]);
            for t in 0..4 {
                let y = &xs[t][k];
                let (y0, y1) = load32(&y.qs);
                sum[t] += d * y.d.to_f32() * dot32(lo, hi, y0, y1) as f32 + m * y.s.to_f32();
            }
        }
        sum
    }

    pub unsafe fn dot_q5_0_q8_0(row: &[u8], x: &[BlockQ8_0]) -> f32 {
        // bit j%8 of byte j/8 of qh, per lane
        const BIT: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
        let bit = vld1q_u8(BIT.as_ptr());
        let sixteen = vdupq_n_u8(0x10);
        let mut sum = 0f32;
        for (b, y) in row.chunks_exact(Q5_0_BYTES).zip(x) {
            let (lo, hi) = nibbles(&b[6..]);
            // 0x10 in lane j where the element's 5th bit is set
            let h0 = vandq_u8(vtstq_u8(vcombine_u8(vdup_n_u8(b[2]), vdup_n_u8(b[3])), bit), sixteen);
            let h1 = vandq_u8(vtstq_u8(vcombine_u8(vdup_n_u8(b[4]), vdup_n_u8(b[5])), bit), sixteen);
            // q - 16 in -16..15
            let q0 = vsubq_s8(vorrq_s8(lo, vreinterpretq_s8_u8(h0)), vdupq_n_s8(16));
            let q1 = vsubq_s8(vorrq_s8(hi, vreinterpretq_s8_u8(h1)), vdupq_n_s8(16));
            let (y0, y1) = load32(&y.qs);
            sum += f16_at(b, 0) * y.d.to_f32() * dot32(q0, q1, y0, y1) as f32;
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 32) as u8
            })
            .collect()
    }

    /// Random blocks (finite f16 scales) of `bytes_per_block`, `n` of them.
    fn random_blocks(n: usize, bytes_per_block: usize, scales: usize, seed: u64) -> Vec<u8> {
        let mut b = random_bytes(n * bytes_per_block, seed);
        for k in 0..n {
            for s in 0..scales {
                let v = f16::from_f32(0.01 + (b[k * bytes_per_block + 2 * s] as f32) / 5000.0);
                b[k * bytes_per_block + 2 * s..k * bytes_per_block + 2 * s + 2].copy_from_slice(&v.to_le_bytes());
            }
        }
        b
    }

    /// The SIMD kernels against the portable ones (integer products per block, so equal up to
    /// the f32 summation order), and both against the dequantized f32 product.
    #[test]
    fn simd_kernels_equal_portable_and_the_dequantized_product() {
        // an odd count too: the last block of a row without a partner
        for blocks in [48, 7] {
            kernels_at(blocks);
        }
    }

    fn kernels_at(blocks: usize) {
        let x: Vec<f32> = random_bytes(blocks * QK, 3).iter().map(|&v| v as f32 / 128.0 - 1.0).collect();
        let (x0, x1) = (quantize_q8_0(&x), quantize_q8_1(&x));
        let xq: Vec<f32> = x0.iter().flat_map(|b| b.qs.iter().map(move |&q| q as f32 * b.d.to_f32())).collect();
        for (ty, bpb, scales) in [
            (formats::ggml_quants::GgmlType::Q4_1, Q4_1_BYTES, 2),
            (formats::ggml_quants::GgmlType::Q5_0, Q5_0_BYTES, 1),
        ] {
            let row = random_blocks(blocks, bpb, scales, 9);
            let (fast, slow) = match ty {
                formats::ggml_quants::GgmlType::Q4_1 => (dot_q4_1_q8_1(&row, &x1), dot_q4_1_q8_1_portable(&row, &x1)),
                _ => (dot_q5_0_q8_0(&row, &x0), dot_q5_0_q8_0_portable(&row, &x0)),
            };
            let mut w = vec![0f32; blocks * QK];
            formats::ggml_quants::dequantize(ty, &row, &mut w);
            let exact: f32 = w.iter().zip(&xq).map(|(a, b)| a * b).sum();
            let scale: f32 = w.iter().zip(&xq).map(|(a, b)| (a * b).abs()).sum();
            assert!((fast - slow).abs() <= 1e-5 * scale, "{}: simd {fast} vs portable {slow}", ty.name());
            if ty == formats::ggml_quants::GgmlType::Q4_1 {
                assert_eq!(
                    dot4_q4_1_q8_1(&row, [&x1, &x1, &x1, &x1]),
                    [fast; 4],
                    "the 4-token kernel is the 1-token one"
                );
            }
            // Q8_1's s is rounded to f16: the offset term m x s carries that rounding
            assert!((slow - exact).abs() <= 2e-3 * scale, "{}: {slow} vs dequantized {exact}", ty.name());
        }
    }

    #[test]
    fn activation_blocks_round_half_to_even_as_llama_cpp() {
        // 127 / 254 * x: x = 1 -> 0.5 -> 0, x = 3 -> 1.5 -> 2
        let mut x = vec![0f32; QK];
        x[0] = 254.0;
        x[1] = 1.0;
        x[2] = 3.0;
        x[3] = -1.0;
        let b = quantize_q8_1(&x);
        assert_eq!(&b[0].qs[..4], &[127, 0, 2, 0]);
        assert_eq!(b[0].s, f16::from_f32(2.0 * 129.0));
    }

    #[test]
    fn q8_k_blocks_as_llama_cpp_quantize_row_q8_k() {
        // llama.cpp's scan, value by value: the first value of the largest magnitude sets the
        // scale's sign; ties round to even; at most 127
        fn reference(c: &[f32]) -> BlockQ8K {
            let mut b = BlockQ8K { d: 0.0, qs: [0; QK_K], bsums: [0; QK_K / 16] };
            let (mut max, mut amax) = (0f32, 0f32);
            for &v in c {
                if v.abs() > amax {
                    amax = v.abs();
                    max = v;
                }
            }
            if amax == 0.0 {
                return b;
            }
            let iscale = -127.0 / max;
            for (q, &v) in b.qs.iter_mut().zip(c) {
                *q = ((iscale * v).round_ties_even() as i32).min(127) as i8;
            }
            for (s, q) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
                *s = q.iter().map(|&v| v as i16).sum();
            }
            b.d = 1.0 / iscale;
            b
        }
        let mut cases: Vec<Vec<f32>> = (0..20u64)
            .map(|seed| random_bytes(QK_K, seed).iter().map(|&v| (v as i8) as f32 * 0.37).collect())
            .collect();
        // the largest magnitude twice with both signs (the first decides), exact halves, zeros
        let mut tie = vec![0f32; QK_K];
        (tie[5], tie[77], tie[9]) = (-254.0, 254.0, 1.0);
        tie[10] = 3.0;
        cases.push(tie);
        cases.push(vec![0.0; QK_K]);
        for c in &cases {
            let (got, want) = (&quantize_q8_k(c)[0], reference(c));
            assert_eq!((got.d.to_bits(), got.qs, got.bsums), (want.d.to_bits(), want.qs, want.bsums));
        }
    }
}
