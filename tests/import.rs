//! `prep import` on the real fixture: the imported f16 tensors are the GGUF's dequantized
//! values (with llama.cpp's q/k row permutation undone), and a Hugging Face directory is
//! accepted as is.

use formats::gguf::GgufFile;
use formats::safetensors_io::MappedSafetensors;
use half::f16;
use tests::*;

fn f16_row(st: &MappedSafetensors, name: &str, row: usize, cols: usize) -> Vec<f32> {
    let e = &st.tensors[name];
    let b = &st.bytes(e)[row * cols * 2..(row + 1) * cols * 2];
    b.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect()
}

#[test]
fn imported_weights_are_the_dequantized_gguf_weights() {
    let g = GgufFile::open(fixture_gguf()).unwrap();
    let st = MappedSafetensors::open(fixture_model().join("model.safetensors")).unwrap();
    let d = 576;
    // An unpermuted tensor: ffn_gate (Q4_1), row 5.
    let gate = g.dequantize_f32("blk.0.ffn_gate.weight").unwrap();
    let want: Vec<f32> = gate[5 * d..6 * d].iter().map(|&v| f16::from_f32(v).to_f32()).collect();
    assert_eq!(f16_row(&st, "model.layers.0.mlp.gate_proj.weight", 5, d), want);
    // The embedding (Q8_0), row 1000.
    let emb = g.dequantize_f32("token_embd.weight").unwrap();
    let want: Vec<f32> = emb[1000 * d..1001 * d].iter().map(|&v| f16::from_f32(v).to_f32()).collect();
    assert_eq!(f16_row(&st, "model.embed_tokens.weight", 1000, d), want);
    // k_proj: 3 kv heads of 64; HF row (head h, half a, index b) is GGUF row (h, b, a).
    let k = g.dequantize_f32("blk.3.attn_k.weight").unwrap();
    for (h, a, b) in [(0usize, 0usize, 0usize), (0, 1, 0), (1, 0, 5), (2, 1, 31)] {
        let hf_row = h * 64 + a * 32 + b;
        let gguf_row = h * 64 + b * 2 + a;
        let want: Vec<f32> = k[gguf_row * d..(gguf_row + 1) * d].iter().map(|&v| f16::from_f32(v).to_f32()).collect();
        assert_eq!(f16_row(&st, "model.layers.3.self_attn.k_proj.weight", hf_row, d), want, "row {hf_row}");
    }
}

#[test]
fn hugging_face_directory_is_accepted_as_is() {
    let out = scratch("hf-import");
    let r = run_bin("prep", &["import", fixture_model().to_str().unwrap(), "--out", out.to_str().unwrap(), "--json"]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    assert_eq!(summary["architecture"], "llama");
    assert_eq!(summary["tensors"], 272);
    let a = MappedSafetensors::open(fixture_model().join("model.safetensors")).unwrap();
    let b = MappedSafetensors::open(out.join("model.safetensors")).unwrap();
    assert_eq!(a.tensors.len(), b.tensors.len());
    for (name, e) in &a.tensors {
        assert_eq!(a.bytes(e), b.bytes(&b.tensors[name]), "tensor {name}");
    }
    // And the result runs.
    let r = run_bin(
        "runtime",
        &["run", out.to_str().unwrap(), "--prompt", "The capital of France is", "-n", "2", "--json"],
    );
    let v: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    assert_eq!(v["text"], " Paris.");
}
