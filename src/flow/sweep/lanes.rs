//! Which owed delivery a sweep pass starts next: the first in the pass's order whose
//! receiver has room. Each receiver (a Discord webhook, the callback receiver) is a lane
//! with a few sends in flight at most, and the pass has a few more in all, so a hung
//! receiver holds its own lane's slots and never another's. Pure: the pass feeds it what
//! started and what ended.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

/// Deliveries in flight at once, all lanes together. Each holds one job in memory, so this
/// (with the cap on a stored result) is what bounds a pass's memory.
pub(super) const IN_FLIGHT: usize = 8;
/// Deliveries in flight to one receiver: a hung one holds this many slots, no more. (A
/// fast receiver's rate limit is its own: Discord's 429s are waited out by the client.)
pub(super) const PER_LANE: usize = 2;

/// The deliveries of one pass, in its order, split by lane; more may be added as the pass
/// lists them.
pub(super) struct Lanes<L> {
    /// Each lane's deliveries not yet started, as indices into the pass's order.
    waiting: HashMap<L, VecDeque<usize>>,
    in_lane: HashMap<L, usize>,
    in_flight: usize,
    started: Vec<bool>,
    lane_of: Vec<L>,
}

impl<L: Clone + Eq + Hash> Lanes<L> {
    pub(super) fn new() -> Self {
        Self {
            waiting: HashMap::new(),
            in_lane: HashMap::new(),
            in_flight: 0,
            started: Vec::new(),
            lane_of: Vec::new(),
        }
    }

    /// The pass's next delivery goes to `lane`.
    pub(super) fn push(&mut self, lane: L) {
        let i = self.lane_of.len();
        self.waiting.entry(lane.clone()).or_default().push_back(i);
        self.lane_of.push(lane);
        self.started.push(false);
    }

    /// Whether the pass has a slot free (though every waiting delivery's lane may be full).
    pub(super) fn has_room(&self) -> bool {
        self.in_flight < IN_FLIGHT
    }

    /// The delivery to start now, marked started: the earliest waiting one whose lane has
    /// room, if the pass has room.
    pub(super) fn start_next(&mut self) -> Option<usize> {
        if self.in_flight >= IN_FLIGHT {
            return None;
        }
        let (lane, &i) = self
            .waiting
            .iter()
            .filter(|(lane, _)| self.in_lane.get(*lane).copied().unwrap_or(0) < PER_LANE)
            .filter_map(|(lane, queue)| queue.front().map(|i| (lane, i)))
            .min_by_key(|(_, i)| **i)?;
        let lane = lane.clone();
        self.waiting.get_mut(&lane).and_then(VecDeque::pop_front);
        *self.in_lane.entry(lane).or_default() += 1;
        self.in_flight += 1;
        self.started[i] = true;
        Some(i)
    }

    /// Delivery `i` has ended: its slot is free.
    pub(super) fn finish(&mut self, i: usize) {
        if let Some(n) = self.in_lane.get_mut(&self.lane_of[i]) {
            *n = n.saturating_sub(1);
        }
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    pub(super) fn is_started(&self, i: usize) -> bool {
        self.started.get(i).copied().unwrap_or(false)
    }

    /// Every delivery not started, in the pass's order.
    pub(super) fn not_started(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.started.len()).filter(|i| !self.started[*i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Starts what can start; the indices started.
    fn fill(lanes: &mut Lanes<&'static str>) -> Vec<usize> {
        std::iter::from_fn(|| lanes.start_next()).collect()
    }

    fn lanes<L: Clone + Eq + Hash>(order: Vec<L>) -> Lanes<L> {
        let mut lanes = Lanes::new();
        order.into_iter().for_each(|l| lanes.push(l));
        lanes
    }

    #[test]
    fn deliveries_start_in_order_with_each_lane_bounded() {
        let mut lanes = lanes(vec!["a", "a", "a", "b", "a", "c"]);
        assert_eq!(
            fill(&mut lanes),
            vec![0, 1, 3, 5],
            "a holds two, b and c one each"
        );
        assert_eq!(lanes.not_started().next(), Some(2));
        lanes.finish(3);
        assert_eq!(
            fill(&mut lanes),
            Vec::<usize>::new(),
            "only a waits, and it is full"
        );
        lanes.finish(0);
        assert_eq!(fill(&mut lanes), vec![2]);
        lanes.finish(1);
        assert_eq!(fill(&mut lanes), vec![4]);
        assert_eq!(lanes.not_started().next(), None);
        assert!(lanes.has_room());
        lanes.push("a");
        assert_eq!(fill(&mut lanes), Vec::<usize>::new(), "a is full");
        lanes.finish(2);
        assert_eq!(fill(&mut lanes), vec![6], "added as the pass lists more");
    }

    #[test]
    fn a_hung_lane_holds_its_own_slots_and_no_others() {
        // Lane "hung" never finishes; every other lane's delivery ends at once.
        let order: Vec<&str> = (0..40)
            .map(|i| if i % 2 == 0 { "hung" } else { "ok" })
            .collect();
        let mut lanes = lanes(order);
        let mut done = Vec::new();
        loop {
            let started = fill(&mut lanes);
            let ok: Vec<usize> = started.into_iter().filter(|i| i % 2 == 1).collect();
            if ok.is_empty() {
                break;
            }
            for i in ok {
                lanes.finish(i);
                done.push(i);
            }
        }
        assert_eq!(
            done.len(),
            20,
            "every delivery of the healthy lane went out"
        );
        assert_eq!(lanes.not_started().next(), Some(4), "the hung lane's third");
    }

    #[test]
    fn the_pass_bounds_deliveries_in_flight_across_lanes() {
        let order: Vec<String> = (0..3 * IN_FLIGHT).map(|i| format!("lane{i}")).collect();
        let mut lanes = lanes(order);
        let started: Vec<usize> = std::iter::from_fn(|| lanes.start_next()).collect();
        assert_eq!(started, (0..IN_FLIGHT).collect::<Vec<_>>());
        assert!(!lanes.has_room());
        lanes.finish(3);
        assert_eq!(lanes.start_next(), Some(IN_FLIGHT));
        assert_eq!(lanes.start_next(), None);
    }
}
