//! The sparse MLP's down projection over the rows a layer holds: `out` `[d]` = `sum_i c_i x
//! row_i`, the one summation every sparse path uses (streamed predictor and scorer, and the
//! in-memory scorer), so streamed and in-memory runs add the same terms in the same order.

use crate::ops::simd::{axpy, axpy_f16, axpy_q4_k};
use formats::ggml_quants::{self, GgmlType};
use half::f16;
use rayon::prelude::*;

/// Rows per rayon task; tasks are summed in order.
pub const DOWN_SUM_CHUNK: usize = 64;

/// `out` `[d]` = `sum_i coef(i, ids[i]) x row(ids[i])` over `ids` (slots or neurons): each
/// chunk of [`DOWN_SUM_CHUNK`] on a rayon task, the chunks' sums then added in chunk order, so
/// the result does not depend on how the pool split the work (a reduce tree would: its
/// rounding flips marginal neurons from run to run). `coef` gets the index into `ids` and the id.
pub fn down_sum<'a>(
    ids: &[u32],
    coef: impl Fn(usize, u32) -> f32 + Sync,
    row: impl Fn(u32) -> &'a [f16] + Sync,
    out: &mut [f32],
) {
    chunked_sum(ids, |k, id, acc| axpy_f16(coef(k, id), row(id), acc), out)
}

/// [`down_sum`] over rows of GGML blocks of type `ty` (version-2 records' down rows: Q8_0,
/// Q5_0 or Q4_K, the types `RecordShape::check` admits), in the same chunk order.
pub fn down_sum_blocks<'a>(
    ty: GgmlType,
    ids: &[u32],
    coef: impl Fn(usize, u32) -> f32 + Sync,
    row: impl Fn(u32) -> &'a [u8] + Sync,
    out: &mut [f32],
) {
    // one monomorphized loop per type, so each block's dequantizer inlines
    match ty {
        GgmlType::Q8_0 => chunked_sum(ids, |k, id, acc| axpy_q8_0(coef(k, id), row(id), acc), out),
        GgmlType::Q4K => chunked_sum(ids, |k, id, acc| axpy_q4_k(coef(k, id), row(id), acc), out),
        GgmlType::Q5_0 => chunked_sum(
            ids,
            |k, id, acc| axpy_blocks::<32, 22>(ggml_quants::dequant_block_q5_0, coef(k, id), row(id), acc),
            out,
        ),
        other => unreachable!("down rows of {}: RecordShape::check admits only Q8_0, Q5_0 and Q4_K", other.name()),
    }
}

/// `y += a x row`, `row` blocks of `BE` values in `BB` bytes: each block dequantized on the
/// stack by `dequant`, then one vector axpy.
#[inline]
pub fn axpy_blocks<const BE: usize, const BB: usize>(
    dequant: impl Fn(&[u8], &mut [f32]),
    a: f32,
    row: &[u8],
    y: &mut [f32],
) {
    debug_assert_eq!(row.len(), y.len() / BE * BB);
    let mut buf = [0f32; BE];
    for (b, ys) in row.chunks_exact(BB).zip(y.chunks_exact_mut(BE)) {
        dequant(b, &mut buf);
        axpy(a, &buf, ys);
    }
}

/// `y += a x row`, `row` Q8_0 blocks of `y.len()` values.
pub fn axpy_q8_0(a: f32, row: &[u8], y: &mut [f32]) {
    debug_assert_eq!(row.len(), y.len() / 32 * 34);
    for (b, ys) in row.chunks_exact(34).zip(y.chunks_exact_mut(32)) {
        let s = a * f16::from_le_bytes([b[0], b[1]]).to_f32();
        for (yv, &q) in ys.iter_mut().zip(&b[2..]) {
            *yv += s * (q as i8) as f32;
        }
    }
}

fn chunked_sum(ids: &[u32], term: impl Fn(usize, u32, &mut [f32]) + Sync, out: &mut [f32]) {
    let d = out.len();
    let partial: Vec<Vec<f32>> = ids
        .par_chunks(DOWN_SUM_CHUNK)
        .enumerate()
        .map(|(c, chunk)| {
            let mut acc = vec![0f32; d];
            for (k, &id) in chunk.iter().enumerate() {
                term(c * DOWN_SUM_CHUNK + k, id, &mut acc);
            }
            acc
        })
        .collect();
    out.fill(0.0);
    for p in &partial {
        out.iter_mut().zip(p).for_each(|(o, v)| *o += v);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_same_sum_however_the_pool_splits() {
        use half::f16;
        let rows: Vec<Vec<f16>> = (0..1000)
            .map(|j| (0..16).map(|i| f16::from_f32(((j * 7 + i * 13) % 29) as f32 * 0.37 - 5.0)).collect())
            .collect();
        let ids: Vec<u32> = (0..1000).collect();
        let coef = |i: usize, _| (i as f32 * 0.013).sin();
        let sum = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            let mut out = vec![0f32; 16];
            pool.install(|| super::down_sum(&ids, coef, |id| &rows[id as usize], &mut out));
            out
        };
        let one = sum(1);
        for threads in [2, 3, 8] {
            for _ in 0..5 {
                assert_eq!(sum(threads), one, "{threads} threads");
            }
        }
    }

    /// Every down-row type sums to the dequantized rows' f32 sum (the same values, so only
    /// the summation's rounding differs).
    #[test]
    fn block_rows_sum_as_their_dequantized_values() {
        use formats::ggml_quants::{dequantize, quantize, GgmlType, QUANTIZABLE};
        let d = 512;
        let rows_f32: Vec<Vec<f32>> = (0..150)
            .map(|j| (0..d).map(|i| (((i * 31 + j * 17) % 101) as f32 / 50.0 - 1.0) * (1.0 + (j % 7) as f32)).collect())
            .collect();
        let ids: Vec<u32> = (0..150).rev().step_by(2).collect();
        let coef = |i: usize, id: u32| ((i as f32) * 0.37 + id as f32 * 0.01).cos();
        for ty in QUANTIZABLE {
            let rows: Vec<Vec<u8>> = rows_f32.iter().map(|r| quantize(ty, r).unwrap()).collect();
            let mut out = vec![0f32; d];
            super::down_sum_blocks(ty, &ids, coef, |id| &rows[id as usize], &mut out);
            let mut want = vec![0f64; d];
            let mut deq = vec![0f32; d];
            for (k, &id) in ids.iter().enumerate() {
                dequantize(ty, &rows[id as usize], &mut deq);
                want.iter_mut().zip(&deq).for_each(|(w, v)| *w += coef(k, id) as f64 * *v as f64);
            }
            let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
            for (o, w) in out.iter().zip(&want) {
                assert!((*o as f64 - w).abs() <= 1e-5 * scale, "{}: {o} vs {w}", ty.name());
            }
            assert_ne!(GgmlType::F16, ty);
        }
    }

    #[test]
    fn sums_every_row_times_its_coefficient() {
        use half::f16;
        // 130 rows of width 3: row j = [j, 1, -j]; coefficient 0.5 for even indices, 2 for odd
        let rows: Vec<Vec<f16>> =
            (0..130).map(|j| vec![f16::from_f32(j as f32), f16::ONE, f16::from_f32(-(j as f32))]).collect();
        let ids: Vec<u32> = (0..130).rev().collect();
        let coef = |i: usize, _id: u32| if i.is_multiple_of(2) { 0.5 } else { 2.0 };
        let mut out = [0f32; 3];
        super::down_sum(&ids, coef, |id| &rows[id as usize], &mut out);
        let mut want = [0f64; 3];
        for (i, &id) in ids.iter().enumerate() {
            let c = if i.is_multiple_of(2) { 0.5 } else { 2.0 };
            want[0] += c * id as f64;
            want[1] += c;
            want[2] -= c * id as f64;
        }
        for (o, w) in out.iter().zip(want) {
            assert!((*o as f64 - w).abs() < 1e-3, "{out:?} vs {want:?}");
        }
    }
}
