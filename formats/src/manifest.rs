//! `manifest.toml`: everything the runtime needs to run a prepared model, and how it was made.
//!
//! ```toml
//! format_version = 1
//! model_name = "smollm2-135m"
//! [model]            # the model's config.json, as imported
//! [sparsity]         # dense prefix d, centroids K, mask kind, alpha, K_max per sparse layer
//! [records]          # records.bin: record size, first sparse layer, neurons per layer, offsets
//! [[artifacts]]      # every file: role, path (relative to the manifest), bytes, sha256
//! [provenance]       # prep version, settings, source model and its sha256, time
//! ```
//! One reader ([`Manifest::load`], which validates) and one writer ([`Manifest::save`], atomic).

use crate::error::{FormatError, Result};
use crate::model_dir::ModelConfig;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

pub const MANIFEST_FORMAT_VERSION: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    pub format_version: u32,
    pub model_name: String,
    pub model: ModelConfig,
    pub sparsity: SparsitySettings,
    pub records: RecordsLayout,
    pub artifacts: Vec<Artifact>,
    pub provenance: Provenance,
}

/// How activations are made sparse.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SparsitySettings {
    /// `gate-up` (separate |gate| and |up| thresholds, intersected) or `product` (|silu(g) * u|).
    pub mask_kind: String,
    /// Fraction of neurons below the per-layer threshold (inactive), e.g. 0.62.
    pub alpha: f64,
    /// Layers `0..dense_prefix` run dense from resident weights; records.bin, the predictor's
    /// heads and k_max cover `dense_prefix..n_layers`.
    pub dense_prefix: usize,
    /// The operating point the runtime uses unless told otherwise: layers
    /// `dense_prefix..default_dense_from` also run dense (their rows loaded from records.bin once),
    /// the later ones sparse. Absent: `dense_prefix`. A smaller memory budget can move it down
    /// (`runtime --dense-from fit`), at a quality cost `make bench-quality` measures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_dense_from: Option<usize>,
    /// Centroids per layer (and projection for `gate-up`).
    pub centroids: usize,
    /// Rows kept per centroid, one entry per sparse layer (`dense_prefix..n_layers`).
    pub k_max: Vec<usize>,
}

/// Where each neuron's record is in `records.bin`: layer-major, neuron order.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RecordsLayout {
    pub path: String,
    pub record_bytes: usize,
    pub first_layer: usize,
    pub neurons_per_layer: usize,
    pub count: usize,
    /// Version-2 records (`formats::records`): the gate/up rows' GGML type ("Q4_K") and the
    /// down rows' ("Q8_0"); absent for version 1 (f16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate_up_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub down_type: Option<String>,
}

impl RecordsLayout {
    /// The version-2 layout (None: version-1 f16 records); an unknown type name is an error.
    pub fn shape(&self, d_model: usize) -> std::result::Result<Option<crate::records::RecordShape>, String> {
        let ty = |n: &Option<String>| -> std::result::Result<Option<crate::ggml_quants::GgmlType>, String> {
            n.as_deref()
                .map(|n| {
                    crate::ggml_quants::GgmlType::from_name(n)
                        .filter(|t| t.is_block_quantized() && t.is_supported())
                        .ok_or_else(|| format!("records type '{n}' is not a block type records hold"))
                })
                .transpose()
        };
        match (ty(&self.gate_up_type)?, ty(&self.down_type)?) {
            (None, None) => Ok(None),
            (Some(gate_up), Some(down)) => {
                let s = crate::records::RecordShape { d_model, gate_up, down };
                s.check()?;
                Ok(Some(s))
            }
            _ => Err("gate_up_type and down_type come together (version-2 records)".into()),
        }
    }

    /// Bytes of one record for this layout.
    pub fn expected_record_bytes(&self, d_model: usize) -> std::result::Result<usize, String> {
        Ok(match self.shape(d_model)? {
            Some(s) => s.record_bytes(),
            None => crate::records::record_bytes(d_model),
        })
    }

    /// Byte offset of the record of (`layer`, `neuron`).
    pub fn offset(&self, layer: usize, neuron: usize) -> u64 {
        crate::records::record_offset(self.first_layer, self.neurons_per_layer, self.record_bytes, layer, neuron)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Artifact {
    /// What the file is: "records", "resident", "centroids", "thresholds", "predictor", "tokenizer".
    pub role: String,
    /// Relative to the manifest's directory.
    pub path: String,
    pub bytes: u64,
    pub sha256: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct Provenance {
    pub prep_version: String,
    pub source: String,
    pub source_sha256: String,
    pub created_unix_s: u64,
    /// Every setting of the recipe, as given.
    pub settings: BTreeMap<String, String>,
}

/// What [`Manifest::verify_checksums_cached`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Verification {
    /// Every artifact was verified before and is unchanged since (size, mtime).
    Cached,
    /// Every artifact's sha256 was computed now and matched; `stamp_written` false: the folder
    /// is not writable, so the next run verifies again.
    Verified { bytes: u64, seconds: f64, stamp_written: bool },
}

/// sha256 of a file, hex.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).map_err(|e| FormatError::io(path, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut pos = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(|e| {
            FormatError::invalid(path, format!("cannot read at byte offset {pos} (checking its sha256): {e}"))
        })?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        pos += n as u64;
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

impl SparsitySettings {
    /// The dense prefix the runtime uses by default (see `default_dense_from`).
    pub fn default_dense_from(&self) -> usize {
        self.default_dense_from.unwrap_or(self.dense_prefix)
    }
}

impl Manifest {
    /// Structural checks that need no other file.
    pub fn validate(&self, path: &Path) -> Result<()> {
        let bad = |what: String| Err(FormatError::invalid(path, what));
        if self.format_version != MANIFEST_FORMAT_VERSION {
            return bad(format!("format_version {} (this build reads {MANIFEST_FORMAT_VERSION})", self.format_version));
        }
        self.model.validate(path)?;
        let (n_layers, n_ff) = (self.model.num_hidden_layers, self.model.intermediate_size);
        let s = &self.sparsity;
        if s.dense_prefix > n_layers {
            return bad(format!("dense_prefix {} exceeds the model's {n_layers} layers", s.dense_prefix));
        }
        if let Some(l) = s.default_dense_from {
            if l < s.dense_prefix || l > n_layers {
                return bad(format!(
                    "default_dense_from {l} is outside dense_prefix..=n_layers ({}..={n_layers})",
                    s.dense_prefix
                ));
            }
        }
        if s.k_max.len() != n_layers - s.dense_prefix {
            return bad(format!("{} k_max entries for {} sparse layers", s.k_max.len(), n_layers - s.dense_prefix));
        }
        if let Some(k) = s.k_max.iter().find(|&&k| k == 0 || k > n_ff) {
            return bad(format!("k_max {k} is outside 1..={n_ff} (intermediate_size)"));
        }
        if !(0.0..1.0).contains(&s.alpha) {
            return bad(format!("alpha {} is outside [0, 1)", s.alpha));
        }
        let mut roles = std::collections::BTreeSet::new();
        for a in &self.artifacts {
            if !roles.insert(a.role.as_str()) {
                return bad(format!("two artifacts with role '{}'", a.role));
            }
            // relative and inside the folder: the folder is what is copied to the device
            let rel = Path::new(&a.path);
            if a.path.is_empty()
                || rel.is_absolute()
                || rel.components().any(|c| !matches!(c, std::path::Component::Normal(_)))
            {
                return bad(format!(
                    "artifact '{}' at '{}': paths must be relative and inside the manifest's folder, so the folder can be copied to a device (rerun make prepare)",
                    a.role, a.path
                ));
            }
            if a.sha256.len() != 64 || !a.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                return bad(format!("artifact '{}': sha256 '{}' is not 64 hex digits", a.role, a.sha256));
            }
        }
        let r = &self.records;
        match self.artifacts.iter().find(|a| a.role == "records") {
            Some(a) if a.path != r.path => {
                return bad(format!("[records] path '{}' but the records artifact is '{}'", r.path, a.path))
            }
            None => return bad("no artifact with role 'records'".into()),
            _ => {}
        }
        let want = match r.expected_record_bytes(self.model.hidden_size) {
            Ok(b) => b,
            Err(e) => return bad(format!("[records] {e}")),
        };
        if r.record_bytes != want {
            return bad(format!(
                "record_bytes {} but hidden_size {} implies {want}{}",
                r.record_bytes,
                self.model.hidden_size,
                r.gate_up_type.as_ref().map(|t| format!(" for {t} rows")).unwrap_or_default()
            ));
        }
        if r.first_layer != s.dense_prefix
            || r.neurons_per_layer != n_ff
            || r.count != (n_layers - s.dense_prefix) * n_ff
        {
            return bad(format!(
                "records cover layers {}.. x {} neurons = {}, expected layers {}.. x {n_ff} = {}",
                r.first_layer,
                r.neurons_per_layer,
                r.count,
                s.dense_prefix,
                (n_layers - s.dense_prefix) * n_ff
            ));
        }
        Ok(())
    }

    /// Reads and validates a manifest, and checks every artifact exists with its recorded size
    /// (sha256 is checked by [`Manifest::verify_checksums`], which reads every byte).
    pub fn load(path: &Path) -> Result<Self> {
        let raw = std::fs::read(path).map_err(|e| FormatError::io(path, e))?;
        if raw.starts_with(b"GGUF") {
            return Err(FormatError::invalid(path, "a GGUF model file, not a prepared model's manifest.toml: `prep import` it into a model directory (or `make prepare` it) first"));
        }
        let text = String::from_utf8(raw).map_err(|e| {
            FormatError::invalid(
                path,
                format!("not a manifest: byte {} is not UTF-8 text", e.utf8_error().valid_up_to()),
            )
        })?;
        // a misspelled key would otherwise fall back to a default (an eos_token_id typo: no stop)
        let mut unknown = Vec::new();
        let m: Manifest =
            serde_ignored::deserialize(toml::Deserializer::new(&text), |key| unknown.push(key.to_string()))
                .map_err(|e| FormatError::invalid(path, format!("not a valid manifest: {e}")))?;
        if !unknown.is_empty() {
            return Err(FormatError::invalid(
                path,
                format!("unknown key{} {} (misspelled?)", if unknown.len() > 1 { "s" } else { "" }, unknown.join(", ")),
            ));
        }
        m.validate(path)?;
        for a in &m.artifacts {
            let p = m.artifact_path(path, a);
            let len = std::fs::metadata(&p).map_err(|e| FormatError::io(&p, e))?.len();
            if len != a.bytes {
                return Err(FormatError::invalid(
                    &p,
                    format!("{} bytes, the manifest {} says {}", len, path.display(), a.bytes),
                ));
            }
        }
        Ok(m)
    }

    pub fn artifact_path(&self, manifest_path: &Path, a: &Artifact) -> PathBuf {
        manifest_path.parent().unwrap_or(Path::new(".")).join(&a.path)
    }

    /// Recomputes every artifact's sha256 and compares with the manifest.
    /// The path of the artifact with this role; an error naming the manifest when there is none.
    pub fn artifact_path_of(&self, manifest_path: &Path, role: &str) -> Result<PathBuf> {
        let a = self.artifacts.iter().find(|a| a.role == role).ok_or_else(|| {
            FormatError::invalid(
                manifest_path,
                format!("no artifact with role '{role}' (prepared by an older prep? rerun make prepare)"),
            )
        })?;
        Ok(self.artifact_path(manifest_path, a))
    }

    pub fn verify_checksums(&self, manifest_path: &Path) -> Result<()> {
        for a in &self.artifacts {
            let p = self.artifact_path(manifest_path, a);
            let got = sha256_file(&p)?;
            if got != a.sha256 {
                return Err(FormatError::invalid(&p, format!("sha256 {got} differs from the manifest's {}", a.sha256)));
            }
        }
        Ok(())
    }

    /// [`Manifest::verify_checksums`] once per artifact set: the stamp `.<manifest>.verified.json`
    /// beside the manifest records the manifest's sha256 and every artifact's identity after a
    /// successful check: its device and inode, size, mtime and ctime. While they all match, the
    /// check is skipped (a second run costs a stat per artifact). The ctime moves on every
    /// write, `touch` and rename and cannot be set back, and a copy (`cp -a`, `rsync -a`, which
    /// carry the stamp) has new inodes, so neither corruption that keeps the mtime nor a copied
    /// stamp skips the hash. A folder that cannot be written (a read-only device) is verified on
    /// every run.
    pub fn verify_checksums_cached(&self, manifest_path: &Path) -> Result<Verification> {
        let name = manifest_path.file_name().map_or("manifest.toml".into(), |n| n.to_string_lossy().into_owned());
        let stamp_path = manifest_path.with_file_name(format!(".{name}.verified.json"));
        let stamp = |m: &Manifest| -> Result<serde_json::Value> {
            let files = m
                .artifacts
                .iter()
                .map(|a| {
                    let p = m.artifact_path(manifest_path, a);
                    use std::os::unix::fs::MetadataExt;
                    let md = std::fs::metadata(&p).map_err(|e| FormatError::io(&p, e))?;
                    let ns = |s: i64, n: i64| s as i128 * 1_000_000_000 + n as i128;
                    Ok(serde_json::json!({
                        "path": a.path, "bytes": md.len(), "dev": md.dev(), "ino": md.ino(),
                        "mtime_ns": ns(md.mtime(), md.mtime_nsec()).to_string(),
                        "ctime_ns": ns(md.ctime(), md.ctime_nsec()).to_string(),
                    }))
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(serde_json::json!({"manifest_sha256": sha256_file(manifest_path)?, "artifacts": files}))
        };
        let now = stamp(self)?;
        let old =
            std::fs::read_to_string(&stamp_path).ok().and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok());
        if old.as_ref() == Some(&now) {
            return Ok(Verification::Cached);
        }
        let t0 = std::time::Instant::now();
        self.verify_checksums(manifest_path)?;
        let bytes = self.artifacts.iter().map(|a| a.bytes).sum();
        let seconds = t0.elapsed().as_secs_f64();
        let written = crate::safetensors_io::write_atomic(
            &crate::safetensors_io::tmp_path(&stamp_path),
            &stamp_path,
            now.to_string().as_bytes(),
        )
        .is_ok();
        Ok(Verification::Verified { bytes, seconds, stamp_written: written })
    }

    /// Writes the manifest atomically.
    pub fn save(&self, path: &Path) -> Result<()> {
        self.validate(path)?;
        let text =
            toml::to_string_pretty(self).map_err(|e| FormatError::invalid(path, format!("cannot serialise: {e}")))?;
        crate::safetensors_io::write_atomic(&crate::safetensors_io::tmp_path(path), path, text.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(dir: &Path) -> Manifest {
        let model: ModelConfig = serde_json::from_value(serde_json::json!({
            "model_type": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
            "num_attention_heads": 9, "num_key_value_heads": 3, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
            "vocab_size": 49152, "tie_word_embeddings": true,
        }))
        .unwrap();
        let art = dir.join("thresholds.bin");
        std::fs::write(&art, b"0123456789").unwrap();
        std::fs::write(dir.join("records.bin"), b"0123456789").unwrap();
        Manifest {
            format_version: MANIFEST_FORMAT_VERSION,
            model_name: "smollm2-135m".into(),
            model,
            sparsity: SparsitySettings {
                mask_kind: "product".into(),
                alpha: 0.62,
                dense_prefix: 20,
                default_dense_from: None,
                centroids: 512,
                k_max: vec![900; 10],
            },
            records: RecordsLayout {
                path: "records.bin".into(),
                record_bytes: 4096,
                first_layer: 20,
                neurons_per_layer: 1536,
                count: 15360,
                gate_up_type: None,
                down_type: None,
            },
            artifacts: vec![
                Artifact {
                    role: "records".into(),
                    path: "records.bin".into(),
                    bytes: 10,
                    sha256: sha256_file(&art).unwrap(),
                },
                Artifact {
                    role: "thresholds".into(),
                    path: "thresholds.bin".into(),
                    bytes: 10,
                    sha256: sha256_file(&art).unwrap(),
                },
            ],
            provenance: Provenance { prep_version: "0.1.0".into(), ..Default::default() },
        }
    }

    /// A directory removed when the guard drops.
    fn dir(name: &str) -> tempfile::TempDir {
        tempfile::Builder::new().prefix(&format!("formats-manifest-{name}-")).tempdir().unwrap()
    }

    #[test]
    fn round_trip_and_checksums() {
        let guard = dir("rt");
        let d = guard.path();
        let m = sample(d);
        let p = d.join("manifest.toml");
        m.save(&p).unwrap();
        let back = Manifest::load(&p).unwrap();
        assert_eq!(back, m);
        back.verify_checksums(&p).unwrap();
        assert_eq!(back.records.offset(21, 3), ((1536 + 3) * 4096) as u64);
        std::fs::write(d.join("thresholds.bin"), b"0123456780").unwrap(); // same size, other bytes
        let e = back.verify_checksums(&p).unwrap_err().to_string();
        assert!(e.contains("thresholds.bin") && e.contains("differs"), "{e}");
        std::fs::write(d.join("thresholds.bin"), b"short").unwrap();
        let e = Manifest::load(&p).unwrap_err().to_string();
        assert!(e.contains("5 bytes") && e.contains("says 10"), "{e}");
    }

    #[test]
    fn impossible_settings_are_refused() {
        let guard = dir("bad");
        let d = guard.path();
        let p = d.join("manifest.toml");
        let mut m = sample(d);
        m.sparsity.k_max[3] = 2000;
        assert!(m.save(&p).unwrap_err().to_string().contains("k_max 2000 is outside 1..=1536"));
        let mut m = sample(d);
        m.sparsity.default_dense_from = Some(19);
        assert!(m.save(&p).unwrap_err().to_string().contains("default_dense_from 19 is outside"));
        m.sparsity.default_dense_from = Some(25);
        m.save(&p).unwrap();
        assert_eq!(Manifest::load(&p).unwrap().sparsity.default_dense_from(), 25);
        m.sparsity.dense_prefix = 31;
        assert!(m.save(&p).unwrap_err().to_string().contains("dense_prefix 31 exceeds"));
        let mut m = sample(d);
        m.records.record_bytes = 4608;
        assert!(m.save(&p).unwrap_err().to_string().contains("record_bytes 4608"));
        std::fs::write(&p, "format_version = 1\nmodel_name = 3\n").unwrap();
        assert!(Manifest::load(&p).unwrap_err().to_string().contains("not a valid manifest"));
        let mut m = sample(d);
        m.artifacts.push(m.artifacts[1].clone());
        assert!(m.save(&p).unwrap_err().to_string().contains("two artifacts with role 'thresholds'"));
        for escaping in ["/abs/tokenizer.json", "../models/tokenizer.json", "a/../../b"] {
            let mut m = sample(d);
            m.artifacts[1].path = escaping.into();
            let e = m.save(&p).unwrap_err().to_string();
            assert!(e.contains("relative and inside") && e.contains(escaping), "{e}");
        }
        let mut m = sample(d);
        m.records.path = "other.bin".into();
        assert!(m.save(&p).unwrap_err().to_string().contains("[records] path 'other.bin'"));
    }

    #[test]
    fn checksums_are_verified_once_per_artifact_set() {
        let guard = dir("verify");
        let d = guard.path();
        let p = d.join("manifest.toml");
        let m = sample(d);
        m.save(&p).unwrap();
        assert!(matches!(m.verify_checksums_cached(&p).unwrap(), Verification::Verified { stamp_written: true, .. }));
        assert_eq!(m.verify_checksums_cached(&p).unwrap(), Verification::Cached);
        // same size, other bytes, new mtime: verified again, and refused
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(d.join("thresholds.bin"), b"0123456780").unwrap();
        let e = m.verify_checksums_cached(&p).unwrap_err().to_string();
        assert!(e.contains("thresholds.bin") && e.contains("differs"), "{e}");
        std::fs::write(d.join("thresholds.bin"), b"0123456789").unwrap();
        assert!(matches!(m.verify_checksums_cached(&p).unwrap(), Verification::Verified { .. }));
        assert_eq!(m.verify_checksums_cached(&p).unwrap(), Verification::Cached);
        // other bytes with the size and mtime kept (as a corruption or `touch -r` leaves them):
        // the ctime moved, so verified again, and refused
        let mtime = std::fs::metadata(d.join("thresholds.bin")).unwrap().modified().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let f = std::fs::OpenOptions::new().write(true).open(d.join("thresholds.bin")).unwrap();
        std::os::unix::fs::FileExt::write_at(&f, b"7", 9).unwrap();
        f.set_modified(mtime).unwrap();
        drop(f);
        assert_eq!(std::fs::metadata(d.join("thresholds.bin")).unwrap().modified().unwrap(), mtime);
        let e = m.verify_checksums_cached(&p).unwrap_err().to_string();
        assert!(e.contains("thresholds.bin") && e.contains("differs"), "{e}");
    }

    #[test]
    fn a_copied_stamp_does_not_skip_the_check() {
        let guard = dir("verify-copy");
        let d = guard.path();
        let (a, b) = (d.join("a"), d.join("b"));
        std::fs::create_dir_all(&a).unwrap();
        let m = sample(&a);
        m.save(&a.join("manifest.toml")).unwrap();
        assert!(matches!(m.verify_checksums_cached(&a.join("manifest.toml")).unwrap(), Verification::Verified { .. }));
        // `cp -a`: the files, the stamp among them, with their mtimes
        let status = std::process::Command::new("cp").arg("-a").arg(&a).arg(&b).status().unwrap();
        assert!(status.success());
        assert!(b.join(".manifest.toml.verified.json").exists());
        let mb = Manifest::load(&b.join("manifest.toml")).unwrap();
        assert!(matches!(mb.verify_checksums_cached(&b.join("manifest.toml")).unwrap(), Verification::Verified { .. }));
        assert_eq!(mb.verify_checksums_cached(&b.join("manifest.toml")).unwrap(), Verification::Cached);
    }

    #[test]
    fn unknown_keys_are_refused() {
        let guard = dir("unknown");
        let d = guard.path();
        let p = d.join("manifest.toml");
        sample(d).save(&p).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        // an optional key misspelled (its default would apply silently), an extra key in a table
        // and at the top
        for (from, to, key) in [
            ("tie_word_embeddings =", "tie_word_embedding =", "model.tie_word_embedding"),
            ("[sparsity]\n", "[sparsity]\ndefault_dense_fom = 25\n", "sparsity.default_dense_fom"),
            ("format_version = 1", "format_version = 1\nextra = 2", "extra"),
        ] {
            assert!(text.contains(from), "{from}");
            std::fs::write(&p, text.replacen(from, to, 1)).unwrap();
            let e = Manifest::load(&p).unwrap_err().to_string();
            assert!(e.contains("unknown key") && e.contains(key) && e.contains("manifest.toml"), "{e}");
        }
    }
}
