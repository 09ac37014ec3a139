//! `bench-kernels` (`make bench-kernels`): one thread, one Qwen2.5-1.5B-sized matrix-vector
//! product (8960 x 1536) per GGML block type, candle-core's block dot product against ours.
//! Prints GB/s of weights read and the ratio, and writes bench/results/kernels.json. The choice
//! it measured: ours for every type (`ops::qmatmul`): Q4_1's one-row kernel; Q4_0, Q5_0 and
//! Q8_0 decode 8 rows a pass (`ops::block32_gemm`, `vpdpbusd` where the CPU has AVX-512 VNNI);
//! Q4_K and Q6_K one row at a time, and where the CPU has AVX-512 VNNI over rows interleaved by
//! eight (`ops::interleaved`, a run with every row in memory); for Q4_K and Q6_K also our prompt
//! kernels, per token: one row against 4 tokens a pass (`ops::kquant_dot`), and the integer
//! product of 64 tokens where the CPU has AVX-512 VNNI (`ops::kquant_gemm`). Then the sparse
//! MLP's down sum over one layer's rows for each records down type (`[pack] down`), against
//! Q8_0's time. Last, where `make baseline` built it, llama.cpp's own matrix-vector product per
//! type (`test-backend-ops perf`) against ours at that test's shape and thread count.

use candle_core::quantized::k_quants::{self as ck, GgmlType as Blocks};
use formats::ggml_quants::{self, GgmlType};
use runtime::ops::{block32_gemm, down_sum, interleaved, kquant_dot, kquant_gemm, qdot};
use runtime::tensor::{F16Matrix, Matrix, QMatrix};
use std::time::Instant;

const ROWS: usize = 8960;
const COLS: usize = 1536;
const REPS: usize = 20;

/// `n` pseudo-random weights in [-1, 1).
fn weights(n: usize) -> Vec<f32> {
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        })
        .collect()
}

/// Seconds per matvec with candle's kernel for `T`, and the weight bytes.
fn candle<T: Blocks>(w: &[f32], x: &[f32]) -> (f64, usize, Vec<u8>) {
    let q = quantized::<T>(w);
    let mut xa = vec![T::VecDotType::zeros(); x.len() / T::VecDotType::BLCK_SIZE];
    T::VecDotType::from_float(x, &mut xa);
    let nb = COLS / T::BLCK_SIZE;
    let mut out = vec![0f32; ROWS];
    let t = Instant::now();
    for _ in 0..REPS {
        for (r, o) in out.iter_mut().enumerate() {
            *o = T::vec_dot(COLS, &q[r * nb..(r + 1) * nb], &xa);
        }
    }
    let sec = t.elapsed().as_secs_f64() / REPS as f64;
    std::hint::black_box(&out);
    let raw = as_bytes(&q);
    (sec, raw.len(), raw)
}

/// `w` as `T`'s blocks (candle-core's quantizer).
fn quantized<T: Blocks>(w: &[f32]) -> Vec<T> {
    let mut q = vec![T::zeros(); w.len() / T::BLCK_SIZE];
    T::from_float(w, &mut q);
    q
}

/// candle's blocks as the GGUF's bytes, our kernels' input.
fn as_bytes<T: Blocks>(q: &[T]) -> Vec<u8> {
    // SAFETY: candle's blocks are #[repr(C)] plain data; viewed as bytes.
    unsafe { std::slice::from_raw_parts(q.as_ptr() as *const u8, std::mem::size_of_val(q)) }.to_vec()
}

/// The activations every product here multiplies: `n` values in [-1, 1).
fn activations(n: usize) -> Vec<f32> {
    (0..n).map(|i| (i % 17) as f32 / 8.0 - 1.0).collect()
}

fn ours(raw: &[u8], dot: impl Fn(&[u8]) -> f32) -> f64 {
    let rb = raw.len() / ROWS;
    let mut out = vec![0f32; ROWS];
    let t = Instant::now();
    for _ in 0..REPS {
        for (r, o) in out.iter_mut().enumerate() {
            *o = dot(&raw[r * rb..(r + 1) * rb]);
        }
    }
    std::hint::black_box(&out);
    t.elapsed().as_secs_f64() / REPS as f64
}

/// Seconds per matvec of a k-quant matrix (`raw`, ROWS rows) with our kernel `dot`, one row
/// against T activations a pass (a prompt's T tokens; the time is per token).
fn ours_k<const T: usize>(raw: &[u8], dot: impl Fn(&[u8]) -> [f32; T]) -> f64 {
    let rb = raw.len() / ROWS;
    let mut out = vec![0f32; ROWS];
    let t = Instant::now();
    for _ in 0..REPS {
        for (r, o) in out.iter_mut().enumerate() {
            *o = dot(&raw[r * rb..(r + 1) * rb])[T - 1];
        }
    }
    std::hint::black_box(&out);
    t.elapsed().as_secs_f64() / REPS as f64 / T as f64
}

/// Seconds per matvec of a `ty` matrix (`raw`, ROWS rows) interleaved by eight rows
/// (`ops::interleaved`, the decode kernel of a run with every row in memory); None where the
/// CPU lacks AVX-512 VNNI.
fn interleaved(ty: GgmlType, raw: &[u8], x: &[qdot::BlockQ8K]) -> Option<f64> {
    if !interleaved::supports(ty) {
        return None;
    }
    let inter = interleaved::interleave(ty, raw, ROWS, COLS);
    let mut out = vec![0f32; ROWS];
    let t = Instant::now();
    for _ in 0..REPS {
        interleaved::matvec_groups(ty, &inter, x, 0, &mut out);
    }
    std::hint::black_box(&out);
    Some(t.elapsed().as_secs_f64() / REPS as f64)
}

/// Seconds per token of the prompt's integer product (`kquant_gemm`, AVX-512 VNNI) over 64
/// copies of `x`; None where the CPU lacks it.
fn integer_product(ty: GgmlType, raw: &[u8], x: &[qdot::BlockQ8K]) -> Option<f64> {
    if !kquant_gemm::available() {
        return None;
    }
    let tiles: Vec<kquant_gemm::TokenTile> = (0..4).map(|_| kquant_gemm::TokenTile::new(&[x; 16])).collect();
    let mut out = vec![0f32; 64 * ROWS];
    let t = Instant::now();
    for _ in 0..REPS {
        kquant_gemm::product(
            ty,
            kquant_gemm::WeightRows::RowMajor { bytes: raw, row_bytes: raw.len() / ROWS },
            ROWS,
            &tiles,
            &mut |t0, r0, acc| {
                for (i, a) in acc.iter().enumerate() {
                    for (t, v) in a.iter().enumerate() {
                        out[(t0 + t) * ROWS + r0 + i] = *v;
                    }
                }
            },
        );
    }
    std::hint::black_box(&out);
    Some(t.elapsed().as_secs_f64() / REPS as f64 / 64.0)
}

/// Seconds per matvec of a `ty` matrix (`raw`, ROWS rows) with decode's 32-value kernel
/// (`block32_gemm::matvec`: 8 rows a pass, `vpdpbusd` where the CPU has AVX-512 VNNI).
fn block32(ty: GgmlType, raw: &[u8], x: &[qdot::BlockQ8_0]) -> f64 {
    let mut out = vec![0f32; ROWS];
    let t = Instant::now();
    for _ in 0..REPS {
        block32_gemm::matvec(ty, raw, raw.len() / ROWS, x, &mut out);
    }
    std::hint::black_box(&out);
    t.elapsed().as_secs_f64() / REPS as f64
}

fn main() {
    let w = weights(ROWS * COLS);
    let x = activations(COLS);
    let gbs = |bytes: usize, s: f64| bytes as f64 / s / 1e9;
    let mut rows = Vec::new();
    let mut report = |name: &str, (s, bytes): (f64, usize), own: Option<f64>| {
        let line = match own {
            Some(o) => {
                format!("{name}: candle {:.1} GB/s, ours {:.1} GB/s ({:.1}x)", gbs(bytes, s), gbs(bytes, o), s / o)
            }
            None => format!("{name}: candle {:.1} GB/s", gbs(bytes, s)),
        };
        println!("{line}");
        rows.push(serde_json::json!({"type": name, "candle_gb_per_s": gbs(bytes, s), "ours_gb_per_s": own.map(|o| gbs(bytes, o))}));
    };
    let xk = qdot::quantize_q8_k(&x);
    let (s, b, raw) = candle::<ck::BlockQ4K>(&w, &x);
    report("Q4_K", (s, b), Some(ours_k(&raw, |row| kquant_dot::dot_q4_k([row], [&xk[..]])[0])));
    report("Q4_K, interleaved by 8 rows (decode, AVX-512 VNNI)", (s, b), interleaved(GgmlType::Q4K, &raw, &xk));
    report(
        "Q4_K, 4 tokens a pass (per token)",
        (s, b),
        Some(ours_k(&raw, |row| kquant_dot::dot_q4_k([row], [&xk[..]; 4])[0])),
    );
    report("Q4_K, integer product of 64 tokens (per token)", (s, b), integer_product(GgmlType::Q4K, &raw, &xk));
    let (s, b, raw) = candle::<ck::BlockQ6K>(&w, &x);
    report("Q6_K", (s, b), Some(ours_k(&raw, |row| kquant_dot::dot_q6_k([row], [&xk[..]])[0])));
    report("Q6_K, interleaved by 8 rows (decode, AVX-512 VNNI)", (s, b), interleaved(GgmlType::Q6K, &raw, &xk));
    report(
        "Q6_K, 4 tokens a pass (per token)",
        (s, b),
        Some(ours_k(&raw, |row| kquant_dot::dot_q6_k([row], [&xk[..]; 4])[0])),
    );
    report("Q6_K, integer product of 64 tokens (per token)", (s, b), integer_product(GgmlType::Q6K, &raw, &xk));
    let x8 = qdot::quantize_q8_0(&x);
    let (s, b, raw) = candle::<ck::BlockQ4_0>(&w, &x);
    report("Q4_0, 8 rows a pass (decode)", (s, b), Some(block32(GgmlType::Q4_0, &raw, &x8)));
    let (s, b, raw) = candle::<ck::BlockQ8_0>(&w, &x);
    report("Q8_0, 8 rows a pass (decode)", (s, b), Some(block32(GgmlType::Q8_0, &raw, &x8)));
    let (s, b, raw) = candle::<ck::BlockQ4_1>(&w, &x);
    let xa = qdot::quantize_q8_1(&x);
    report("Q4_1", (s, b), Some(ours(&raw, |row| qdot::dot_q4_1_q8_1(row, &xa))));
    let (s, b, raw) = candle::<ck::BlockQ5_0>(&w, &x);
    report("Q5_0, 8 rows a pass (decode)", (s, b), Some(block32(GgmlType::Q5_0, &raw, &x8)));
    // the sparse MLP's down sum: ROWS down rows of COLS values (a Qwen2.5-1.5B layer's W_down
    // columns), each scaled by its coefficient and added, per records' down type, against Q8_0
    let coef: Vec<f32> = (0..ROWS).map(|i| (i % 13) as f32 / 6.0 - 1.0).collect();
    let ids: Vec<u32> = (0..ROWS as u32).collect();
    let mut down = Vec::new();
    let mut q8_s = 0.0;
    for ty in ggml_quants::QUANTIZABLE {
        let blocks: Vec<u8> = w.chunks_exact(COLS).flat_map(|r| ggml_quants::quantize(ty, r).unwrap()).collect();
        let rb = blocks.len() / ROWS;
        let mut out = vec![0f32; COLS];
        let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        let t = Instant::now();
        pool.install(|| {
            for _ in 0..REPS {
                down_sum::down_sum_blocks(
                    ty,
                    &ids,
                    |k, _| coef[k],
                    |id| &blocks[id as usize * rb..(id as usize + 1) * rb],
                    &mut out,
                );
            }
        });
        let sec = t.elapsed().as_secs_f64() / REPS as f64;
        std::hint::black_box(&out);
        if ty == GgmlType::Q8_0 {
            q8_s = sec;
        }
        println!(
            "down sum {}: {:.2} ms per {ROWS} rows ({:.1} GB/s of rows, {:.2}x Q8_0's time, {rb} bytes a row)",
            ty.name(),
            sec * 1e3,
            gbs(blocks.len(), sec),
            sec / q8_s
        );
        down.push(serde_json::json!({"type": ty.name(), "ms": sec * 1e3, "row_bytes": rb, "time_vs_q8_0": sec / q8_s}));
    }
    let llama_cpp = against_llama_cpp();
    let out = serde_json::json!({"rows": ROWS, "cols": COLS, "threads": 1, "reps": REPS, "kernels": rows,
        "down_sum": down, "against_llama_cpp": llama_cpp});
    std::fs::create_dir_all("bench/results").ok();
    std::fs::write("bench/results/kernels.json", serde_json::to_string_pretty(&out).unwrap())
        .expect("write bench/results/kernels.json");
    println!("-> bench/results/kernels.json");
}

/// llama.cpp's matrix-vector product per type (`test-backend-ops perf`, which `make baseline`
/// builds with llama.cpp as it ships: native SIMD; the test computes from plain ggml buffers, so
/// without the repacking a loaded model gets) against ours through the runtime's own decode
/// dispatch (`ops::matmul`, Q4_K/Q6_K rows interleaved as a run in memory lays them out), at
/// the test's shape (4096 x 14336, one token: 33 MB of Q4_K, beyond L2) and its thread count
/// (half the CPUs). GB/s of the GGUF's bytes; the ratio is llama.cpp's time over ours.
fn against_llama_cpp() -> Vec<serde_json::Value> {
    const TOOL: &str = "baseline/bin/test-backend-ops";
    const M: usize = 4096;
    const K: usize = 14336;
    if !std::path::Path::new(TOOL).exists() {
        println!("llama.cpp's kernels: {TOOL} is missing (make baseline builds it)");
        return Vec::new();
    }
    let threads = (std::thread::available_parallelism().map_or(2, |n| n.get()) / 2).max(1);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    let w = weights(M * K);
    let x = activations(K);
    println!("against llama.cpp's kernels ({TOOL} perf), {M} x {K}, one token, {threads} thread(s):");
    let mut rows = Vec::new();
    for (ty, name) in [
        (GgmlType::F16, "f16"),
        (GgmlType::Q4_0, "q4_0"),
        (GgmlType::Q4_1, "q4_1"),
        (GgmlType::Q5_0, "q5_0"),
        (GgmlType::Q8_0, "q8_0"),
        (GgmlType::Q4K, "q4_K"),
        (GgmlType::Q6K, "q6_K"),
    ] {
        let (m, bytes) = match ty {
            GgmlType::F16 => {
                let h: Vec<half::f16> = w.iter().map(|&v| half::f16::from_f32(v)).collect();
                (Matrix::F16(F16Matrix::owned(M, K, h)), 2 * M * K)
            }
            _ => {
                let b = match ty {
                    GgmlType::Q4_0 => as_bytes(&quantized::<ck::BlockQ4_0>(&w)),
                    GgmlType::Q4_1 => as_bytes(&quantized::<ck::BlockQ4_1>(&w)),
                    GgmlType::Q5_0 => as_bytes(&quantized::<ck::BlockQ5_0>(&w)),
                    GgmlType::Q8_0 => as_bytes(&quantized::<ck::BlockQ8_0>(&w)),
                    GgmlType::Q4K => as_bytes(&quantized::<ck::BlockQ4K>(&w)),
                    _ => as_bytes(&quantized::<ck::BlockQ6K>(&w)),
                };
                let q = QMatrix::interleaved(ty, M, K, &b).unwrap_or_else(|| QMatrix::owned(ty, M, K, &b));
                (Matrix::Quant(q), b.len())
            }
        };
        let mut out = vec![0f32; M];
        let ours = pool.install(|| {
            runtime::ops::matmul::matmul(&x, 1, &m, &mut out);
            let t = Instant::now();
            for _ in 0..REPS {
                runtime::ops::matmul::matmul(&x, 1, &m, &mut out);
            }
            t.elapsed().as_secs_f64() / REPS as f64
        });
        std::hint::black_box(&out);
        let filter = format!("type_a={name},type_b=f32,m={M},n=1,k={K},");
        let theirs = std::process::Command::new(TOOL)
            .args(["perf", "-b", "CPU", "-o", "MUL_MAT", "-p", &filter])
            .output()
            .ok()
            .and_then(|o| us_per_run(&String::from_utf8_lossy(&o.stdout)))
            .map(|us| us * 1e-6);
        let gbs = |s: f64| bytes as f64 / s / 1e9;
        match theirs {
            Some(l) => {
                println!("  {}: llama.cpp {:.1} GB/s, ours {:.1} GB/s ({:.2}x)", ty.name(), gbs(l), gbs(ours), l / ours)
            }
            None => println!("  {}: ours {:.1} GB/s; llama.cpp's line not found", ty.name(), gbs(ours)),
        }
        rows.push(serde_json::json!({"type": ty.name(), "m": M, "k": K, "threads": threads,
            "ours_gb_per_s": gbs(ours), "llama_cpp_gb_per_s": theirs.map(gbs)}));
    }
    rows
}

/// The `N us/run` of the one MUL_MAT line `test-backend-ops perf` prints for a case.
fn us_per_run(stdout: &str) -> Option<f64> {
    let line = stdout.lines().find(|l| l.contains("MUL_MAT(") && l.contains("us/run"))?;
    line.split(" - ").find(|f| f.trim_end().ends_with("us/run"))?.split_whitespace().next()?.parse().ok()
}
