//! A small end-to-end `prep prepare` of the fixture (the CI-sized version of
//! `make prepare MODEL=smollm2-135m`): manifest written and verifiable, a rerun skips every
//! stage, `prep report` reads the capture, and a recipe error is reported clearly.

use formats::manifest::Manifest;
use tests::*;

fn recipe(dir: &std::path::Path, dense_prefix: usize) -> std::path::PathBuf {
    fixture_recipe(dir, "smollm2-135m-ci", dense_prefix, 1.5, 30)
}

#[test]
fn prepare_end_to_end_then_resume() {
    let dir = scratch("prepare");
    let r = recipe(&dir, 26);
    let out = run_bin("prep", &["prepare", r.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let stages: Vec<&str> = report["stages"].as_array().unwrap().iter().map(|s| s["stage"].as_str().unwrap()).collect();
    assert_eq!(stages, ["capture", "importance", "cluster", "train", "layers", "pack", "scorer", "sketch", "reuse"]);

    // the predictor: better than chance on held-out tokens (loss and top-1; top-1 also beats
    // always guessing the most frequent label),
    // sets of exactly K_max, and the saved f16 file gives the runtime the same logits
    let t: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("artifacts/predictor/train.json")).unwrap()).unwrap();
    let top1 = t["heldout_top1"].as_f64().unwrap();
    assert!(top1 > 1.0 / 16.0 && top1 > t["heldout_top1_majority"].as_f64().unwrap(), "{t}");
    assert!(
        t["heldout_loss"].as_f64().unwrap() < (16f64).ln(),
        "held-out loss above chance (uniform over K = 16): {t}"
    );
    assert!(t["param_share"].as_f64().unwrap() <= 0.03);
    assert_eq!(t["reload_top1_agreement"].as_f64().unwrap(), 1.0, "{t}");
    assert!(t["reload_max_abs_logit_diff"].as_f64().unwrap() < 1e-3, "{t}");

    let mpath = dir.join("artifacts/manifest.toml");
    let m = Manifest::load(&mpath).unwrap();
    m.verify_checksums(&mpath).unwrap();
    assert_eq!(m.sparsity.dense_prefix, 26);
    assert_eq!(m.sparsity.k_max.len(), 4);
    assert!(m.sparsity.k_max.iter().all(|&k| k > 500 && k < 1536), "{:?}", m.sparsity.k_max);
    let sizes: Vec<usize> =
        t["layers"].as_array().unwrap().iter().map(|l| l["predicted_set_size"].as_f64().unwrap() as usize).collect();
    assert_eq!(sizes, m.sparsity.k_max, "every predicted set holds exactly K_max neurons");
    assert_eq!(m.records.count, 4 * 1536);
    assert_eq!(std::fs::metadata(dir.join("artifacts/records.bin")).unwrap().len(), 4 * 1536 * 4096);

    // the 4-bit scorer of layers 26..30: its rows stand for the records' gate and up rows
    // (Q4_0 error, well under a fifth of the row's norm), and its CRC of each downT row is the
    // CRC of the record's downT row
    let sc = formats::scorer::GateUpScorerFile::load(&m.artifact_path_of(&mpath, "scorer").unwrap(), 26, 4, 1536, 576)
        .unwrap();
    let rf =
        formats::records::RecordFile::open(&m.artifact_path_of(&mpath, "records").unwrap(), 576, 26, 30, 1536).unwrap();
    for (layer, j) in [(26, 0), (27, 5), (29, 1535)] {
        let rows = rf.read(layer, j).unwrap();
        assert_eq!(sc.layer_down_crc32c(layer)[j], formats::scorer::f16_row_crc32c(&rows.down_t));
        let norm = rows.down_t.iter().map(|v| v.to_f32().powi(2)).sum::<f32>().sqrt();
        assert!((sc.layer_down_norm(layer)[j] - norm).abs() < 1e-3 * norm);
        for (part, want) in [(0, &rows.gate), (1, &rows.up)] {
            let q = &sc.layer_q4(layer)[(2 * j + part) * 288..(2 * j + part + 1) * 288];
            let s = &sc.layer_scales(layer)[(2 * j + part) * 18..(2 * j + part + 1) * 18];
            let got = formats::scorer::dequantize_q4_row(q, s);
            let err: f32 = got.iter().zip(want.iter()).map(|(a, b)| (a - b.to_f32()).powi(2)).sum::<f32>().sqrt();
            let len: f32 = want.iter().map(|b| b.to_f32().powi(2)).sum::<f32>().sqrt();
            assert!(err < 0.2 * len, "layer {layer} neuron {j} part {part}: error {err} of {len}");
        }
    }

    // importance over the calibration tokens (8 sequences of 64), and its ranking holds on
    // held-out text: the tenth of layer 28's neurons it ranks first move far more than the half
    // it ranks last
    let imp = formats::importance::NeuronImportance::load(&m.artifact_path_of(&mpath, "importance").unwrap(), 30, 1536)
        .unwrap();
    assert_eq!(imp.tokens, 8 * 64);
    struct Magnitudes(Vec<f64>);
    impl runtime::model::MlpHook for Magnitudes {
        fn observe(&mut self, layer: usize, gate_silu: &[f32], up: &[f32]) {
            if layer == 28 {
                for (g, u) in gate_silu.chunks_exact(1536).zip(up.chunks_exact(1536)) {
                    self.0.iter_mut().zip(g.iter().zip(u)).for_each(|(s, (a, b))| *s += (a * b).abs() as f64);
                }
            }
        }
    }
    let (model, tok) = runtime::open_model(&fixture_model(), runtime::DecodeLayout::Mapped).unwrap();
    let text = std::fs::read_to_string(repo_root().join("data/text/lambada-500.txt")).unwrap();
    let ids: Vec<u32> = tok.encode(&text, true).unwrap().into_iter().take(128).collect();
    let mut held_out = Magnitudes(vec![0.0; 1536]);
    model.forward_observed(&ids, &mut model.new_cache(128).unwrap(), 127, Some(&mut held_out)).unwrap();
    let mut order: Vec<usize> = (0..1536).collect();
    order.sort_by(|a, b| imp.layer(28)[*b].total_cmp(&imp.layer(28)[*a]));
    let mean = |js: &[usize]| js.iter().map(|&j| held_out.0[j]).sum::<f64>() / js.len() as f64;
    let (first, last) = (mean(&order[..154]), mean(&order[768..]));
    assert!(
        first > 3.0 * last,
        "held-out |silu(g) * u| of the most important tenth {first:.3} vs the least important half {last:.3}"
    );

    // unchanged inputs and settings: every stage is skipped
    let again = run_bin("prep", &["prepare", r.to_str().unwrap(), "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert!(report["stages"].as_array().unwrap().iter().all(|s| s["skipped"] == true), "{report}");

    // a changed setting reruns what depends on it: dense prefix -> cluster, train, layers, pack,
    // scorer, sketch and reuse, not capture
    let r = recipe(&dir, 27);
    let third = run_bin("prep", &["prepare", r.to_str().unwrap(), "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&third.stdout).unwrap();
    let skipped: Vec<bool> =
        report["stages"].as_array().unwrap().iter().map(|s| s["skipped"].as_bool().unwrap()).collect();
    assert_eq!(skipped, [true, true, false, false, false, false, false, false, false]);
    assert_eq!(Manifest::load(&mpath).unwrap().sparsity.k_max.len(), 3);

    // the report over the calibration capture
    let rep = run_bin(
        "prep",
        &[
            "report",
            dir.join("artifacts/capture").to_str().unwrap(),
            "--cluster",
            dir.join("artifacts/cluster").to_str().unwrap(),
            "--png",
            dir.join("reuse.png").to_str().unwrap(),
            "--mass-model",
            fixture_model().to_str().unwrap(),
            "--mass-text",
            repo_root().join("data/text/lambada-500.txt").to_str().unwrap(),
            "--mass-tokens",
            "128",
            "--predictor",
            dir.join("artifacts/predictor/predictor.safetensors").to_str().unwrap(),
            "--json",
        ],
    );
    assert!(rep.status.success(), "{}", String::from_utf8_lossy(&rep.stderr));
    let rep: serde_json::Value = serde_json::from_slice(&rep.stdout).unwrap();
    let png = std::fs::read(dir.join("reuse.png")).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000, "not a plotted PNG ({} bytes)", png.len());
    let layers = rep["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 30);
    let l28 = layers.iter().find(|l| l["column"] == "mask_l28").unwrap();
    let exact: Vec<f64> = l28["reuse_exact"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    assert!(exact[0] > 0.2 && exact[0] < exact[1] && exact[1] < exact[2] && exact[2] < 1.0, "{exact:?}");
    assert!(l28["centroid_recall"].as_f64().unwrap() > 0.3);
    let mass = l28["centroid_mass_coverage"].as_f64().unwrap();
    assert!(mass > 0.3 && mass <= 1.0, "mass coverage {mass}");
    let (top1, recall, size) = (
        l28["predictor_top1"].as_f64().unwrap(),
        l28["predictor_recall"].as_f64().unwrap(),
        l28["predictor_set_size"].as_f64().unwrap(),
    );
    assert!(top1 > 1.0 / 16.0 && recall > 0.3 && recall <= 1.0, "{l28}");
    assert_eq!(size as usize, Manifest::load(&mpath).unwrap().sparsity.k_max[28 - 27], "predicted sets hold K_max");
    assert!(layers.iter().find(|l| l["column"] == "mask_l10").unwrap()["centroid_mass_coverage"].is_null());
    assert!(
        layers.iter().find(|l| l["column"] == "mask_l10").unwrap()["reuse_centroid"].is_null(),
        "layer 10 is dense, not clustered"
    );
}

#[test]
fn recipe_errors_name_the_file() {
    let dir = scratch("prepare-bad");
    let p = dir.join("bad.toml");
    std::fs::write(&p, "name = \"x\"\nmodel_dir = \"m\"\nout = \"o\"\n[capture]\nalpha = 2\n").unwrap();
    let out = run_bin("prep", &["prepare", p.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("bad.toml") && e.contains("invalid recipe"), "{e}");
    let r = recipe(&dir, 31);
    let out = run_bin("prep", &["prepare", r.to_str().unwrap()]);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("pack.dense_prefix 31 exceeds the model's 30 layers"), "{e}");
}
