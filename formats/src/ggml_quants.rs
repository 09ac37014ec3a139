//! GGML tensor types: block sizes and dequantizers (reference semantics of llama.cpp's
//! `ggml-quants.c`, written from the block layouts below).
//!
//! | type | elements/block | bytes/block | layout |
//! |------|----------------|-------------|--------|
//! | F32  | 1   | 4   | f32 |
//! | F16  | 1   | 2   | f16 |
//! | BF16 | 1   | 2   | bf16 |
//! | Q4_0 | 32  | 18  | d: f16, qs[16]: low nibbles = x[0..16], high = x[16..32]; x = (q - 8) * d |
//! | Q4_1 | 32  | 20  | d: f16, m: f16, qs[16]; x = q * d + m |
//! | Q5_0 | 32  | 22  | d: f16, qh: u32 (5th bits), qs[16]; x = (q - 16) * d |
//! | Q8_0 | 32  | 34  | d: f16, qs[32]: i8; x = q * d |
//! | Q4_K | 256 | 144 | d: f16, dmin: f16, scales[12] (8 x 6-bit scale/min pairs), qs[128] |
//! | Q5_K | 256 | 176 | d: f16, dmin: f16, scales[12] (as Q4_K), qh[32] (5th bits), qs[128] |
//! | Q6_K | 256 | 210 | ql[128], qh[64], scales[16]: i8, d: f16 |

use half::{bf16, f16};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    BF16,
}

const ALL_TYPES: [GgmlType; 15] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q8_1,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::Q8K,
    GgmlType::BF16,
];

/// The name llama.cpp gives a type id (for error messages), "unknown" otherwise.
pub fn type_name(id: u32) -> &'static str {
    match id {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        6 => "Q5_0",
        7 => "Q5_1",
        8 => "Q8_0",
        9 => "Q8_1",
        10 => "Q2_K",
        11 => "Q3_K",
        12 => "Q4_K",
        13 => "Q5_K",
        14 => "Q6_K",
        15 => "Q8_K",
        16..=23 => "IQ*",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        30 => "BF16",
        _ => "unknown",
    }
}

impl GgmlType {
    pub fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            8 => GgmlType::Q8_0,
            9 => GgmlType::Q8_1,
            10 => GgmlType::Q2K,
            11 => GgmlType::Q3K,
            12 => GgmlType::Q4K,
            13 => GgmlType::Q5K,
            14 => GgmlType::Q6K,
            15 => GgmlType::Q8K,
            30 => GgmlType::BF16,
            _ => return None,
        })
    }

    /// The name llama.cpp gives the type ("Q4_K").
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::BF16 => "BF16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q8_1 => "Q8_1",
            GgmlType::Q2K => "Q2_K",
            GgmlType::Q3K => "Q3_K",
            GgmlType::Q4K => "Q4_K",
            GgmlType::Q5K => "Q5_K",
            GgmlType::Q6K => "Q6_K",
            GgmlType::Q8K => "Q8_K",
        }
    }

    /// llama.cpp's type id (the inverse of [`GgmlType::from_id`]).
    pub fn id(self) -> u32 {
        (0..31).find(|&i| GgmlType::from_id(i) == Some(self)).expect("every type has an id")
    }

    /// The type llama.cpp calls `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        ALL_TYPES.into_iter().find(|t| t.name() == name)
    }

    /// Blocks of several weights with shared scales (not a plain float).
    pub fn is_block_quantized(self) -> bool {
        self.block_elements() > 1
    }

    /// Types this crate can dequantize.
    pub fn is_supported(self) -> bool {
        matches!(
            self,
            GgmlType::F32
                | GgmlType::F16
                | GgmlType::BF16
                | GgmlType::Q4_0
                | GgmlType::Q4_1
                | GgmlType::Q5_0
                | GgmlType::Q8_0
                | GgmlType::Q4K
                | GgmlType::Q5K
                | GgmlType::Q6K
        )
    }

    pub fn block_elements(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0 | GgmlType::Q8_1 => 32,
            GgmlType::Q2K | GgmlType::Q3K | GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K | GgmlType::Q8K => 256,
        }
    }

    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q5_0 => 22,
            GgmlType::Q5_1 => 24,
            GgmlType::Q8_0 => 34,
            GgmlType::Q8_1 => 36,
            GgmlType::Q2K => 84,
            GgmlType::Q3K => 110,
            GgmlType::Q4K => 144,
            GgmlType::Q5K => 176,
            GgmlType::Q6K => 210,
            GgmlType::Q8K => 292,
        }
    }
}

/// `x` (a multiple of 32 values) as Q8_0 blocks, llama.cpp's quantize_row_q8_0_ref: per
/// block d = max|x| / 127 (f16), q = round(x / d) (half away from zero).
pub fn quantize_q8_0(x: &[f32]) -> Vec<u8> {
    assert!(x.len().is_multiple_of(32));
    let mut out = Vec::with_capacity(x.len() / 32 * 34);
    for b in x.chunks_exact(32) {
        let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        out.extend(b.iter().map(|&v| (v * id).round() as i8 as u8));
    }
    out
}

/// `x` (a multiple of 32 values) as Q5_0 blocks, llama.cpp's quantize_row_q5_0_ref: per block
/// the value of largest magnitude `max`, d = max / -16 (f16), q = min(31, trunc(x / d + 16.5)),
/// the fifth bits in `qh`.
pub fn quantize_q5_0(x: &[f32]) -> Vec<u8> {
    assert!(x.len().is_multiple_of(32));
    let mut out = Vec::with_capacity(x.len() / 32 * 22);
    for b in x.chunks_exact(32) {
        let max = b.iter().fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let q = |v: f32| ((v * id + 16.5) as i32).clamp(0, 31) as u32;
        let (mut qh, mut qs) = (0u32, [0u8; 16]);
        for j in 0..16 {
            let (x0, x1) = (q(b[j]), q(b[j + 16]));
            qs[j] = ((x0 & 0x0F) | ((x1 & 0x0F) << 4)) as u8;
            qh |= ((x0 & 0x10) >> 4) << j;
            qh |= ((x1 & 0x10) >> 4) << (j + 16);
        }
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        out.extend_from_slice(&qh.to_le_bytes());
        out.extend_from_slice(&qs);
    }
    out
}

/// The types [`quantize`] writes (llama.cpp's reference quantizers, no importance matrix): a
/// records down row in Q8_0, or in 5 bits per 32 values, or 4.5 per 256 (Q4_1 would pad to the
/// same 512-byte sectors as Q5_0 or Q4_K at both shipped widths, so it is not offered).
pub const QUANTIZABLE: [GgmlType; 3] = [GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q4K];

/// `x` as blocks of `t` (one of [`QUANTIZABLE`]); None for another type. `x.len()` must be a
/// multiple of the type's block (the callers check, naming the tensor).
pub fn quantize(t: GgmlType, x: &[f32]) -> Option<Vec<u8>> {
    Some(match t {
        GgmlType::Q8_0 => quantize_q8_0(x),
        GgmlType::Q5_0 => quantize_q5_0(x),
        GgmlType::Q4K => quantize_q4_k(x),
        _ => return None,
    })
}

/// llama.cpp's `nearest_int`: round half to even.
fn nearest_int(v: f32) -> i32 {
    v.round_ties_even() as i32
}

/// Sub-blocks quantized side by side: lane `j` of a `Lanes` is the `j`-th 32-value sub-block
/// of a Q4_K block.
type Lanes = [f32; 8];

/// llama.cpp's make_qkx2_quants for the 8 sub-blocks of a block at once (`x[i][j]`: value `i`
/// of sub-block `j`): the scale and (negated) minimum that fit each sub-block with levels
/// `0..=nmax` under `weights`, searching `nstep + 1` scales around the range's; levels in `l`.
/// Each lane runs the scalar algorithm's operations in its order (no reassociation, no fused
/// multiply-add), so a lane's result is bit for bit the one-group function's
/// (`tests::make_qkx2_quants_one`); the lanes make the loops vector instructions, which the
/// one-group function's running sums cannot be. Returns (scale, min), `x ~= scale * l - min`.
#[allow(clippy::too_many_arguments)]
fn make_qkx2_quants_x8(
    nmax: i32,
    x: &[Lanes; 32],
    weights: &[Lanes; 32],
    l: &mut [Lanes; 32],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
) -> (Lanes, Lanes) {
    let nmax_f = nmax as f32;
    // round half to even, clamped to 0..=nmax (NaN to 0, as `nearest_int(..).clamp(..)`)
    let level = |v: f32| v.round_ties_even().max(0.0).min(nmax_f);
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = [0f32; 8];
    for j in 0..8 {
        sum_x[j] = sum_w[j] * x[0][j];
    }
    for i in 1..32 {
        for j in 0..8 {
            if x[i][j] < min[j] {
                min[j] = x[i][j];
            }
            if x[i][j] > max[j] {
                max[j] = x[i][j];
            }
            sum_w[j] += weights[i][j];
            sum_x[j] += weights[i][j] * x[i][j];
        }
    }
    let mut flat = [false; 8];
    let (mut scale, mut best_error, mut iscale) = ([0f32; 8], [0f32; 8], [0f32; 8]);
    for j in 0..8 {
        if min[j] > 0.0 {
            min[j] = 0.0;
        }
        flat[j] = max[j] == min[j];
        iscale[j] = nmax_f / (max[j] - min[j]);
        scale[j] = 1.0 / iscale[j];
    }
    for i in 0..32 {
        for j in 0..8 {
            let q = level(iscale[j] * (x[i][j] - min[j]));
            l[i][j] = q;
            let diff = scale[j] * q + min[j] - x[i][j];
            best_error[j] += weights[i][j] * diff * diff;
        }
    }
    let mut laux = [[0f32; 8]; 32];
    for is in 0..=nstep {
        let (mut sum_l, mut sum_l2, mut sum_xl) = ([0f32; 8], [0f32; 8], [0f32; 8]);
        for j in 0..8 {
            iscale[j] = (rmin + rdelta * is as f32 + nmax_f) / (max[j] - min[j]);
        }
        for i in 0..32 {
            for j in 0..8 {
                let q = level(iscale[j] * (x[i][j] - min[j]));
                laux[i][j] = q;
                let w = weights[i][j];
                sum_l[j] += w * q;
                sum_l2[j] += w * q * q;
                sum_xl[j] += w * q * x[i][j];
            }
        }
        let (mut this_scale, mut this_min, mut better) = ([0f32; 8], [0f32; 8], [false; 8]);
        let mut cur_error = [0f32; 8];
        for j in 0..8 {
            let d = sum_w[j] * sum_l2[j] - sum_l[j] * sum_l[j];
            this_scale[j] = (sum_w[j] * sum_xl[j] - sum_x[j] * sum_l[j]) / d;
            this_min[j] = (sum_l2[j] * sum_x[j] - sum_l[j] * sum_xl[j]) / d;
            if this_min[j] > 0.0 {
                this_min[j] = 0.0;
                this_scale[j] = sum_xl[j] / sum_l2[j];
            }
            better[j] = d > 0.0;
        }
        for i in 0..32 {
            for j in 0..8 {
                let diff = this_scale[j] * laux[i][j] + this_min[j] - x[i][j];
                cur_error[j] += weights[i][j] * diff * diff;
            }
        }
        for j in 0..8 {
            better[j] &= cur_error[j] < best_error[j];
            if better[j] {
                best_error[j] = cur_error[j];
                scale[j] = this_scale[j];
                min[j] = this_min[j];
            }
        }
        for i in 0..32 {
            for j in 0..8 {
                if better[j] {
                    l[i][j] = laux[i][j];
                }
            }
        }
    }
    for j in 0..8 {
        if flat[j] {
            // every value the same: levels 0, no scale
            (0..32).for_each(|i| l[i][j] = 0.0);
            scale[j] = 0.0;
        }
        min[j] = -min[j];
    }
    (scale, min)
}

/// A Q4_K block's 256 values as its 8 sub-blocks side by side (`x[i][j]`: value `i` of
/// sub-block `j`), with the search's weights: `rms + |x|`, the rms over the value's sub-block.
fn q4_k_sub_blocks(xb: &[f32]) -> ([Lanes; 32], [Lanes; 32]) {
    let (mut x, mut weights) = ([[0f32; 8]; 32], [[0f32; 8]; 32]);
    for (j, g) in xb.chunks_exact(32).enumerate() {
        let av_x = (g.iter().map(|v| v * v).sum::<f32>() / 32.0).sqrt();
        for (i, &v) in g.iter().enumerate() {
            x[i][j] = v;
            weights[i][j] = av_x + v.abs();
        }
    }
    (x, weights)
}

/// `x` (a multiple of 256 values) as Q4_K blocks, llama.cpp's quantize_row_q4_K_ref (no
/// importance matrix): per 32 values a scale and minimum from [`make_qkx2_quants_x8`] weighted by
/// `rms + |x|`, both requantized to 6 bits against the block's f16 `d` and `dmin`, then 4-bit
/// levels. 144 bytes a block: d, dmin, 12 bytes of packed scales/minimums, 128 of nibbles.
pub fn quantize_q4_k(x: &[f32]) -> Vec<u8> {
    assert!(x.len().is_multiple_of(256));
    let mut out = Vec::with_capacity(x.len() / 256 * 144);
    for xb in x.chunks_exact(256) {
        let (x8, weights) = q4_k_sub_blocks(xb);
        let mut l8 = [[0f32; 8]; 32];
        let (scales, mins) = make_qkx2_quants_x8(15, &x8, &weights, &mut l8, -1.0, 0.1, 20);
        let mut l = [0u8; 256];
        let (mut max_scale, mut max_min) = (0f32, 0f32);
        for j in 0..8 {
            (0..32).for_each(|i| l[32 * j + i] = l8[i][j] as u8);
            max_scale = max_scale.max(scales[j]);
            max_min = max_min.max(mins[j]);
        }
        let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
        let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
        let mut packed = [0u8; 12];
        for j in 0..8 {
            let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
            let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
            if j < 4 {
                packed[j] = ls;
                packed[j + 4] = lm;
            } else {
                packed[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
                packed[j - 4] |= (ls >> 4) << 6;
                packed[j] |= (lm >> 4) << 6;
            }
        }
        let (d, dmin) = (f16::from_f32(max_scale / 63.0), f16::from_f32(max_min / 63.0));
        for j in 0..8 {
            let (sc, m) = scale_min_k4(j, &packed);
            let dj = d.to_f32() * sc as f32;
            if dj == 0.0 {
                continue;
            }
            let dm = dmin.to_f32() * m as f32;
            for ii in 0..32 {
                l[32 * j + ii] = nearest_int((xb[32 * j + ii] + dm) / dj).clamp(0, 15) as u8;
            }
        }
        out.extend_from_slice(&d.to_le_bytes());
        out.extend_from_slice(&dmin.to_le_bytes());
        out.extend_from_slice(&packed);
        for j in (0..256).step_by(64) {
            out.extend((0..32).map(|k| l[j + k] | (l[j + k + 32] << 4)));
        }
    }
    out
}

#[inline]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Dequantizes `bytes` (a whole number of blocks of type `t`) into `out`.
/// Panics if the sizes disagree or the type is unsupported: callers validate first
/// (`GgufFile::open` checks sizes, `GgufFile::dequantize_f32` checks support).
pub fn dequantize(t: GgmlType, bytes: &[u8], out: &mut [f32]) {
    let be = t.block_elements();
    let bb = t.block_bytes();
    assert_eq!(bytes.len() / bb * be, out.len(), "dequantize: byte and element counts disagree");
    let f: fn(&[u8], &mut [f32]) = match t {
        GgmlType::F32 => |b, o| o[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        GgmlType::F16 => |b, o| o[0] = f16_at(b, 0),
        GgmlType::BF16 => |b, o| o[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32(),
        GgmlType::Q4_0 => dequant_block_q4_0,
        GgmlType::Q4_1 => dequant_block_q4_1,
        GgmlType::Q5_0 => dequant_block_q5_0,
        GgmlType::Q8_0 => dequant_block_q8_0,
        GgmlType::Q4K => dequant_block_q4_k,
        GgmlType::Q5K => dequant_block_q5_k,
        GgmlType::Q6K => dequant_block_q6_k,
        other => panic!("dequantize: {other:?} is not supported"),
    };
    for (b, o) in bytes.chunks_exact(bb).zip(out.chunks_exact_mut(be)) {
        f(b, o);
    }
}

pub fn dequant_block_q4_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    for j in 0..16 {
        out[j] = ((qs[j] & 0x0F) as i32 - 8) as f32 * d;
        out[j + 16] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
    }
}

pub fn dequant_block_q4_1(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qs = &b[4..20];
    for j in 0..16 {
        out[j] = (qs[j] & 0x0F) as f32 * d + m;
        out[j + 16] = (qs[j] >> 4) as f32 * d + m;
    }
}

/// (Inlined into the runtime's Q5_0 down sum.)
#[inline]
pub fn dequant_block_q5_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    for j in 0..16 {
        let xh0 = ((qh >> j) << 4) & 0x10;
        let xh1 = (qh >> (j + 12)) & 0x10;
        let x0 = ((qs[j] as u32 & 0x0F) | xh0) as i32 - 16;
        let x1 = ((qs[j] as u32 >> 4) | xh1) as i32 - 16;
        out[j] = x0 as f32 * d;
        out[j + 16] = x1 as f32 * d;
    }
}

pub fn dequant_block_q8_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    for j in 0..32 {
        out[j] = (b[2 + j] as i8) as f32 * d;
    }
}

/// The j-th 6-bit (scale, min) pair of a K-quant `scales[12]` array.
#[inline]
pub fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

pub fn dequant_block_q4_k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qs = &b[16..144];
    for (chunk, (q, y)) in qs.chunks_exact(32).zip(out.chunks_exact_mut(64)).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * chunk, scales);
        let (sc2, m2) = scale_min_k4(2 * chunk + 1, scales);
        let (d1, min1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, min2) = (d * sc2 as f32, dmin * m2 as f32);
        for l in 0..32 {
            y[l] = d1 * (q[l] & 0x0F) as f32 - min1;
            y[l + 32] = d2 * (q[l] >> 4) as f32 - min2;
        }
    }
}

/// Q5_K: Q4_K's 8 (scale, min) pairs per 256, 4 low bits in qs (two 32-element groups per 32
/// bytes, low then high nibbles) and the 5th bit of element l of group g in bit g of qh[l].
pub fn dequant_block_q5_k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for (chunk, (q, y)) in qs.chunks_exact(32).zip(out.chunks_exact_mut(64)).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * chunk, scales);
        let (sc2, m2) = scale_min_k4(2 * chunk + 1, scales);
        let (d1, min1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, min2) = (d * sc2 as f32, dmin * m2 as f32);
        let (u1, u2) = (1u8 << (2 * chunk), 2u8 << (2 * chunk));
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            y[l] = d1 * ((q[l] & 0x0F) + h1) as f32 - min1;
            y[l + 32] = d2 * ((q[l] >> 4) + h2) as f32 - min2;
        }
    }
}

pub fn dequant_block_q6_k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 208);
    for half_block in 0..2 {
        let ql = &b[half_block * 64..half_block * 64 + 64];
        let qh = &b[128 + half_block * 32..128 + half_block * 32 + 32];
        let sc = &b[192 + half_block * 8..192 + half_block * 8 + 8];
        let y = &mut out[half_block * 128..half_block * 128 + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's make_qkx2_quants for one group, as llama.cpp writes it (the reference each
    /// lane of [`make_qkx2_quants_x8`] equals bit for bit): the scale and (negated) minimum that
    /// fit `x` with levels `0..=nmax` under `weights`, searching `nstep + 1` scales around the
    /// range's; levels in `l`. Returns (scale, min), `x ~= scale * l - min`.
    #[allow(clippy::too_many_arguments)]
    fn make_qkx2_quants(
        nmax: i32,
        x: &[f32],
        weights: &[f32],
        l: &mut [u8],
        laux: &mut [u8],
        rmin: f32,
        rdelta: f32,
        nstep: i32,
    ) -> (f32, f32) {
        let n = x.len();
        let (mut min, mut max) = (x[0], x[0]);
        let mut sum_w = weights[0];
        let mut sum_x = sum_w * x[0];
        for i in 1..n {
            if x[i] < min {
                min = x[i];
            }
            if x[i] > max {
                max = x[i];
            }
            sum_w += weights[i];
            sum_x += weights[i] * x[i];
        }
        if min > 0.0 {
            min = 0.0;
        }
        if max == min {
            l.fill(0);
            return (0.0, -min);
        }
        let mut iscale = nmax as f32 / (max - min);
        let mut scale = 1.0 / iscale;
        let mut best_error = 0f32;
        for i in 0..n {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            l[i] = q as u8;
            let diff = scale * l[i] as f32 + min - x[i];
            best_error += weights[i] * diff * diff;
        }
        for is in 0..=nstep {
            iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
            let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
            for i in 0..n {
                let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
                laux[i] = q as u8;
                let (w, lf) = (weights[i], q as f32);
                sum_l += w * lf;
                sum_l2 += w * lf * lf;
                sum_xl += w * lf * x[i];
            }
            let d = sum_w * sum_l2 - sum_l * sum_l;
            if d > 0.0 {
                let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
                let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
                if this_min > 0.0 {
                    this_min = 0.0;
                    this_scale = sum_xl / sum_l2;
                }
                let mut cur_error = 0f32;
                for i in 0..n {
                    let diff = this_scale * laux[i] as f32 + this_min - x[i];
                    cur_error += weights[i] * diff * diff;
                }
                if cur_error < best_error {
                    l[..n].copy_from_slice(&laux[..n]);
                    best_error = cur_error;
                    scale = this_scale;
                    min = this_min;
                }
            }
        }
        (scale, -min)
    }

    fn h(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_le_bytes()
    }

    #[test]
    fn q4_0_block() {
        let mut b = Vec::from(h(0.5));
        // qs[j]: low nibble j % 16, high nibble 15 - j % 16
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let mut out = [0f32; 32];
        dequantize(GgmlType::Q4_0, &b, &mut out);
        for j in 0..16 {
            assert_eq!(out[j], (j as f32 - 8.0) * 0.5);
            assert_eq!(out[j + 16], ((15 - j) as f32 - 8.0) * 0.5);
        }
    }

    #[test]
    fn q4_1_block() {
        let mut b = Vec::from(h(0.25));
        b.extend(h(-1.0));
        b.extend((0..16u8).map(|j| j | (3 << 4)));
        let mut out = [0f32; 32];
        dequantize(GgmlType::Q4_1, &b, &mut out);
        assert_eq!(out[0], -1.0);
        assert_eq!(out[15], 15.0 * 0.25 - 1.0);
        assert_eq!(out[16], 3.0 * 0.25 - 1.0);
    }

    #[test]
    fn q5_0_block() {
        let mut b = Vec::from(h(1.0));
        // fifth bit of element i is qh bit i: set for elements 1 and 18
        let qh: u32 = (1 << 1) | (1 << 18);
        b.extend(qh.to_le_bytes());
        b.extend([0x21u8; 16]); // low nibble 1, high nibble 2
        let mut out = [0f32; 32];
        dequantize(GgmlType::Q5_0, &b, &mut out);
        assert_eq!(out[0], 1.0 - 16.0);
        assert_eq!(out[1], (1 + 16) as f32 - 16.0);
        assert_eq!(out[16], 2.0 - 16.0);
        assert_eq!(out[18], (2 + 16) as f32 - 16.0);
    }

    #[test]
    fn q8_0_block() {
        let mut b = Vec::from(h(2.0));
        b.extend((0..32).map(|j| (j as i8 - 16) as u8));
        let mut out = [0f32; 32];
        dequantize(GgmlType::Q8_0, &b, &mut out);
        for (j, v) in out.iter().enumerate() {
            assert_eq!(*v, (j as f32 - 16.0) * 2.0);
        }
    }

    /// A k-quant head: d = 0.5, dmin = 0.25; scales: sub-blocks 0..4 scale j+1, min j;
    /// sub-blocks 4..8 scale 9, min 5 (no high bits).
    fn k_quant_head() -> Vec<u8> {
        let mut b = Vec::from(h(0.5));
        b.extend(h(0.25));
        let mut scales = [0u8; 12];
        for j in 0..4 {
            scales[j] = (j as u8) + 1;
            scales[j + 4] = j as u8;
        }
        scales[8..12].fill(9 | (5 << 4));
        b.extend(scales);
        b
    }

    #[test]
    fn q4_k_block() {
        let mut b = k_quant_head();
        b.extend([0x73u8; 128]); // low nibble 3, high nibble 7
        let mut out = [0f32; 256];
        dequantize(GgmlType::Q4K, &b, &mut out);
        // sub-block 0 (elements 0..32): scale 1, min 0, low nibbles
        assert_eq!(out[0], 0.5 * 1.0 * 3.0 - 0.0);
        // sub-block 1 (32..64): scale 2, min 1, high nibbles
        assert_eq!(out[32], 0.5 * 2.0 * 7.0 - 0.25 * 1.0);
        // sub-block 5 (160..192): scale 9, min 5, high nibbles
        assert_eq!(out[160], 0.5 * 9.0 * 7.0 - 0.25 * 5.0);
    }

    #[test]
    fn q5_k_block() {
        let mut b = k_quant_head();
        // qh[l]: bit g is the 5th bit of element l of 32-element group g; set groups 1 and 6 for
        // l = 0, group 0 for l = 1
        let mut qh = [0u8; 32];
        qh[0] = (1 << 1) | (1 << 6);
        qh[1] = 1;
        b.extend(qh);
        b.extend([0x73u8; 128]); // low nibble 3, high nibble 7
        let mut out = [0f32; 256];
        dequantize(GgmlType::Q5K, &b, &mut out);
        assert_eq!(out[0], 0.5 * 1.0 * 3.0); // group 0, no 5th bit
        assert_eq!(out[1], 0.5 * 1.0 * 19.0); // group 0, 5th bit
        assert_eq!(out[32], 0.5 * 2.0 * 23.0 - 0.25); // group 1 (high nibbles), 5th bit
        assert_eq!(out[33], 0.5 * 2.0 * 7.0 - 0.25);
        assert_eq!(out[192], 0.5 * 9.0 * 19.0 - 0.25 * 5.0); // group 6 (low nibbles), 5th bit
    }

    #[test]
    fn q4_k_high_scale_bits() {
        // sub-block 4 takes its upper two scale bits from scales[0] >> 6 and min bits from scales[4] >> 6
        let mut scales = [0u8; 12];
        scales[0] = 0b1100_0000; // scale hi bits for j=4 -> 3 << 4 = 48
        scales[4] = 0b0100_0000; // min hi bits for j=4 -> 1 << 4 = 16
        scales[8] = 0x21; // low nibble scale 1, high nibble min 2
        assert_eq!(scale_min_k4(4, &scales), (1 | 48, 2 | 16));
        assert_eq!(scale_min_k4(0, &scales), (0, 0));
    }

    #[test]
    fn q6_k_block() {
        let mut b = vec![0u8; 210];
        // element 0: ql low nibble 5, qh bits 0..2 = 2 -> q = 5 | 32 = 37 -> 37 - 32 = 5
        b[0] = 5;
        b[128] = 2;
        // element 96 (q4 of l=0): ql[32] high nibble 1, qh[0] bits 6..8 = 1 -> 1 | 16 = 17 -> -15
        b[32] = 1 << 4;
        b[128] |= 1 << 6;
        for s in 0..16 {
            b[192 + s] = (s as i8 - 4) as u8;
        }
        b[208..210].copy_from_slice(&h(0.5));
        let mut out = [0f32; 256];
        dequantize(GgmlType::Q6K, &b, &mut out);
        assert_eq!(out[0], 0.5 * -4.0 * 5.0);
        assert_eq!(out[96], 0.5 * (6 - 4) as f32 * -15.0);
        // element 1: all-zero bits -> q = -32, scale index 0
        assert_eq!(out[1], 0.5 * -4.0 * -32.0);
        // element 128 lives in the second half: scales[8] = 4
        assert_eq!(out[128], 0.5 * 4.0 * -32.0);
    }

    #[test]
    fn f16_bf16_f32() {
        let mut out = [0f32; 2];
        dequantize(GgmlType::F16, &[h(1.5), h(-2.0)].concat(), &mut out);
        assert_eq!(out, [1.5, -2.0]);
        let bytes: Vec<u8> = [bf16::from_f32(3.0), bf16::from_f32(-0.5)].iter().flat_map(|x| x.to_le_bytes()).collect();
        dequantize(GgmlType::BF16, &bytes, &mut out);
        assert_eq!(out, [3.0, -0.5]);
        let bytes: Vec<u8> = [7.25f32, -1.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        dequantize(GgmlType::F32, &bytes, &mut out);
        assert_eq!(out, [7.25, -1.0]);
    }

    /// Each lane of the 8-lane search is the one-group search bit for bit (scale, minimum and
    /// levels) on blocks of many kinds: spread and narrow, all positive, with exact and negative
    /// zeros, constant sub-blocks, a tie-prone grid, tiny and huge magnitudes.
    #[test]
    fn make_qkx2_quants_one() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 11) as f64 / (1u64 << 53) as f64
        };
        for block in 0..3000 {
            let kind = block % 8;
            let xb: Vec<f32> = (0..256)
                .map(|i| {
                    let u = next() as f32 * 2.0 - 1.0;
                    match kind {
                        0 => u,
                        1 => u * 1e-4 + 0.3,
                        2 => u.abs() * 5.0,
                        3 if i % 3 == 0 => 0.0,
                        3 if i % 3 == 1 => -0.0,
                        4 if (i / 32) % 2 == 0 => 0.25,
                        5 => (u * 8.0).round() / 8.0,
                        6 => u * 1e-30,
                        7 => u * 1e30,
                        _ => u * if i % 17 == 0 { 9.0 } else { 0.1 },
                    }
                })
                .collect();
            let (x8, w8) = q4_k_sub_blocks(&xb);
            let mut l8 = [[0f32; 8]; 32];
            let (scales, mins) = make_qkx2_quants_x8(15, &x8, &w8, &mut l8, -1.0, 0.1, 20);
            for (j, g) in xb.chunks_exact(32).enumerate() {
                let weights: Vec<f32> = (0..32).map(|i| w8[i][j]).collect();
                let (mut l, mut laux) = ([0u8; 32], [0u8; 32]);
                let (sc, mn) = make_qkx2_quants(15, g, &weights, &mut l, &mut laux, -1.0, 0.1, 20);
                assert_eq!(
                    (sc.to_bits(), mn.to_bits()),
                    (scales[j].to_bits(), mins[j].to_bits()),
                    "block {block} sub-block {j}"
                );
                assert!((0..32).all(|i| l[i] == l8[i][j] as u8), "block {block} sub-block {j}: levels differ");
            }
        }
    }

    /// Our Q8_0 and Q4_K quantizers round-trip through the dequantizers within their steps.
    /// (On Qwen2.5-Coder-1.5B's F16 GGUF, `prep import --quantize Q4_K` differs from
    /// `llama-quantize --pure ... Q4_K` in 12 bytes of 1 GB, and Q8_0 of the fixture is
    /// byte-identical: docs/RESULTS.md.)
    #[test]
    fn q8_0_and_q4_k_quantizers_round_trip() {
        let x: Vec<f32> =
            (0..512).map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * if i % 97 == 0 { 6.0 } else { 1.0 }).collect();
        let mut back = vec![0f32; 512];
        dequantize(GgmlType::Q8_0, &quantize_q8_0(&x), &mut back);
        assert_within_half_steps(&x, &back, 127.0, 1e-6);
        let q = quantize_q4_k(&x);
        assert_eq!(q.len(), 2 * 144);
        dequantize(GgmlType::Q4K, &q, &mut back);
        for (b, c) in back.chunks(32).zip(x.chunks(32)) {
            let range = c.iter().fold(f32::MIN, |m, v| m.max(*v)) - c.iter().fold(f32::MAX, |m, v| m.min(*v)).min(0.0);
            // 15 levels over the group's range, plus the 6-bit scale and minimum rounding
            assert!(b.iter().zip(c).all(|(p, q)| (p - q).abs() <= range / 15.0), "{b:?} vs {c:?}");
        }
        assert!(quantize_q4_k(&[0.0; 256]).iter().skip(4).all(|&b| b == 0));
    }

    /// Every value of `back` (a symmetric 32-value block type's round trip of `x`) within half a
    /// step of its block's grid, the step being max |x| / `levels`, plus `slack`.
    fn assert_within_half_steps(x: &[f32], back: &[f32], levels: f32, slack: f32) {
        for (b, c) in back.chunks(32).zip(x.chunks(32)) {
            let step = c.iter().fold(0f32, |m, v| m.max(v.abs())) / levels;
            assert!(b.iter().zip(c).all(|(p, q)| (p - q).abs() <= 0.51 * step + slack), "{b:?} vs {c:?}");
        }
    }

    /// Q5_0 round-trips within half a step of its grid, and `quantize` dispatches every type it
    /// names.
    #[test]
    fn q5_0_quantizer_round_trips() {
        let x: Vec<f32> =
            (0..256).map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * if i % 37 == 0 { 5.0 } else { 1.0 }).collect();
        let mut back = vec![0f32; 256];
        dequantize(GgmlType::Q5_0, &quantize_q5_0(&x), &mut back);
        assert_within_half_steps(&x, &back, 16.0, 1e-3);
        for t in QUANTIZABLE {
            let q = quantize(t, &x).unwrap();
            assert_eq!(q.len(), 256 / t.block_elements() * t.block_bytes(), "{}", t.name());
        }
        assert!(quantize(GgmlType::Q6K, &x).is_none());
    }
}
