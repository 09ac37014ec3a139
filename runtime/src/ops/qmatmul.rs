//! `out[t, o] = sum_i x[t, i] * w[o, i]` for a weight matrix in GGML blocks ([`QMatrix`]), the
//! way llama.cpp computes it: each token's activation row is quantized once to the weight
//! type's dot-product partner (Q8_K for the k-quants, Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1),
//! then every output is an integer dot product per block, scaled, summed in f32.
//!
//! The block dot products of Q4_K, Q5_K, Q6_K, Q4_0 and Q8_0 are candle-core's
//! (`candle_core::quantized::k_quants`, from ggml-quants.c): AVX2 by runtime detection on
//! x86-64, NEON on aarch64, portable otherwise. Its block structs are `#[repr(C)]` with ggml's
//! layout, so a GGUF row is viewed in place. Q4_1 and Q5_0 (scalar in candle on x86) and the
//! Q8_0/Q8_1 activation blocks are ours (`ops::qdot`), quantized as llama.cpp's x86 build does.
//! x: `[n_tokens, cols]` f32, w: `[rows, cols]` blocks, out: `[n_tokens, rows]` f32.

use crate::ops::qdot::{self, BlockQ8K, BlockQ8_0, BlockQ8_1};
use crate::ops::{block32_gemm, interleaved, kquant_dot, kquant_gemm};
use crate::tensor::{BlockLayout, QMatrix};
use candle_core::quantized::k_quants::{self as ck, BlockQ4K, BlockQ4_0, BlockQ5K, BlockQ6K, GgmlType as Blocks};
use formats::ggml_quants::GgmlType;
use rayon::prelude::*;

/// Tokens from which a k-quant prompt product runs as an integer matrix product
/// ([`kquant_gemm`]) where the CPU has AVX-512 VNNI or the dot-product extension.
const INTEGER_PRODUCT_MIN_TOKENS: usize = 8;
/// Weight rows per rayon task of the integer product.
const INTEGER_PRODUCT_ROWS_PER_TASK: usize = 32;

/// Rows of `w` per rayon task (decode).
const DECODE_ROWS_PER_TASK: usize = 64;
/// Rows of `w` per rayon task (prefill).
const ROWS_PER_TASK: usize = 16;
/// Tokens whose activation rows are dotted with a task's rows before the next group (prefill).
const TOKENS_PER_GROUP: usize = 32;

/// One activation row quantized for a weight type's block dot product.
pub enum QActivation {
    Q8K(Vec<BlockQ8K>),
    Q8_0(Vec<BlockQ8_0>),
    Q8_1(Vec<BlockQ8_1>),
}

/// The activation type `ty`'s dot product takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActivationType {
    Q8K,
    Q8_0,
    Q8_1,
}

/// The partner of weight type `ty` (None: a type without a block kernel here).
pub fn activation_type(ty: GgmlType) -> Option<ActivationType> {
    match ty {
        GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K => Some(ActivationType::Q8K),
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => Some(ActivationType::Q8_0),
        GgmlType::Q4_1 => Some(ActivationType::Q8_1),
        _ => None,
    }
}

impl QActivation {
    /// `x` `[cols]` (a multiple of the type's block) quantized as llama.cpp does.
    pub fn quantize(at: ActivationType, x: &[f32]) -> Self {
        match at {
            ActivationType::Q8K => QActivation::Q8K(qdot::quantize_q8_k(x)),
            ActivationType::Q8_0 => QActivation::Q8_0(qdot::quantize_q8_0(x)),
            ActivationType::Q8_1 => QActivation::Q8_1(qdot::quantize_q8_1(x)),
        }
    }
}

impl QActivation {
    /// The Q8_0 blocks, where the row is of that type.
    pub fn as_q8_0(&self) -> Option<&[BlockQ8_0]> {
        if let QActivation::Q8_0(b) = self {
            Some(b)
        } else {
            None
        }
    }

    /// The Q8_1 blocks, where the row is of that type.
    pub fn as_q8_1(&self) -> Option<&[BlockQ8_1]> {
        if let QActivation::Q8_1(b) = self {
            Some(b)
        } else {
            None
        }
    }

    /// The Q8_K blocks, where the row is of that type.
    pub fn as_q8k(&self) -> Option<&[BlockQ8K]> {
        if let QActivation::Q8K(b) = self {
            Some(b)
        } else {
            None
        }
    }

    /// The row as the kernels see it (the 8-bit blocks dequantized) `[cols]`.
    pub fn dequantize(&self) -> Vec<f32> {
        match self {
            QActivation::Q8K(b) => b.iter().flat_map(|b| b.qs.iter().map(move |&q| q as f32 * b.d)).collect(),
            QActivation::Q8_0(b) => b.iter().flat_map(|b| b.qs.iter().map(move |&q| q as f32 * b.d.to_f32())).collect(),
            QActivation::Q8_1(b) => b.iter().flat_map(|b| b.qs.iter().map(move |&q| q as f32 * b.d.to_f32())).collect(),
        }
    }
}

/// `bytes` (whole blocks) as blocks of `T`.
fn blocks<T: Blocks>(bytes: &[u8]) -> &[T] {
    let size = std::mem::size_of::<T>();
    assert!(
        bytes.len().is_multiple_of(size) && (bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>()),
        "a row of {} bytes is not whole, aligned {size}-byte blocks",
        bytes.len()
    );
    // SAFETY: candle's block structs are #[repr(C)] plain data (f16 scales, u8/i8 arrays), valid
    // for any bit pattern, with ggml's sizes (asserted in candle); the length and alignment
    // are checked above and the slice borrows `bytes`.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr() as *const T, bytes.len() / size) }
}

/// Our Q8_0 activation blocks as candle's (the same #[repr(C)] layout, 34 bytes).
fn as_candle_q8_0(a: &[BlockQ8_0]) -> &[ck::BlockQ8_0] {
    const _: () = assert!(
        std::mem::size_of::<ck::BlockQ8_0>() == std::mem::size_of::<BlockQ8_0>()
            && std::mem::align_of::<ck::BlockQ8_0>() == std::mem::align_of::<BlockQ8_0>()
    );
    // SAFETY: both are #[repr(C)] { d: f16, qs: [i8; 32] } (sizes and alignments asserted);
    // the slice borrows `a`.
    unsafe { std::slice::from_raw_parts(a.as_ptr() as *const ck::BlockQ8_0, a.len()) }
}

/// Our Q8_K activation blocks as candle's (the same #[repr(C)] layout, 292 bytes).
fn as_candle_q8_k(a: &[BlockQ8K]) -> &[ck::BlockQ8K] {
    const _: () = assert!(
        std::mem::size_of::<ck::BlockQ8K>() == std::mem::size_of::<BlockQ8K>()
            && std::mem::align_of::<ck::BlockQ8K>() == std::mem::align_of::<BlockQ8K>()
    );
    // SAFETY: both are #[repr(C)] { d: f32, qs: [i8; 256], bsums: [i16; 16] } (sizes and
    // alignments asserted); the slice borrows `a`.
    unsafe { std::slice::from_raw_parts(a.as_ptr() as *const ck::BlockQ8K, a.len()) }
}

/// One row of `ty` blocks against an activation row quantized for it.
#[inline]
pub fn dot_row(ty: GgmlType, row: &[u8], cols: usize, x: &QActivation) -> f32 {
    if let Some(a) = block32_activation(ty, x) {
        return block32_gemm::dot_row(ty, row, a);
    }
    match (ty, x) {
        (GgmlType::Q4K, QActivation::Q8K(a)) => kquant_dot::dot_q4_k([row], [a])[0][0],
        (GgmlType::Q6K, QActivation::Q8K(a)) => kquant_dot::dot_q6_k([row], [a])[0][0],
        (GgmlType::Q5K, QActivation::Q8K(a)) => candle_dot_q8_k(GgmlType::Q5K, row, a),
        (GgmlType::Q4_0, QActivation::Q8_0(a)) => BlockQ4_0::vec_dot(cols, blocks(row), as_candle_q8_0(a)),
        (GgmlType::Q8_0, QActivation::Q8_0(a)) => ck::BlockQ8_0::vec_dot(cols, blocks(row), as_candle_q8_0(a)),
        (GgmlType::Q5_0, QActivation::Q8_0(a)) => qdot::dot_q5_0_q8_0(row, a),
        (GgmlType::Q4_1, QActivation::Q8_1(a)) => qdot::dot_q4_1_q8_1(row, a),
        (t, _) => panic!("no block kernel for {} with this activation type", t.name()),
    }
}

/// candle-core's one-row kernel for a k-quant row against Q8_K blocks (the portable and NEON
/// path of [`crate::ops::kquant_dot`]).
pub(crate) fn candle_dot_q8_k(ty: GgmlType, row: &[u8], x: &[BlockQ8K]) -> f32 {
    let cols = x.len() * qdot::QK_K;
    match ty {
        GgmlType::Q4K => BlockQ4K::vec_dot(cols, blocks(row), as_candle_q8_k(x)),
        GgmlType::Q5K => BlockQ5K::vec_dot(cols, blocks(row), as_candle_q8_k(x)),
        GgmlType::Q6K => BlockQ6K::vec_dot(cols, blocks(row), as_candle_q8_k(x)),
        t => panic!("{} is not a k-quant", t.name()),
    }
}

/// `x`'s Q8_0 blocks where `ty`'s products go through [`block32_gemm`] (the CPU runs its
/// integer product, so one token computes as one of its lanes, whatever the batch).
fn block32_activation(ty: GgmlType, x: &QActivation) -> Option<&[BlockQ8_0]> {
    if !(block32_gemm::supports(ty) && kquant_gemm::available()) {
        return None;
    }
    Some(x.as_q8_0().unwrap_or_else(|| panic!("{} weights need Q8_0 activations", ty.name())))
}

/// `dst[i] = row r0 + i . x` over `rows`, rows of `row_bytes` bytes of `ty` blocks.
fn matvec_rows(ty: GgmlType, rows: &[u8], row_bytes: usize, cols: usize, x: &QActivation, r0: usize, dst: &mut [f32]) {
    if let Some(x) = block32_activation(ty, x) {
        return block32_gemm::matvec(ty, &rows[r0 * row_bytes..(r0 + dst.len()) * row_bytes], row_bytes, x, dst);
    }
    for (i, o) in dst.iter_mut().enumerate() {
        let r = r0 + i;
        *o = dot_row(ty, &rows[r * row_bytes..(r + 1) * row_bytes], cols, x);
    }
}

/// `dst[i] = w row r0 + i . x`, in either layout of `w`'s blocks.
fn matvec_task(w: &QMatrix, x: &QActivation, r0: usize, dst: &mut [f32]) {
    match (w.layout(), x) {
        (BlockLayout::RowMajor(rows), _) => matvec_rows(w.ty, rows, w.row_bytes, w.cols, x, r0, dst),
        (BlockLayout::Interleaved(inter), QActivation::Q8K(a)) => {
            interleaved::matvec_groups(w.ty, inter, a, r0 / interleaved::ROWS, dst)
        }
        (BlockLayout::Interleaved(_), _) => panic!("{} weights need Q8_K activations", w.ty.name()),
    }
}

/// `out[o] = w[o, :] . x` for one token, `x` already quantized for `w`.
pub fn qmatvec(w: &QMatrix, x: &QActivation, out: &mut [f32]) {
    assert_eq!(out.len(), w.rows);
    out.par_chunks_mut(DECODE_ROWS_PER_TASK)
        .enumerate()
        .for_each(|(b, dst)| matvec_task(w, x, b * DECODE_ROWS_PER_TASK, dst));
}

/// [`qmatvec`] over `out.len()` rows of `ty` blocks held as plain bytes (`rows`).
pub fn qmatvec_bytes(ty: GgmlType, rows: &[u8], cols: usize, x: &QActivation, out: &mut [f32]) {
    let row_bytes = cols / ty.block_elements() * ty.block_bytes();
    assert_eq!(rows.len(), out.len() * row_bytes);
    out.par_chunks_mut(DECODE_ROWS_PER_TASK)
        .enumerate()
        .for_each(|(b, dst)| matvec_rows(ty, rows, row_bytes, cols, x, b * DECODE_ROWS_PER_TASK, dst));
}

/// Several matrices against the same quantized `x` in one parallel pass (q/k/v, gate/up).
pub fn qmatvec_many(ws: &[&QMatrix], xs: &[&QActivation], outs: &mut [&mut [f32]]) {
    let tasks = crate::ops::matmul::row_block_tasks(outs, |m| ws[m].rows, DECODE_ROWS_PER_TASK);
    tasks.into_par_iter().for_each(|(m, dst, r0)| matvec_task(ws[m], xs[m], r0, dst));
}

/// The block type's activation rows for `x` `[n_tokens, cols]`.
pub fn quantize_rows(at: ActivationType, x: &[f32], cols: usize) -> Vec<QActivation> {
    x.par_chunks(cols).map(|row| QActivation::quantize(at, row)).collect()
}

/// A group of activation rows viewed as the blocks of a weight type with a 4-token kernel
/// (Q4_1, Q4_K, Q6_K); each 4-token product equals the one-token kernel's bit for bit.
enum TokenBlocks<'a> {
    Q8_1(Vec<&'a [BlockQ8_1]>),
    Q8K(Vec<&'a [BlockQ8K]>),
    None,
}

impl<'a> TokenBlocks<'a> {
    fn of(ty: GgmlType, group: &'a [QActivation]) -> Self {
        match ty {
            GgmlType::Q4_1 => group
                .iter()
                .map(QActivation::as_q8_1)
                .collect::<Option<_>>()
                .map_or(TokenBlocks::None, TokenBlocks::Q8_1),
            GgmlType::Q4K | GgmlType::Q6K => {
                group.iter().map(QActivation::as_q8k).collect::<Option<_>>().map_or(TokenBlocks::None, TokenBlocks::Q8K)
            }
            _ => TokenBlocks::None,
        }
    }

    /// `row . x[k..k + 4]`, where this type has a 4-token kernel and the group holds 4 more.
    fn dot4(&self, ty: GgmlType, row: &[u8], k: usize) -> Option<[f32; 4]> {
        match self {
            TokenBlocks::Q8_1(x) if k + 4 <= x.len() => {
                Some(qdot::dot4_q4_1_q8_1(row, [x[k], x[k + 1], x[k + 2], x[k + 3]]))
            }
            TokenBlocks::Q8K(x) if k + 4 <= x.len() => {
                let xs = [x[k], x[k + 1], x[k + 2], x[k + 3]];
                Some(if ty == GgmlType::Q4K {
                    kquant_dot::dot_q4_k([row], xs)[0]
                } else {
                    kquant_dot::dot_q6_k([row], xs)[0]
                })
            }
            _ => None,
        }
    }
}

/// `out[t, o] = w[o, :] . x[t, :]` for `n_tokens` quantized rows: each block of weight rows is
/// read once and dotted with every token (the rows stay in cache).
pub fn qmatmul(xs: &[QActivation], w: &QMatrix, out: &mut [f32]) {
    qmatmul_many(xs, &[w], &mut [out]);
}

/// Whether `w` times `n_tokens` rows runs as an integer matrix product.
fn integer_product_runs(w: &QMatrix, n_tokens: usize) -> bool {
    (matches!(w.ty, GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K) || block32_gemm::supports(w.ty))
        && n_tokens >= INTEGER_PRODUCT_MIN_TOKENS
        && w.rows.is_multiple_of(kquant_gemm::ROWS)
        && kquant_gemm::available()
}

/// [`qmatmul`] of the same rows `xs` by several matrices (q, k and v; gate and up), `outs[m]`
/// `[n_tokens, ws[m].rows]`: where every matrix runs the integer product, the tokens are laid
/// out once for all of them and every matrix's row tasks run as one parallel pass.
pub fn qmatmul_many(xs: &[QActivation], ws: &[&QMatrix], outs: &mut [&mut [f32]]) {
    let n_tokens = xs.len();
    assert_eq!(ws.len(), outs.len());
    for (w, out) in ws.iter().zip(outs.iter()) {
        assert_eq!(out.len(), n_tokens * w.rows);
    }
    // one pass where every matrix runs the integer product on the same activations' tiles
    let tiles_of = |w: &QMatrix| activation_type(w.ty);
    if ws.iter().all(|w| integer_product_runs(w, n_tokens) && tiles_of(w) == tiles_of(ws[0])) {
        return integer_product(xs, ws, outs);
    }
    for (w, out) in ws.iter().zip(outs.iter_mut()) {
        if integer_product_runs(w, n_tokens) {
            integer_product(xs, &[w], &mut [out]);
        } else {
            qmatmul_one(xs, w, out);
        }
    }
}

/// [`qmatmul`] where the integer product does not run: the 4-token kernels or the decode
/// kernel per token.
fn qmatmul_one(xs: &[QActivation], w: &QMatrix, out: &mut [f32]) {
    let (n_tokens, n_out) = (xs.len(), w.rows);
    if let BlockLayout::Interleaved(_) = w.layout() {
        // a few tokens: the decode kernel for each
        for (x, o) in xs.iter().zip(out.chunks_exact_mut(n_out)) {
            qmatvec(w, x, o);
        }
        return;
    }
    let n_blocks = n_out.div_ceil(ROWS_PER_TASK);
    let tiles: Vec<Vec<f32>> = (0..n_blocks)
        .into_par_iter()
        .map(|b| {
            let r0 = b * ROWS_PER_TASK;
            let n_rows = ROWS_PER_TASK.min(n_out - r0);
            let mut tile = vec![0f32; n_tokens * n_rows]; // [n_tokens, n_rows]
                                                          // tokens in groups, so a group's activations stay in cache across the rows
            for t0 in (0..n_tokens).step_by(TOKENS_PER_GROUP) {
                let group = &xs[t0..(t0 + TOKENS_PER_GROUP).min(n_tokens)];
                let blocks = TokenBlocks::of(w.ty, group);
                for r in 0..n_rows {
                    let row = &*w.row(r0 + r);
                    let mut k = 0;
                    while let Some(d) = blocks.dot4(w.ty, row, k) {
                        for (i, d) in d.into_iter().enumerate() {
                            tile[(t0 + k + i) * n_rows + r] = d;
                        }
                        k += 4;
                    }
                    for (k, x) in group.iter().enumerate().skip(k) {
                        tile[(t0 + k) * n_rows + r] = dot_row(w.ty, row, w.cols, x);
                    }
                }
            }
            tile
        })
        .collect();
    out.par_chunks_mut(n_out).enumerate().for_each(|(t, row)| {
        for (b, tile) in tiles.iter().enumerate() {
            let r0 = b * ROWS_PER_TASK;
            let n_rows = tile.len() / n_tokens;
            row[r0..r0 + n_rows].copy_from_slice(&tile[t * n_rows..(t + 1) * n_rows]);
        }
    });
}

/// [`qmatmul_many`] as integer matrix products: Q4_K, Q5_K and Q6_K by [`kquant_gemm`], Q4_0, Q5_0
/// and Q8_0 by [`block32_gemm`] (every matrix of one of the two); the tokens laid out once in
/// tiles of 16, each task's rows unpacked once for all of them, each task writing its columns
/// of one output.
fn integer_product(xs: &[QActivation], ws: &[&QMatrix], outs: &mut [&mut [f32]]) {
    let wrong = |want: &str| -> ! { panic!("{} weights need {want} activations", ws[0].ty.name()) };
    let tiles = if block32_gemm::supports(ws[0].ty) {
        let rows: Vec<&[BlockQ8_0]> = xs.iter().map(|x| x.as_q8_0().unwrap_or_else(|| wrong("Q8_0"))).collect();
        Tiles::Block32(rows.par_chunks(kquant_gemm::TOKENS).map(block32_gemm::TokenTile::new).collect())
    } else {
        let rows: Vec<&[BlockQ8K]> = xs.iter().map(|x| x.as_q8k().unwrap_or_else(|| wrong("Q8_K"))).collect();
        Tiles::KQuant(rows.par_chunks(kquant_gemm::TOKENS).map(kquant_gemm::TokenTile::new).collect())
    };
    let windows: Vec<(&QMatrix, ColumnWindow)> = ws
        .iter()
        .zip(outs.iter_mut())
        .flat_map(|(w, out)| {
            column_windows(out, w.rows, INTEGER_PRODUCT_ROWS_PER_TASK).into_iter().map(move |c| (*w, c))
        })
        .collect();
    windows.into_par_iter().for_each(|(w, mut window)| {
        let (r0, n) = (window.first_column, window.width);
        let put =
            &mut |t0: usize, r: usize, acc: &[[f32; kquant_gemm::TOKENS]; kquant_gemm::ROWS]| window.put(t0, r, acc);
        match (&tiles, w.layout()) {
            (Tiles::Block32(t), BlockLayout::RowMajor(b)) => {
                block32_gemm::product(w.ty, &b[r0 * w.row_bytes..], w.row_bytes, n, t, put)
            }
            (Tiles::Block32(_), BlockLayout::Interleaved(_)) => {
                unreachable!("only Q4_K and Q6_K are interleaved")
            }
            (Tiles::KQuant(t), BlockLayout::RowMajor(b)) => kquant_gemm::product(
                w.ty,
                kquant_gemm::WeightRows::RowMajor { bytes: &b[r0 * w.row_bytes..], row_bytes: w.row_bytes },
                n,
                t,
                put,
            ),
            (Tiles::KQuant(t), BlockLayout::Interleaved(v)) => {
                let group = interleaved::group_bytes(w.ty, w.cols);
                let rows = kquant_gemm::WeightRows::Interleaved(&v[r0 / interleaved::ROWS * group..]);
                kquant_gemm::product(w.ty, rows, n, t, put)
            }
        }
    });
}

/// Columns `first_column..first_column + width` of every token's row of a product's output
/// `[n_tokens, n_out]`: one task's share, written in place.
struct ColumnWindow<'a> {
    out: *mut f32,
    n_tokens: usize,
    n_out: usize,
    first_column: usize,
    width: usize,
    _out: std::marker::PhantomData<&'a mut [f32]>,
}

// SAFETY: the windows of one output cover disjoint columns ([`column_windows`] makes them all,
// from one exclusive borrow), so threads holding different windows never write the same value,
// and nothing reads the output while they live.
unsafe impl Send for ColumnWindow<'_> {}

/// `out` `[n_tokens, n_out]` as windows of `width` columns (the last one narrower), so the
/// tasks of a product each write their columns into `out` itself: no buffer per task to copy
/// from.
fn column_windows(out: &mut [f32], n_out: usize, width: usize) -> Vec<ColumnWindow<'_>> {
    assert!(n_out > 0 && out.len().is_multiple_of(n_out));
    let (ptr, n_tokens) = (out.as_mut_ptr(), out.len() / n_out);
    (0..n_out)
        .step_by(width)
        .map(|c0| ColumnWindow {
            out: ptr,
            n_tokens,
            n_out,
            first_column: c0,
            width: width.min(n_out - c0),
            _out: std::marker::PhantomData,
        })
        .collect()
}

impl ColumnWindow<'_> {
    /// `acc[i][t]` into column `first_column + r + i` of token `t0 + t`'s row, for the tokens
    /// the output has (a product's last tile is padded).
    fn put(&mut self, t0: usize, r: usize, acc: &[[f32; kquant_gemm::TOKENS]; kquant_gemm::ROWS]) {
        assert!(r + kquant_gemm::ROWS <= self.width, "rows beyond the window");
        for t in 0..kquant_gemm::TOKENS.min(self.n_tokens.saturating_sub(t0)) {
            let at = (t0 + t) * self.n_out + self.first_column + r;
            for (i, a) in acc.iter().enumerate() {
                // SAFETY: token t0 + t < n_tokens and column first_column + r + i < first_column +
                // width <= n_out, so `at + i` is inside the output this window borrows, in this
                // window's columns, which no other window holds.
                unsafe { *self.out.add(at + i) = a[t] };
            }
        }
    }
}

/// The tokens of an integer product, laid out for its kernel.
enum Tiles {
    KQuant(Vec<kquant_gemm::TokenTile>),
    Block32(Vec<block32_gemm::TokenTile>),
}

#[cfg(test)]
mod tests {
    use super::*;
    use memmap2::MmapMut;

    /// Every type with a block kernel here.
    const BLOCK_TYPES: [GgmlType; 7] =
        [GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q8_0];
    use std::sync::Arc;

    fn quantize_blocks<T: Blocks>(x: &[f32]) -> Vec<T> {
        let mut out = vec![T::zeros(); x.len() / T::BLCK_SIZE];
        T::from_float(x, &mut out);
        out
    }

    /// A QMatrix of `ty` quantized (by candle, llama.cpp's algorithm) from `w` `[rows, cols]`.
    fn quantized(ty: GgmlType, w: &[f32], rows: usize, cols: usize) -> QMatrix {
        fn q<T: Blocks>(w: &[f32]) -> Vec<u8> {
            let b: Vec<T> = quantize_blocks(w);
            let size = std::mem::size_of::<T>() * b.len();
            // SAFETY: plain-data blocks viewed as their bytes, for the test's copy only.
            unsafe { std::slice::from_raw_parts(b.as_ptr() as *const u8, size) }.to_vec()
        }
        let bytes = match ty {
            GgmlType::Q4K => q::<BlockQ4K>(w),
            GgmlType::Q5K => q::<BlockQ5K>(w),
            GgmlType::Q6K => q::<BlockQ6K>(w),
            GgmlType::Q4_0 => q::<BlockQ4_0>(w),
            GgmlType::Q4_1 => q::<ck::BlockQ4_1>(w),
            GgmlType::Q5_0 => q::<ck::BlockQ5_0>(w),
            GgmlType::Q8_0 => q::<ck::BlockQ8_0>(w),
            _ => unreachable!(),
        };
        let mut map = MmapMut::map_anon(bytes.len()).unwrap();
        map.copy_from_slice(&bytes);
        QMatrix::mapped(ty, rows, cols, Arc::new(map.make_read_only().unwrap()), 0)
    }

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

    /// Every kernel against the f32 dot product of the dequantized row (formats' dequantizer,
    /// written independently of candle) with the exact activation: the only differences are
    /// the activation's 8-bit rounding, so the error is bounded relative to |w| |x|.
    /// Every kernel equals the f64 product of the dequantized row and the dequantized
    /// activation blocks up to f32 rounding (integer sums per block): a kernel that drops or
    /// mis-scales part of a block fails here, not only by 1%.
    #[test]
    fn block_kernels_compute_the_exact_block_product() {
        let (rows, cols) = (4, 1024);
        let w = random(rows * cols, 5);
        let x: Vec<f32> = random(cols, 13).iter().map(|v| v * 3.0).collect();
        for ty in BLOCK_TYPES {
            let m = quantized(ty, &w, rows, cols);
            let xa = QActivation::quantize(activation_type(ty).unwrap(), &x);
            let xd = xa.dequantize();
            for r in 0..rows {
                let mut wr = vec![0f32; cols];
                formats::ggml_quants::dequantize(ty, &m.row(r), &mut wr);
                let exact: f64 = wr.iter().zip(&xd).map(|(a, b)| *a as f64 * *b as f64).sum();
                let size: f64 = wr.iter().zip(&xd).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
                let got = dot_row(ty, &m.row(r), cols, &xa) as f64;
                // Q4_1's offset term uses Q8_1's s, rounded to f16 (as llama.cpp's)
                let tol = if ty == GgmlType::Q4_1 { 2e-3 } else { 2e-5 };
                assert!(
                    (got - exact).abs() <= tol * size,
                    "{}: row {r}: {got} vs {exact} (sum |w x| {size})",
                    ty.name()
                );
            }
        }
    }

    #[test]
    fn block_kernels_match_the_dequantized_reference() {
        let (rows, cols) = (8, 512);
        let w = random(rows * cols, 7);
        let x = random(cols, 11);
        for ty in BLOCK_TYPES {
            let m = quantized(ty, &w, rows, cols);
            let xa = QActivation::quantize(activation_type(ty).unwrap(), &x);
            let mut out = vec![0f32; rows];
            qmatvec(&m, &xa, &mut out);
            // 5 tokens: the 4-token kernels (Q4_1, Q4_K, Q6_K) and the one-token one
            let xs = quantize_rows(activation_type(ty).unwrap(), &x.repeat(5), cols);
            let mut out2 = vec![0f32; 5 * rows];
            qmatmul(&xs, &m, &mut out2);
            for r in 0..rows {
                let mut wr = vec![0f32; cols];
                formats::ggml_quants::dequantize(ty, &m.row(r), &mut wr);
                let want: f32 = wr.iter().zip(&x).map(|(a, b)| a * b).sum();
                let scale = (wr.iter().map(|v| v * v).sum::<f32>() * x.iter().map(|v| v * v).sum::<f32>()).sqrt();
                // 8-bit activations: |err| <= ~|w||x| / 127 per block, far less summed at random
                assert!(
                    (out[r] - want).abs() <= 0.01 * scale,
                    "{}: row {r}: {} vs {want} (|w||x| {scale})",
                    ty.name(),
                    out[r]
                );
                assert_eq!(out[r], out2[r], "{}: matvec and matmul differ", ty.name());
                for t in 1..5 {
                    assert_eq!(out2[t * rows + r], out2[r], "{}: token {t} differs", ty.name());
                }
            }
        }
    }
    /// The integer product (a prompt of 8 tokens or more, with AVX-512 VNNI or SDOT) of every
    /// type that has one equals the one-token kernels up to f32 summation order (Q4_0, Q5_0 and
    /// Q8_0 bit for bit: their one-token kernel is one lane of it): within 1e-5 of sum |w x|
    /// per product, on 72 rows (two tasks of 32 rows, then 8) x 768 columns and 40 tokens (three tiles, the third
    /// padded), scaled 1e-3 to 1e3. Skipped where the CPU lacks both.
    #[test]
    fn the_integer_product_matches_the_one_token_kernels() {
        if !kquant_gemm::available() {
            eprintln!("no AVX-512 VNNI or dot-product extension here: the integer product does not run");
            return;
        }
        let (rows, cols, n_tokens) = (72, 768, 40);
        let w = random(rows * cols, 17);
        let x: Vec<f32> = (0..n_tokens)
            .flat_map(|t| random(cols, 100 + t as u64).into_iter().map(move |v| v * [1e-3, 1.0, 1e3][t % 3]))
            .collect();
        for ty in BLOCK_TYPES {
            let m = quantized(ty, &w, rows, cols);
            let xs = quantize_rows(activation_type(ty).unwrap(), &x, cols);
            let mut out = vec![0f32; n_tokens * rows];
            qmatmul(&xs, &m, &mut out);
            for (t, xa) in xs.iter().enumerate() {
                let xd = xa.dequantize();
                let mut decoded = vec![0f32; rows];
                qmatvec(&m, xa, &mut decoded);
                for r in 0..rows {
                    let one = dot_row(ty, &m.row(r), cols, xa);
                    if block32_gemm::supports(ty) {
                        // decode, 8 rows at a time, computes each row as the one-row kernel does
                        assert_eq!(decoded[r].to_bits(), one.to_bits(), "{}: decode of row {r}", ty.name());
                    }
                    let mut wr = vec![0f32; cols];
                    formats::ggml_quants::dequantize(ty, &m.row(r), &mut wr);
                    let size: f64 = wr.iter().zip(&xd).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
                    let got = out[t * rows + r];
                    if block32_gemm::supports(ty) {
                        // their one-token kernel is one lane of the product: the same bits
                        assert_eq!(got.to_bits(), one.to_bits(), "{}: token {t} row {r}", ty.name());
                    }
                    assert!(
                        ((got - one) as f64).abs() <= 1e-5 * size,
                        "{}: token {t} row {r}: {got} vs {one} (sum |w x| {size})",
                        ty.name()
                    );
                }
            }
        }
    }

    /// Several matrices by the same rows in one pass ([`qmatmul_many`]: the tokens laid out
    /// once, every matrix's tasks together) give each matrix's [`qmatmul`] bit for bit: q, k
    /// and v of different types and heights sharing tiles, and a group that falls back to one
    /// product each (36 rows are not whole groups of 8: that matrix runs the 4-token kernels,
    /// its Q4_K partner still the integer product).
    #[test]
    fn several_matrices_in_one_pass_give_each_product() {
        let (cols, n_tokens) = (512, 21);
        let x = random(n_tokens * cols, 5);
        for group in [
            vec![(GgmlType::Q4K, 96), (GgmlType::Q4K, 16), (GgmlType::Q6K, 16)],
            vec![(GgmlType::Q8_0, 40), (GgmlType::Q4_0, 72)],
            vec![(GgmlType::Q4K, 64), (GgmlType::Q5K, 32)],
            vec![(GgmlType::Q4K, 64), (GgmlType::Q5K, 36)],
        ] {
            let ms: Vec<QMatrix> = group
                .iter()
                .enumerate()
                .map(|(i, &(ty, rows))| quantized(ty, &random(rows * cols, 30 + i as u64), rows, cols))
                .collect();
            let xs = quantize_rows(activation_type(ms[0].ty).unwrap(), &x, cols);
            let mut together: Vec<Vec<f32>> = ms.iter().map(|m| vec![0f32; n_tokens * m.rows]).collect();
            let ws: Vec<&QMatrix> = ms.iter().collect();
            qmatmul_many(&xs, &ws, &mut together.iter_mut().map(|o| o.as_mut_slice()).collect::<Vec<_>>());
            for (m, got) in ms.iter().zip(&together) {
                let mut alone = vec![0f32; n_tokens * m.rows];
                qmatmul(&xs, m, &mut alone);
                let differ = got.iter().zip(&alone).position(|(a, b)| a.to_bits() != b.to_bits());
                assert_eq!(differ, None, "{} x {} in {group:?}: the first value that differs", m.ty.name(), m.rows);
            }
        }
    }

    /// Q4_K and Q6_K rows interleaved by eight (`interleaved`, a run with every row in memory)
    /// give back their GGUF bytes, compute each product within 1e-5 of sum |w x| of the
    /// one-token kernel and within 2e-5 of the exact block product, and a prompt's integer
    /// product over them equals the row-major one bit for bit. Skipped where the CPU lacks
    /// AVX-512 VNNI and the dot-product extension.
    #[test]
    fn interleaved_rows_compute_the_same_products() {
        if !interleaved::supports(GgmlType::Q4K) {
            eprintln!("no AVX-512 VNNI or dot-product extension here: matrices keep the GGUF's layout");
            return;
        }
        let (rows, cols, n_tokens) = (24, 1024, 21);
        let w = random(rows * cols, 23);
        let x: Vec<f32> = (0..n_tokens)
            .flat_map(|t| random(cols, 300 + t as u64).into_iter().map(move |v| v * [1e-3, 1.0, 1e3][t % 3]))
            .collect();
        let xs = quantize_rows(ActivationType::Q8K, &x, cols);
        for ty in [GgmlType::Q4K, GgmlType::Q6K] {
            let m = quantized(ty, &w, rows, cols);
            let BlockLayout::RowMajor(bytes) = m.layout() else { unreachable!() };
            let mi = QMatrix::interleaved(ty, rows, cols, bytes).expect("the interleaved kernel is here");
            assert!(matches!(mi.layout(), BlockLayout::Interleaved(_)));
            for r in 0..rows {
                assert_eq!(mi.row(r), m.row(r), "{}: row {r} changed by interleaving", ty.name());
            }
            for xa in &xs {
                let xd = xa.dequantize();
                let mut got = vec![0f32; rows];
                qmatvec(&mi, xa, &mut got);
                for (r, g) in got.iter().enumerate() {
                    let mut wr = vec![0f32; cols];
                    formats::ggml_quants::dequantize(ty, &m.row(r), &mut wr);
                    let exact: f64 = wr.iter().zip(&xd).map(|(a, b)| *a as f64 * *b as f64).sum();
                    let size: f64 = wr.iter().zip(&xd).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
                    let one = dot_row(ty, &m.row(r), cols, xa);
                    assert!(
                        ((g - one) as f64).abs() <= 1e-5 * size,
                        "{}: row {r}: {g} vs {one} (sum |w x| {size})",
                        ty.name()
                    );
                    assert!((*g as f64 - exact).abs() <= 2e-5 * size, "{}: row {r}: {g} vs exact {exact}", ty.name());
                }
            }
            let (mut a, mut b) = (vec![0f32; n_tokens * rows], vec![0f32; n_tokens * rows]);
            qmatmul(&xs, &m, &mut a);
            qmatmul(&xs, &mi, &mut b);
            let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a), bits(&b), "{}: the integer product differs", ty.name());
            // a few tokens: the decode kernel for each
            let (mut few, mut one) = (vec![0f32; 3 * rows], vec![0f32; rows]);
            qmatmul(&xs[..3], &mi, &mut few);
            qmatvec(&mi, &xs[2], &mut one);
            assert_eq!(bits(&few[2 * rows..]), bits(&one));
        }
    }
}
