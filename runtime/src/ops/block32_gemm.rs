//! A prompt's product with weights in 32-value blocks against Q8_0 activations (Q4_0, Q5_0,
//! Q8_0) as an integer matrix product, where [`kquant_gemm::available`] (AVX-512 VNNI, or the
//! aarch64 dot-product extension): `out[t, o] = w[o, :] . x[t, :]` for many tokens at once, the
//! tokens' Q8_0 rows laid out once per product in tiles of 16 and each task's rows unpacked
//! once, 8 at a time, into one signed byte per weight (Q4_0 `q - 8`, Q5_0 `q - 16`, Q8_0 as
//! stored).
//!
//! Each block's integer sum of 32 products is exact; it is scaled by `d_w x d_x` with one fused
//! multiply-add per block, row and token, block after block. Decode computes each row the same
//! way ([`dot_row`], [`matvec`]), so a token's products are the same bits whether it went
//! through the product with 15 others or alone: a reply does not depend on how its tokens were
//! batched (a chat's cached prefix, a short continuation). `vpdpbusd` multiplies unsigned by
//! signed bytes: on x86-64 the tokens' bytes go in with their sign bit flipped (`x + 128`) and
//! `128 x` each block's weight sum comes off; `SDOT` multiplies signed bytes as they are.

use crate::ops::kquant_gemm::{available, ROWS, TOKENS};
use crate::ops::qdot::BlockQ8_0;
use formats::ggml_quants::GgmlType;

/// Values per block.
const QK: usize = 32;

/// Whether `ty` has an integer product here.
pub fn supports(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0)
}

/// Up to 16 tokens' rows laid out for the product: per block, 8 groups of the 16 tokens' 4
/// bytes side by side, and each token's scale.
pub struct TokenTile {
    /// `[n_blocks][8][TOKENS][4]`
    qs: Vec<i8>,
    /// `[n_blocks][TOKENS]`
    d: Vec<f32>,
}

impl TokenTile {
    /// Up to 16 tokens' rows of the same length; missing tokens are zeros.
    pub fn new(xs: &[&[BlockQ8_0]]) -> Self {
        assert!(xs.len() <= TOKENS && !xs.is_empty());
        let nb = xs[0].len();
        let mut tile = TokenTile { qs: vec![0; nb * QK * TOKENS], d: vec![0.0; nb * TOKENS] };
        for (t, x) in xs.iter().enumerate() {
            assert_eq!(x.len(), nb, "token rows of different lengths");
            for (b, y) in x.iter().enumerate() {
                for g in 0..QK / 4 {
                    let at = ((b * QK / 4 + g) * TOKENS + t) * 4;
                    tile.qs[at..at + 4].copy_from_slice(&y.qs[4 * g..4 * g + 4]);
                }
                tile.d[b * TOKENS + t] = y.d.to_f32();
            }
        }
        tile
    }
}

/// 8 weight rows unpacked: one signed byte per weight, each block's scale and weight sum.
struct RowTile {
    /// `[n_blocks][8][ROWS][4]`: each 4 consecutive weights of the 8 rows side by side
    q: Vec<i8>,
    /// `[ROWS][n_blocks]`
    d: Vec<f32>,
    /// `[ROWS][n_blocks]`: the sum of the block's 32 weights (x86-64's correction)
    sum: Vec<i32>,
}

impl RowTile {
    fn new(nb: usize) -> Self {
        RowTile { q: vec![0; nb * QK * ROWS], d: vec![0.0; ROWS * nb], sum: vec![0; ROWS * nb] }
    }

    /// Unpacks `rows[i]` (whole blocks of `ty`) into row i.
    fn unpack(&mut self, ty: GgmlType, rows: [&[u8]; ROWS]) {
        let nb = self.d.len() / ROWS;
        let bytes = ty.block_bytes();
        let mut w = [0i8; QK];
        for (i, row) in rows.iter().enumerate() {
            for b in 0..nb {
                self.d[i * nb + b] = unpack_block(ty, &row[b * bytes..(b + 1) * bytes], &mut w);
                self.sum[i * nb + b] = w.iter().map(|&v| v as i32).sum();
                for g in 0..QK / 4 {
                    let at = b * QK * ROWS + (g * ROWS + i) * 4;
                    self.q[at..at + 4].copy_from_slice(&w[4 * g..4 * g + 4]);
                }
            }
        }
    }
}

/// One block of `ty` as 32 signed weights into `w`; returns its scale.
#[inline]
fn unpack_block(ty: GgmlType, blk: &[u8], w: &mut [i8; QK]) -> f32 {
    let f16 = |at: usize| half::f16::from_le_bytes([blk[at], blk[at + 1]]).to_f32();
    match ty {
        GgmlType::Q4_0 => {
            for (j, &q) in blk[2..18].iter().enumerate() {
                w[j] = (q & 0xF) as i8 - 8;
                w[j + 16] = (q >> 4) as i8 - 8;
            }
            f16(0)
        }
        GgmlType::Q5_0 => {
            let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
            let hi = |k: usize| (((qh >> k) & 1) << 4) as u8;
            for (j, &q) in blk[6..22].iter().enumerate() {
                w[j] = ((q & 0xF) | hi(j)) as i8 - 16;
                w[j + 16] = ((q >> 4) | hi(j + 16)) as i8 - 16;
            }
            f16(0)
        }
        GgmlType::Q8_0 => {
            w.iter_mut().zip(&blk[2..34]).for_each(|(w, &q)| *w = q as i8);
            f16(0)
        }
        t => panic!("no 32-value integer product for {}", t.name()),
    }
}

/// One row of `ty` blocks against one token, with the arithmetic of one lane of [`product`]:
/// each block's exact integer sum, then `sum = fma(isum, d_w x d_x, sum)`, block after block.
pub fn dot_row(ty: GgmlType, row: &[u8], x: &[BlockQ8_0]) -> f32 {
    assert_eq!(row.len(), x.len() * ty.block_bytes());
    let mut sum = 0f32;
    for (blk, y) in row.chunks_exact(ty.block_bytes()).zip(x) {
        #[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
        // SAFETY: AVX2 is a target feature of this build; `blk` is one whole block of `ty`.
        let (isum, d) = unsafe { x86::block_sum(ty, blk, &y.qs) };
        #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2")))]
        let (isum, d) = {
            let mut w = [0i8; QK];
            let d = unpack_block(ty, blk, &mut w);
            (w.iter().zip(&y.qs).map(|(&a, &b)| a as i32 * b as i32).sum::<i32>(), d)
        };
        sum = (isum as f32).mul_add(d * y.d.to_f32(), sum);
    }
    sum
}

/// `rows[r] . token t` for the first `n_rows` (a multiple of [`ROWS`]) rows of `ty` blocks,
/// `row_bytes` a row in `bytes`, and every tile's tokens, handed to `put(t0, r0, acc)` as
/// [`crate::ops::kquant_gemm::product`] hands them. Only where [`available`] and
/// [`supports`]`(ty)`.
pub fn product(
    ty: GgmlType,
    bytes: &[u8],
    row_bytes: usize,
    n_rows: usize,
    tiles: &[TokenTile],
    put: &mut impl FnMut(usize, usize, &[[f32; TOKENS]; ROWS]),
) {
    assert!(available(), "the integer product needs AVX-512 VNNI or the dot-product extension");
    assert!(supports(ty), "no 32-value integer product for {}", ty.name());
    let nb = tiles[0].d.len() / TOKENS;
    assert!(n_rows.is_multiple_of(ROWS) && row_bytes == nb * ty.block_bytes() && bytes.len() >= n_rows * row_bytes);
    let mut unpacked = RowTile::new(nb);
    for r0 in (0..n_rows).step_by(ROWS) {
        unpacked.unpack(ty, std::array::from_fn(|i| &bytes[(r0 + i) * row_bytes..(r0 + i + 1) * row_bytes]));
        for (k, tile) in tiles.iter().enumerate() {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX-512 F/BW/VL/VNNI detected (asserted above); the tile and the unpacked
            // rows hold nb blocks each (built for the same columns).
            let acc = unsafe { x86::tile(&unpacked, tile, nb) };
            #[cfg(target_arch = "aarch64")]
            // SAFETY: the dot-product extension detected (asserted above); the tile and the
            // unpacked rows hold nb blocks each (built for the same columns).
            let acc = unsafe { neon::tile(&unpacked, tile, nb) };
            #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
            let acc = [[0f32; TOKENS]; ROWS];
            put(k * TOKENS, r0, &acc);
        }
    }
}

/// `out[i] = row i . x` for the rows of `ty` blocks in `rows` (`row_bytes` each), each the
/// bits of [`dot_row`]: 8 rows at a time where the build has AVX2 and FMA.
pub fn matvec(ty: GgmlType, rows: &[u8], row_bytes: usize, x: &[BlockQ8_0], out: &mut [f32]) {
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
    let done = {
        let xs: Vec<(&[i8; QK], f32)> = x.iter().map(|y| (&y.qs, y.d.to_f32())).collect();
        assert_eq!(row_bytes, xs.len() * ty.block_bytes());
        // with VNNI the 4- and 5-bit weights multiply unsigned, their offset taken off once per
        // block through the activations' sum
        let vnni = available();
        let x_sums: Vec<i32> =
            if vnni { x.iter().map(|y| y.qs.iter().map(|&v| v as i32).sum()).collect() } else { Vec::new() };
        let whole = out.len() / 8 * 8;
        for r in (0..whole).step_by(8) {
            let rows8 = &rows[r * row_bytes..(r + 8) * row_bytes];
            let v = if vnni {
                // SAFETY: AVX-512 F/BW/VL/VNNI detected; 8 whole rows from `r`, a sum per block.
                unsafe { x86::dot_rows8_vnni(ty, rows8, row_bytes, &xs, &x_sums) }
            } else {
                // SAFETY: AVX2 and FMA are target features of this build; 8 whole rows from `r`.
                unsafe { x86::dot_rows8(ty, rows8, row_bytes, &xs) }
            };
            out[r..r + 8].copy_from_slice(&v);
        }
        whole
    };
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma")))]
    let done = 0;
    for (i, o) in out.iter_mut().enumerate().skip(done) {
        *o = dot_row(ty, &rows[i * row_bytes..(i + 1) * row_bytes], x);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{RowTile, TokenTile, QK, ROWS, TOKENS};
    use formats::ggml_quants::GgmlType;
    use std::arch::x86_64::*;

    /// One block of `ty` against 32 activation bytes: the exact integer sum of the 32
    /// products and the block's scale, as [`super::unpack_block`] and a sum over its weights
    /// give them.
    ///
    /// # Safety
    /// AVX2 available; `blk` is one whole block of `ty` (one of the 32-value types).
    #[cfg(target_feature = "avx2")]
    #[inline(always)]
    pub unsafe fn block_sum(ty: GgmlType, blk: &[u8], x: &[i8; QK]) -> (i32, f32) {
        // SAFETY: the caller's contract.
        let (w, d) = unsafe { weights(ty, blk) };
        let d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(d as i32)));
        // SAFETY: `x` is 32 bytes; unaligned load.
        // SAFETY: AVX2 (the caller's contract); `x` is 32 bytes, an unaligned load.
        let quads = unsafe { products(w, _mm256_loadu_si256(x.as_ptr() as *const __m256i)) };
        let s = _mm_add_epi32(_mm256_castsi256_si128(quads), _mm256_extracti128_si256(quads, 1));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
        (_mm_cvtsi128_si32(s), d)
    }

    /// 8 sums of 4 adjacent products of the weights `w` and the activations `x` (32 bytes each).
    ///
    /// # Safety
    /// AVX2 available.
    #[cfg(target_feature = "avx2")]
    #[inline(always)]
    unsafe fn products(w: __m256i, x: __m256i) -> __m256i {
        // |w| x (x with w's sign): pairs of at most 128 x 127 fit i16, then pairs of i16 to i32
        let pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
        _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
    }

    /// 8 rows of `ty` (`row_bytes` apart in `rows`) against one token's blocks `xs` (bytes and
    /// scale per block): lane i is row i's [`super::dot_row`], bit for bit (the same
    /// exact block sums, the same fused multiply-adds in block order), 8 rows' chains side by side.
    ///
    /// # Safety
    /// AVX2 and FMA available; `rows` holds 8 rows of `xs.len()` blocks of `ty`.
    #[cfg(all(target_feature = "avx2", target_feature = "fma"))]
    pub unsafe fn dot_rows8(ty: GgmlType, rows: &[u8], row_bytes: usize, xs: &[(&[i8; QK], f32)]) -> [f32; 8] {
        let bytes = ty.block_bytes();
        assert!(rows.len() >= 7 * row_bytes + xs.len() * bytes);
        let mut acc = _mm256_setzero_ps();
        for (b, &(xq, dx)) in xs.iter().enumerate() {
            prefetch_next_rows(rows.as_ptr(), row_bytes, xs.len(), b);
            // SAFETY: `xq` is 32 bytes; unaligned load.
            let xv = unsafe { _mm256_loadu_si256(xq.as_ptr() as *const __m256i) };
            let r: [(__m256i, u16); 8] = std::array::from_fn(|i| {
                let at = i * row_bytes + b * bytes;
                // SAFETY: block b of row i is in bounds (asserted above); AVX2 (the caller's
                // contract).
                unsafe {
                    let (w, d) = weights(ty, &rows[at..at + bytes]);
                    (products(w, xv), d)
                }
            });
            // SAFETY: AVX2, FMA and F16C (the caller's contract).
            acc = unsafe { add_scaled(acc, row_sums8(r.each_ref().map(|x| x.0)), r.map(|x| x.1), dx) };
        }
        let mut out = [0f32; 8];
        // SAFETY: 8 f32; unaligned store.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), acc) };
        out
    }

    /// While block `b` of the 8 rows at `rows` (`nb` blocks each) computes, asks for block b's
    /// share of the next 8 rows' cache lines, so that pass's loads find them in cache: the 8
    /// rows are 8 short streams a row apart (612 bytes for a Q8_0 row of 576 values), which the
    /// hardware's prefetchers do not run ahead of. A prefetch reads nothing and never faults,
    /// so the last pass asks for lines past the rows harmlessly.
    #[inline(always)]
    fn prefetch_next_rows(rows: *const u8, row_bytes: usize, nb: usize, b: usize) {
        let lines = (8 * row_bytes).div_ceil(64);
        let per_block = lines.div_ceil(nb);
        let next = rows.wrapping_add(8 * row_bytes);
        for k in b * per_block..((b + 1) * per_block).min(lines) {
            // SAFETY: a prefetch is a hint: it dereferences nothing.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(64 * k) as *const i8) };
        }
    }

    /// `acc + isum x d_w x dx`, lane i row i's block: one fused multiply-add per row, `scales`
    /// the 8 rows' block scales (f16 bits).
    ///
    /// # Safety
    /// AVX2, FMA and F16C available.
    #[cfg(all(target_feature = "avx2", target_feature = "fma"))]
    #[inline(always)]
    unsafe fn add_scaled(acc: __m256, isum: __m256i, scales: [u16; 8], dx: f32) -> __m256 {
        let v = scales.map(|x| x as i16);
        let d = _mm256_cvtph_ps(_mm_setr_epi16(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]));
        _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d, _mm256_set1_ps(dx)), acc)
    }

    /// Lane i: the sum of `r[i]`'s 8 lanes (8 rows' block sums side by side).
    ///
    /// # Safety
    /// AVX2 available.
    #[cfg(target_feature = "avx2")]
    #[inline(always)]
    unsafe fn row_sums8(r: [__m256i; 8]) -> __m256i {
        let (s01, s23) = (_mm256_hadd_epi32(r[0], r[1]), _mm256_hadd_epi32(r[2], r[3]));
        let (s45, s67) = (_mm256_hadd_epi32(r[4], r[5]), _mm256_hadd_epi32(r[6], r[7]));
        let (lo, hi) = (_mm256_hadd_epi32(s01, s23), _mm256_hadd_epi32(s45, s67));
        _mm256_add_epi32(_mm256_permute2x128_si256(lo, hi, 0x20), _mm256_permute2x128_si256(lo, hi, 0x31))
    }

    /// [`dot_rows8`] with `vpdpbusd` (AVX-512 VNNI on 256 bits): Q4_0 and Q5_0 weights multiply
    /// as stored (0..15, 0..31) and `8` or `16` x the block's activation sum (`x_sums`) comes off
    /// the 8 rows' sums at once; Q8_0's as `|w|` by `x` with w's sign. The same exact block
    /// sums, so lane i is row i's [`super::dot_row`], bit for bit.
    ///
    /// # Safety
    /// AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI available; `rows` holds 8 rows of `xs.len()`
    /// blocks of `ty`; `x_sums[b]` is the sum of `xs[b]`'s 32 bytes.
    #[cfg(all(target_feature = "avx2", target_feature = "fma"))]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn dot_rows8_vnni(
        ty: GgmlType,
        rows: &[u8],
        row_bytes: usize,
        xs: &[(&[i8; QK], f32)],
        x_sums: &[i32],
    ) -> [f32; 8] {
        let bytes = ty.block_bytes();
        assert!(rows.len() >= 7 * row_bytes + xs.len() * bytes && x_sums.len() == xs.len());
        // SAFETY (each arm): the caller's contract, the rows' bounds asserted above.
        match ty {
            GgmlType::Q8_0 => unsafe { rows8_vnni::<Q8_0>(rows.as_ptr(), row_bytes, xs, x_sums) },
            GgmlType::Q4_0 => unsafe { rows8_vnni::<Q4_0>(rows.as_ptr(), row_bytes, xs, x_sums) },
            GgmlType::Q5_0 => unsafe { rows8_vnni::<Q5_0>(rows.as_ptr(), row_bytes, xs, x_sums) },
            t => panic!("no 32-value decode kernel for {}", t.name()),
        }
    }

    /// The 32-value types of [`rows8_vnni`], as its constant parameter.
    const Q8_0: u8 = 0;
    const Q4_0: u8 = 1;
    const Q5_0: u8 = 2;

    /// [`dot_rows8_vnni`] for one type (`KIND`, a constant: no branch on the type per block).
    ///
    /// # Safety
    /// As [`dot_rows8_vnni`]; `rows` points at 8 rows of `xs.len()` blocks of the type.
    #[cfg(all(target_feature = "avx2", target_feature = "fma"))]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    unsafe fn rows8_vnni<const KIND: u8>(
        rows: *const u8,
        row_bytes: usize,
        xs: &[(&[i8; QK], f32)],
        x_sums: &[i32],
    ) -> [f32; 8] {
        // the type and the offset its stored weights carry
        let (ty, offset) = match KIND {
            Q8_0 => (GgmlType::Q8_0, 0),
            Q4_0 => (GgmlType::Q4_0, 8),
            _ => (GgmlType::Q5_0, 16),
        };
        let bytes = ty.block_bytes();
        let mut acc = _mm256_setzero_ps();
        for (b, (&(xq, dx), &sx)) in xs.iter().zip(x_sums).enumerate() {
            prefetch_next_rows(rows, row_bytes, xs.len(), b);
            // SAFETY: `xq` is 32 bytes; unaligned load.
            let xv = unsafe { _mm256_loadu_si256(xq.as_ptr() as *const __m256i) };
            let sums: [__m256i; 8] = std::array::from_fn(|i| {
                // SAFETY: block b of row i is inside the caller's rows; the features (the
                // caller's contract).
                unsafe {
                    let blk = rows.add(i * row_bytes + b * bytes);
                    if KIND == Q8_0 {
                        let w = _mm256_loadu_si256(blk.add(2) as *const __m256i);
                        _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(w), _mm256_sign_epi8(xv, w))
                    } else {
                        _mm256_dpbusd_epi32(_mm256_setzero_si256(), unsigned_block(blk, KIND == Q5_0), xv)
                    }
                }
            });
            let scales: [u16; 8] = std::array::from_fn(|i| {
                // SAFETY: the block's first 2 bytes, its f16 scale, are inside the rows.
                unsafe { (rows.add(i * row_bytes + b * bytes) as *const u16).read_unaligned() }
            });
            // SAFETY: AVX2, FMA and F16C (the caller's contract).
            acc = unsafe {
                let isum = _mm256_sub_epi32(row_sums8(sums), _mm256_set1_epi32(offset * sx));
                add_scaled(acc, isum, scales, dx)
            };
        }
        let mut out = [0f32; 8];
        // SAFETY: 8 f32; unaligned store.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), acc) };
        out
    }

    /// The 32 unsigned weights of the Q4_0 block (`five_bit` false) or Q5_0 block at `blk`:
    /// bytes 0..16 the low nibbles (weights j), 16..32 the high (weights j + 16), Q5_0's fifth
    /// bit from bit j of its `qh`.
    ///
    /// # Safety
    /// AVX2 available; `blk` points at a whole block of that type.
    #[cfg(target_feature = "avx2")]
    #[inline(always)]
    unsafe fn unsigned_block(blk: *const u8, five_bit: bool) -> __m256i {
        // SAFETY (caller): the nibbles (16 bytes after the scale, and qh for Q5_0) and qh's 4
        // bytes are inside the block; unaligned loads.
        unsafe {
            let q = _mm_loadu_si128(blk.add(if five_bit { 6 } else { 2 }) as *const __m128i);
            let low = _mm_set1_epi8(0x0F);
            let nibbles = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), low), _mm_and_si128(q, low));
            if !five_bit {
                return nibbles;
            }
            let qh = (blk.add(2) as *const i32).read_unaligned();
            // byte j of the vector: bit j of qh, spread to 0xFF or 0 (llama.cpp's
            // bytes_from_bits_32), then 16 where set
            let spread = _mm256_shuffle_epi8(
                _mm256_set1_epi32(qh),
                _mm256_setr_epi64x(0, 0x0101_0101_0101_0101, 0x0202_0202_0202_0202, 0x0303_0303_0303_0303),
            );
            let set = _mm256_cmpeq_epi8(
                _mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe)),
                _mm256_set1_epi64x(-1),
            );
            _mm256_or_si256(nibbles, _mm256_and_si256(set, _mm256_set1_epi8(16)))
        }
    }

    /// One block of `ty` as 32 signed weights in a vector and its scale (f16 bits).
    ///
    /// # Safety
    /// AVX2 available; `blk` is one whole block of `ty` (one of the 32-value types).
    #[cfg(target_feature = "avx2")]
    #[inline(always)]
    unsafe fn weights(ty: GgmlType, blk: &[u8]) -> (__m256i, u16) {
        // SAFETY (caller): one whole block of `ty`; unaligned loads inside it.
        unsafe {
            match ty {
                GgmlType::Q4_0 | GgmlType::Q5_0 => {
                    let q = unsigned_block(blk.as_ptr(), ty == GgmlType::Q5_0);
                    let offset = if ty == GgmlType::Q4_0 { 8 } else { 16 };
                    (_mm256_sub_epi8(q, _mm256_set1_epi8(offset)), u16::from_le_bytes([blk[0], blk[1]]))
                }
                GgmlType::Q8_0 => {
                    (_mm256_loadu_si256(blk.as_ptr().add(2) as *const __m256i), u16::from_le_bytes([blk[0], blk[1]]))
                }
                t => panic!("no 32-value integer product for {}", t.name()),
            }
        }
    }

    /// # Safety
    /// AVX-512 F/BW/VL/VNNI available; `tile` and `rows` hold `nb` blocks.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn tile(rows: &RowTile, tile: &TokenTile, nb: usize) -> [[f32; TOKENS]; ROWS] {
        let mut out = [[0f32; TOKENS]; ROWS];
        let mut acc = [_mm512_setzero_ps(); ROWS];
        let flip = _mm512_set1_epi8(i8::MIN);
        for b in 0..nb {
            let q = rows.q[b * QK * ROWS..].as_ptr();
            let xq = tile.qs[b * QK * TOKENS..].as_ptr();
            // (x + 128) . w = x . w + 128 sum(w): the weight sums come off first
            let mut isum: [__m512i; ROWS] = std::array::from_fn(|i| _mm512_set1_epi32(-128 * rows.sum[i * nb + b]));
            for g in 0..QK / 4 {
                // SAFETY: group g < 8 of block b: 64 bytes of tokens and 32 of weights in
                // bounds, read unaligned.
                unsafe {
                    let x = _mm512_xor_si512(_mm512_loadu_si512(xq.add(g * TOKENS * 4) as *const __m512i), flip);
                    for (i, s) in isum.iter_mut().enumerate() {
                        let w = (q.add((g * ROWS + i) * 4) as *const i32).read_unaligned();
                        *s = _mm512_dpbusd_epi32(*s, x, _mm512_set1_epi32(w));
                    }
                }
            }
            // SAFETY: 16 f32 in bounds (b < nb); unaligned load.
            let yd = unsafe { _mm512_loadu_ps(tile.d.as_ptr().add(b * TOKENS)) };
            for (i, (acc, isum)) in acc.iter_mut().zip(&isum).enumerate() {
                let d = _mm512_mul_ps(_mm512_set1_ps(rows.d[i * nb + b]), yd);
                *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(*isum), d, *acc);
            }
        }
        for (o, a) in out.iter_mut().zip(&acc) {
            // SAFETY: o is 16 f32; unaligned store.
            unsafe { _mm512_storeu_ps(o.as_mut_ptr(), *a) };
        }
        out
    }
}

#[cfg(target_arch = "aarch64")]
mod neon {
    use super::{RowTile, TokenTile, QK, ROWS, TOKENS};
    use crate::ops::kquant_gemm::neon::{store, sub_block_sums};
    use std::arch::aarch64::*;

    /// # Safety
    /// The dot-product extension is here; `tile` and `rows` hold `nb` blocks.
    pub unsafe fn tile(rows: &RowTile, tile: &TokenTile, nb: usize) -> [[f32; TOKENS]; ROWS] {
        let mut acc = [[[vdupq_n_f32(0.0); 2]; 4]; TOKENS / 4];
        for b in 0..nb {
            let q = rows.q[b * QK * ROWS..].as_ptr();
            let d: [f32; ROWS] = std::array::from_fn(|i| rows.d[i * nb + b]);
            // SAFETY: 8 values; unaligned loads of 4 at 0 and 4.
            let d = unsafe { [vld1q_f32(d.as_ptr()), vld1q_f32(d.as_ptr().add(4))] };
            for (quad, acc) in acc.iter_mut().enumerate() {
                let xq = tile.qs[b * QK * TOKENS + 16 * quad..].as_ptr();
                // SAFETY: the caller's contract; the block's 8 groups.
                let s = unsafe { sub_block_sums(q, xq, 0, QK / 4) };
                for (t, (acc, s)) in acc.iter_mut().zip(&s).enumerate() {
                    let token = b * TOKENS + 4 * quad + t;
                    for h in 0..2 {
                        acc[h] = vfmaq_f32(acc[h], vcvtq_f32_s32(s[h]), vmulq_n_f32(d[h], tile.d[token]));
                    }
                }
            }
        }
        store(&acc)
    }
}

#[cfg(all(test, target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
mod tests {
    use super::*;

    /// Decode's two x86-64 kernels (AVX2, and `vpdpbusd` where the CPU has AVX-512 VNNI) give
    /// the same bits on random blocks of each type, every byte value in the weights.
    #[test]
    fn both_decode_kernels_give_the_same_bits() {
        if !available() {
            eprintln!("no AVX-512 VNNI here: decode runs the AVX2 kernel only");
            return;
        }
        let nb = 24;
        let mut s = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let x: Vec<f32> = (0..nb * QK).map(|_| (next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0).collect();
        let xb = crate::ops::qdot::quantize_q8_0(&x);
        let xs: Vec<(&[i8; QK], f32)> = xb.iter().map(|y| (&y.qs, y.d.to_f32())).collect();
        let sums: Vec<i32> = xb.iter().map(|y| y.qs.iter().map(|&v| v as i32).sum()).collect();
        for ty in [GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0] {
            let bytes = ty.block_bytes();
            let mut rows: Vec<u8> = (0..8 * nb * bytes).map(|_| next() as u8).collect();
            for blk in rows.chunks_exact_mut(bytes) {
                // a scale of 2^-7 .. 2^-4: finite and normal
                blk[..2].copy_from_slice(&half::f16::from_f32(1.0 / (16 << (next() % 4)) as f32).to_le_bytes());
            }
            // SAFETY: AVX2 and FMA are target features of this build, AVX-512 VNNI detected;
            // 8 rows of nb blocks, a sum per block.
            let (a, b) = unsafe {
                (x86::dot_rows8(ty, &rows, nb * bytes, &xs), x86::dot_rows8_vnni(ty, &rows, nb * bytes, &xs, &sums))
            };
            assert_eq!(a.map(f32::to_bits), b.map(f32::to_bits), "{}", ty.name());
            for (i, v) in a.iter().enumerate() {
                let one = dot_row(ty, &rows[i * nb * bytes..(i + 1) * nb * bytes], &xb);
                assert_eq!(v.to_bits(), one.to_bits(), "{}: row {i}", ty.name());
            }
        }
    }
}
