//! A prompt's product with weights in 32-value blocks (Q4_0, Q4_1, Q5_0, Q8_0) as an integer
//! matrix product, where [`kquant_gemm::available`] (AVX-512 VNNI, or the aarch64 dot-product
//! extension): `out[t, o] = w[o, :] . x[t, :]` for many tokens at once, the tokens' Q8_0 (Q4_1:
//! Q8_1) rows laid out once per product in tiles of 16 and each task's rows unpacked once, 8 at a
//! time, into one signed byte per weight (Q4_0 `q - 8`, Q5_0 `q - 16`, Q8_0 as stored, Q4_1 `q`).
//!
//! Each block's integer sum of 32 products is exact, as in the one-token kernels; it is scaled
//! by `d_w x d_x` (and Q4_1 adds `m_w x s_x`, its min times the token's scaled sum) with one
//! fused multiply-add per block, row and token, so results differ from the one-token kernels'
//! in the last bits only (tested within 1e-5 of sum |w x|). `vpdpbusd` multiplies unsigned by
//! signed bytes: on x86-64 the tokens' bytes go in with their sign bit flipped (`x + 128`) and
//! `128 x` each block's weight sum comes off; `SDOT` multiplies signed bytes as they are.

use crate::ops::kquant_gemm::{available, ROWS, TOKENS};
use crate::ops::qdot::{BlockQ8_0, BlockQ8_1};
use formats::ggml_quants::GgmlType;

/// Values per block.
const QK: usize = 32;

/// Whether `ty` has an integer product here.
pub fn supports(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q8_0)
}

/// One token's activation row as the product takes it.
#[derive(Clone, Copy)]
pub enum TokenRow<'a> {
    Q8_0(&'a [BlockQ8_0]),
    Q8_1(&'a [BlockQ8_1]),
}

/// Up to 16 tokens' rows laid out for the product: per block, 8 groups of the 16 tokens' 4
/// bytes side by side, each token's scale and (Q8_1) its scaled sum.
pub struct TokenTile {
    /// `[n_blocks][8][TOKENS][4]`
    qs: Vec<i8>,
    /// `[n_blocks][TOKENS]`
    d: Vec<f32>,
    /// `[n_blocks][TOKENS]`: Q8_1's `s` (`d x sum(qs)`), zeros for Q8_0
    s: Vec<f32>,
}

impl TokenTile {
    /// Up to 16 tokens' rows of the same length and type; missing tokens are zeros.
    pub fn new(xs: &[TokenRow<'_>]) -> Self {
        assert!(xs.len() <= TOKENS && !xs.is_empty());
        let nb = match xs[0] {
            TokenRow::Q8_0(b) => b.len(),
            TokenRow::Q8_1(b) => b.len(),
        };
        let mut tile =
            TokenTile { qs: vec![0; nb * QK * TOKENS], d: vec![0.0; nb * TOKENS], s: vec![0.0; nb * TOKENS] };
        for (t, x) in xs.iter().enumerate() {
            for b in 0..nb {
                let (qs, d, s) = match x {
                    TokenRow::Q8_0(x) => (&x[b].qs, x[b].d.to_f32(), 0.0),
                    TokenRow::Q8_1(x) => (&x[b].qs, x[b].d.to_f32(), x[b].s.to_f32()),
                };
                for g in 0..QK / 4 {
                    let at = ((b * QK / 4 + g) * TOKENS + t) * 4;
                    tile.qs[at..at + 4].copy_from_slice(&qs[4 * g..4 * g + 4]);
                }
                tile.d[b * TOKENS + t] = d;
                tile.s[b * TOKENS + t] = s;
            }
            let len = match x {
                TokenRow::Q8_0(b) => b.len(),
                TokenRow::Q8_1(b) => b.len(),
            };
            assert_eq!(len, nb, "token rows of different lengths");
        }
        tile
    }
}

/// 8 weight rows unpacked: one signed byte per weight, each block's scale, min and weight sum.
struct RowTile {
    /// `[n_blocks][8][ROWS][4]`: each 4 consecutive weights of the 8 rows side by side
    q: Vec<i8>,
    /// `[ROWS][n_blocks]`
    d: Vec<f32>,
    /// `[ROWS][n_blocks]`: Q4_1's min (zeros otherwise)
    m: Vec<f32>,
    /// `[ROWS][n_blocks]`: the sum of the block's 32 weights (x86-64's correction)
    sum: Vec<i32>,
}

impl RowTile {
    fn new(nb: usize) -> Self {
        RowTile {
            q: vec![0; nb * QK * ROWS],
            d: vec![0.0; ROWS * nb],
            m: vec![0.0; ROWS * nb],
            sum: vec![0; ROWS * nb],
        }
    }

    /// Unpacks `rows[i]` (whole blocks of `ty`) into row i.
    fn unpack(&mut self, ty: GgmlType, rows: [&[u8]; ROWS]) {
        let nb = self.d.len() / ROWS;
        let bytes = ty.block_bytes();
        let f16 = |x: &[u8], at: usize| half::f16::from_le_bytes([x[at], x[at + 1]]).to_f32();
        let mut w = [0i8; QK];
        for (i, row) in rows.iter().enumerate() {
            for b in 0..nb {
                let blk = &row[b * bytes..(b + 1) * bytes];
                let (d, m) = match ty {
                    GgmlType::Q4_0 | GgmlType::Q4_1 => {
                        let (qs, off) = if ty == GgmlType::Q4_0 { (&blk[2..18], 8) } else { (&blk[4..20], 0) };
                        for (j, &q) in qs.iter().enumerate() {
                            w[j] = (q & 0xF) as i8 - off;
                            w[j + 16] = (q >> 4) as i8 - off;
                        }
                        (f16(blk, 0), if ty == GgmlType::Q4_1 { f16(blk, 2) } else { 0.0 })
                    }
                    GgmlType::Q5_0 => {
                        let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
                        for (j, &q) in blk[6..22].iter().enumerate() {
                            let hi = |k: usize| (((qh >> k) & 1) << 4) as u8;
                            w[j] = ((q & 0xF) | hi(j)) as i8 - 16;
                            w[j + 16] = ((q >> 4) | hi(j + 16)) as i8 - 16;
                        }
                        (f16(blk, 0), 0.0)
                    }
                    GgmlType::Q8_0 => {
                        w.iter_mut().zip(&blk[2..34]).for_each(|(w, &q)| *w = q as i8);
                        (f16(blk, 0), 0.0)
                    }
                    t => panic!("no 32-value integer product for {}", t.name()),
                };
                self.d[i * nb + b] = d;
                self.m[i * nb + b] = m;
                self.sum[i * nb + b] = w.iter().map(|&v| v as i32).sum();
                for g in 0..QK / 4 {
                    let at = b * QK * ROWS + (g * ROWS + i) * 4;
                    self.q[at..at + 4].copy_from_slice(&w[4 * g..4 * g + 4]);
                }
            }
        }
    }
}

/// `out[t][r] = rows[r] . token t` for the first `n_rows` (a multiple of [`ROWS`]) rows of `ty`
/// blocks, `row_bytes` a row in `bytes`, and every tile's tokens; `out` is
/// `[tiles x TOKENS][n_rows]`. Only where [`available`] and [`supports`]`(ty)`.
pub fn product(ty: GgmlType, bytes: &[u8], row_bytes: usize, n_rows: usize, tiles: &[TokenTile], out: &mut [f32]) {
    assert!(available(), "the integer product needs AVX-512 VNNI or the dot-product extension");
    assert!(supports(ty), "no 32-value integer product for {}", ty.name());
    let nb = tiles[0].d.len() / TOKENS;
    assert!(
        n_rows.is_multiple_of(ROWS)
            && row_bytes == nb * ty.block_bytes()
            && bytes.len() >= n_rows * row_bytes
            && out.len() == tiles.len() * TOKENS * n_rows
    );
    let with_min = ty == GgmlType::Q4_1;
    let mut unpacked = RowTile::new(nb);
    for r0 in (0..n_rows).step_by(ROWS) {
        unpacked.unpack(ty, std::array::from_fn(|i| &bytes[(r0 + i) * row_bytes..(r0 + i + 1) * row_bytes]));
        for (k, tile) in tiles.iter().enumerate() {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX-512 F/BW/VL/VNNI detected (asserted above); the tile and the unpacked
            // rows hold nb blocks each (built for the same columns).
            let acc = unsafe { x86::tile(&unpacked, tile, nb, with_min) };
            #[cfg(target_arch = "aarch64")]
            // SAFETY: the dot-product extension detected (asserted above); the tile and the
            // unpacked rows hold nb blocks each (built for the same columns).
            let acc = unsafe { neon::tile(&unpacked, tile, nb, with_min) };
            #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
            let acc = [[0f32; TOKENS]; ROWS];
            for (i, a) in acc.iter().enumerate() {
                for (t, v) in a.iter().enumerate() {
                    out[(k * TOKENS + t) * n_rows + r0 + i] = *v;
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{RowTile, TokenTile, QK, ROWS, TOKENS};
    use std::arch::x86_64::*;

    /// # Safety
    /// AVX-512 F/BW/VL/VNNI available; `tile` and `rows` hold `nb` blocks.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn tile(rows: &RowTile, tile: &TokenTile, nb: usize, with_min: bool) -> [[f32; TOKENS]; ROWS] {
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
            // SAFETY: 16 f32 in bounds (b < nb); unaligned loads.
            let (yd, ys) = unsafe {
                (_mm512_loadu_ps(tile.d.as_ptr().add(b * TOKENS)), _mm512_loadu_ps(tile.s.as_ptr().add(b * TOKENS)))
            };
            for (i, (acc, isum)) in acc.iter_mut().zip(&isum).enumerate() {
                let d = _mm512_mul_ps(_mm512_set1_ps(rows.d[i * nb + b]), yd);
                *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(*isum), d, *acc);
                if with_min {
                    *acc = _mm512_fmadd_ps(_mm512_set1_ps(rows.m[i * nb + b]), ys, *acc);
                }
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
    pub unsafe fn tile(rows: &RowTile, tile: &TokenTile, nb: usize, with_min: bool) -> [[f32; TOKENS]; ROWS] {
        let mut acc = [[[vdupq_n_f32(0.0); 2]; 4]; TOKENS / 4];
        for b in 0..nb {
            let q = rows.q[b * QK * ROWS..].as_ptr();
            let at = |v: &[f32]| -> [f32; ROWS] { std::array::from_fn(|i| v[i * nb + b]) };
            let (d, m) = (at(&rows.d), at(&rows.m));
            // SAFETY: each array holds 8 values; unaligned loads of 4 at 0 and 4.
            let (d, m) = unsafe {
                (
                    [vld1q_f32(d.as_ptr()), vld1q_f32(d.as_ptr().add(4))],
                    [vld1q_f32(m.as_ptr()), vld1q_f32(m.as_ptr().add(4))],
                )
            };
            for (quad, acc) in acc.iter_mut().enumerate() {
                let xq = tile.qs[b * QK * TOKENS + 16 * quad..].as_ptr();
                // SAFETY: the caller's contract; the block's 8 groups.
                let s = unsafe { sub_block_sums(q, xq, 0, QK / 4) };
                for (t, (acc, s)) in acc.iter_mut().zip(&s).enumerate() {
                    let token = b * TOKENS + 4 * quad + t;
                    for h in 0..2 {
                        acc[h] = vfmaq_f32(acc[h], vcvtq_f32_s32(s[h]), vmulq_n_f32(d[h], tile.d[token]));
                        if with_min {
                            acc[h] = vfmaq_n_f32(acc[h], m[h], tile.s[token]);
                        }
                    }
                }
            }
        }
        store(&acc)
    }
}
