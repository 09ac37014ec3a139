//! The windowed storage roofline of Budgeting Bytes (arXiv 2609.04238, Theorem 1).
//!
//! A token's forward pass is a compute timeline; every transfer from storage has a release time
//! (when its address becomes known: A0 at the previous token's sampling, A1 after an early
//! layer, A2 inside its own layer) and a deadline (when compute uses it), both on the timeline
//! as it would run without stalls, and a service time on the one I/O machine (its requests over
//! the device's rate at that size and queue depth). The I/O machine serves transfers
//! preemptively. All I/O is hidden exactly when, for every window [s, e], the transfers released
//! at or after s and due by e need at most e - s of service; otherwise the exposed latency is the
//! largest such deficit, and earliest-deadline-first attains it: no schedule stalls compute less.
//! (Only windows from a release time to a deadline need checking.)

/// One transfer: `release_s` and `deadline_s` on the stall-free compute timeline, `service_s`
/// of I/O-machine time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Transfer {
    pub release_s: f64,
    pub deadline_s: f64,
    pub service_s: f64,
}

/// The exposed I/O time of `transfers`: the largest window deficit (0 when all is hidden).
/// O(n^2) over release x deadline pairs after sorting; n is a few per layer.
pub fn exposed_s(transfers: &[Transfer]) -> f64 {
    let mut releases: Vec<f64> = transfers.iter().map(|t| t.release_s).collect();
    releases.sort_by(f64::total_cmp);
    releases.dedup();
    let mut by_deadline: Vec<&Transfer> = transfers.iter().collect();
    by_deadline.sort_by(|a, b| a.deadline_s.total_cmp(&b.deadline_s));
    let mut worst = 0f64;
    for &s in &releases {
        // the transfers inside [s, e] for growing e: released at or after s, in deadline order
        let mut need = 0f64;
        for t in by_deadline.iter().filter(|t| t.release_s >= s) {
            need += t.service_s;
            worst = worst.max(need - (t.deadline_s - s));
        }
    }
    worst
}

/// Earliest-deadline-first on one preemptive I/O machine: the largest lateness of any transfer
/// (its finish minus its deadline, at least 0), and the order transfers finish in. Equal to
/// [`exposed_s`] (Theorem 1); the tests check both on hand-computed cases.
pub fn edf(transfers: &[Transfer]) -> (f64, Vec<usize>) {
    let n = transfers.len();
    let mut left: Vec<f64> = transfers.iter().map(|t| t.service_s).collect();
    let mut done = vec![false; n];
    let mut order = Vec::with_capacity(n);
    let mut now = transfers.iter().map(|t| t.release_s).fold(f64::INFINITY, f64::min);
    let mut lateness = 0f64;
    while order.len() < n {
        // the released, unfinished transfer due first; if none, jump to the next release
        let ready = (0..n)
            .filter(|&j| !done[j] && transfers[j].release_s <= now)
            .min_by(|&a, &b| transfers[a].deadline_s.total_cmp(&transfers[b].deadline_s));
        let next_release = (0..n)
            .filter(|&j| !done[j] && transfers[j].release_s > now)
            .map(|j| transfers[j].release_s)
            .fold(f64::INFINITY, f64::min);
        let Some(j) = ready else {
            now = next_release;
            continue;
        };
        // run j until it finishes or a release may preempt it
        let run = left[j].min(next_release - now);
        now += run;
        left[j] -= run;
        if left[j] <= 1e-15 {
            done[j] = true;
            order.push(j);
            lateness = lateness.max(now - transfers[j].deadline_s);
        }
    }
    (lateness, order)
}

/// The exposed I/O when releases and deadlines move with the compute stalls before them: a
/// transfer whose address is known only inside its own layer (A2) is released by the compute it
/// then holds up, so each layer's deficit adds to the next layer's timeline (Budgeting Bytes:
/// "A2 bytes remain exposed"). Transfers are served in release order (deadline order among
/// equal releases: EDF where all are released together, as A1 sets after layer 0, where this
/// equals [`exposed_s`]).
pub fn exposed_with_stalls_s(transfers: &[Transfer]) -> f64 {
    let mut order: Vec<&Transfer> = transfers.iter().collect();
    order.sort_by(|a, b| a.release_s.total_cmp(&b.release_s).then(a.deadline_s.total_cmp(&b.deadline_s)));
    // (nominal deadline, the stall it caused): a later release moves by the stalls due before it
    let mut stalls: Vec<(f64, f64)> = Vec::new();
    let mut io_free = f64::NEG_INFINITY;
    let mut shift = 0f64;
    for t in order {
        let before: f64 = stalls.iter().filter(|(d, _)| *d <= t.release_s).map(|(_, s)| s).sum();
        let finish = (t.release_s + before).max(io_free) + t.service_s;
        io_free = finish;
        let late = finish - (t.deadline_s + shift);
        if late > 0.0 {
            shift += late;
            stalls.push((t.deadline_s, late));
        }
    }
    shift
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(release_s: f64, deadline_s: f64, service_s: f64) -> Transfer {
        Transfer { release_s, deadline_s, service_s }
    }

    #[test]
    fn hidden_when_every_window_has_room() {
        // two layers of 1 s compute; each layer's rows released a layer early (A1-like)
        let ts = [t(0.0, 1.0, 0.9), t(1.0, 2.0, 0.9)];
        assert_eq!(exposed_s(&ts), 0.0);
        assert_eq!(edf(&ts).0, 0.0);
    }

    #[test]
    fn exposed_is_the_largest_window_deficit() {
        // released at its own use (A2): nothing can hide, all of it is exposed in sequence
        let ts = [t(1.0, 1.0, 0.3), t(2.0, 2.0, 0.5)];
        assert!((exposed_s(&ts) - 0.5).abs() < 1e-12);
        assert!((edf(&ts).0 - 0.5).abs() < 1e-12);
        // window [0, 2] holds 2.6 s of service: deficit 0.6; window [1, 2] holds 1.2: deficit 0.2
        let ts = [t(0.0, 1.0, 1.4), t(1.0, 2.0, 1.2)];
        assert!((exposed_s(&ts) - 0.6).abs() < 1e-12, "{}", exposed_s(&ts));
        assert!((edf(&ts).0 - 0.6).abs() < 1e-12, "{:?}", edf(&ts));
    }

    #[test]
    fn edf_serves_the_earliest_deadline_first_and_preempts() {
        // a long transfer due late is preempted by a short one released later and due sooner
        let ts = [t(0.0, 10.0, 4.0), t(1.0, 2.0, 1.0)];
        let (late, order) = edf(&ts);
        assert_eq!(order, vec![1, 0]);
        assert_eq!(late, 0.0);
        assert_eq!(exposed_s(&ts), 0.0);
        // first-come-first-served would finish the short one at 5 (3 late): EDF's 0 is optimal
    }

    #[test]
    fn stalls_add_up_when_reads_are_released_by_their_own_layer() {
        // three layers of 1 s; each layer's rows known at its middle, needed 0.2 s later, 0.5 s
        // to read: 0.3 s exposed per layer, 0.9 s in all (the largest window deficit is 0.3)
        let ts: Vec<Transfer> = (0..3).map(|l| t(l as f64 + 0.5, l as f64 + 0.7, 0.5)).collect();
        assert!((exposed_with_stalls_s(&ts) - 0.9).abs() < 1e-12, "{}", exposed_with_stalls_s(&ts));
        assert!((exposed_s(&ts) - 0.3).abs() < 1e-12);
        // all released together (A1): the same as the window deficit
        let ts = [t(1.0, 2.0, 0.8), t(1.0, 3.0, 0.8), t(1.0, 3.2, 0.9)];
        assert!(
            (exposed_with_stalls_s(&ts) - exposed_s(&ts)).abs() < 1e-12,
            "{} vs {}",
            exposed_with_stalls_s(&ts),
            exposed_s(&ts)
        );
        // hidden when every read fits its window
        let ts: Vec<Transfer> = (0..3).map(|l| t(l as f64 + 0.5, l as f64 + 0.7, 0.1)).collect();
        assert_eq!(exposed_with_stalls_s(&ts), 0.0);
    }

    #[test]
    fn edf_attains_the_deficit_on_random_cases() {
        let mut s = 0x9e3779b97f4a7c15u64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 53) as f64
        };
        for _ in 0..200 {
            let ts: Vec<Transfer> = (0..6)
                .map(|_| {
                    let r = (next() * 8.0).floor();
                    t(r, r + (next() * 4.0).floor(), 0.25 + (next() * 8.0).floor() / 4.0)
                })
                .collect();
            let (a, b) = (exposed_s(&ts), edf(&ts).0);
            assert!((a - b).abs() < 1e-9, "{ts:?}: window deficit {a}, EDF lateness {b}");
            // with one common release, moving with stalls changes nothing
            let common: Vec<Transfer> = ts.iter().map(|x| t(0.0, x.deadline_s, x.service_s)).collect();
            assert!((exposed_with_stalls_s(&common) - exposed_s(&common)).abs() < 1e-9, "{common:?}");
        }
    }
}
