//! Q4_K and Q6_K rows interleaved by eight for decode on CPUs with AVX-512 VNNI (x86-64) or the
//! dot-product extension (aarch64): `out[o] = w[o, :] . x` with the eight rows of a group in the
//! eight i32 lanes of one vector (two on aarch64), so one `vpdpbusd` (two `SDOT`s) multiplies 4
//! weights of each of 8 rows by the same 4 activations (broadcast),
//! the sub-block scales (and Q4_K's mins) apply to 8 rows in one multiply, and no row needs a
//! horizontal sum. This is the layout llama.cpp's repacked CPU kernels use for the same reason
//! (its `q4_K_8x8`); a matrix is interleaved once when it is loaded for a run with every row
//! in memory (`model::DecodeLayout::Interleaved`).
//!
//! A group of 8 rows is stored block by block (256 columns), each group block holding the 8
//! rows' blocks with every field side by side:
//! - Q4_K ([`Q4_K_GROUP_BYTES`]): `d: [f16; 8]`, `dmin: [f16; 8]`, then the 6-bit sub-block
//!   scales and mins unpacked from Q4_K's 12 packed bytes (`scales: [[u8; 8]; 8]`, `mins`, each
//!   `[sub-block][row]`), then `qs: [[[u8; 4]; 8]; 32]`: for byte offset `4k` of Q4_K's 128
//!   nibble bytes, the 8 rows' 4 bytes side by side (bytes `32j..32j + 32` of a row hold
//!   sub-block `2j` in their low nibbles and `2j + 1` in their high ones, as in Q4_K).
//! - Q6_K ([`Q6_K_GROUP_BYTES`], 8 x 210): `d: [f16; 8]`, `scales: [[i8; 8]; 16]`
//!   (`[sub-block][row]`), then `ql` (128 bytes a row) and `qh` (64) as 4-byte groups of the 8
//!   rows side by side.
//!
//! The integer sums are the block's exactly (sub-block sums times scales, less Q4_K's mins or
//! Q6_K's offset of 32 times the activation's sums); the f32 sums run per block (one fused
//! multiply-add per block and row), so a product differs from [`crate::ops::kquant_dot`]'s in
//! the last bits, as the prompt's integer product ([`crate::ops::kquant_gemm`]) does (tested
//! within the same bound).

use crate::ops::qdot::{BlockQ8K, QK_K};
use formats::ggml_quants::GgmlType;

/// Rows interleaved together.
pub const ROWS: usize = 8;
const Q4_K_BYTES: usize = 144;
const Q6_K_BYTES: usize = 210;
/// Bytes of a Q4_K group block: 8 x 144 and 32 more for the unpacked scales.
pub const Q4_K_GROUP_BYTES: usize = 16 + 16 + 64 + 64 + 1024;
/// Bytes of a Q6_K group block: 8 x 210.
pub const Q6_K_GROUP_BYTES: usize = 16 + 128 + 1024 + 512;

/// Q4_K group block: where each field starts.
mod q4k {
    pub const D: usize = 0;
    pub const DMIN: usize = 16;
    pub const SCALES: usize = 32;
    pub const MINS: usize = 96;
    pub const QS: usize = 160;
}

/// Q6_K group block: where each field starts. The weights' bits come first, in the order the
/// kernel reads them: for each half `n` and 4-byte group `g` of it, 96 bytes: the 8 rows' `ql`
/// bytes `64n + 4g..`, then `64n + 32 + 4g..`, then `qh` bytes `32n + 4g..`.
mod q6k {
    pub const BITS: usize = 0;
    pub const SCALES: usize = 1536;
    pub const D: usize = 1664;

    /// Where row `i`'s `ql` bytes `4k..4k + 4` are.
    pub fn ql_at(k: usize, i: usize) -> usize {
        let (n, r) = (k / 16, k % 16);
        BITS + 96 * (8 * n + r % 8) + 32 * (r / 8) + 4 * i
    }

    /// Where row `i`'s `qh` bytes `4k..4k + 4` are.
    pub fn qh_at(k: usize, i: usize) -> usize {
        BITS + 96 * k + 64 + 4 * i
    }
}

/// Whether matrices of `ty` are interleaved on this CPU (Q4_K and Q6_K, with AVX-512 F, BW,
/// VL and VNNI on x86-64 or the dot-product extension on aarch64).
pub fn supports(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4K | GgmlType::Q6K) && crate::ops::kquant_gemm::available()
}

/// Bytes of a group block of `ty`.
pub fn group_block_bytes(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q4K => Q4_K_GROUP_BYTES,
        GgmlType::Q6K => Q6_K_GROUP_BYTES,
        t => panic!("{} rows are not interleaved", t.name()),
    }
}

/// Bytes of a group of 8 rows of `cols` columns.
pub fn group_bytes(ty: GgmlType, cols: usize) -> usize {
    cols / QK_K * group_block_bytes(ty)
}

/// Q4_K's eight 6-bit scales and eight 6-bit mins from its 12 packed bytes.
fn unpack_scales(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
    for j in 0..8 {
        (sc[j], m[j]) = if j < 4 {
            (s[j] & 63, s[j + 4] & 63)
        } else {
            ((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
        };
    }
    (sc, m)
}

/// The 12 packed bytes of eight 6-bit scales and mins (the inverse of [`unpack_scales`]).
fn pack_scales(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..4 {
        s[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        s[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
        s[j + 8] = (sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4);
    }
    s
}

/// Copies row `i`'s block `blk` into group block `dst`, or (`back`) the other way.
fn place(ty: GgmlType, dst: &mut [u8], blk: &mut [u8], i: usize, back: bool) {
    let mut copy = |at_group: usize, at_row: usize, n: usize| {
        if back {
            blk[at_row..at_row + n].copy_from_slice(&dst[at_group..at_group + n]);
        } else {
            dst[at_group..at_group + n].copy_from_slice(&blk[at_row..at_row + n]);
        }
    };
    match ty {
        GgmlType::Q4K => {
            copy(q4k::D + 2 * i, 0, 2);
            copy(q4k::DMIN + 2 * i, 2, 2);
            for k in 0..32 {
                copy(q4k::QS + 32 * k + 4 * i, 16 + 4 * k, 4);
            }
            if back {
                let sc = std::array::from_fn(|j| dst[q4k::SCALES + 8 * j + i]);
                let m = std::array::from_fn(|j| dst[q4k::MINS + 8 * j + i]);
                blk[4..16].copy_from_slice(&pack_scales(&sc, &m));
            } else {
                let (sc, m) = unpack_scales(&blk[4..16]);
                for j in 0..8 {
                    dst[q4k::SCALES + 8 * j + i] = sc[j];
                    dst[q4k::MINS + 8 * j + i] = m[j];
                }
            }
        }
        GgmlType::Q6K => {
            copy(q6k::D + 2 * i, 208, 2);
            for j in 0..16 {
                copy(q6k::SCALES + 8 * j + i, 192 + j, 1);
            }
            for k in 0..32 {
                copy(q6k::ql_at(k, i), 4 * k, 4);
            }
            for k in 0..16 {
                copy(q6k::qh_at(k, i), 128 + 4 * k, 4);
            }
        }
        t => panic!("{} rows are not interleaved", t.name()),
    }
}

fn block_bytes(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q4K => Q4_K_BYTES,
        _ => Q6_K_BYTES,
    }
}

/// `bytes` (`rows` rows of `cols` weights of `ty`, row after row) interleaved by eight.
pub fn interleave(ty: GgmlType, bytes: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    let mut out = vec![0u8; rows / ROWS * group_bytes(ty, cols)];
    interleave_into(ty, bytes, cols, &mut out);
    out
}

/// [`interleave`] into `out`: `bytes` is whole groups of rows of `cols` weights, row after row,
/// `out` as many groups interleaved.
pub fn interleave_into(ty: GgmlType, bytes: &[u8], cols: usize, out: &mut [u8]) {
    let (nb, gbb, bb) = (cols / QK_K, group_block_bytes(ty), block_bytes(ty));
    let row_bytes = nb * bb;
    let rows = bytes.len() / row_bytes;
    assert!(
        rows.is_multiple_of(ROWS)
            && cols.is_multiple_of(QK_K)
            && bytes.len() == rows * row_bytes
            && out.len() == rows / ROWS * nb * gbb
    );
    let mut blk = vec![0u8; bb];
    for (g, group) in out.chunks_exact_mut(nb * gbb).enumerate() {
        for (b, dst) in group.chunks_exact_mut(gbb).enumerate() {
            for i in 0..ROWS {
                blk.copy_from_slice(&bytes[(ROWS * g + i) * row_bytes + b * bb..][..bb]);
                place(ty, dst, &mut blk, i, false);
            }
        }
    }
}

/// Row `r`'s blocks as stored before [`interleave`] (bit for bit).
pub fn row(ty: GgmlType, inter: &[u8], cols: usize, r: usize) -> Vec<u8> {
    let (nb, gbb, bb) = (cols / QK_K, group_block_bytes(ty), block_bytes(ty));
    let (g, i) = (r / ROWS, r % ROWS);
    let mut out = vec![0u8; nb * bb];
    let mut group_block = vec![0u8; gbb];
    for (b, blk) in out.chunks_exact_mut(bb).enumerate() {
        group_block.copy_from_slice(&inter[(g * nb + b) * gbb..][..gbb]);
        place(ty, &mut group_block, blk, i, true);
    }
    out
}

/// A group block's weights unpacked for the prompt's integer product, one byte per weight
/// (Q4_K 0..15, Q6_K 0..63) into `q` `[64][8][4]`: for each 4 consecutive weights, the 8 rows'
/// side by side.
pub fn unpack_weights(ty: GgmlType, block: &[u8], q: &mut [u8]) {
    let q: &mut [[u8; 32]] = bytemuck::cast_slice_mut(&mut q[..64 * 32]);
    let vec = |at: usize| -> [u8; 32] { block[at..at + 32].try_into().expect("32 bytes") };
    match ty {
        GgmlType::Q4K => {
            for j in 0..4 {
                for g in 0..8 {
                    let v = vec(q4k::QS + 32 * (8 * j + g));
                    q[16 * j + g] = v.map(|b| b & 0xF);
                    q[16 * j + 8 + g] = v.map(|b| b >> 4);
                }
            }
        }
        GgmlType::Q6K => {
            for n in 0..2 {
                for g in 0..8 {
                    let at = q6k::BITS + 96 * (8 * n + g);
                    let (l0, l1, h) = (vec(at), vec(at + 32), vec(at + 64));
                    let group = 32 * n + g;
                    q[group] = std::array::from_fn(|k| (l0[k] & 0xF) | ((h[k] & 3) << 4));
                    q[group + 8] = std::array::from_fn(|k| (l1[k] & 0xF) | (((h[k] >> 2) & 3) << 4));
                    q[group + 16] = std::array::from_fn(|k| (l0[k] >> 4) | (((h[k] >> 4) & 3) << 4));
                    q[group + 24] = std::array::from_fn(|k| (l1[k] >> 4) | (((h[k] >> 6) & 3) << 4));
                }
            }
        }
        t => panic!("{} rows are not interleaved", t.name()),
    }
}

/// Row `i`'s scales in a group block, as integers into `scales` `[16]` (Q4_K: the 8 sub-block
/// scales then the 8 mins; Q6_K: the 16 scales), and its `d` and Q4_K's `dmin` (0 for Q6_K).
pub fn row_scales(ty: GgmlType, block: &[u8], i: usize, scales: &mut [i32]) -> (f32, f32) {
    let f16 = |at: usize| half::f16::from_le_bytes([block[at], block[at + 1]]).to_f32();
    match ty {
        GgmlType::Q4K => {
            for j in 0..8 {
                scales[j] = block[q4k::SCALES + 8 * j + i] as i32;
                scales[8 + j] = block[q4k::MINS + 8 * j + i] as i32;
            }
            (f16(q4k::D + 2 * i), f16(q4k::DMIN + 2 * i))
        }
        GgmlType::Q6K => {
            for (j, s) in scales.iter_mut().enumerate().take(16) {
                *s = block[q6k::SCALES + 8 * j + i] as i8 as i32;
            }
            (f16(q6k::D + 2 * i), 0.0)
        }
        t => panic!("{} rows are not interleaved", t.name()),
    }
}

/// `out[8k + i] = row (8 (g0 + k) + i) . x` for the groups `g0..g0 + out.len() / 8` of a
/// matrix of `ty` interleaved by eight, `x.len()` blocks a row. Only where [`supports`] `ty`.
pub fn matvec_groups(ty: GgmlType, inter: &[u8], x: &[BlockQ8K], g0: usize, out: &mut [f32]) {
    assert!(supports(ty), "no interleaved kernel for {} on this CPU", ty.name());
    let group = x.len() * group_block_bytes(ty);
    assert!(out.len().is_multiple_of(ROWS) && inter.len() >= (g0 + out.len() / ROWS) * group);
    for (k, dst) in out.chunks_exact_mut(ROWS).enumerate() {
        let g = &inter[(g0 + k) * group..][..group];
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512 F/BW/VL/VNNI detected (asserted above); the group holds x.len()
        // group blocks of ty.
        dst.copy_from_slice(&unsafe {
            if ty == GgmlType::Q4K {
                x86::q4_k_group(g, x)
            } else {
                x86::q6_k_group(g, x)
            }
        });
        #[cfg(target_arch = "aarch64")]
        // SAFETY: the dot-product extension detected (asserted above); the group holds
        // x.len() group blocks of ty.
        dst.copy_from_slice(&unsafe {
            if ty == GgmlType::Q4K {
                neon::q4_k_group(g, x)
            } else {
                neon::q6_k_group(g, x)
            }
        });
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        let _ = (g, dst);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use std::arch::x86_64::*;

    /// The 8 rows' bytes of group `k` (4 bytes a row) at `at` of a group block.
    ///
    /// # Safety
    /// `p + at + 32 (k + 1)` is within the group block.
    #[inline(always)]
    unsafe fn rows4(p: *const u8, at: usize, k: usize) -> __m256i {
        // SAFETY: the caller's contract; unaligned load.
        unsafe { _mm256_loadu_si256(p.add(at + 32 * k) as *const __m256i) }
    }

    /// 4 activations at `at`, broadcast to the 8 lanes.
    ///
    /// # Safety
    /// `at + 4 <= 256`.
    #[inline(always)]
    unsafe fn x4(y: &BlockQ8K, at: usize) -> __m256i {
        // SAFETY: the caller's contract; unaligned read of 4 bytes of qs.
        _mm256_set1_epi32(unsafe { (y.qs.as_ptr().add(at) as *const i32).read_unaligned() })
    }

    /// 8 bytes at `at` (one per row) widened to i32: unsigned, or (`signed`) signed.
    ///
    /// # Safety
    /// `p + at + 8` is within the group block.
    #[inline(always)]
    unsafe fn lanes(p: *const u8, at: usize, signed: bool) -> __m256i {
        // SAFETY: the caller's contract; unaligned 8-byte load.
        let v = unsafe { _mm_loadl_epi64(p.add(at) as *const __m128i) };
        if signed {
            _mm256_cvtepi8_epi32(v)
        } else {
            _mm256_cvtepu8_epi32(v)
        }
    }

    /// # Safety
    /// AVX-512 F/BW/VL/VNNI available; `group` holds `x.len()` Q4_K group blocks.
    #[target_feature(enable = "avx,avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn q4_k_group(group: &[u8], x: &[BlockQ8K]) -> [f32; ROWS] {
        debug_assert!(group.len() >= x.len() * Q4_K_GROUP_BYTES);
        let m4 = _mm256_set1_epi8(0xF);
        let mut acc = _mm256_setzero_ps();
        for (b, y) in x.iter().enumerate() {
            let p = group[b * Q4_K_GROUP_BYTES..].as_ptr();
            let mut isum = _mm256_setzero_si256();
            for j in 0..4 {
                // sub-blocks 2j (low nibbles) and 2j + 1 (high), two chains each
                let mut s = [_mm256_setzero_si256(); 4];
                for g in 0..8 {
                    // SAFETY: 8j + g < 32 groups of qs; activations 64j + 4g (+ 32) + 4 <= 256.
                    unsafe {
                        let v = rows4(p, q4k::QS, 8 * j + g);
                        let lo = _mm256_and_si256(v, m4);
                        let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                        s[g % 2] = _mm256_dpbusd_epi32(s[g % 2], lo, x4(y, 64 * j + 4 * g));
                        s[2 + g % 2] = _mm256_dpbusd_epi32(s[2 + g % 2], hi, x4(y, 64 * j + 32 + 4 * g));
                    }
                }
                // SAFETY: sub-blocks 2j, 2j + 1 < 8 of the scales.
                let (sl, sh) =
                    unsafe { (lanes(p, q4k::SCALES + 16 * j, false), lanes(p, q4k::SCALES + 16 * j + 8, false)) };
                let lo = _mm256_mullo_epi32(_mm256_add_epi32(s[0], s[1]), sl);
                let hi = _mm256_mullo_epi32(_mm256_add_epi32(s[2], s[3]), sh);
                isum = _mm256_add_epi32(isum, _mm256_add_epi32(lo, hi));
            }
            // the mins' term: each sub-block's 32 activations' sum times the rows' mins
            let mut msum = _mm256_setzero_si256();
            for j in 0..8 {
                let bs = y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32;
                // SAFETY: sub-block j < 8 of the mins.
                let m = unsafe { lanes(p, q4k::MINS + 8 * j, false) };
                msum = _mm256_add_epi32(msum, _mm256_mullo_epi32(m, _mm256_set1_epi32(bs)));
            }
            // SAFETY: 16 bytes of d and of dmin in the group block; unaligned loads.
            let (d, dmin) = unsafe {
                (
                    _mm256_cvtph_ps(_mm_loadu_si128(p.add(q4k::D) as *const __m128i)),
                    _mm256_cvtph_ps(_mm_loadu_si128(p.add(q4k::DMIN) as *const __m128i)),
                )
            };
            let yd = _mm256_set1_ps(y.d);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d, yd), acc);
            acc = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_mul_ps(dmin, yd), acc);
        }
        let mut out = [0f32; ROWS];
        // SAFETY: out is 8 f32; unaligned store.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), acc) };
        out
    }

    /// # Safety
    /// AVX-512 F/BW/VL/VNNI available; `group` holds `x.len()` Q6_K group blocks.
    #[target_feature(enable = "avx,avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn q6_k_group(group: &[u8], x: &[BlockQ8K]) -> [f32; ROWS] {
        debug_assert!(group.len() >= x.len() * Q6_K_GROUP_BYTES);
        let (m4, m2) = (_mm256_set1_epi8(0xF), _mm256_set1_epi8(3));
        let mut acc = _mm256_setzero_ps();
        for (b, y) in x.iter().enumerate() {
            let p = group[b * Q6_K_GROUP_BYTES..].as_ptr();
            let mut isum = _mm256_setzero_si256();
            for n in 0..2 {
                // s[h][i]: weights 128n + 32i + 16h.. (sub-block 8n + 2i + h)
                let mut s = [[_mm256_setzero_si256(); 4]; 2];
                for (h, s) in s.iter_mut().enumerate() {
                    for g in 4 * h..4 * h + 4 {
                        // SAFETY: 96 (8n + g) + 96 <= 1536 bytes of bits; activations
                        // 128n + 96 + 4g + 4 <= 256.
                        unsafe {
                            let at = q6k::BITS + 96 * (8 * n + g);
                            let (l0, l1, hi) = (rows4(p, at, 0), rows4(p, at, 1), rows4(p, at, 2));
                            let q0 = _mm256_or_si256(
                                _mm256_and_si256(l0, m4),
                                _mm256_slli_epi16(_mm256_and_si256(hi, m2), 4),
                            );
                            let q1 = _mm256_or_si256(
                                _mm256_and_si256(l1, m4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hi, 2), m2), 4),
                            );
                            let q2 = _mm256_or_si256(
                                _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hi, 4), m2), 4),
                            );
                            let q3 = _mm256_or_si256(
                                _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hi, 6), m2), 4),
                            );
                            s[0] = _mm256_dpbusd_epi32(s[0], q0, x4(y, 128 * n + 4 * g));
                            s[1] = _mm256_dpbusd_epi32(s[1], q1, x4(y, 128 * n + 32 + 4 * g));
                            s[2] = _mm256_dpbusd_epi32(s[2], q2, x4(y, 128 * n + 64 + 4 * g));
                            s[3] = _mm256_dpbusd_epi32(s[3], q3, x4(y, 128 * n + 96 + 4 * g));
                        }
                    }
                }
                for (h, s) in s.iter().enumerate() {
                    for (i, &sum) in s.iter().enumerate() {
                        let sb = 8 * n + 2 * i + h;
                        // the weights are stored + 32: 32 x the 16 activations' sum comes off
                        let dot = _mm256_sub_epi32(sum, _mm256_set1_epi32(32 * y.bsums[sb] as i32));
                        // SAFETY: sub-block sb < 16 of the scales.
                        let sc = unsafe { lanes(p, q6k::SCALES + 8 * sb, true) };
                        isum = _mm256_add_epi32(isum, _mm256_mullo_epi32(dot, sc));
                    }
                }
            }
            // SAFETY: 16 bytes of d in the group block; unaligned load.
            let d = unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.add(q6k::D) as *const __m128i)) };
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d, _mm256_set1_ps(y.d)), acc);
        }
        let mut out = [0f32; ROWS];
        // SAFETY: out is 8 f32; unaligned store.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), acc) };
        out
    }
}

#[cfg(target_arch = "aarch64")]
mod neon {
    use super::*;
    use crate::ops::sdot::sdot;
    use std::arch::aarch64::*;

    /// The 8 rows' bytes of group `k` (4 bytes a row) at `at` of a group block, as rows 0..4
    /// and 4..8.
    ///
    /// # Safety
    /// `p + at + 32 (k + 1)` is within the group block.
    #[inline(always)]
    unsafe fn rows4(p: *const u8, at: usize, k: usize) -> [uint8x16_t; 2] {
        // SAFETY: the caller's contract; unaligned loads.
        unsafe { [vld1q_u8(p.add(at + 32 * k)), vld1q_u8(p.add(at + 32 * k + 16))] }
    }

    /// 4 activations at `at`, broadcast to the 4 lanes.
    ///
    /// # Safety
    /// `at + 4 <= 256`.
    #[inline(always)]
    unsafe fn x4(y: &BlockQ8K, at: usize) -> int8x16_t {
        // SAFETY: the caller's contract; unaligned read of 4 bytes of qs.
        let v = unsafe { (y.qs.as_ptr().add(at) as *const i32).read_unaligned() };
        // SAFETY: NEON is the aarch64 baseline; registers only.
        unsafe { vreinterpretq_s8_s32(vdupq_n_s32(v)) }
    }

    /// 8 bytes at `at` (one per row) widened to i32 as rows 0..4 and 4..8: unsigned, or
    /// (`signed`) signed.
    ///
    /// # Safety
    /// `p + at + 8` is within the group block.
    #[inline(always)]
    unsafe fn lanes(p: *const u8, at: usize, signed: bool) -> [int32x4_t; 2] {
        // SAFETY: the caller's contract; unaligned 8-byte loads.
        unsafe {
            if signed {
                let v = vmovl_s8(vld1_s8(p.add(at) as *const i8));
                [vmovl_s16(vget_low_s16(v)), vmovl_s16(vget_high_s16(v))]
            } else {
                let v = vmovl_u8(vld1_u8(p.add(at)));
                [vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(v))), vreinterpretq_s32_u32(vmovl_u16(vget_high_u16(v)))]
            }
        }
    }

    /// The 8 f16 at `at` as f32, rows 0..4 and 4..8.
    ///
    /// # Safety
    /// `p + at + 16` is within the group block.
    #[inline(always)]
    unsafe fn f16x8(p: *const u8, at: usize) -> [float32x4_t; 2] {
        // SAFETY: the caller's contract; 16 bytes read.
        let b: [u8; 16] = unsafe { std::ptr::read_unaligned(p.add(at) as *const [u8; 16]) };
        let v: [f32; 8] = std::array::from_fn(|i| half::f16::from_le_bytes([b[2 * i], b[2 * i + 1]]).to_f32());
        // SAFETY: v is 8 f32; unaligned loads.
        unsafe { [vld1q_f32(v.as_ptr()), vld1q_f32(v.as_ptr().add(4))] }
    }

    fn store(acc: [float32x4_t; 2]) -> [f32; ROWS] {
        let mut out = [0f32; ROWS];
        // SAFETY: out is 8 f32; unaligned stores.
        unsafe {
            vst1q_f32(out.as_mut_ptr(), acc[0]);
            vst1q_f32(out.as_mut_ptr().add(4), acc[1]);
        }
        out
    }

    /// # Safety
    /// The dot-product extension is here; `group` holds `x.len()` Q4_K group blocks.
    pub unsafe fn q4_k_group(group: &[u8], x: &[BlockQ8K]) -> [f32; ROWS] {
        debug_assert!(group.len() >= x.len() * Q4_K_GROUP_BYTES);
        // SAFETY: NEON is the aarch64 baseline; SDOT is here (the caller's contract); every
        // load is within the group block as each helper states.
        unsafe {
            let m4 = vdupq_n_u8(0xF);
            let mut acc = [vdupq_n_f32(0.0); 2];
            for (b, y) in x.iter().enumerate() {
                let p = group[b * Q4_K_GROUP_BYTES..].as_ptr();
                let mut isum = [vdupq_n_s32(0); 2];
                for j in 0..4 {
                    // sub-blocks 2j (low nibbles) and 2j + 1 (high), per half of the rows
                    let (mut lo, mut hi) = ([vdupq_n_s32(0); 2], [vdupq_n_s32(0); 2]);
                    for g in 0..8 {
                        // 8j + g < 32 groups of qs; activations 64j + 4g (+ 32) + 4 <= 256
                        let v = rows4(p, q4k::QS, 8 * j + g);
                        let (xl, xh) = (x4(y, 64 * j + 4 * g), x4(y, 64 * j + 32 + 4 * g));
                        for h in 0..2 {
                            lo[h] = sdot(lo[h], vreinterpretq_s8_u8(vandq_u8(v[h], m4)), xl);
                            hi[h] = sdot(hi[h], vreinterpretq_s8_u8(vshrq_n_u8::<4>(v[h])), xh);
                        }
                    }
                    let (sl, sh) = (lanes(p, q4k::SCALES + 16 * j, false), lanes(p, q4k::SCALES + 16 * j + 8, false));
                    for h in 0..2 {
                        isum[h] = vaddq_s32(isum[h], vaddq_s32(vmulq_s32(lo[h], sl[h]), vmulq_s32(hi[h], sh[h])));
                    }
                }
                // the mins' term: each sub-block's 32 activations' sum times the rows' mins
                let mut msum = [vdupq_n_s32(0); 2];
                for j in 0..8 {
                    let bs = y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32;
                    let m = lanes(p, q4k::MINS + 8 * j, false);
                    for h in 0..2 {
                        msum[h] = vaddq_s32(msum[h], vmulq_n_s32(m[h], bs));
                    }
                }
                let (d, dmin) = (f16x8(p, q4k::D), f16x8(p, q4k::DMIN));
                for h in 0..2 {
                    acc[h] = vfmaq_f32(acc[h], vcvtq_f32_s32(isum[h]), vmulq_n_f32(d[h], y.d));
                    acc[h] = vfmsq_f32(acc[h], vcvtq_f32_s32(msum[h]), vmulq_n_f32(dmin[h], y.d));
                }
            }
            store(acc)
        }
    }

    /// # Safety
    /// The dot-product extension is here; `group` holds `x.len()` Q6_K group blocks.
    pub unsafe fn q6_k_group(group: &[u8], x: &[BlockQ8K]) -> [f32; ROWS] {
        debug_assert!(group.len() >= x.len() * Q6_K_GROUP_BYTES);
        // SAFETY: NEON is the aarch64 baseline; SDOT is here (the caller's contract); every
        // load is within the group block as each helper states.
        unsafe {
            let (m4, m2) = (vdupq_n_u8(0xF), vdupq_n_u8(3));
            let mut acc = [vdupq_n_f32(0.0); 2];
            for (b, y) in x.iter().enumerate() {
                let p = group[b * Q6_K_GROUP_BYTES..].as_ptr();
                let mut isum = [vdupq_n_s32(0); 2];
                for n in 0..2 {
                    // s[h][i][half]: weights 128n + 32i + 16h.. (sub-block 8n + 2i + h)
                    let mut s = [[[vdupq_n_s32(0); 2]; 4]; 2];
                    for (h, s) in s.iter_mut().enumerate() {
                        for g in 4 * h..4 * h + 4 {
                            // 96 (8n + g) + 96 <= 1536 bytes of bits; activations
                            // 128n + 96 + 4g + 4 <= 256
                            let at = q6k::BITS + 96 * (8 * n + g);
                            let (l0, l1, hi) = (rows4(p, at, 0), rows4(p, at, 1), rows4(p, at, 2));
                            let xs: [int8x16_t; 4] = std::array::from_fn(|i| x4(y, 128 * n + 32 * i + 4 * g));
                            for half in 0..2 {
                                let q = [
                                    vorrq_u8(vandq_u8(l0[half], m4), vshlq_n_u8::<4>(vandq_u8(hi[half], m2))),
                                    vorrq_u8(
                                        vandq_u8(l1[half], m4),
                                        vshlq_n_u8::<4>(vandq_u8(vshrq_n_u8::<2>(hi[half]), m2)),
                                    ),
                                    vorrq_u8(
                                        vshrq_n_u8::<4>(l0[half]),
                                        vshlq_n_u8::<4>(vandq_u8(vshrq_n_u8::<4>(hi[half]), m2)),
                                    ),
                                    vorrq_u8(vshrq_n_u8::<4>(l1[half]), vshlq_n_u8::<4>(vshrq_n_u8::<6>(hi[half]))),
                                ];
                                for i in 0..4 {
                                    s[i][half] = sdot(s[i][half], vreinterpretq_s8_u8(q[i]), xs[i]);
                                }
                            }
                        }
                    }
                    for (h, s) in s.iter().enumerate() {
                        for (i, sum) in s.iter().enumerate() {
                            let sb = 8 * n + 2 * i + h;
                            // the weights are stored + 32: 32 x the 16 activations' sum comes off
                            let bias = vdupq_n_s32(32 * y.bsums[sb] as i32);
                            let sc = lanes(p, q6k::SCALES + 8 * sb, true);
                            for half in 0..2 {
                                isum[half] = vaddq_s32(isum[half], vmulq_s32(vsubq_s32(sum[half], bias), sc[half]));
                            }
                        }
                    }
                }
                let d = f16x8(p, q6k::D);
                for h in 0..2 {
                    acc[h] = vfmaq_f32(acc[h], vcvtq_f32_s32(isum[h]), vmulq_n_f32(d[h], y.d));
                }
            }
            store(acc)
        }
    }
}
