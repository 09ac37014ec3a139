//! `prep capture` on the real fixture: the shard opens as Arrow IPC, masks have the target
//! density, and each stored mask bit and hidden state equals what the forward pass computes.

use arrow_array::{Array, FixedSizeBinaryArray, FixedSizeListArray, Float16Array, UInt32Array};
use runtime::model::MlpHook;
use tests::*;

struct Grab {
    layer: usize,
    product: Vec<f32>,
    hidden0: Vec<f32>,
}

impl MlpHook for Grab {
    fn observe(&mut self, layer: usize, g: &[f32], u: &[f32]) {
        if layer == self.layer {
            self.product = g.iter().zip(u).map(|(a, b)| a * b).collect();
        }
    }
    fn after_layer(&mut self, layer: usize, h: &[f32]) {
        if layer == 0 {
            self.hidden0 = h.to_vec();
        }
    }
}

#[test]
fn capture_masks_equal_the_forward_pass() {
    let out = scratch("capture");
    let r = run_bin(
        "prep",
        &[
            "capture",
            fixture_model().to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--corpus",
            data_text("boolq.txt").to_str().unwrap(),
            "--corpus",
            data_text("hamlet.txt").to_str().unwrap(),
            "--seq-len",
            "64",
            "--sequences",
            "4",
            "--threshold-sequences",
            "4",
            "--alpha",
            "0.62",
            "--json",
        ],
    );
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    assert_eq!(summary["tokens_captured"], 256);
    for d in summary["density_per_layer"].as_array().unwrap() {
        // thresholds come from these same tokens: density is 1 - alpha up to one histogram bin
        let d = d.as_f64().unwrap();
        assert!((d - 0.38).abs() < 0.01, "density {d}");
    }
    let th: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("thresholds.json")).unwrap()).unwrap();
    let t5 = th["product"][5].as_f64().unwrap() as f32;

    let file = std::fs::File::open(out.join("masks-000-of-001.arrow")).unwrap();
    let reader = arrow_ipc::reader::FileReader::try_new(file, None).unwrap();
    assert_eq!(reader.schema().fields().len(), 4 + 30);
    let batches: Vec<_> = reader.map(|b| b.unwrap()).collect();
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 256);

    // Recompute the second sequence and compare every token's mask of layer 5 and hidden state.
    let b = &batches[1];
    let tokens: Vec<u32> =
        b.column_by_name("token").unwrap().as_any().downcast_ref::<UInt32Array>().unwrap().values().to_vec();
    let (model, _) = runtime::open_model(&fixture_model(), runtime::DecodeLayout::Mapped).unwrap();
    let mut grab = Grab { layer: 5, product: vec![], hidden0: vec![] };
    let mut cache = model.new_cache(64).unwrap();
    model.forward_observed(&tokens, &mut cache, 64, Some(&mut grab)).unwrap();
    let masks = b.column_by_name("mask_l05").unwrap().as_any().downcast_ref::<FixedSizeBinaryArray>().unwrap();
    let hidden =
        b.column_by_name("hidden_after_layer0").unwrap().as_any().downcast_ref::<FixedSizeListArray>().unwrap();
    for t in 0..64 {
        let bits = masks.value(t);
        for n in 0..1536 {
            let stored = bits[n / 8] >> (n % 8) & 1 == 1;
            assert_eq!(stored, grab.product[t * 1536 + n].abs() >= t5, "token {t} neuron {n}");
        }
        let h = hidden.value(t);
        let h = h.as_any().downcast_ref::<Float16Array>().unwrap();
        for i in 0..576 {
            assert_eq!(h.value(i), half::f16::from_f32(grab.hidden0[t * 576 + i]));
        }
    }
}

#[test]
fn capture_refuses_a_corpus_too_small() {
    let out = scratch("capture-small");
    let tiny = out.join("tiny.txt");
    std::fs::write(&tiny, "Only a few words here.").unwrap();
    let r = run_bin(
        "prep",
        &[
            "capture",
            fixture_model().to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--corpus",
            tiny.to_str().unwrap(),
        ],
    );
    assert_eq!(r.status.code(), Some(1));
    let e = String::from_utf8_lossy(&r.stderr);
    assert!(e.contains("the corpus gives 0 sequences of 512 tokens; 8 are needed"), "{e}");
}

#[test]
fn cluster_writes_fixed_size_centroids_and_labels() {
    let cap = scratch("cluster-cap");
    let r = run_bin(
        "prep",
        &[
            "capture",
            fixture_model().to_str().unwrap(),
            "--out",
            cap.to_str().unwrap(),
            "--corpus",
            data_text("boolq.txt").to_str().unwrap(),
            "--seq-len",
            "64",
            "--sequences",
            "8",
            "--threshold-sequences",
            "8",
        ],
    );
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let out = scratch("cluster-out");
    let run = |factor: &str| {
        let r = run_bin(
            "prep",
            &[
                "cluster",
                cap.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
                "--k",
                "16",
                "--k-max-factor",
                factor,
                "--layers",
                "3..5",
                "--json",
            ],
        );
        assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
        serde_json::from_slice::<serde_json::Value>(&r.stdout).unwrap()
    };
    let narrow = run("1.0");
    let wide = run("2.0");
    assert_eq!(narrow["tokens"], 512);
    let layers = wide["layers"].as_array().unwrap();
    assert_eq!(layers.iter().map(|l| l["column"].as_str().unwrap()).collect::<Vec<_>>(), ["mask_l03", "mask_l04"]);
    for (n, w) in narrow["layers"].as_array().unwrap().iter().zip(layers) {
        let (rn, rw) = (n["recall"].as_f64().unwrap(), w["recall"].as_f64().unwrap());
        assert!(rn > 0.3 && rn < rw && rw <= 1.0, "recall {rn} (1.0x) vs {rw} (2.0x)");
    }
    // every pruned centroid holds exactly K_max neurons; one label per token, each < K
    let k_max = layers[0]["k_max"].as_u64().unwrap() as u32;
    let c = formats::safetensors_io::MappedSafetensors::open(out.join("centroids.safetensors")).unwrap();
    let e = &c.tensors["centroids_l03"];
    assert_eq!(e.shape, vec![16, 192]);
    for row in c.bytes(e).chunks_exact(192) {
        assert_eq!(row.iter().map(|b| b.count_ones()).sum::<u32>(), k_max);
    }
    let l = formats::safetensors_io::MappedSafetensors::open(out.join("labels.safetensors")).unwrap();
    let e = &l.tensors["labels_l04"];
    assert_eq!(e.shape, vec![512]);
    assert!(l.bytes(e).chunks_exact(2).all(|b| u16::from_le_bytes([b[0], b[1]]) < 16));
    // K larger than the sample is refused
    let r = run_bin("prep", &["cluster", cap.to_str().unwrap(), "--out", out.to_str().unwrap(), "--k", "600"]);
    assert_eq!(r.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&r.stderr).contains("K = 600 centroids but only 512 captured tokens"));
    // so is K_max beyond the intermediate size
    let r = run_bin(
        "prep",
        &["cluster", cap.to_str().unwrap(), "--out", out.to_str().unwrap(), "--k", "16", "--k-max", "2000"],
    );
    assert_eq!(r.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&r.stderr).contains("K_max = 2000 is impossible: it must be in 1..=1536"));
}
