//! `scorer/reuse.json`, written by prep's reuse stage: per strategy (scorer, sketch, layers), the
//! share of each token's needed rows that a layer's slots already hold (reuse), simulated on
//! calibration text (`runtime::reuse`) for a grid of set shares (rows needed per token, over
//! n_ff) and slot shares (rows held, over n_ff). `runtime plan` reads it instead of assuming the
//! needed sets are independent of what is held (Budgeting Bytes: the bytes a token reads are a
//! property of the model and text, measured once offline).

use crate::error::{FormatError, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

pub const REUSE_TABLE_FORMAT: &str = "reuse-table-2";

/// The table's role in `manifest.toml`.
pub const ARTIFACT_ROLE: &str = "reuse";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ReuseTable {
    pub format: String,
    pub n_ff: usize,
    /// The sparse layers simulated: `first_layer..n_layers`.
    pub first_layer: usize,
    pub n_layers: usize,
    /// Tokens counted per layer (after `warmup_tokens` per sequence that fill the slots).
    pub tokens: usize,
    pub warmup_tokens: usize,
    /// Where the tokens came from (the recipe's calibration corpus).
    pub text: String,
    /// Ascending, in (0, 1].
    pub set_shares: Vec<f64>,
    /// Ascending, in (0, 1]; a slot share below a set share holds as many rows as the set.
    pub slot_shares: Vec<f64>,
    /// The scorer's resident bonus in the simulation (a held row counts this many times its
    /// score; tables from before it was recorded simulated 1).
    #[serde(default = "bonus_one")]
    pub scorer_resident_bonus: f64,
    /// Per strategy (its rule: scorer, sketch, layers), `[set_shares.len()][slot_shares.len()]`,
    /// each in [0, 1].
    pub rules: BTreeMap<String, Vec<Vec<f64>>>,
}

fn bonus_one() -> f64 {
    1.0
}

impl ReuseTable {
    /// Reads and checks a table: one error naming the file and what is wrong.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| FormatError::io(path, e))?;
        let t: ReuseTable =
            serde_json::from_str(&text).map_err(|source| FormatError::Json { path: path.to_path_buf(), source })?;
        t.check().map_err(|what| FormatError::invalid(path, what))?;
        Ok(t)
    }

    /// The table of the preparation at `manifest_path`, loaded and checked; None when its
    /// manifest lists none (a preparation made before the reuse stage).
    pub fn of_manifest(manifest_path: &Path, m: &crate::manifest::Manifest) -> Result<Option<Self>> {
        m.artifacts
            .iter()
            .find(|a| a.role == ARTIFACT_ROLE)
            .map(|a| Self::load(&m.artifact_path(manifest_path, a)))
            .transpose()
    }

    pub fn check(&self) -> std::result::Result<(), String> {
        if self.format != REUSE_TABLE_FORMAT {
            return Err(format!("format '{}', expected '{REUSE_TABLE_FORMAT}'", self.format));
        }
        for (name, axis) in [("set_shares", &self.set_shares), ("slot_shares", &self.slot_shares)] {
            if axis.is_empty()
                || axis.iter().any(|s| !(s.is_finite() && *s > 0.0 && *s <= 1.0))
                || axis.windows(2).any(|w| w[0] >= w[1])
            {
                return Err(format!("{name} must be ascending shares in (0, 1], got {axis:?}"));
            }
        }
        if !(self.scorer_resident_bonus.is_finite() && self.scorer_resident_bonus >= 1.0) {
            return Err(format!("scorer_resident_bonus is {}: expected a factor >= 1", self.scorer_resident_bonus));
        }
        if self.rules.is_empty() {
            return Err("no strategy simulated (rules is empty)".into());
        }
        for (rule, reuse) in &self.rules {
            if reuse.len() != self.set_shares.len() || reuse.iter().any(|r| r.len() != self.slot_shares.len()) {
                return Err(format!(
                    "{rule}: reuse must be {} rows of {} values (set shares x slot shares)",
                    self.set_shares.len(),
                    self.slot_shares.len()
                ));
            }
            if let Some((i, j)) = reuse
                .iter()
                .enumerate()
                .find_map(|(i, r)| r.iter().position(|v| !(v.is_finite() && (0.0..=1.0).contains(v))).map(|j| (i, j)))
            {
                return Err(format!("{rule}: reuse[{i}][{j}] = {} is not a share in [0, 1]", reuse[i][j]));
            }
        }
        if self.tokens == 0 || self.n_ff == 0 || self.first_layer >= self.n_layers {
            return Err(format!(
                "tokens {}, n_ff {}, layers {}..{}: nothing simulated",
                self.tokens, self.n_ff, self.first_layer, self.n_layers
            ));
        }
        Ok(())
    }

    /// The reuse of `rule`'s strategy at a set share and a slot share, interpolated bilinearly
    /// between the grid's points (clamped to its edges; a slot share below the set share is the
    /// set share); None when the table has no such strategy.
    pub fn at(&self, rule: &str, set_share: f64, slot_share: f64) -> Option<f64> {
        let reuse = self.rules.get(rule)?;
        let slot_share = slot_share.max(set_share);
        let (i0, i1, ti) = bracket(&self.set_shares, set_share);
        let (j0, j1, tj) = bracket(&self.slot_shares, slot_share);
        let r = |i: usize, j: usize| reuse[i][j];
        let lo = r(i0, j0) * (1.0 - tj) + r(i0, j1) * tj;
        let hi = r(i1, j0) * (1.0 - tj) + r(i1, j1) * tj;
        Some(lo * (1.0 - ti) + hi * ti)
    }
}

/// The grid points around `x` and its position between them (clamped to the ends).
fn bracket(axis: &[f64], x: f64) -> (usize, usize, f64) {
    let last = axis.len() - 1;
    if x <= axis[0] {
        return (0, 0, 0.0);
    }
    if x >= axis[last] {
        return (last, last, 0.0);
    }
    let j = axis.iter().position(|&a| a > x).unwrap_or(last);
    (j - 1, j, (x - axis[j - 1]) / (axis[j] - axis[j - 1]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> ReuseTable {
        ReuseTable {
            format: REUSE_TABLE_FORMAT.into(),
            n_ff: 100,
            first_layer: 1,
            n_layers: 4,
            tokens: 10,
            warmup_tokens: 2,
            text: "t".into(),
            set_shares: vec![0.1, 0.2],
            slot_shares: vec![0.2, 0.4, 1.0],
            scorer_resident_bonus: 1.5,
            rules: BTreeMap::from([("scorer".to_string(), vec![vec![0.5, 0.7, 1.0], vec![0.3, 0.6, 1.0]])]),
        }
    }

    #[test]
    fn interpolates_between_and_clamps_outside_the_grid() {
        let t = table();
        let at = |a, b| t.at("scorer", a, b).unwrap();
        assert!((at(0.1, 0.4) - 0.7).abs() < 1e-12);
        assert!((at(0.15, 0.3) - (0.6 + 0.45) / 2.0).abs() < 1e-12);
        assert!((at(0.05, 0.1) - 0.5).abs() < 1e-12, "below both grids: the corner");
        assert!((at(0.2, 0.1) - 0.3).abs() < 1e-12, "slots below the set hold the set");
        assert!((at(0.5, 2.0) - 1.0).abs() < 1e-12);
        assert_eq!(t.at("unknown", 0.1, 0.4), None);
    }

    #[test]
    fn bad_tables_are_refused_with_what_is_wrong() {
        let mut t = table();
        t.rules.get_mut("scorer").unwrap()[1][2] = f64::NAN;
        assert!(t.check().unwrap_err().contains("scorer: reuse[1][2]"));
        let mut t = table();
        t.slot_shares = vec![0.4, 0.2, 1.0];
        assert!(t.check().unwrap_err().contains("slot_shares"));
        let mut t = table();
        t.rules.get_mut("scorer").unwrap().pop();
        assert!(t.check().unwrap_err().contains("2 rows of 3"));
        let mut t = table();
        t.rules.clear();
        assert!(t.check().unwrap_err().contains("no strategy"));
        let mut t = table();
        t.scorer_resident_bonus = 0.5;
        assert!(t.check().unwrap_err().contains("scorer_resident_bonus is 0.5"));
        let dir = std::env::temp_dir().join(format!("reuse-table-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("reuse.json");
        std::fs::write(&p, serde_json::to_string(&table()).unwrap().replace("0.7", "1.7")).unwrap();
        let e = ReuseTable::load(&p).unwrap_err().to_string();
        assert!(e.contains("reuse.json") && e.contains("scorer: reuse[0][1] = 1.7"), "{e}");
        // a table written before the bonus was recorded simulated 1
        let mut v = serde_json::to_value(table()).unwrap();
        v.as_object_mut().unwrap().remove("scorer_resident_bonus");
        std::fs::write(&p, v.to_string()).unwrap();
        assert_eq!(ReuseTable::load(&p).unwrap().scorer_resident_bonus, 1.0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
