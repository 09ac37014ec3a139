//! A prompt's product with Q4_K, Q5_K or Q6_K weights on CPUs with AVX-512 VNNI (x86-64) or the
//! dot-product extension (aarch64): `out[t, o] = w[o, :] . x[t, :]` for many tokens at once, as
//! an integer matrix product.
//!
//! The weight rows are unpacked once per task, 8 rows at a time, into one byte per weight (Q4_K
//! 0..15, Q5_K 0..31, Q6_K 0..63; Q5_K then runs Q4_K's kernel, whose scales and mins it shares) with their sub-block scales; the tokens' Q8_K rows are laid out once per
//! product, 16 tokens at a time, as 4-byte groups of the 16 tokens side by side. Then one
//! `vpdpbusd` multiplies 4 weights of a row by the same 4 positions of 16 tokens and adds them
//! to 16 exact integer sums; each sub-block's sum is scaled by its integer scale, each 256-weight
//! block's by its f32 scales. The same sums as the one-token kernels, in integers; the f32 sums
//! per block run in a different order (one fused multiply-add per block and token), so a token's
//! result differs from [`crate::ops::kquant_dot`]'s in the last bits (tested within 1e-5 of
//! |w| |x|). llama.cpp's prompt path on such CPUs works the same way (its `tiled` kernels).
//! On aarch64 `SDOT` by element multiplies 4 weights of 4 rows by the same 4 positions of one
//! token, 4 tokens at a time, with the same integer sums and per-block f32 operations as on
//! x86-64. Where the CPU lacks both, [`available`] is false and the caller
//! uses `kquant_dot`.

use crate::ops::interleaved;
use crate::ops::qdot::{BlockQ8K, QK_K};
use formats::ggml_quants::GgmlType;

/// Tokens side by side in a vector (16 i32 lanes).
pub const TOKENS: usize = 16;
/// Weight rows unpacked together.
pub const ROWS: usize = 8;

/// Whether this CPU runs the integer product (x86-64: AVX-512 F, BW, VL and VNNI; aarch64: the
/// dot-product extension), checked once.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *HAS.get_or_init(|| {
            is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512vnni")
        })
    }
    #[cfg(target_arch = "aarch64")]
    {
        crate::ops::sdot::available()
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    false
}

/// 16 tokens' Q8_K rows laid out for the product: per 256-value block, 64 groups of the 16
/// tokens' 4 bytes (`qs[block][group][token][4]`), each token's scale, and each token's sums
/// of 16 values.
pub struct TokenTile {
    /// `[n_blocks][64][TOKENS][4]`
    qs: Vec<i8>,
    /// `[n_blocks][TOKENS]`
    d: Vec<f32>,
    /// `[n_blocks][16][TOKENS]`: the sum of each 16 values
    sums16: Vec<i32>,
    /// `[n_blocks][4][TOKENS]`: the sums of 32 values `64p..64p + 32` and `64p + 32..64p + 64`
    /// as the low and high i16 of one i32 (each at most 32 x 128 in magnitude), for Q4_K's mins
    /// (x86-64: two sub-blocks' mins a `vpdpwssd`)
    #[cfg(target_arch = "x86_64")]
    sums32_pairs: Vec<i32>,
}

impl TokenTile {
    /// Up to 16 tokens' rows (`xs[t].len()` blocks each); missing tokens are zeros.
    pub fn new(xs: &[&[BlockQ8K]]) -> Self {
        assert!(xs.len() <= TOKENS && !xs.is_empty());
        let nb = xs[0].len();
        let mut tile = TokenTile {
            qs: vec![0; nb * 64 * TOKENS * 4],
            d: vec![0.0; nb * TOKENS],
            sums16: vec![0; nb * 16 * TOKENS],
            #[cfg(target_arch = "x86_64")]
            sums32_pairs: vec![0; nb * 4 * TOKENS],
        };
        for (t, x) in xs.iter().enumerate() {
            assert_eq!(x.len(), nb, "token rows of different lengths");
            for (b, y) in x.iter().enumerate() {
                for g in 0..64 {
                    let at = ((b * 64 + g) * TOKENS + t) * 4;
                    tile.qs[at..at + 4].copy_from_slice(&y.qs[4 * g..4 * g + 4]);
                }
                tile.d[b * TOKENS + t] = y.d;
                for s in 0..16 {
                    tile.sums16[(b * 16 + s) * TOKENS + t] = y.bsums[s] as i32;
                }
                #[cfg(target_arch = "x86_64")]
                for p in 0..4 {
                    let sum32 = |j: usize| (y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32) as i16 as u16 as u32;
                    tile.sums32_pairs[(b * 4 + p) * TOKENS + t] = (sum32(2 * p) | (sum32(2 * p + 1) << 16)) as i32;
                }
            }
        }
        tile
    }
}

/// 8 weight rows unpacked: one byte per weight and each block's scales, as integers.
struct RowTile {
    /// `[n_blocks][64][ROWS][4]`: one byte per weight (Q4_K 0..15, Q5_K 0..31, Q6_K 0..63), each 4
    /// consecutive weights of the 8 rows side by side
    q: Vec<u8>,
    /// `[ROWS][n_blocks][16]`: Q4_K and Q5_K the 8 sub-block scales then the 8 mins; Q6_K the
    /// 16 scales
    scales: Vec<i32>,
    /// `[ROWS][n_blocks]`
    d: Vec<f32>,
    /// `[ROWS][n_blocks]`: Q4_K's and Q5_K's dmin
    dmin: Vec<f32>,
}

impl RowTile {
    fn new(cols: usize) -> Self {
        let nb = cols / QK_K;
        RowTile {
            q: vec![0; ROWS * cols],
            scales: vec![0; ROWS * nb * 16],
            d: vec![0.0; ROWS * nb],
            dmin: vec![0.0; ROWS * nb],
        }
    }

    /// Unpacks one group of 8 rows of `ty` interleaved by eight (`ops::interleaved`).
    fn unpack_interleaved(&mut self, ty: GgmlType, group: &[u8]) {
        let nb = self.d.len() / ROWS;
        let gbb = interleaved::group_block_bytes(ty);
        for b in 0..nb {
            let block = &group[b * gbb..(b + 1) * gbb];
            interleaved::unpack_weights(ty, block, &mut self.q[b * QK_K * ROWS..(b + 1) * QK_K * ROWS]);
            for i in 0..ROWS {
                let sc = &mut self.scales[(i * nb + b) * 16..(i * nb + b + 1) * 16];
                (self.d[i * nb + b], self.dmin[i * nb + b]) = interleaved::row_scales(ty, block, i, sc);
            }
        }
    }

    /// Weights `4k..4k + 4` of row `i` in block `b`, one byte each.
    fn put4(&mut self, b: usize, k: usize, i: usize, w: u32) {
        let at = b * QK_K * ROWS + (k * ROWS + i) * 4;
        self.q[at..at + 4].copy_from_slice(&w.to_le_bytes());
    }

    /// Unpacks `rows[i]` (whole blocks of `ty`) into row i.
    fn unpack(&mut self, ty: GgmlType, rows: [&[u8]; ROWS]) {
        const LOW4: u32 = 0x0F0F_0F0F;
        const LOW2: u32 = 0x0303_0303;
        let word = |x: &[u8], at: usize| u32::from_le_bytes([x[at], x[at + 1], x[at + 2], x[at + 3]]);
        let nb = self.d.len() / ROWS;
        for (i, row) in rows.iter().enumerate() {
            for b in 0..nb {
                let sc = &mut self.scales[(i * nb + b) * 16..(i * nb + b + 1) * 16];
                let f16 = |x: &[u8], at: usize| half::f16::from_le_bytes([x[at], x[at + 1]]).to_f32();
                match ty {
                    GgmlType::Q4K => {
                        let blk = &row[b * 144..(b + 1) * 144];
                        self.d[i * nb + b] = f16(blk, 0);
                        self.dmin[i * nb + b] = f16(blk, 2);
                        k_scale_mins(&blk[4..16], sc);
                        for j in 0..4 {
                            for g in 0..8 {
                                // qs bytes 32j + 4g..: weights 64j + 4g.. (low) and 64j + 32 + 4g.. (high)
                                let v = word(blk, 16 + 32 * j + 4 * g);
                                self.put4(b, 16 * j + g, i, v & LOW4);
                                self.put4(b, 16 * j + 8 + g, i, (v >> 4) & LOW4);
                            }
                        }
                    }
                    GgmlType::Q5K => {
                        // Q4_K's scales and 4 low bits, and a fifth bit per weight: qh byte l's
                        // bit 2j for weight 64j + l, bit 2j + 1 for weight 64j + 32 + l
                        let blk = &row[b * 176..(b + 1) * 176];
                        self.d[i * nb + b] = f16(blk, 0);
                        self.dmin[i * nb + b] = f16(blk, 2);
                        k_scale_mins(&blk[4..16], sc);
                        const BIT0: u32 = 0x0101_0101;
                        for j in 0..4 {
                            for g in 0..8 {
                                let (v, h) = (word(blk, 48 + 32 * j + 4 * g), word(blk, 16 + 4 * g));
                                self.put4(b, 16 * j + g, i, (v & LOW4) | (((h >> (2 * j)) & BIT0) << 4));
                                self.put4(b, 16 * j + 8 + g, i, ((v >> 4) & LOW4) | (((h >> (2 * j + 1)) & BIT0) << 4));
                            }
                        }
                    }
                    GgmlType::Q6K => {
                        let blk = &row[b * 210..(b + 1) * 210];
                        let (ql, qh) = (&blk[0..128], &blk[128..192]);
                        self.d[i * nb + b] = f16(blk, 208);
                        for (j, s) in sc.iter_mut().enumerate() {
                            *s = blk[192 + j] as i8 as i32;
                        }
                        for n in 0..2 {
                            for g in 0..8 {
                                // weights 128n + 4g.. (+ 32, + 64, + 96) from ql bytes 64n + 4g..
                                // and 64n + 32 + 4g.., qh bytes 32n + 4g..
                                let (l0, l1, h) =
                                    (word(ql, 64 * n + 4 * g), word(ql, 64 * n + 32 + 4 * g), word(qh, 32 * n + 4 * g));
                                let k = 32 * n + g;
                                self.put4(b, k, i, (l0 & LOW4) | ((h & LOW2) << 4));
                                self.put4(b, k + 8, i, (l1 & LOW4) | (((h >> 2) & LOW2) << 4));
                                self.put4(b, k + 16, i, ((l0 >> 4) & LOW4) | (((h >> 4) & LOW2) << 4));
                                self.put4(b, k + 24, i, ((l1 >> 4) & LOW4) | (((h >> 6) & LOW2) << 4));
                            }
                        }
                    }
                    t => panic!("no integer product for {}", t.name()),
                }
            }
        }
    }
}

/// Q4_K's and Q5_K's 12 bytes of 6-bit sub-block scales and mins as `sc[0..8]` (scales) and
/// `sc[8..16]` (mins).
fn k_scale_mins(s: &[u8], sc: &mut [i32]) {
    for j in 0..8 {
        let (scale, min) = if j < 4 {
            (s[j] & 63, s[j + 4] & 63)
        } else {
            ((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
        };
        sc[j] = scale as i32;
        sc[8 + j] = min as i32;
    }
}

/// The weight rows of a product.
pub enum WeightRows<'a> {
    /// `row_bytes` bytes of `ty` blocks a row, row after row.
    RowMajor { bytes: &'a [u8], row_bytes: usize },
    /// Rows interleaved by eight (`ops::interleaved`), whole groups.
    Interleaved(&'a [u8]),
}

/// `rows[r] . token t` for the first `n_rows` (a multiple of [`ROWS`]) rows of `ty` blocks in
/// `w` and every tile's tokens, handed to `put(t0, r0, acc)` 8 rows by 16 tokens at a time:
/// `acc[i][t]` is row `r0 + i` by token `t0 + t` (tile `t0 / TOKENS`; a padded tile's missing
/// tokens give zeros). Only where [`available`].
pub fn product(
    ty: GgmlType,
    w: WeightRows<'_>,
    n_rows: usize,
    tiles: &[TokenTile],
    put: &mut impl FnMut(usize, usize, &[[f32; TOKENS]; ROWS]),
) {
    assert!(available(), "the integer product needs AVX-512 VNNI or the dot-product extension");
    let nb = tiles[0].d.len() / TOKENS;
    let held = match w {
        WeightRows::RowMajor { bytes, row_bytes } => bytes.len() >= n_rows * row_bytes,
        WeightRows::Interleaved(v) => v.len() >= n_rows / ROWS * interleaved::group_bytes(ty, nb * QK_K),
    };
    assert!(n_rows.is_multiple_of(ROWS) && held);
    let mut unpacked = RowTile::new(nb * QK_K);
    for r0 in (0..n_rows).step_by(ROWS) {
        match w {
            WeightRows::RowMajor { bytes, row_bytes } => {
                unpacked.unpack(ty, std::array::from_fn(|i| &bytes[(r0 + i) * row_bytes..(r0 + i + 1) * row_bytes]))
            }
            WeightRows::Interleaved(v) => {
                let group = interleaved::group_bytes(ty, nb * QK_K);
                unpacked.unpack_interleaved(ty, &v[r0 / ROWS * group..(r0 / ROWS + 1) * group])
            }
        }
        for (k, tile) in tiles.iter().enumerate() {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX-512 F/BW/VL/VNNI detected (asserted above); the tile and the unpacked rows
            // hold nb blocks each (built for the same columns).
            let acc = unsafe {
                if ty == GgmlType::Q6K {
                    x86::q6_k_tile(&unpacked, tile, nb)
                } else {
                    x86::q4_k_tile(&unpacked, tile, nb)
                }
            };
            #[cfg(target_arch = "aarch64")]
            // SAFETY: the dot-product extension detected (asserted above); the tile and the
            // unpacked rows hold nb blocks each (built for the same columns).
            let acc = unsafe {
                if ty == GgmlType::Q6K {
                    neon::q6_k_tile(&unpacked, tile, nb)
                } else {
                    neon::q4_k_tile(&unpacked, tile, nb)
                }
            };
            #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
            let acc = [[0f32; TOKENS]; ROWS];
            put(k * TOKENS, r0, &acc);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{RowTile, TokenTile, ROWS, TOKENS};
    use crate::ops::qdot::QK_K;
    use std::arch::x86_64::*;

    /// The 8 rows' sums of sub-block `j` (`groups` groups of 4 from group `first`) against the
    /// tile's 16 tokens: 8 independent chains of `vpdpbusd`, one token vector loaded per group
    /// for all 8 rows.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL/VNNI available; `xq` points at the block's `[64][TOKENS][4]` bytes and
    /// `q` at its unpacked weights, `[64][ROWS][4]`.
    #[inline(always)]
    unsafe fn sub_block_sums(q: *const u8, xq: *const i8, first: usize, groups: usize) -> [__m512i; ROWS] {
        let mut s = [_mm512_setzero_si512(); ROWS];
        for g in first..first + groups {
            // SAFETY (caller): group g < 64 of the block: 64 bytes of tokens and 32 of weights
            // in bounds, read unaligned.
            unsafe {
                let x = _mm512_loadu_si512(xq.add(g * TOKENS * 4) as *const __m512i);
                for (i, s) in s.iter_mut().enumerate() {
                    let w = (q.add((g * ROWS + i) * 4) as *const i32).read_unaligned();
                    *s = _mm512_dpbusd_epi32(*s, _mm512_set1_epi32(w), x);
                }
            }
        }
        s
    }

    /// # Safety
    /// AVX-512 F/BW/VL/VNNI available; `tile` and `rows` hold `nb` blocks.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    #[allow(clippy::needless_range_loop)] // sub-block j indexes the scales, the groups and the sums
    pub unsafe fn q4_k_tile(rows: &RowTile, tile: &TokenTile, nb: usize) -> [[f32; TOKENS]; ROWS] {
        let mut out = [[0f32; TOKENS]; ROWS];
        let mut acc = [_mm512_setzero_ps(); ROWS];
        for b in 0..nb {
            let q = rows.q[b * QK_K * ROWS..(b + 1) * QK_K * ROWS].as_ptr();
            let sc: [&[i32]; ROWS] = std::array::from_fn(|i| &rows.scales[(i * nb + b) * 16..(i * nb + b + 1) * 16]);
            let xq = tile.qs[b * 64 * TOKENS * 4..].as_ptr();
            let mut isum = [_mm512_setzero_si512(); ROWS];
            for j in 0..8 {
                // SAFETY: the caller's contract; 8 groups of sub-block j.
                let s = unsafe { sub_block_sums(q, xq, 8 * j, 8) };
                for i in 0..ROWS {
                    isum[i] = _mm512_add_epi32(isum[i], _mm512_mullo_epi32(s[i], _mm512_set1_epi32(sc[i][j])));
                }
            }
            // SAFETY: 16 f32 in bounds (b < nb); unaligned load.
            let yd = unsafe { _mm512_loadu_ps(tile.d.as_ptr().add(b * TOKENS)) };
            // SAFETY: 4 vectors of 16 i32 in bounds (b < nb); unaligned loads.
            let pairs: [__m512i; 4] = std::array::from_fn(|p| unsafe {
                _mm512_loadu_si512(tile.sums32_pairs.as_ptr().add((b * 4 + p) * TOKENS) as *const __m512i)
            });
            for i in 0..ROWS {
                // the mins' term: each 32 values' sum times the sub-block's min, two sub-blocks
                // a multiply of i16 pairs (exact: the sums and mins fit i16)
                let mut msum = _mm512_setzero_si512();
                for (p, &pair) in pairs.iter().enumerate() {
                    let mins = (sc[i][8 + 2 * p] as u32) | ((sc[i][9 + 2 * p] as u32) << 16);
                    msum = _mm512_dpwssd_epi32(msum, pair, _mm512_set1_epi32(mins as i32));
                }
                let d = _mm512_mul_ps(_mm512_set1_ps(rows.d[i * nb + b]), yd);
                let dmin = _mm512_mul_ps(_mm512_set1_ps(rows.dmin[i * nb + b]), yd);
                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[i]), d, acc[i]);
                acc[i] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum), dmin, acc[i]);
            }
        }
        for i in 0..ROWS {
            // SAFETY: out[i] is 16 f32; unaligned store.
            unsafe { _mm512_storeu_ps(out[i].as_mut_ptr(), acc[i]) };
        }
        out
    }

    /// # Safety
    /// AVX-512 F/BW/VL/VNNI available; `tile` and `rows` hold `nb` blocks.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    #[allow(clippy::needless_range_loop)] // sub-block j indexes the scales, the groups and the sums
    pub unsafe fn q6_k_tile(rows: &RowTile, tile: &TokenTile, nb: usize) -> [[f32; TOKENS]; ROWS] {
        let mut out = [[0f32; TOKENS]; ROWS];
        let mut acc = [_mm512_setzero_ps(); ROWS];
        for b in 0..nb {
            let q = rows.q[b * QK_K * ROWS..(b + 1) * QK_K * ROWS].as_ptr();
            let sc: [&[i32]; ROWS] = std::array::from_fn(|i| &rows.scales[(i * nb + b) * 16..(i * nb + b + 1) * 16]);
            let xq = tile.qs[b * 64 * TOKENS * 4..].as_ptr();
            let mut isum = [_mm512_setzero_si512(); ROWS];
            for j in 0..16 {
                // SAFETY: the caller's contract; 4 groups of sub-block j.
                let s = unsafe { sub_block_sums(q, xq, 4 * j, 4) };
                // the weights are stored + 32: 32 x the 16 values' sum comes off
                // SAFETY: 16 i32 in bounds (j < 16); unaligned load.
                let bias = _mm512_slli_epi32::<5>(unsafe {
                    _mm512_loadu_si512(tile.sums16.as_ptr().add((b * 16 + j) * TOKENS) as *const __m512i)
                });
                for i in 0..ROWS {
                    let p = _mm512_sub_epi32(s[i], bias);
                    isum[i] = _mm512_add_epi32(isum[i], _mm512_mullo_epi32(p, _mm512_set1_epi32(sc[i][j])));
                }
            }
            // SAFETY: 16 f32 in bounds (b < nb); unaligned load.
            let yd = unsafe { _mm512_loadu_ps(tile.d.as_ptr().add(b * TOKENS)) };
            for i in 0..ROWS {
                let d = _mm512_mul_ps(_mm512_set1_ps(rows.d[i * nb + b]), yd);
                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[i]), d, acc[i]);
            }
        }
        for i in 0..ROWS {
            // SAFETY: out[i] is 16 f32; unaligned store.
            unsafe { _mm512_storeu_ps(out[i].as_mut_ptr(), acc[i]) };
        }
        out
    }
}

#[cfg(target_arch = "aarch64")]
pub(crate) mod neon {
    use super::{RowTile, TokenTile, ROWS, TOKENS};
    use crate::ops::qdot::QK_K;
    use crate::ops::sdot::sdot_lane;
    use std::arch::aarch64::*;

    /// Block `b`'s integer scales of the 8 rows as `[sub-block][rows 0..4, 4..8]` (Q4_K: the 8
    /// scales then the 8 mins; Q6_K: the 16 scales), and its `d` and `dmin` per row, laid out
    /// once per block for the tile's 4 passes over its tokens.
    ///
    /// # Safety
    /// None beyond NEON, the aarch64 baseline.
    #[inline(always)]
    unsafe fn block_scales(
        rows: &RowTile,
        nb: usize,
        b: usize,
    ) -> ([[int32x4_t; 2]; 16], [float32x4_t; 2], [float32x4_t; 2]) {
        let sc: [[i32; ROWS]; 16] =
            std::array::from_fn(|j| std::array::from_fn(|i| rows.scales[(i * nb + b) * 16 + j]));
        let d: [f32; ROWS] = std::array::from_fn(|i| rows.d[i * nb + b]);
        let dmin: [f32; ROWS] = std::array::from_fn(|i| rows.dmin[i * nb + b]);
        // SAFETY: each array holds 8 values; unaligned loads of 4 at 0 and 4.
        unsafe {
            let i32x8 = |v: &[i32; ROWS]| [vld1q_s32(v.as_ptr()), vld1q_s32(v.as_ptr().add(4))];
            let f32x8 = |v: &[f32; ROWS]| [vld1q_f32(v.as_ptr()), vld1q_f32(v.as_ptr().add(4))];
            (std::array::from_fn(|j| i32x8(&sc[j])), f32x8(&d), f32x8(&dmin))
        }
    }

    /// Sums of groups `first..first + groups` of a block for 4 tokens: `s[t][h]` holds rows
    /// `4h..4h + 4` against token `t`, one `SDOT` by element per token and half, the 32 bytes of
    /// weights and the 16 of tokens loaded once per group.
    ///
    /// # Safety
    /// The dot-product extension is here; `q` points at the block's unpacked weights
    /// (`[64][ROWS][4]`) and `xq` at its first group's 4 tokens (`TOKENS x 4` bytes a group).
    #[inline(always)]
    pub(crate) unsafe fn sub_block_sums(
        q: *const i8,
        xq: *const i8,
        first: usize,
        groups: usize,
    ) -> [[int32x4_t; 2]; 4] {
        let mut s = [[vdupq_n_s32(0); 2]; 4];
        for g in first..first + groups {
            // SAFETY (caller): group g < 64 of the block: 32 bytes of weights and 16 of tokens
            // in bounds, read unaligned; SDOT is here.
            unsafe {
                let (w0, w1) = (vld1q_s8(q.add(g * ROWS * 4)), vld1q_s8(q.add(g * ROWS * 4 + 16)));
                let x = vld1q_s8(xq.add(g * TOKENS * 4));
                s[0] = [sdot_lane::<0>(s[0][0], w0, x), sdot_lane::<0>(s[0][1], w1, x)];
                s[1] = [sdot_lane::<1>(s[1][0], w0, x), sdot_lane::<1>(s[1][1], w1, x)];
                s[2] = [sdot_lane::<2>(s[2][0], w0, x), sdot_lane::<2>(s[2][1], w1, x)];
                s[3] = [sdot_lane::<3>(s[3][0], w0, x), sdot_lane::<3>(s[3][1], w1, x)];
            }
        }
        s
    }

    /// `acc[quad][t][h]` (token `4 quad + t`, rows `4h..`) as `out[row][token]`.
    pub(crate) fn store(acc: &[[[float32x4_t; 2]; 4]; TOKENS / 4]) -> [[f32; TOKENS]; ROWS] {
        let mut out = [[0f32; TOKENS]; ROWS];
        for (quad, acc) in acc.iter().enumerate() {
            for (t, a) in acc.iter().enumerate() {
                for (h, v) in a.iter().enumerate() {
                    let mut lanes = [0f32; 4];
                    // SAFETY: lanes is 4 f32; unaligned store.
                    unsafe { vst1q_f32(lanes.as_mut_ptr(), *v) };
                    for (l, x) in lanes.iter().enumerate() {
                        out[4 * h + l][4 * quad + t] = *x;
                    }
                }
            }
        }
        out
    }

    /// # Safety
    /// The dot-product extension is here; `tile` and `rows` hold `nb` blocks.
    pub(super) unsafe fn q4_k_tile(rows: &RowTile, tile: &TokenTile, nb: usize) -> [[f32; TOKENS]; ROWS] {
        let mut acc = [[[vdupq_n_f32(0.0); 2]; 4]; TOKENS / 4];
        for b in 0..nb {
            let q = rows.q[b * QK_K * ROWS..].as_ptr() as *const i8;
            // SAFETY: NEON only.
            let (sc, d, dmin) = unsafe { block_scales(rows, nb, b) };
            for (quad, acc) in acc.iter_mut().enumerate() {
                let xq = tile.qs[b * 64 * TOKENS * 4 + 16 * quad..].as_ptr();
                let mut isum = [[vdupq_n_s32(0); 2]; 4];
                for (j, scale) in sc.iter().enumerate().take(8) {
                    // SAFETY: the caller's contract; 8 groups of sub-block j.
                    let s = unsafe { sub_block_sums(q, xq, 8 * j, 8) };
                    for (isum, s) in isum.iter_mut().zip(&s) {
                        for h in 0..2 {
                            isum[h] = vmlaq_s32(isum[h], s[h], scale[h]);
                        }
                    }
                }
                for (t, (acc, isum)) in acc.iter_mut().zip(&isum).enumerate() {
                    let token = 4 * quad + t;
                    // the mins' term: each 32 values' sum times the sub-block's min
                    let mut msum = [vdupq_n_s32(0); 2];
                    for (j, min) in sc[8..].iter().enumerate() {
                        let at = (b * 16 + 2 * j) * TOKENS + token;
                        let sums = tile.sums16[at] + tile.sums16[at + TOKENS];
                        for h in 0..2 {
                            msum[h] = vmlaq_n_s32(msum[h], min[h], sums);
                        }
                    }
                    let yd = tile.d[b * TOKENS + token];
                    for h in 0..2 {
                        acc[h] = vfmaq_f32(acc[h], vcvtq_f32_s32(isum[h]), vmulq_n_f32(d[h], yd));
                        acc[h] = vfmsq_f32(acc[h], vcvtq_f32_s32(msum[h]), vmulq_n_f32(dmin[h], yd));
                    }
                }
            }
        }
        store(&acc)
    }

    /// # Safety
    /// The dot-product extension is here; `tile` and `rows` hold `nb` blocks.
    pub(super) unsafe fn q6_k_tile(rows: &RowTile, tile: &TokenTile, nb: usize) -> [[f32; TOKENS]; ROWS] {
        let mut acc = [[[vdupq_n_f32(0.0); 2]; 4]; TOKENS / 4];
        for b in 0..nb {
            let q = rows.q[b * QK_K * ROWS..].as_ptr() as *const i8;
            // SAFETY: NEON only.
            let (sc, d, _) = unsafe { block_scales(rows, nb, b) };
            for (quad, acc) in acc.iter_mut().enumerate() {
                let xq = tile.qs[b * 64 * TOKENS * 4 + 16 * quad..].as_ptr();
                let mut isum = [[vdupq_n_s32(0); 2]; 4];
                for (j, scale) in sc.iter().enumerate() {
                    // SAFETY: the caller's contract; 4 groups of sub-block j.
                    let s = unsafe { sub_block_sums(q, xq, 4 * j, 4) };
                    for (t, (isum, s)) in isum.iter_mut().zip(&s).enumerate() {
                        // the weights are stored + 32: 32 x the 16 values' sum comes off
                        let bias = vdupq_n_s32(32 * tile.sums16[(b * 16 + j) * TOKENS + 4 * quad + t]);
                        for h in 0..2 {
                            isum[h] = vmlaq_s32(isum[h], vsubq_s32(s[h], bias), scale[h]);
                        }
                    }
                }
                for (t, (acc, isum)) in acc.iter_mut().zip(&isum).enumerate() {
                    let yd = tile.d[b * TOKENS + 4 * quad + t];
                    for h in 0..2 {
                        acc[h] = vfmaq_f32(acc[h], vcvtq_f32_s32(isum[h]), vmulq_n_f32(d[h], yd));
                    }
                }
            }
        }
        store(&acc)
    }
}
