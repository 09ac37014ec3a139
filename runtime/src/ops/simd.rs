//! Innermost kernels: f16 x f32 dot products and f32 dot products.
//!
//! On x86-64 the build targets x86-64-v3 (see .cargo/config.toml), so AVX2, FMA and F16C are
//! compile-time features and these use them directly; elsewhere a portable version is used.
//! This is the one place outside I/O where `unsafe` appears: unaligned vector loads.

use formats::ggml_quants::scale_min_k4;
use half::f16;

/// `sum_i w[i] * x[i]` with `w` in f16. `w.len() == x.len()`.
#[inline]
pub fn dot_f16_f32(w: &[f16], x: &[f32]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
    {
        // SAFETY: this branch is compiled only when AVX2, FMA and F16C are enabled for the whole
        // build (x86-64-v3, .cargo/config.toml), so the CPU running this binary has them.
        unsafe { x86::dot_f16_f32(w, x) }
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c")))]
    {
        portable_dot(w.iter().map(|v| v.to_f32()), x)
    }
}

/// Two dot products sharing `x`: `(w0 . x, w1 . x)`.
#[inline]
pub fn dot2_f16_f32(w0: &[f16], w1: &[f16], x: &[f32]) -> (f32, f32) {
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
    {
        // SAFETY: this branch is compiled only when AVX2, FMA and F16C are enabled for the whole
        // build (x86-64-v3, .cargo/config.toml), so the CPU running this binary has them.
        unsafe { x86::dot2_f16_f32(w0, w1, x) }
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c")))]
    {
        (dot_f16_f32(w0, x), dot_f16_f32(w1, x))
    }
}

/// Eight dot products sharing `x`: `out[r] = rows[r cols..(r + 1) cols] . x` for the 8
/// contiguous rows of `rows` (`8 x.len()` values), decode's f16 kernel. It asks for the next
/// 8 rows' cache lines (those after `rows` in memory) while computing these: 8 rows a row apart
/// are 8 short streams the hardware prefetchers do not run ahead of. A prefetch reads nothing
/// and never faults, so past the matrix's end it is harmless.
#[inline]
pub fn dot8_f16_f32(rows: &[f16], x: &[f32]) -> [f32; 8] {
    assert_eq!(rows.len(), 8 * x.len());
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
    {
        // SAFETY: this branch is compiled only when AVX2, FMA and F16C are enabled for the whole
        // build (x86-64-v3, .cargo/config.toml), so the CPU running this binary has them.
        unsafe { x86::dot8_f16_f32(rows, x) }
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c")))]
    {
        std::array::from_fn(|r| dot_f16_f32(&rows[r * x.len()..(r + 1) * x.len()], x))
    }
}

/// Eight dot products of contiguous f32 rows with one `x`: `out[r] = rows[r n..(r + 1) n] . x`,
/// `n = x.len()`. Each row's sum is the same tree of the same operations whichever lane it
/// takes, so a row's result depends on its own values only.
#[inline]
pub fn dot8_f32(rows: &[f32], x: &[f32]) -> [f32; 8] {
    assert_eq!(rows.len(), 8 * x.len());
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
    {
        // SAFETY: this branch is compiled only when AVX2, FMA and F16C are enabled for the whole
        // build (x86-64-v3, .cargo/config.toml), so the CPU running this binary has them.
        unsafe { x86::dot8_f32(rows, x) }
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c")))]
    {
        std::array::from_fn(|r| dot_f32(&rows[r * x.len()..(r + 1) * x.len()], x))
    }
}

/// `exp(v)` for `v <= 0` (softmax's shifted inputs), from `2^n exp(r)`: `n = round(v log2 e)`,
/// `r = v - n ln 2` (ln 2 in two parts), `exp(r)` its Taylor polynomial to `r^7` (error below
/// 1e-8 for `|r| <= ln 2 / 2`), within 2 ulp of the exact value. Below -87 (near f32's
/// smallest normal) it gives 0, so does -inf; a NaN stays NaN. [`exp_shifted_sum`]'s vector
/// lanes run the same operations, so a value's bits do not depend on where it sits in a slice.
#[inline]
pub fn exp_nonpositive(v: f32) -> f32 {
    if v < EXP_FLOOR {
        return 0.0;
    }
    let n = (v * std::f32::consts::LOG2_E).round_ties_even();
    let r = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, v));
    let p = EXP_TAYLOR.iter().fold(0f32, |p, &c| p.mul_add(r, c));
    p * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

const EXP_FLOOR: f32 = -87.0;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// 1/7!, 1/6!, ..., 1/1!, 1/0!: Horner's order
const EXP_TAYLOR: [f32; 8] = [1.0 / 5040.0, 1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0];

/// `x[i] = exp(x[i] - shift)` ([`exp_nonpositive`]; `shift >= max x`); returns their sum.
#[inline]
pub fn exp_shifted_sum(x: &mut [f32], shift: f32) -> f32 {
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
    {
        // SAFETY: this branch is compiled only when AVX2, FMA and F16C are enabled for the whole
        // build (x86-64-v3, .cargo/config.toml), so the CPU running this binary has them.
        unsafe { x86::exp_shifted_sum(x, shift) }
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c")))]
    {
        x.iter_mut().fold(0f32, |sum, v| {
            *v = exp_nonpositive(*v - shift);
            sum + *v
        })
    }
}

/// `sum_i a[i] * b[i]` in f32.
#[inline]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
    {
        // SAFETY: this branch is compiled only when AVX2, FMA and F16C are enabled for the whole
        // build (x86-64-v3, .cargo/config.toml), so the CPU running this binary has them.
        unsafe { x86::dot_f32(a, b) }
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c")))]
    {
        portable_dot(a.iter().copied(), b)
    }
}

/// Four dot products of one f32 row `w` against four activation rows.
#[inline]
pub fn dot4_f32(w: &[f32], x0: &[f32], x1: &[f32], x2: &[f32], x3: &[f32]) -> [f32; 4] {
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
    {
        // SAFETY: this branch is compiled only when AVX2, FMA and F16C are enabled for the whole
        // build (x86-64-v3, .cargo/config.toml), so the CPU running this binary has them.
        unsafe { x86::dot4_f32(w, x0, x1, x2, x3) }
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c")))]
    {
        [dot_f32(w, x0), dot_f32(w, x1), dot_f32(w, x2), dot_f32(w, x3)]
    }
}

/// The 2 x 4 block of dot products of two f32 weight rows with four activation rows:
/// `out[r][t] = w[r] . x[t]`. Six loads feed eight FMAs, so the FMA units stay busy.
#[inline]
pub fn dot_2x4_f32(w0: &[f32], w1: &[f32], x: [&[f32]; 4]) -> [[f32; 4]; 2] {
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
    {
        // SAFETY: this branch is compiled only when AVX2, FMA and F16C are enabled for the whole
        // build (x86-64-v3, .cargo/config.toml), so the CPU running this binary has them.
        unsafe { x86::dot_2x4_f32(w0, w1, x) }
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c")))]
    {
        [dot4_f32(w0, x[0], x[1], x[2], x[3]), dot4_f32(w1, x[0], x[1], x[2], x[3])]
    }
}

/// `y += a * x` (f32).
#[inline]
pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi = a.mul_add(*xi, *yi);
    }
}

/// `y += a * x` with `x` in f16.
#[inline]
pub fn axpy_f16(a: f32, x: &[f16], y: &mut [f32]) {
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
    {
        // SAFETY: this branch is compiled only when AVX2, FMA and F16C are enabled for the whole
        // build (x86-64-v3, .cargo/config.toml), so the CPU running this binary has them.
        unsafe { x86::axpy_f16(a, x, y) }
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c")))]
    {
        for (yi, xi) in y.iter_mut().zip(x) {
            *yi += a * xi.to_f32();
        }
    }
}

/// `y += a x row`, `row` Q4_K blocks (144 bytes per 256 values) of `y.len()` values, fused: per
/// 32-value group `y = (a d sc) q + (y - a dmin m)` (llama.cpp's dequantization, times `a`).
/// The vector kernel does the same operations per element as the portable loop, so both give
/// the same bits.
#[inline]
pub fn axpy_q4_k(a: f32, row: &[u8], y: &mut [f32]) {
    debug_assert_eq!(row.len(), y.len() / 256 * 144);
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
    {
        // SAFETY: this branch is compiled only when AVX2, FMA and F16C are enabled for the whole
        // build (x86-64-v3, .cargo/config.toml), so the CPU running this binary has them.
        unsafe { x86::axpy_q4_k(a, row, y) }
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c")))]
    {
        portable_axpy_q4_k(a, row, y)
    }
}

/// A Q4_K block's 8 group factors times `a`: `(a d sc_j, a dmin m_j)`.
#[inline]
fn q4_k_group_factors(a: f32, b: &[u8]) -> [(f32, f32); 8] {
    let d = a * f16::from_le_bytes([b[0], b[1]]).to_f32();
    let dmin = a * f16::from_le_bytes([b[2], b[3]]).to_f32();
    std::array::from_fn(|j| {
        let (sc, m) = scale_min_k4(j, &b[4..16]);
        (d * sc as f32, dmin * m as f32)
    })
}

#[cfg_attr(
    all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"),
    allow(dead_code)
)]
fn portable_axpy_q4_k(a: f32, row: &[u8], y: &mut [f32]) {
    for (b, ys) in row.chunks_exact(144).zip(y.chunks_exact_mut(256)) {
        let f = q4_k_group_factors(a, b);
        for (chunk, (q, y64)) in b[16..144].chunks_exact(32).zip(ys.chunks_exact_mut(64)).enumerate() {
            let ((d1, min1), (d2, min2)) = (f[2 * chunk], f[2 * chunk + 1]);
            let (lo, hi) = y64.split_at_mut(32);
            for ((yl, yh), &qb) in lo.iter_mut().zip(hi.iter_mut()).zip(q) {
                *yl = d1.mul_add((qb & 0x0F) as f32, *yl - min1);
                *yh = d2.mul_add((qb >> 4) as f32, *yh - min2);
            }
        }
    }
}

/// Two Q4_0 rows (`formats::scorer`: 16 bytes and one f16 scale per block of 32) against one
/// int8 vector (`xq` `[d]`, a scale `xs` per block): `(row0 . x, row1 . x)`. `None` where the
/// x86-64-v3 kernel is not compiled (callers then use the portable loop in `ops::q4`).
#[inline]
pub fn dot2_q4_q8(p0: &[u8], s0: &[f16], p1: &[u8], s1: &[f16], xq: &[i8], xs: &[f32]) -> Option<(f32, f32)> {
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
    {
        assert!(
            p0.len() == p1.len()
                && p0.len() * 2 == xq.len()
                && s0.len() == xs.len()
                && s1.len() == xs.len()
                && xq.len().is_multiple_of(32)
        );
        // SAFETY: this branch is compiled only when AVX2, FMA and F16C are enabled for the whole
        // build (x86-64-v3, .cargo/config.toml), so the CPU running this binary has them; the
        // lengths are checked above, and every load stays inside them.
        Some(unsafe { x86::dot2_q4_q8(p0, s0, p1, s1, xq, xs) })
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c")))]
    {
        let _ = (p0, s0, p1, s1, xq, xs);
        None
    }
}

/// [`dot2_q4_q8`] against `x` in pair layout ([`crate::ops::qmatvec::Q8Vector`]'s `xp`, with
/// `xsum8[b] = 8 x sum(xq of block b)`): the nibbles go into the integer products unsigned and
/// the 8 they are offset by comes off once per row (`sum_b scale_b x xsum8[b]`), two blocks per
/// 256-bit step. `None` where the x86-64-v3 kernel is not compiled or the block count is odd.
#[inline]
pub fn dot2_q4_q8_pairs(
    p0: &[u8],
    s0: &[f16],
    p1: &[u8],
    s1: &[f16],
    xp: &[i8],
    xs: &[f32],
    xsum8: &[f32],
) -> Option<(f32, f32)> {
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
    {
        if !xs.len().is_multiple_of(2) || xp.len() != xs.len() * 32 {
            return None;
        }
        assert!(
            p0.len() == xs.len() * 16
                && p1.len() == p0.len()
                && s0.len() == xs.len()
                && s1.len() == xs.len()
                && xsum8.len() == xs.len()
        );
        // SAFETY: compiled only with AVX2, FMA and F16C enabled for the whole build (x86-64-v3);
        // the lengths are checked above and every load stays inside them.
        Some(unsafe { x86::dot2_q4_q8_pairs(p0, s0, p1, s1, xp, xs, xsum8) })
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c")))]
    {
        let _ = (p0, s0, p1, s1, xp, xs, xsum8);
        None
    }
}

/// One Q8_0 row (`q` `[d]`, an f16 scale per block of 32) against one int8 vector. `None`
/// where the x86-64-v3 kernel is not compiled.
#[inline]
pub fn dot_q8_q8(q: &[i8], s: &[f16], xq: &[i8], xs: &[f32]) -> Option<f32> {
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
    {
        assert!(q.len() == xq.len() && s.len() == xs.len() && xq.len() == xs.len() * 32);
        // SAFETY: compiled only with AVX2, FMA and F16C enabled for the whole build (x86-64-v3);
        // the lengths are checked above and every load stays inside them.
        Some(unsafe { x86::dot_q8_q8(q, s, xq, xs) })
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c")))]
    {
        let _ = (q, s, xq, xs);
        None
    }
}

/// Two 2-bit sketch rows (`formats::sketch`: groups of 4 blocks in 32 bytes, an f16 scale per
/// block, weight `(q - 1.5) s`) against one int8 vector `xq` with block scales `xs` and block
/// sums `xsum`: `(row0 . x, row1 . x)`. The levels go into the integer products unsigned and
/// the 1.5 they are offset by comes off once per row. `None` where the x86-64-v3 kernel is not
/// compiled.
#[inline]
pub fn dot2_sketch2_q8(
    p0: &[u8],
    s0: &[f16],
    p1: &[u8],
    s1: &[f16],
    xq: &[i8],
    xs: &[f32],
    xsum: &[i32],
) -> Option<(f32, f32)> {
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
    {
        let n = xs.len();
        assert!(
            xq.len() == n * 32
                && s0.len() == n
                && s1.len() == n
                && xsum.len() == n
                && p0.len() == n.div_ceil(4) * 32
                && p1.len() == p0.len()
        );
        // SAFETY: compiled only with AVX2, FMA and F16C enabled for the whole build (x86-64-v3);
        // the lengths are checked above and every load stays inside them.
        Some(unsafe { x86::dot2_sketch2_q8(p0, s0, p1, s1, xq, xs, xsum) })
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c")))]
    {
        let _ = (p0, s0, p1, s1, xq, xs, xsum);
        None
    }
}

/// The portable two-row Q4 x Q8 product (rows wider than the x86 kernel's 64 blocks).
#[allow(dead_code)]
fn portable_dot2_q4_q8(p0: &[u8], s0: &[f16], p1: &[u8], s1: &[f16], xq: &[i8], xs: &[f32]) -> (f32, f32) {
    let one = |p: &[u8], s: &[f16]| -> f32 {
        let mut sum = 0f32;
        for (b, (&sb, &xb)) in s.iter().zip(xs).enumerate() {
            let mut acc = 0i32;
            for k in 0..16 {
                let (lo, hi) = ((p[b * 16 + k] & 0x0F) as i32 - 8, (p[b * 16 + k] >> 4) as i32 - 8);
                acc += lo * xq[b * 32 + k] as i32 + hi * xq[b * 32 + k + 16] as i32;
            }
            sum += acc as f32 * sb.to_f32() * xb;
        }
        sum
    };
    (one(p0, s0), one(p1, s1))
}

/// Eight independent accumulators so the compiler can vectorise without reassociating.
#[inline]
#[allow(dead_code)] // used where the x86-64-v3 kernels are not compiled
fn portable_dot(a: impl Iterator<Item = f32>, b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let mut it = a.zip(b.iter());
    loop {
        let mut done = false;
        for slot in acc.iter_mut() {
            match it.next() {
                Some((x, y)) => *slot += x * y,
                None => {
                    done = true;
                    break;
                }
            }
        }
        if done {
            break;
        }
    }
    acc.iter().sum()
}

#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
mod x86 {
    use half::f16;
    use std::arch::x86_64::*;

    /// 32 signed 4-bit weights of one block (`(q - 8)`, low nibbles then high nibbles).
    #[target_feature(enable = "avx,avx2,fma,f16c")]
    fn q4_block(p: &[u8]) -> __m256i {
        debug_assert!(p.len() >= 16);
        // SAFETY: p holds at least 16 bytes (one block); unaligned load.
        let q = unsafe { _mm_loadu_si128(p.as_ptr() as *const __m128i) };
        let m = _mm_set1_epi8(0x0F);
        let lo = _mm_and_si128(q, m);
        let hi = _mm_and_si128(_mm_srli_epi16(q, 4), m);
        _mm256_sub_epi8(_mm256_set_m128i(hi, lo), _mm256_set1_epi8(8))
    }

    /// Sum of the 32 products of signed bytes `w` x `x`, as 8 i32 lanes -> f32.
    #[target_feature(enable = "avx,avx2,fma,f16c")]
    fn block_dot(w: __m256i, x: __m256i) -> __m256 {
        // maddubs multiplies unsigned by signed: |w| x (x with w's sign)
        let p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
        _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)))
    }

    /// `out[b] = f32(s[b]) * xs[b]` for every block, eight at a time (F16C).
    #[target_feature(enable = "avx,avx2,fma,f16c")]
    fn block_scales(s: &[f16], xs: &[f32], out: &mut [f32]) {
        let n = xs.len();
        let mut b = 0;
        while b + 8 <= n {
            // SAFETY: b + 8 <= n = s.len() = xs.len() <= out.len(); unaligned loads and store.
            unsafe {
                let h = _mm_loadu_si128(s.as_ptr().add(b) as *const __m128i);
                let v = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_loadu_ps(xs.as_ptr().add(b)));
                _mm256_storeu_ps(out.as_mut_ptr().add(b), v);
            }
            b += 8;
        }
        while b < n {
            out[b] = s[b].to_f32() * xs[b];
            b += 1;
        }
    }

    #[target_feature(enable = "avx,avx2,fma,f16c")]
    pub fn dot_q8_q8(q: &[i8], s: &[f16], xq: &[i8], xs: &[f32]) -> f32 {
        let mut acc = [_mm256_setzero_ps(); 2];
        for b in 0..xs.len() {
            // SAFETY: q and xq hold xs.len() blocks of 32 (checked by the caller); unaligned loads.
            let (w, x) = unsafe {
                (
                    _mm256_loadu_si256(q.as_ptr().add(b * 32) as *const __m256i),
                    _mm256_loadu_si256(xq.as_ptr().add(b * 32) as *const __m256i),
                )
            };
            acc[b & 1] = _mm256_fmadd_ps(_mm256_set1_ps(s[b].to_f32() * xs[b]), block_dot(w, x), acc[b & 1]);
        }
        hsum(_mm256_add_ps(acc[0], acc[1]))
    }

    #[target_feature(enable = "avx,avx2,fma,f16c")]
    pub fn dot2_q4_q8(p0: &[u8], s0: &[f16], p1: &[u8], s1: &[f16], xq: &[i8], xs: &[f32]) -> (f32, f32) {
        let n = xs.len();
        // combined block scales (weight x activation), converted eight at a time
        let (mut c0, mut c1) = ([0f32; 64], [0f32; 64]);
        if n > 64 {
            let (a, b) = super::portable_dot2_q4_q8(p0, s0, p1, s1, xq, xs);
            return (a, b);
        }
        block_scales(s0, xs, &mut c0);
        block_scales(s1, xs, &mut c1);
        // two blocks per step, four independent accumulators (FMA latency, not throughput,
        // would bound a single chain)
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut b = 0;
        while b < n {
            let step = if b + 1 < n { 2 } else { 1 };
            for k in 0..step {
                let bb = b + k;
                // SAFETY: xq holds xs.len() blocks of 32 (checked by the caller); unaligned load.
                let x = unsafe { _mm256_loadu_si256(xq.as_ptr().add(bb * 32) as *const __m256i) };
                let w0 = q4_block(&p0[bb * 16..]);
                let w1 = q4_block(&p1[bb * 16..]);
                acc[k] = _mm256_fmadd_ps(_mm256_set1_ps(c0[bb]), block_dot(w0, x), acc[k]);
                acc[2 + k] = _mm256_fmadd_ps(_mm256_set1_ps(c1[bb]), block_dot(w1, x), acc[2 + k]);
            }
            b += step;
        }
        (hsum(_mm256_add_ps(acc[0], acc[1])), hsum(_mm256_add_ps(acc[2], acc[3])))
    }

    /// Up to 8 block scales (f16 weight scale x activation scale) from block `b`, zero past `n`.
    #[target_feature(enable = "avx,avx2,fma,f16c")]
    fn scales8(s: &[f16], xs: &[f32], b: usize) -> __m256 {
        if b + 8 <= xs.len() {
            // SAFETY: b + 8 <= xs.len() = s.len(); unaligned loads.
            unsafe {
                _mm256_mul_ps(
                    _mm256_cvtph_ps(_mm_loadu_si128(s.as_ptr().add(b) as *const __m128i)),
                    _mm256_loadu_ps(xs.as_ptr().add(b)),
                )
            }
        } else {
            let mut c = [0f32; 8];
            c.iter_mut().zip(s[b..].iter().zip(&xs[b..])).for_each(|(o, (w, x))| *o = w.to_f32() * x);
            // SAFETY: c is 8 f32 on the stack.
            unsafe { _mm256_loadu_ps(c.as_ptr()) }
        }
    }

    /// Up to 8 values of `v` from `b`, zero past its end.
    #[target_feature(enable = "avx,avx2,fma,f16c")]
    fn load8_padded(v: &[f32], b: usize) -> __m256 {
        let mut c = [0f32; 8];
        let n = (v.len() - b).min(8);
        c[..n].copy_from_slice(&v[b..b + n]);
        // SAFETY: c is 8 f32 on the stack.
        unsafe { _mm256_loadu_ps(c.as_ptr()) }
    }

    #[target_feature(enable = "avx,avx2,fma,f16c")]
    pub fn dot2_q4_q8_pairs(
        p0: &[u8],
        s0: &[f16],
        p1: &[u8],
        s1: &[f16],
        xp: &[i8],
        xs: &[f32],
        xsum8: &[f32],
    ) -> (f32, f32) {
        let n = xs.len();
        let nib = _mm256_set1_epi8(0x0F);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); 4]; // row 0: 0, 1; row 1: 2, 3
        let (mut corr0, mut corr1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut b = 0;
        while b < n {
            // eight blocks' scales; the pair (b + 2p, b + 2p + 1) takes lanes 2p and 2p + 1,
            // each spread over the four i32 lanes of its 128-bit half
            let (c0, c1) = (scales8(s0, xs, b), scales8(s1, xs, b));
            let xsum = load8_padded(xsum8, b);
            corr0 = _mm256_fmadd_ps(c0, xsum, corr0);
            corr1 = _mm256_fmadd_ps(c1, xsum, corr1);
            let pairs = (n - b).min(8) / 2;
            for p in 0..pairs {
                let bb = b + 2 * p;
                let idx = _mm256_setr_epi32(
                    2 * p as i32,
                    2 * p as i32,
                    2 * p as i32,
                    2 * p as i32,
                    2 * p as i32 + 1,
                    2 * p as i32 + 1,
                    2 * p as i32 + 1,
                    2 * p as i32 + 1,
                );
                // SAFETY: blocks bb, bb + 1 < n: xp holds n x 32 bytes, p0/p1 n x 16 (checked by
                // the caller); unaligned loads.
                let (xlo, xhi, q0, q1) = unsafe {
                    (
                        _mm256_loadu_si256(xp.as_ptr().add(bb * 32) as *const __m256i),
                        _mm256_loadu_si256(xp.as_ptr().add(bb * 32 + 32) as *const __m256i),
                        _mm256_loadu_si256(p0.as_ptr().add(bb * 16) as *const __m256i),
                        _mm256_loadu_si256(p1.as_ptr().add(bb * 16) as *const __m256i),
                    )
                };
                let dot = |q: __m256i| {
                    let lo = _mm256_and_si256(q, nib);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), nib);
                    let s16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xlo), _mm256_maddubs_epi16(hi, xhi));
                    _mm256_cvtepi32_ps(_mm256_madd_epi16(s16, ones))
                };
                acc[p & 1] = _mm256_fmadd_ps(dot(q0), _mm256_permutevar8x32_ps(c0, idx), acc[p & 1]);
                acc[2 + (p & 1)] = _mm256_fmadd_ps(dot(q1), _mm256_permutevar8x32_ps(c1, idx), acc[2 + (p & 1)]);
            }
            b += 8;
        }
        (hsum(_mm256_add_ps(acc[0], acc[1])) - hsum(corr0), hsum(_mm256_add_ps(acc[2], acc[3])) - hsum(corr1))
    }

    #[target_feature(enable = "avx,avx2,fma,f16c")]
    pub fn dot2_sketch2_q8(
        p0: &[u8],
        s0: &[f16],
        p1: &[u8],
        s1: &[f16],
        xq: &[i8],
        xs: &[f32],
        xsum: &[i32],
    ) -> (f32, f32) {
        let n = xs.len();
        // combined block scales (weight x activation), converted eight at a time
        let (mut c0, mut c1) = ([0f32; 128], [0f32; 128]);
        if n > 128 {
            let one = |p: &[u8], s: &[f16]| crate::ops::sketch_dot::dot_sketch_q8(p, s, 2, xq, xs, xsum);
            return (one(p0, s0), one(p1, s1));
        }
        block_scales(s0, xs, &mut c0);
        block_scales(s1, xs, &mut c1);
        // the 1.5 the levels are offset by, once per row
        let (mut corr0, mut corr1) = (0f32, 0f32);
        for b in 0..n {
            corr0 += c0[b] * xsum[b] as f32;
            corr1 += c1[b] * xsum[b] as f32;
        }
        let two = _mm256_set1_epi8(0x03);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); 4]; // row 0: 0, 1; row 1: 2, 3
        for g in 0..n.div_ceil(4) {
            // SAFETY: group g < n.div_ceil(4): p0/p1 hold that many groups of 32 bytes (checked
            // by the caller); unaligned loads.
            let (q0, q1) = unsafe {
                (
                    _mm256_loadu_si256(p0.as_ptr().add(g * 32) as *const __m256i),
                    _mm256_loadu_si256(p1.as_ptr().add(g * 32) as *const __m256i),
                )
            };
            for j in 0..(n - 4 * g).min(4) {
                let b = 4 * g + j;
                // SAFETY: block b < n: xq holds n x 32 bytes; unaligned load.
                let x = unsafe { _mm256_loadu_si256(xq.as_ptr().add(b * 32) as *const __m256i) };
                let sh = _mm_cvtsi32_si128(2 * j as i32);
                let dot = |q: __m256i| {
                    let l = _mm256_and_si256(_mm256_srl_epi16(q, sh), two);
                    _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(l, x), ones))
                };
                acc[j & 1] = _mm256_fmadd_ps(dot(q0), _mm256_set1_ps(c0[b]), acc[j & 1]);
                acc[2 + (j & 1)] = _mm256_fmadd_ps(dot(q1), _mm256_set1_ps(c1[b]), acc[2 + (j & 1)]);
            }
        }
        (hsum(_mm256_add_ps(acc[0], acc[1])) - 1.5 * corr0, hsum(_mm256_add_ps(acc[2], acc[3])) - 1.5 * corr1)
    }

    #[target_feature(enable = "avx,avx2,fma,f16c")]
    fn hsum(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps(v, 1);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    /// 8 f16 values at `w[i..i+8]` widened to f32.
    #[target_feature(enable = "avx,avx2,fma,f16c")]
    fn load_f16x8(w: &[f16], i: usize) -> __m256 {
        let s = &w[i..i + 8];
        // SAFETY: `s` is exactly 8 f16 = 16 bytes in bounds; loadu has no alignment requirement.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(s.as_ptr() as *const __m128i)) }
    }

    #[target_feature(enable = "avx,avx2,fma,f16c")]
    fn load_f32x8(x: &[f32], i: usize) -> __m256 {
        let s = &x[i..i + 8];
        // SAFETY: `s` is exactly 8 f32 in bounds; loadu has no alignment requirement.
        unsafe { _mm256_loadu_ps(s.as_ptr()) }
    }

    #[target_feature(enable = "avx,avx2,fma,f16c")]
    pub fn dot_f16_f32(w: &[f16], x: &[f32]) -> f32 {
        let n = w.len().min(x.len());
        let (w, x) = (&w[..n], &x[..n]); // equal lengths let the compiler drop per-load bounds checks
        let (mut a0, mut a1, mut a2, mut a3) =
            (_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        while i + 32 <= n {
            a0 = _mm256_fmadd_ps(load_f16x8(w, i), load_f32x8(x, i), a0);
            a1 = _mm256_fmadd_ps(load_f16x8(w, i + 8), load_f32x8(x, i + 8), a1);
            a2 = _mm256_fmadd_ps(load_f16x8(w, i + 16), load_f32x8(x, i + 16), a2);
            a3 = _mm256_fmadd_ps(load_f16x8(w, i + 24), load_f32x8(x, i + 24), a3);
            i += 32;
        }
        while i + 8 <= n {
            a0 = _mm256_fmadd_ps(load_f16x8(w, i), load_f32x8(x, i), a0);
            i += 8;
        }
        let mut s = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
        while i < n {
            s += w[i].to_f32() * x[i];
            i += 1;
        }
        s
    }

    #[target_feature(enable = "avx,avx2,fma,f16c")]
    pub fn exp_shifted_sum(x: &mut [f32], shift: f32) -> f32 {
        use super::{exp_nonpositive, EXP_FLOOR, EXP_TAYLOR, LN2_HI, LN2_LO};
        let (floor, log2e, shift_v) =
            (_mm256_set1_ps(EXP_FLOOR), _mm256_set1_ps(std::f32::consts::LOG2_E), _mm256_set1_ps(shift));
        let (hi, lo) = (_mm256_set1_ps(LN2_HI), _mm256_set1_ps(LN2_LO));
        let mut sum = _mm256_setzero_ps();
        let mut chunks = x.chunks_exact_mut(8);
        for c in chunks.by_ref() {
            // SAFETY: c is 8 f32; unaligned load and store.
            let v = _mm256_sub_ps(unsafe { _mm256_loadu_ps(c.as_ptr()) }, shift_v);
            // lanes below the floor give 0 (an ordered comparison: a NaN lane is not below it)
            let below = _mm256_cmp_ps::<_CMP_LT_OQ>(v, floor);
            let v = _mm256_max_ps(floor, v);
            let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(v, log2e));
            let r = _mm256_fnmadd_ps(n, lo, _mm256_fnmadd_ps(n, hi, v));
            let mut p = _mm256_setzero_ps();
            for c in EXP_TAYLOR {
                p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
            }
            let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)));
            let y = _mm256_andnot_ps(below, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
            // SAFETY: as above.
            unsafe { _mm256_storeu_ps(c.as_mut_ptr(), y) };
            sum = _mm256_add_ps(sum, y);
        }
        let mut total = hsum(sum);
        for v in chunks.into_remainder() {
            *v = exp_nonpositive(*v - shift);
            total += *v;
        }
        total
    }

    #[target_feature(enable = "avx,avx2,fma,f16c")]
    pub fn dot8_f32(rows: &[f32], x: &[f32]) -> [f32; 8] {
        let n = x.len();
        let rows = &rows[..8 * n];
        let mut acc = [_mm256_setzero_ps(); 8];
        let mut i = 0;
        while i + 8 <= n {
            let xv = load_f32x8(x, i);
            for (r, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(load_f32x8(rows, r * n + i), xv, *a);
            }
            i += 8;
        }
        // the 8 sums side by side: pairs, then quads, then the two halves of each row
        let q0 = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
        let q1 = _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]), _mm256_hadd_ps(acc[6], acc[7]));
        let sums = _mm256_add_ps(_mm256_permute2f128_ps(q0, q1, 0x20), _mm256_permute2f128_ps(q0, q1, 0x31));
        let mut out = [0f32; 8];
        // SAFETY: out is 8 f32; unaligned store.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), sums) };
        for (r, o) in out.iter_mut().enumerate() {
            for j in i..n {
                *o += rows[r * n + j] * x[j];
            }
        }
        out
    }

    #[target_feature(enable = "avx,avx2,fma,f16c")]
    pub fn dot8_f16_f32(rows: &[f16], x: &[f32]) -> [f32; 8] {
        let n = x.len();
        let rows = &rows[..8 * n];
        let mut acc = [_mm256_setzero_ps(); 8];
        // the next 8 rows' lines, a share per pass of 8 columns
        let next = rows.as_ptr().wrapping_add(8 * n) as *const u8;
        let lines = (16 * n).div_ceil(64);
        let per_pass = lines.div_ceil((n / 8).max(1));
        let mut i = 0;
        while i + 8 <= n {
            for k in (i / 8) * per_pass..((i / 8 + 1) * per_pass).min(lines) {
                // a hint: it dereferences nothing
                _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(64 * k) as *const i8);
            }
            let xv = load_f32x8(x, i);
            for (r, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(load_f16x8(rows, r * n + i), xv, *a);
            }
            i += 8;
        }
        let mut out = acc.map(|a| hsum(a));
        for (r, o) in out.iter_mut().enumerate() {
            for j in i..n {
                *o += rows[r * n + j].to_f32() * x[j];
            }
        }
        out
    }

    #[target_feature(enable = "avx,avx2,fma,f16c")]
    pub fn dot2_f16_f32(w0: &[f16], w1: &[f16], x: &[f32]) -> (f32, f32) {
        let n = x.len().min(w0.len()).min(w1.len());
        let (w0, w1, x) = (&w0[..n], &w1[..n], &x[..n]);
        let (mut a0, mut a1, mut b0, mut b1) =
            (_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        // Asks for the lines `8n` values past each row: where rows follow each other (a slot
        // buffer's records), those a later call reads, which hides DRAM latency the hardware
        // prefetcher leaves exposed; a prefetch never faults, past the buffer's end too.
        let (p0, p1) = (w0.as_ptr().wrapping_add(8 * n), w1.as_ptr().wrapping_add(8 * n));
        while i + 16 <= n {
            _mm_prefetch::<_MM_HINT_T0>(p0.wrapping_add(i) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(p1.wrapping_add(i) as *const i8);
            let x0 = load_f32x8(x, i);
            let x1 = load_f32x8(x, i + 8);
            a0 = _mm256_fmadd_ps(load_f16x8(w0, i), x0, a0);
            a1 = _mm256_fmadd_ps(load_f16x8(w0, i + 8), x1, a1);
            b0 = _mm256_fmadd_ps(load_f16x8(w1, i), x0, b0);
            b1 = _mm256_fmadd_ps(load_f16x8(w1, i + 8), x1, b1);
            i += 16;
        }
        let (mut s0, mut s1) = (hsum(_mm256_add_ps(a0, a1)), hsum(_mm256_add_ps(b0, b1)));
        while i < n {
            s0 += w0[i].to_f32() * x[i];
            s1 += w1[i].to_f32() * x[i];
            i += 1;
        }
        (s0, s1)
    }

    #[target_feature(enable = "avx,avx2,fma,f16c")]
    pub fn dot4_f32(w: &[f32], x0: &[f32], x1: &[f32], x2: &[f32], x3: &[f32]) -> [f32; 4] {
        let n = w.len();
        let (x0, x1, x2, x3) = (&x0[..n], &x1[..n], &x2[..n], &x3[..n]);
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 8 <= n {
            let wv = load_f32x8(w, i);
            acc[0] = _mm256_fmadd_ps(wv, load_f32x8(x0, i), acc[0]);
            acc[1] = _mm256_fmadd_ps(wv, load_f32x8(x1, i), acc[1]);
            acc[2] = _mm256_fmadd_ps(wv, load_f32x8(x2, i), acc[2]);
            acc[3] = _mm256_fmadd_ps(wv, load_f32x8(x3, i), acc[3]);
            i += 8;
        }
        let mut out = [hsum(acc[0]), hsum(acc[1]), hsum(acc[2]), hsum(acc[3])];
        while i < n {
            out[0] += w[i] * x0[i];
            out[1] += w[i] * x1[i];
            out[2] += w[i] * x2[i];
            out[3] += w[i] * x3[i];
            i += 1;
        }
        out
    }

    #[target_feature(enable = "avx,avx2,fma,f16c")]
    pub fn dot_2x4_f32(w0: &[f32], w1: &[f32], x: [&[f32]; 4]) -> [[f32; 4]; 2] {
        let n = w0.len();
        let w1 = &w1[..n];
        let x = [&x[0][..n], &x[1][..n], &x[2][..n], &x[3][..n]];
        let mut a = [_mm256_setzero_ps(); 4];
        let mut b = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 8 <= n {
            let u = load_f32x8(w0, i);
            let v = load_f32x8(w1, i);
            for t in 0..4 {
                let xv = load_f32x8(x[t], i);
                a[t] = _mm256_fmadd_ps(u, xv, a[t]);
                b[t] = _mm256_fmadd_ps(v, xv, b[t]);
            }
            i += 8;
        }
        let mut out = [[0f32; 4]; 2];
        for t in 0..4 {
            out[0][t] = hsum(a[t]);
            out[1][t] = hsum(b[t]);
            for j in i..n {
                out[0][t] += w0[j] * x[t][j];
                out[1][t] += w1[j] * x[t][j];
            }
        }
        out
    }

    #[target_feature(enable = "avx,avx2,fma,f16c")]
    pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (a, b) = (&a[..n], &b[..n]);
        let (mut s0, mut s1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        while i + 16 <= n {
            s0 = _mm256_fmadd_ps(load_f32x8(a, i), load_f32x8(b, i), s0);
            s1 = _mm256_fmadd_ps(load_f32x8(a, i + 8), load_f32x8(b, i + 8), s1);
            i += 16;
        }
        if i + 8 <= n {
            s0 = _mm256_fmadd_ps(load_f32x8(a, i), load_f32x8(b, i), s0);
            i += 8;
        }
        let mut s = hsum(_mm256_add_ps(s0, s1));
        for j in i..n {
            s += a[j] * b[j];
        }
        s
    }

    #[target_feature(enable = "avx,avx2,fma,f16c")]
    pub fn axpy_q4_k(a: f32, row: &[u8], y: &mut [f32]) {
        let mask = _mm256_set1_epi32(0x0F);
        for (b, ys) in row.chunks_exact(144).zip(y.chunks_exact_mut(256)) {
            let f = super::q4_k_group_factors(a, b);
            for (chunk, (q, y64)) in b[16..144].chunks_exact(32).zip(ys.chunks_exact_mut(64)).enumerate() {
                let (d1, min1) = (_mm256_set1_ps(f[2 * chunk].0), _mm256_set1_ps(f[2 * chunk].1));
                let (d2, min2) = (_mm256_set1_ps(f[2 * chunk + 1].0), _mm256_set1_ps(f[2 * chunk + 1].1));
                for k in 0..4 {
                    // SAFETY: q is 32 bytes, so the 8 at 8k are in bounds; y64 is 64 f32, so the 8
                    // at 8k (low nibbles) and at 32 + 8k (high nibbles) are; unaligned loads/stores.
                    unsafe {
                        let v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(q.as_ptr().add(8 * k) as *const __m128i));
                        let lo = _mm256_cvtepi32_ps(_mm256_and_si256(v, mask));
                        let hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4));
                        let pl = y64.as_mut_ptr().add(8 * k);
                        let ph = y64.as_mut_ptr().add(32 + 8 * k);
                        _mm256_storeu_ps(pl, _mm256_fmadd_ps(d1, lo, _mm256_sub_ps(_mm256_loadu_ps(pl), min1)));
                        _mm256_storeu_ps(ph, _mm256_fmadd_ps(d2, hi, _mm256_sub_ps(_mm256_loadu_ps(ph), min2)));
                    }
                }
            }
        }
    }

    #[target_feature(enable = "avx,avx2,fma,f16c")]
    pub fn axpy_f16(a: f32, x: &[f16], y: &mut [f32]) {
        let n = x.len().min(y.len());
        let (x, y) = (&x[..n], &mut y[..n]);
        let av = _mm256_set1_ps(a);
        let mut i = 0;
        while i + 8 <= n {
            let r = _mm256_fmadd_ps(av, load_f16x8(x, i), load_f32x8(y, i));
            let dst = &mut y[i..i + 8];
            // SAFETY: `dst` is exactly 8 f32 in bounds; storeu has no alignment requirement.
            unsafe { _mm256_storeu_ps(dst.as_mut_ptr(), r) };
            i += 8;
        }
        while i < n {
            y[i] += a * x[i].to_f32();
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_match_scalar() {
        for n in [1usize, 7, 8, 31, 33, 64, 577] {
            let w: Vec<f16> = (0..n).map(|i| f16::from_f32(((i * 37 % 17) as f32 - 8.0) / 8.0)).collect();
            let w1: Vec<f16> = (0..n).map(|i| f16::from_f32(((i * 11 % 13) as f32 - 6.0) / 4.0)).collect();
            let x: Vec<f32> = (0..n).map(|i| ((i * 7 % 23) as f32 - 11.0) / 3.0).collect();
            let exact: f64 = w.iter().zip(&x).map(|(a, b)| a.to_f32() as f64 * *b as f64).sum();
            let exact1: f64 = w1.iter().zip(&x).map(|(a, b)| a.to_f32() as f64 * *b as f64).sum();
            assert!((dot_f16_f32(&w, &x) as f64 - exact).abs() < 1e-3, "n={n}");
            let (d0, d1) = dot2_f16_f32(&w, &w1, &x);
            // 8 rows: w, w1 and six more, each within the bound of its f64 sum
            let rows: Vec<f16> = (0..8 * n).map(|i| f16::from_f32(((i * 29 % 31) as f32 - 15.0) / 16.0)).collect();
            let d8 = dot8_f16_f32(&rows, &x);
            for (r, d) in d8.iter().enumerate() {
                let row = &rows[r * n..(r + 1) * n];
                let exact: f64 = row.iter().zip(&x).map(|(a, b)| a.to_f32() as f64 * *b as f64).sum();
                assert!((*d as f64 - exact).abs() < 1e-3, "n={n} row {r}: {d} against {exact}");
            }
            assert!((d0 as f64 - exact).abs() < 1e-3 && (d1 as f64 - exact1).abs() < 1e-3);
            let wf: Vec<f32> = w.iter().map(|v| v.to_f32()).collect();
            assert!((dot_f32(&wf, &x) as f64 - exact).abs() < 1e-3);
            let d4 = dot4_f32(&wf, &x, &x, &x, &x);
            assert!(d4.iter().all(|d| (*d as f64 - exact).abs() < 1e-3));
            let w1f: Vec<f32> = w1.iter().map(|v| v.to_f32()).collect();
            let b = dot_2x4_f32(&wf, &w1f, [&x, &x, &x, &x]);
            assert!(b[0].iter().all(|d| (*d as f64 - exact).abs() < 1e-3));
            assert!(b[1].iter().all(|d| (*d as f64 - exact1).abs() < 1e-3));
            let mut y = vec![1.0f32; n];
            axpy_f16(2.0, &w, &mut y);
            assert!(y.iter().zip(&w).all(|(yi, wi)| (yi - (1.0 + 2.0 * wi.to_f32())).abs() < 1e-6));
        }
    }

    /// The vector exp gives the scalar one's bits, whatever a value's place in the slice, and
    /// both are within 2 ulp of f64's exp; NaN stays NaN.
    #[test]
    fn exp_matches_f64_and_its_lanes_match_the_scalar() {
        let xs: Vec<f32> = (0..2000).map(|i| -(i as f32) * 0.0537 - (i % 7) as f32 * 1e-3).collect();
        for len in [xs.len(), 13, 8, 3] {
            let mut v = xs[..len].to_vec();
            let sum = exp_shifted_sum(&mut v, 0.0);
            let mut want_sum = 0f32;
            for (x, y) in xs.iter().zip(&v) {
                assert_eq!(y.to_bits(), exp_nonpositive(*x).to_bits(), "exp({x})");
                want_sum += y;
                let exact = if *x < -87.0 { 0.0 } else { (*x as f64).exp() };
                assert!(
                    ((*y as f64) - exact).abs() <= 2.0 * exact * f32::EPSILON as f64,
                    "exp({x}) = {y}, f64 {exact}"
                );
            }
            assert!((sum - want_sum).abs() <= 1e-5 * want_sum);
        }
        assert!(exp_nonpositive(f32::NAN).is_nan());
        assert_eq!(exp_nonpositive(f32::NEG_INFINITY), 0.0);
        let mut v = [f32::NEG_INFINITY; 9];
        assert_eq!(exp_shifted_sum(&mut v, 0.0), 0.0);
        let mut v = [0.0, f32::NAN, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0, -2.0];
        assert!(exp_shifted_sum(&mut v, 0.0).is_nan() && v[1].is_nan());
    }

    /// The Q4_K row axpy gives the portable loop's bits (the same operations per element) and
    /// the dequantized row's sum, on real quantized rows.
    #[test]
    fn q4_k_axpy_equals_the_portable_loop_and_the_dequantized_row() {
        use formats::ggml_quants::{dequantize, quantize, GgmlType};
        let d = 1536;
        for j in 0..40 {
            let x: Vec<f32> = (0..d)
                .map(|i| ((((i * 31 + j * 17) % 101) as f32 / 50.0 - 1.0) * (1.0 + (i / 37 % 9) as f32)).powi(3))
                .collect();
            let a = ((j as f32) * 0.37).sin() * 3.0;
            let y0: Vec<f32> = (0..d).map(|i| ((i * 7 + j) % 23) as f32 / 7.0 - 1.5).collect();
            let q4 = quantize(GgmlType::Q4K, &x).unwrap();
            let (mut fast, mut slow) = (y0.clone(), y0.clone());
            axpy_q4_k(a, &q4, &mut fast);
            portable_axpy_q4_k(a, &q4, &mut slow);
            assert_eq!(fast, slow, "row {j}");
            let mut deq = vec![0f32; d];
            dequantize(GgmlType::Q4K, &q4, &mut deq);
            for ((f, y), v) in fast.iter().zip(&y0).zip(&deq) {
                assert!(
                    (f - (y + a * v)).abs() <= 1e-4 * (1.0 + (a * v).abs() + y.abs()),
                    "row {j}: {f} vs {}",
                    y + a * v
                );
            }
        }
    }
}
