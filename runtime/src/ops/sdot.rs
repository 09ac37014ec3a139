//! The Armv8.2 dot-product instruction (`SDOT`, the `dotprod` extension: Cortex-A55/A76 and
//! later, the Jetson Orin's A78AE, the Raspberry Pi 5's A76, Apple M1 on): four signed 8-bit
//! products summed into each 32-bit lane in one instruction, the counterpart of x86's
//! `vpdpbusd`. Rust's `vdotq_s32` intrinsics are unstable, so these wrap the instruction in
//! `asm!`; callers run them only where [`available`] (checked once at run time).

use std::arch::aarch64::{int32x4_t, int8x16_t};
use std::arch::asm;

/// Whether this CPU has the dot-product extension, checked once.
pub fn available() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| std::arch::is_aarch64_feature_detected!("dotprod"))
}

/// `acc[l] += sum_k a[4l + k] b[4l + k]`, lane by lane.
///
/// # Safety
/// The CPU has the dot-product extension ([`available`]).
#[inline(always)]
pub unsafe fn sdot(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    // SAFETY (caller): SDOT exists on this CPU; registers only, no memory.
    unsafe {
        asm!(
            ".arch_extension dotprod",
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack)
        );
    }
    acc
}

/// `acc[l] += sum_k a[4l + k] b[4 L + k]`: each lane's 4 bytes of `a` against the same 4 bytes
/// of `b` (its 32-bit lane `L`).
///
/// # Safety
/// The CPU has the dot-product extension ([`available`]).
#[inline(always)]
pub unsafe fn sdot_lane<const L: i32>(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    // SAFETY (caller): SDOT exists on this CPU; registers only, no memory; L < 4 is checked by
    // the assembler.
    unsafe {
        asm!(
            ".arch_extension dotprod",
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.4b[{l}]",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            l = const L,
            options(pure, nomem, nostack)
        );
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::arch::aarch64::*;

    /// Both forms equal the sums of products computed in i32, at the extremes of i8 too.
    #[test]
    fn sdot_sums_four_products_per_lane() {
        if !available() {
            eprintln!("no dot-product extension here");
            return;
        }
        let a: [i8; 16] = std::array::from_fn(|i| [-128, 127, -1, 5][i % 4] as i8 + (i / 4) as i8);
        let b: [i8; 16] = std::array::from_fn(|i| [127, -128, 3, -7][i % 4] as i8 - (i / 4) as i8);
        let want = |l: usize, m: usize| (0..4).map(|k| a[4 * l + k] as i32 * b[4 * m + k] as i32).sum::<i32>();
        let (mut full, mut lane) = ([0i32; 4], [0i32; 4]);
        // SAFETY: the extension is here (checked above); 16-byte loads and stores of arrays.
        unsafe {
            let (va, vb) = (vld1q_s8(a.as_ptr()), vld1q_s8(b.as_ptr()));
            vst1q_s32(full.as_mut_ptr(), sdot(vdupq_n_s32(1), va, vb));
            vst1q_s32(lane.as_mut_ptr(), sdot_lane::<2>(vdupq_n_s32(0), va, vb));
        }
        for l in 0..4 {
            assert_eq!(full[l], 1 + want(l, l));
            assert_eq!(lane[l], want(l, 2));
        }
    }
}
