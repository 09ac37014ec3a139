//! Q4_K and Q6_K weight rows against Q8_K activation rows, several products per pass over the
//! blocks: `R` weight rows with `T` activation rows, `out[r][t] = rows[r] . xs[t]`. Decode
//! passes several rows and one activation (the activation's loads and sums are shared, and R
//! independent chains keep more loads in flight); a prompt passes one row and several tokens
//! (each weight block is unpacked once for every token).
//!
//! Each product is summed exactly as llama.cpp's AVX2 kernel (`ggml_vec_dot_q4_K_q8_K`,
//! `..._q6_K_q8_K`, which candle-core's x86 kernels copy) sums it: integer sums per block, one
//! f32 fused multiply-add per block in block order, the same horizontal sum. So a product
//! equals the one-row, one-token kernel's bit for bit whatever batch computes it, and a token's
//! logits do not depend on the prompt it came in.
//!
//! Block layouts (ggml-common.h). Q4_K, 144 bytes: `d: f16, dmin: f16, scales: [u8; 12]` (eight
//! 6-bit scales and eight 6-bit mins, packed), `qs: [u8; 128]` (sub-block 2j in the low nibbles
//! of bytes 32j..32j+32, sub-block 2j+1 in the high); x = d sc q - dmin m. Q6_K, 210 bytes:
//! `ql: [u8; 128]` (low 4 bits), `qh: [u8; 64]` (high 2 bits), `scales: [i8; 16]`, `d: f16`;
//! x = d sc (q - 32). AVX2 where compiled for it (x86-64-v3, .cargo/config.toml); elsewhere
//! (NEON on aarch64, portable code) each product is candle-core's one-row kernel.

use crate::ops::qdot::BlockQ8K;

/// Bytes of one Q4_K block (256 weights).
pub const Q4_K_BYTES: usize = 144;
/// Bytes of one Q6_K block (256 weights).
pub const Q6_K_BYTES: usize = 210;

/// `out[r][t] = rows[r] . xs[t]` for Q4_K rows (each `xs[t].len()` blocks).
pub fn dot_q4_k<const R: usize, const T: usize>(rows: [&[u8]; R], xs: [&[BlockQ8K]; T]) -> [[f32; T]; R] {
    check(&rows, &xs, Q4_K_BYTES);
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
    {
        // SAFETY: AVX2, FMA and F16C are compiled in (the cfg above); every row holds
        // xs[t].len() whole blocks (checked above).
        unsafe { x86::dot_q4_k(rows, xs) }
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c")))]
    rows.map(|row| xs.map(|x| crate::ops::qmatmul::candle_dot_q8_k(formats::ggml_quants::GgmlType::Q4K, row, x)))
}

/// `out[r][t] = rows[r] . xs[t]` for Q6_K rows (each `xs[t].len()` blocks).
pub fn dot_q6_k<const R: usize, const T: usize>(rows: [&[u8]; R], xs: [&[BlockQ8K]; T]) -> [[f32; T]; R] {
    check(&rows, &xs, Q6_K_BYTES);
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
    {
        // SAFETY: as in dot_q4_k.
        unsafe { x86::dot_q6_k(rows, xs) }
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c")))]
    rows.map(|row| xs.map(|x| crate::ops::qmatmul::candle_dot_q8_k(formats::ggml_quants::GgmlType::Q6K, row, x)))
}

/// Every row is as many whole blocks as every activation row.
fn check(rows: &[&[u8]], xs: &[&[BlockQ8K]], block_bytes: usize) {
    let n_blocks = xs.first().map_or(0, |x| x.len());
    assert!(
        xs.iter().all(|x| x.len() == n_blocks) && rows.iter().all(|r| r.len() == n_blocks * block_bytes),
        "k-quant rows and activations of different lengths"
    );
}

#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
mod x86 {
    use super::{BlockQ8K, Q4_K_BYTES, Q6_K_BYTES};
    use half::f16;
    use std::arch::x86_64::*;

    /// Row i (32 bytes) picks 16-bit lane i of each 128-bit half: Q4_K's scale of sub-block i
    /// in every lane.
    const SCALE_PAIR: [u8; 256] = {
        let mut t = [0u8; 256];
        let mut i = 0;
        while i < 256 {
            t[i] = (2 * (i / 32) + i % 2) as u8;
            i += 1;
        }
        t
    };
    /// Row i (16 bytes): byte 2i eight times, then byte 2i + 1: two Q6_K scales, one per 16
    /// weights.
    const SCALE_BYTE: [u8; 128] = {
        let mut t = [0u8; 128];
        let mut i = 0;
        while i < 128 {
            t[i] = (i / 8) as u8;
            i += 1;
        }
        t
    };

    #[inline(always)]
    fn f16_at(b: &[u8], at: usize) -> f32 {
        f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
    }

    /// The f32 sum of `v`'s 8 lanes, in llama.cpp's `hsum_float_8` order.
    #[inline(always)]
    unsafe fn hsum8(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }

    /// The f32 sum of `v`'s 4 lanes, in llama.cpp's order for Q4_K's minimum terms.
    #[inline(always)]
    unsafe fn hsum4(v: __m128) -> f32 {
        let s = _mm_add_ps(v, _mm_movehl_ps(v, v));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }

    /// A Q4_K block's eight 6-bit scales (16-bit lanes 0..8) and mins (8..16).
    #[inline(always)]
    unsafe fn q4_k_scales_and_mins(packed: &[u8]) -> __m256i {
        const KMASK1: u32 = 0x3f3f_3f3f;
        const KMASK2: u32 = 0x0f0f_0f0f;
        const KMASK3: u32 = 0x0303_0303;
        let w = |i: usize| u32::from_le_bytes([packed[4 * i], packed[4 * i + 1], packed[4 * i + 2], packed[4 * i + 3]]);
        let (u0, u1, u2) = (w(0), w(1), w(2));
        let u3 = ((u2 >> 4) & KMASK2) | (((u1 >> 6) & KMASK3) << 4);
        let s1 = (u2 & KMASK2) | (((u0 >> 6) & KMASK3) << 4);
        let s2 = u1 & KMASK1;
        let s0 = u0 & KMASK1;
        _mm256_cvtepu8_epi16(_mm_set_epi32(u3 as i32, s2 as i32, s1 as i32, s0 as i32))
    }

    /// Whether this CPU has AVX-512 (F, VL, BW), checked once: the same kernels then compile to
    /// EVEX code with 32 vector registers, enough to hold a 4-token product's accumulators.
    pub(super) fn avx512() -> bool {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *HAS.get_or_init(|| {
            is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512bw")
        })
    }

    /// # Safety
    /// AVX2/FMA/F16C available; every row holds `xs[t].len()` Q4_K blocks.
    pub unsafe fn dot_q4_k<const R: usize, const T: usize>(rows: [&[u8]; R], xs: [&[BlockQ8K]; T]) -> [[f32; T]; R] {
        if avx512() {
            // SAFETY: AVX-512 F/VL/BW detected; the caller's contract for the rest.
            unsafe { dot_q4_k_avx512(rows, xs) }
        } else {
            // SAFETY: the caller's contract.
            unsafe { dot_q4_k_avx2(rows, xs) }
        }
    }

    /// # Safety
    /// AVX2/FMA/F16C available; every row holds `xs[t].len()` Q6_K blocks.
    pub unsafe fn dot_q6_k<const R: usize, const T: usize>(rows: [&[u8]; R], xs: [&[BlockQ8K]; T]) -> [[f32; T]; R] {
        if avx512() {
            // SAFETY: AVX-512 F/VL/BW detected; the caller's contract for the rest.
            unsafe { dot_q6_k_avx512(rows, xs) }
        } else {
            // SAFETY: the caller's contract.
            unsafe { dot_q6_k_avx2(rows, xs) }
        }
    }

    #[target_feature(enable = "avx,avx2,fma,f16c")]
    pub(super) unsafe fn dot_q4_k_avx2<const R: usize, const T: usize>(
        rows: [&[u8]; R],
        xs: [&[BlockQ8K]; T],
    ) -> [[f32; T]; R] {
        // SAFETY: the caller's contract.
        unsafe { q4_k(rows, xs) }
    }

    #[target_feature(enable = "avx,avx2,fma,f16c,avx512f,avx512vl,avx512bw")]
    pub(super) unsafe fn dot_q4_k_avx512<const R: usize, const T: usize>(
        rows: [&[u8]; R],
        xs: [&[BlockQ8K]; T],
    ) -> [[f32; T]; R] {
        // SAFETY: the caller's contract.
        unsafe { q4_k(rows, xs) }
    }

    #[target_feature(enable = "avx,avx2,fma,f16c")]
    pub(super) unsafe fn dot_q6_k_avx2<const R: usize, const T: usize>(
        rows: [&[u8]; R],
        xs: [&[BlockQ8K]; T],
    ) -> [[f32; T]; R] {
        // SAFETY: the caller's contract.
        unsafe { q6_k(rows, xs) }
    }

    #[target_feature(enable = "avx,avx2,fma,f16c,avx512f,avx512vl,avx512bw")]
    pub(super) unsafe fn dot_q6_k_avx512<const R: usize, const T: usize>(
        rows: [&[u8]; R],
        xs: [&[BlockQ8K]; T],
    ) -> [[f32; T]; R] {
        // SAFETY: the caller's contract.
        unsafe { q6_k(rows, xs) }
    }

    /// The Q4_K product, inlined into each instruction set's entry point.
    #[inline(always)]
    unsafe fn q4_k<const R: usize, const T: usize>(rows: [&[u8]; R], xs: [&[BlockQ8K]; T]) -> [[f32; T]; R] {
        let m4 = _mm256_set1_epi8(0xF);
        let mut acc = [[_mm256_setzero_ps(); T]; R];
        let mut acc_m = [[_mm_setzero_ps(); T]; R];
        for k in 0..xs[0].len() {
            let blocks = rows.map(|r| &r[k * Q4_K_BYTES..(k + 1) * Q4_K_BYTES]);
            let ys = xs.map(|x| &x[k]);
            // the activations' sums of 32 (hadd of its sums of 16), for the minimum terms
            let q8s = ys.map(|y| {
                // SAFETY: bsums is 16 i16 (32 bytes); unaligned load.
                let s = unsafe { _mm256_loadu_si256(y.bsums.as_ptr() as *const __m256i) };
                _mm_hadd_epi16(_mm256_extracti128_si256(s, 0), _mm256_extracti128_si256(s, 1))
            });
            let mut scales = [_mm256_setzero_si256(); R];
            for r in 0..R {
                let b = blocks[r];
                // SAFETY: b[4..16] is the block's packed scales.
                let sm = unsafe { q4_k_scales_and_mins(&b[4..16]) };
                let dmin = f16_at(b, 2);
                for t in 0..T {
                    let prod = _mm_madd_epi16(_mm256_extracti128_si256(sm, 1), q8s[t]);
                    acc_m[r][t] = _mm_fmadd_ps(_mm_set1_ps(-ys[t].d * dmin), _mm_cvtepi32_ps(prod), acc_m[r][t]);
                }
                let sc = _mm256_extracti128_si256(sm, 0);
                scales[r] = _mm256_set_m128i(sc, sc);
            }
            let mut sumi = [[_mm256_setzero_si256(); T]; R];
            for j in 0..4 {
                // SAFETY: SCALE_PAIR has 8 rows of 32 bytes; j < 4.
                let (pick_l, pick_h) = unsafe {
                    (
                        _mm256_loadu_si256(SCALE_PAIR.as_ptr().add(64 * j) as *const __m256i),
                        _mm256_loadu_si256(SCALE_PAIR.as_ptr().add(64 * j + 32) as *const __m256i),
                    )
                };
                let mut w =
                    [(_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256());
                        R];
                for r in 0..R {
                    // SAFETY: the block's qs are bytes 16..144; 32 bytes at 16 + 32j, unaligned.
                    let q4 = unsafe { _mm256_loadu_si256(blocks[r].as_ptr().add(16 + 32 * j) as *const __m256i) };
                    w[r] = (
                        _mm256_and_si256(q4, m4),
                        _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4),
                        _mm256_shuffle_epi8(scales[r], pick_l),
                        _mm256_shuffle_epi8(scales[r], pick_h),
                    );
                }
                for t in 0..T {
                    // SAFETY: qs is 256 bytes; 64 at 64j, unaligned.
                    let (q8l, q8h) = unsafe {
                        (
                            _mm256_loadu_si256(ys[t].qs.as_ptr().add(64 * j) as *const __m256i),
                            _mm256_loadu_si256(ys[t].qs.as_ptr().add(64 * j + 32) as *const __m256i),
                        )
                    };
                    for r in 0..R {
                        let (q4l, q4h, scale_l, scale_h) = w[r];
                        let pl = _mm256_madd_epi16(scale_l, _mm256_maddubs_epi16(q4l, q8l));
                        let ph = _mm256_madd_epi16(scale_h, _mm256_maddubs_epi16(q4h, q8h));
                        sumi[r][t] = _mm256_add_epi32(sumi[r][t], _mm256_add_epi32(pl, ph));
                    }
                }
            }
            for r in 0..R {
                let d = f16_at(blocks[r], 0);
                for t in 0..T {
                    acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(ys[t].d * d), _mm256_cvtepi32_ps(sumi[r][t]), acc[r][t]);
                }
            }
        }
        let mut out = [[0f32; T]; R];
        for r in 0..R {
            for t in 0..T {
                // SAFETY: AVX enabled here.
                out[r][t] = unsafe { hsum8(acc[r][t]) + hsum4(acc_m[r][t]) };
            }
        }
        out
    }

    /// The Q6_K product, inlined into each instruction set's entry point.
    #[inline(always)]
    unsafe fn q6_k<const R: usize, const T: usize>(rows: [&[u8]; R], xs: [&[BlockQ8K]; T]) -> [[f32; T]; R] {
        let (m4, m2, m32s) = (_mm256_set1_epi8(0xF), _mm256_set1_epi8(3), _mm256_set1_epi8(32));
        let mut acc = [[_mm256_setzero_ps(); T]; R];
        for k in 0..xs[0].len() {
            let blocks = rows.map(|r| &r[k * Q6_K_BYTES..(k + 1) * Q6_K_BYTES]);
            let ys = xs.map(|x| &x[k]);
            // SAFETY: bytes 192..208 are the block's 16 scales; unaligned load.
            let scales = blocks.map(|b| unsafe { _mm_loadu_si128(b.as_ptr().add(192) as *const __m128i) });
            let mut sumi = [[_mm256_setzero_si256(); T]; R];
            for j in 0..2 {
                // the four sub-blocks of 32 in this half: weights (6-bit, unsigned) and scales
                let mut w = [[(_mm256_setzero_si256(), _mm256_setzero_si256()); 4]; R];
                for r in 0..R {
                    let b = blocks[r].as_ptr();
                    // SAFETY: ql is bytes 0..128 (64 at 64j), qh 128..192 (32 at 128 + 32j);
                    // SCALE_BYTE has 8 rows of 16 bytes (4j + i < 8). Unaligned loads.
                    let (lo1, lo2, hi) = unsafe {
                        (
                            _mm256_loadu_si256(b.add(64 * j) as *const __m256i),
                            _mm256_loadu_si256(b.add(64 * j + 32) as *const __m256i),
                            _mm256_loadu_si256(b.add(128 + 32 * j) as *const __m256i),
                        )
                    };
                    let high = |shift: i32| {
                        let h = match shift {
                            0 => hi,
                            2 => _mm256_srli_epi16(hi, 2),
                            4 => _mm256_srli_epi16(hi, 4),
                            _ => _mm256_srli_epi16(hi, 6),
                        };
                        _mm256_slli_epi16(_mm256_and_si256(h, m2), 4)
                    };
                    let q = [
                        _mm256_or_si256(_mm256_and_si256(lo1, m4), high(0)),
                        _mm256_or_si256(_mm256_and_si256(lo2, m4), high(2)),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo1, 4), m4), high(4)),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo2, 4), m4), high(6)),
                    ];
                    for i in 0..4 {
                        // SAFETY: as above.
                        let pick =
                            unsafe { _mm_loadu_si128(SCALE_BYTE.as_ptr().add(16 * (4 * j + i)) as *const __m128i) };
                        w[r][i] = (q[i], _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales[r], pick)));
                    }
                }
                for t in 0..T {
                    let mut q8 = [_mm256_setzero_si256(); 4];
                    let mut q8s = [_mm256_setzero_si256(); 4];
                    for i in 0..4 {
                        // SAFETY: qs is 256 bytes; 32 at 128j + 32i, unaligned.
                        q8[i] =
                            unsafe { _mm256_loadu_si256(ys[t].qs.as_ptr().add(128 * j + 32 * i) as *const __m256i) };
                        q8s[i] = _mm256_maddubs_epi16(m32s, q8[i]);
                    }
                    for r in 0..R {
                        let p = [0, 1, 2, 3].map(|i| {
                            let (q, sc) = w[r][i];
                            _mm256_madd_epi16(sc, _mm256_sub_epi16(_mm256_maddubs_epi16(q, q8[i]), q8s[i]))
                        });
                        sumi[r][t] = _mm256_add_epi32(sumi[r][t], _mm256_add_epi32(p[0], p[1]));
                        sumi[r][t] = _mm256_add_epi32(sumi[r][t], _mm256_add_epi32(p[2], p[3]));
                    }
                }
            }
            for r in 0..R {
                let d = f16_at(blocks[r], 208);
                for t in 0..T {
                    acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(ys[t].d * d), _mm256_cvtepi32_ps(sumi[r][t]), acc[r][t]);
                }
            }
        }
        let mut out = [[0f32; T]; R];
        for r in 0..R {
            for t in 0..T {
                // SAFETY: AVX enabled here.
                out[r][t] = unsafe { hsum8(acc[r][t]) };
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::qdot::quantize_q8_k;
    use candle_core::quantized::k_quants::{BlockQ4K, BlockQ6K, GgmlType as Blocks};
    use formats::ggml_quants::GgmlType;

    fn random(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
            })
            .collect()
    }

    /// `rows` rows of `cols` weights quantized to `B` (candle's quantizer: llama.cpp's), as bytes.
    fn quantized<B: Blocks>(rows: usize, cols: usize, seed: u64) -> Vec<Vec<u8>> {
        let w = random(rows * cols, seed);
        w.chunks(cols)
            .map(|row| {
                let mut b = vec![B::zeros(); cols / B::BLCK_SIZE];
                B::from_float(row, &mut b);
                let n = std::mem::size_of_val(b.as_slice());
                // SAFETY: plain-data blocks viewed as their bytes, for the test's copy only.
                unsafe { std::slice::from_raw_parts(b.as_ptr() as *const u8, n) }.to_vec()
            })
            .collect()
    }

    /// Every (rows, tokens) shape gives candle's one-row, one-token result bit for bit (the
    /// same sums in the same order), for each type, on rows of several blocks whose
    /// activations span a wide range (one token scaled by 1e3, one by 1e-3).
    #[test]
    fn every_batch_shape_equals_the_one_row_kernel_bit_for_bit() {
        let cols = 1536;
        let xs: Vec<Vec<BlockQ8K>> = (0..4)
            .map(|t| {
                let scale = [1.0, 1e3, 1e-3, 7.5][t];
                quantize_q8_k(&random(cols, 100 + t as u64).iter().map(|v| v * scale).collect::<Vec<_>>())
            })
            .collect();
        let x = |t: usize| xs[t].as_slice();
        for ty in [GgmlType::Q4K, GgmlType::Q6K] {
            let rows = match ty {
                GgmlType::Q4K => quantized::<BlockQ4K>(4, cols, 3),
                _ => quantized::<BlockQ6K>(4, cols, 4),
            };
            let want: Vec<Vec<f32>> = rows
                .iter()
                .map(|r| (0..4).map(|t| crate::ops::qmatmul::candle_dot_q8_k(ty, r, x(t))).collect())
                .collect();
            let (r4, r2, r1) = ([&rows[0][..], &rows[1], &rows[2], &rows[3]], [&rows[0][..], &rows[1]], [&rows[0][..]]);
            let (got41, got14, got22, got11) = match ty {
                GgmlType::Q4K => (
                    dot_q4_k(r4, [x(0)]),
                    dot_q4_k(r1, [x(0), x(1), x(2), x(3)]),
                    dot_q4_k(r2, [x(0), x(1)]),
                    dot_q4_k(r1, [x(2)]),
                ),
                _ => (
                    dot_q6_k(r4, [x(0)]),
                    dot_q6_k(r1, [x(0), x(1), x(2), x(3)]),
                    dot_q6_k(r2, [x(0), x(1)]),
                    dot_q6_k(r1, [x(2)]),
                ),
            };
            for r in 0..4 {
                assert_eq!(got41[r][0].to_bits(), want[r][0].to_bits(), "{}: row {r}", ty.name());
            }
            for t in 0..4 {
                assert_eq!(got14[0][t].to_bits(), want[0][t].to_bits(), "{}: token {t}", ty.name());
            }
            for r in 0..2 {
                for t in 0..2 {
                    assert_eq!(got22[r][t].to_bits(), want[r][t].to_bits(), "{}: {r}, {t}", ty.name());
                }
            }
            assert_eq!(got11[0][0].to_bits(), want[0][2].to_bits());
            assert!(want.iter().flatten().all(|v| v.is_finite() && *v != 0.0));
        }
    }

    /// The AVX2 code and the AVX-512 code (chosen at run time) are the same sums: equal bit
    /// for bit on every shape (skipped where the CPU has no AVX-512).
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
    #[test]
    fn both_instruction_sets_give_the_same_bits() {
        if !x86::avx512() {
            eprintln!("no AVX-512 here: only the AVX2 code runs");
            return;
        }
        let cols = 768;
        let xs: Vec<Vec<BlockQ8K>> = (0..4).map(|t| quantize_q8_k(&random(cols, 200 + t))).collect();
        let x = [&xs[0][..], &xs[1], &xs[2], &xs[3]];
        let q4 = quantized::<BlockQ4K>(2, cols, 8);
        let q6 = quantized::<BlockQ6K>(2, cols, 9);
        let bits = |v: [[f32; 4]; 2]| v.map(|r| r.map(f32::to_bits));
        // SAFETY: AVX2/FMA/F16C compiled in, AVX-512 detected above; rows of whole blocks.
        unsafe {
            assert_eq!(bits(x86::dot_q4_k_avx2([&q4[0], &q4[1]], x)), bits(x86::dot_q4_k_avx512([&q4[0], &q4[1]], x)));
            assert_eq!(bits(x86::dot_q6_k_avx2([&q6[0], &q6[1]], x)), bits(x86::dot_q6_k_avx512([&q6[0], &q6[1]], x)));
        }
    }
}
