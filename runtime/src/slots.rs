//! `SlotMap`: which neuron rows of one sparse layer are resident, in which slot of the layer's
//! buffer, and when each was last used. Planning a token's active set gives the `Load`s (the
//! delta): missing rows, each with the slot it goes to, taken from free slots first and then
//! from the least recently used rows not in the set, or the coolest (the map's heat, which the
//! layer's chooser keeps: `select::LayerChooser`).

pub const EMPTY: u32 = u32::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Load {
    pub neuron: u32,
    pub slot: u32,
}

pub struct SlotMap {
    /// `[n_ff]` slot of each neuron, or EMPTY.
    pub slot_of: Vec<u32>,
    /// `[capacity]` neuron in each slot, or EMPTY.
    pub neuron_of: Vec<u32>,
    /// `[capacity]` tick of the last token that used the slot.
    last_used: Vec<u64>,
    /// `[n_ff]` what [`SlotMap::plan_by_heat`] evicts by: the coolest held row goes first. A
    /// moving average the layer's chooser updates token by token (of every neuron's score, or
    /// of each summed row's coefficient); it outlives [`SlotMap::empty`].
    pub heat: Vec<f32>,
}

impl SlotMap {
    pub fn new(n_ff: usize, capacity: usize) -> Self {
        SlotMap {
            slot_of: vec![EMPTY; n_ff],
            neuron_of: vec![EMPTY; capacity],
            last_used: vec![0; capacity],
            heat: vec![0.0; n_ff],
        }
    }

    /// Every slot emptied; the heat stays (a prompt's batches empty the slots mid-sequence).
    pub fn empty(&mut self) {
        self.slot_of.fill(EMPTY);
        self.neuron_of.fill(EMPTY);
        self.last_used.fill(0);
    }

    pub fn capacity(&self) -> usize {
        self.neuron_of.len()
    }

    /// Marks `active` (distinct neurons) as used at `tick` (> every earlier tick) and returns the
    /// rows to load, sorted by neuron. Panics if `active` exceeds the capacity (the engine sizes
    /// every buffer to at least K_max).
    pub fn plan(&mut self, active: &[u32], tick: u64) -> Vec<Load> {
        // victims: empty slots first, then the least recently used rows not used this tick
        self.plan_evicting(active, tick, |m, victims, _| {
            victims.sort_unstable_by_key(|&s| (m.neuron_of[s as usize] != EMPTY, m.last_used[s as usize]));
        })
    }

    /// [`SlotMap::plan`], but the rows evicted first are those of lowest [`SlotMap::heat`]
    /// (not the least recently used): a row that often scores high stays through the tokens it
    /// is not needed.
    pub fn plan_by_heat(&mut self, active: &[u32], tick: u64) -> Vec<Load> {
        self.plan_evicting(active, tick, |m, victims, n| {
            let key = |s: u32| match m.neuron_of[s as usize] {
                EMPTY => f32::NEG_INFINITY,
                j => m.heat[j as usize],
            };
            if victims.len() > n {
                victims.select_nth_unstable_by(n - 1, |&a, &b| key(a).total_cmp(&key(b)).then(a.cmp(&b)));
                victims.truncate(n);
            }
            victims.sort_unstable_by(|&a, &b| key(a).total_cmp(&key(b)).then(a.cmp(&b)));
        })
    }

    /// The planning both policies share: `order` puts the candidate victim slots (empty, or not
    /// used at `tick`) in eviction order; its third argument is how many are needed.
    fn plan_evicting(
        &mut self,
        active: &[u32],
        tick: u64,
        order: impl FnOnce(&Self, &mut Vec<u32>, usize),
    ) -> Vec<Load> {
        assert!(active.len() <= self.capacity(), "active set {} > buffer {}", active.len(), self.capacity());
        let mut missing = Vec::new();
        for &j in active {
            match self.slot_of[j as usize] {
                EMPTY => missing.push(j),
                s => self.last_used[s as usize] = tick,
            }
        }
        if missing.is_empty() {
            return vec![];
        }
        let mut victims: Vec<u32> = (0..self.capacity() as u32)
            .filter(|&s| self.last_used[s as usize] < tick || self.neuron_of[s as usize] == EMPTY)
            .collect();
        order(self, &mut victims, missing.len());
        let mut loads = Vec::with_capacity(missing.len());
        for (&j, &s) in missing.iter().zip(&victims) {
            let old = self.neuron_of[s as usize];
            if old != EMPTY {
                self.slot_of[old as usize] = EMPTY;
            }
            self.neuron_of[s as usize] = j;
            self.slot_of[j as usize] = s;
            self.last_used[s as usize] = tick;
            loads.push(Load { neuron: j, slot: s });
        }
        loads.sort_unstable();
        loads
    }

    /// The slots holding a row that is not being loaded now (`loading`), ascending: every row a
    /// layer can add up while its missing ones are read.
    pub fn held_slots(&self, loading: &[Load]) -> Vec<u32> {
        let busy = self.loading_mask(loading);
        (0..self.capacity() as u32).filter(|&s| self.neuron_of[s as usize] != EMPTY && !busy[s as usize]).collect()
    }

    /// The slots of `neurons` (each held) whose row is not being loaded now, in `neurons`' order.
    pub fn held_slots_of(&self, neurons: &[u32], loading: &[Load]) -> Vec<u32> {
        let busy = self.loading_mask(loading);
        neurons.iter().map(|&j| self.slot_of[j as usize]).filter(|&s| !busy[s as usize]).collect()
    }

    fn loading_mask(&self, loading: &[Load]) -> Vec<bool> {
        let mut busy = vec![false; self.capacity()];
        loading.iter().for_each(|l| busy[l.slot as usize] = true);
        busy
    }

    /// Forgets a slot's row (its load failed).
    pub fn invalidate(&mut self, slot: u32) {
        let old = self.neuron_of[slot as usize];
        if old != EMPTY {
            self.slot_of[old as usize] = EMPTY;
        }
        self.neuron_of[slot as usize] = EMPTY;
        self.last_used[slot as usize] = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas_and_lru_eviction() {
        let mut m = SlotMap::new(10, 4);
        let l1 = m.plan(&[1, 2, 3], 1);
        assert_eq!(l1.iter().map(|l| l.neuron).collect::<Vec<_>>(), [1, 2, 3]);
        // 2 and 3 resident; 4 takes the free slot
        let l2 = m.plan(&[2, 3, 4], 2);
        assert_eq!(l2.iter().map(|l| l.neuron).collect::<Vec<_>>(), [4]);
        // 5 evicts 1 (last used at tick 1), not 2/3/4
        let l3 = m.plan(&[5, 2], 3);
        assert_eq!(l3.len(), 1);
        assert_eq!(m.slot_of[1], EMPTY);
        assert_eq!(m.neuron_of[l3[0].slot as usize], 5);
        // nothing new: no loads
        assert!(m.plan(&[5, 2], 4).is_empty());
        // every resident neuron is in exactly the slot the map says
        for (s, &n) in m.neuron_of.iter().enumerate() {
            if n != EMPTY {
                assert_eq!(m.slot_of[n as usize], s as u32);
            }
        }
    }

    #[test]
    fn held_slots_leave_out_the_rows_being_loaded() {
        let mut m = SlotMap::new(10, 4);
        m.plan(&[1, 2, 3], 1);
        let loads = m.plan(&[2, 3, 7], 2); // 7 goes to the free slot
        assert_eq!(loads.len(), 1);
        let (s1, s2, s3, s7) = (m.slot_of[1], m.slot_of[2], m.slot_of[3], m.slot_of[7]);
        let mut want = vec![s1, s2, s3];
        want.sort_unstable();
        assert_eq!(m.held_slots(&loads), want, "every held row but 7's, ascending");
        assert!(!m.held_slots(&loads).contains(&s7));
        assert_eq!(m.held_slots_of(&[3, 7, 2], &loads), vec![s3, s2], "the set's held rows, in its order");
    }

    #[test]
    fn heat_evicts_the_coolest_row_not_the_oldest() {
        let mut m = SlotMap::new(10, 3);
        m.heat = vec![0.0, 5.0, 1.0, 3.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        assert_eq!(m.plan_by_heat(&[1, 2, 3], 1).len(), 3);
        // 1 is the oldest but the hottest: 2 (coolest, not needed now) goes
        let l = m.plan_by_heat(&[3, 4], 2);
        assert_eq!(l.len(), 1);
        assert_eq!(m.slot_of[2], EMPTY);
        assert!(m.slot_of[1] != EMPTY && m.slot_of[4] != EMPTY);
        // a needed row is never evicted, however cool
        let l = m.plan_by_heat(&[4, 5], 3);
        assert_eq!(l.len(), 1);
        assert!(m.slot_of[4] != EMPTY && m.slot_of[5] != EMPTY && m.slot_of[1] != EMPTY && m.slot_of[3] == EMPTY);
    }
}
