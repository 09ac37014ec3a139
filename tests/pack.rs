//! `prep pack` on the real fixture: records.bin read back row by row equals the imported
//! weights, a flipped byte is caught by the CRC, and resident.safetensors holds exactly what
//! stays in memory.

use formats::records::{record_bytes, RecordFile, RECORD_HEADER_BYTES};
use formats::safetensors_io::MappedSafetensors;
use half::f16;
use tests::*;

fn tensor(st: &MappedSafetensors, name: &str) -> Vec<f16> {
    st.bytes(&st.tensors[name]).chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]])).collect()
}

#[test]
fn pack_round_trips_and_crc_catches_corruption() {
    let out = scratch("pack");
    let r = run_bin(
        "prep",
        &["pack", fixture_model().to_str().unwrap(), "--dense-prefix", "20", "--out", out.to_str().unwrap(), "--json"],
    );
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let (d, ff) = (576, 1536);
    let model = MappedSafetensors::open(fixture_model().join("model.safetensors")).unwrap();
    let recs = RecordFile::open(&out.join("records.bin"), d, 20, 30, ff).unwrap();
    for layer in [20usize, 29] {
        let gate = tensor(&model, &format!("model.layers.{layer}.mlp.gate_proj.weight"));
        let up = tensor(&model, &format!("model.layers.{layer}.mlp.up_proj.weight"));
        let down = tensor(&model, &format!("model.layers.{layer}.mlp.down_proj.weight"));
        for neuron in 0..ff {
            let rows = recs.read(layer, neuron).unwrap();
            assert_eq!(rows.gate, gate[neuron * d..(neuron + 1) * d], "gate, layer {layer} neuron {neuron}");
            assert_eq!(rows.up, up[neuron * d..(neuron + 1) * d], "up, layer {layer} neuron {neuron}");
            let col: Vec<f16> = (0..d).map(|i| down[i * ff + neuron]).collect();
            assert_eq!(rows.down_t, col, "down^T, layer {layer} neuron {neuron}");
        }
    }
    // resident: attention everywhere, MLPs only in the dense prefix
    let res = MappedSafetensors::open(out.join("resident.safetensors")).unwrap();
    assert!(res.tensors.contains_key("model.layers.19.mlp.down_proj.weight"));
    assert!(!res.tensors.contains_key("model.layers.20.mlp.gate_proj.weight"));
    assert!(res.tensors.contains_key("model.layers.29.self_attn.q_proj.weight"));
    assert!(res.tensors.contains_key("model.embed_tokens.weight"));
    assert_eq!(res.tensors.len(), 2 + 30 * 6 + 20 * 3);

    // flip one payload byte of layer 25, neuron 700
    let path = out.join("records.bin");
    let off = recs.offset(25, 700) as usize + RECORD_HEADER_BYTES + 100;
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[off] ^= 0x10;
    std::fs::write(&path, &bytes).unwrap();
    let recs = RecordFile::open(&path, d, 20, 30, ff).unwrap();
    let e = recs.read(25, 700).unwrap_err().to_string();
    let rec_off = 5 * ff * record_bytes(d) + 700 * record_bytes(d);
    assert!(
        e.contains("layer 25, neuron 700") && e.contains("CRC32C mismatch") && e.contains(&format!("offset {rec_off}")),
        "{e}"
    );
    assert!(recs.read(25, 699).is_ok());
    // a truncated file is refused when opened
    std::fs::write(&path, &bytes[..bytes.len() - 4096]).unwrap();
    let e = RecordFile::open(&path, d, 20, 30, ff).err().unwrap().to_string();
    assert!(e.contains("truncated"), "{e}");
}

#[test]
fn impossible_dense_prefix_is_refused() {
    let out = scratch("pack-bad");
    let r = run_bin(
        "prep",
        &["pack", fixture_model().to_str().unwrap(), "--dense-prefix", "31", "--out", out.to_str().unwrap()],
    );
    assert_eq!(r.status.code(), Some(1));
    let e = String::from_utf8_lossy(&r.stderr);
    assert!(e.contains("--dense-prefix 31 exceeds the model's 30 layers"), "{e}");
}
