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
/// Deliveries in flight to one receiver: a hung one holds this many slots, no more. Two
/// keeps a Discord webhook well inside its rate limit (5 requests per 2 s).
pub(super) const PER_LANE: usize = 2;

/// The deliveries of one pass, in its order, split by lane.
pub(super) struct Lanes<L> {
    /// Each lane's deliveries not yet started, as indices into the pass's order.
    waiting: HashMap<L, VecDeque<usize>>,
    in_lane: HashMap<L, usize>,
    in_flight: usize,
    started: Vec<bool>,
    lane_of: Vec<L>,
}

impl<L: Clone + Eq + Hash> Lanes<L> {
    /// `lanes[i]`: the lane of the pass's `i`th delivery.
    pub(super) fn new(lanes: Vec<L>) -> Self {
        let mut waiting: HashMap<L, VecDeque<usize>> = HashMap::new();
        for (i, lane) in lanes.iter().enumerate() {
            waiting.entry(lane.clone()).or_default().push_back(i);
        }
        Self {
            waiting,
            in_lane: HashMap::new(),
            in_flight: 0,
            started: vec![false; lanes.len()],
            lane_of: lanes,
        }
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

    /// The first delivery in the pass's order not started: where the next pass begins.
    pub(super) fn first_not_started(&self) -> Option<usize> {
        self.started.iter().position(|s| !s)
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

    #[test]
    fn deliveries_start_in_order_with_each_lane_bounded() {
        let mut lanes = Lanes::new(vec!["a", "a", "a", "b", "a", "c"]);
        assert_eq!(
            fill(&mut lanes),
            vec![0, 1, 3, 5],
            "a holds two, b and c one each"
        );
        assert_eq!(lanes.first_not_started(), Some(2));
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
        assert_eq!(lanes.first_not_started(), None);
    }

    #[test]
    fn a_hung_lane_holds_its_own_slots_and_no_others() {
        // Lane "hung" never finishes; every other lane's delivery ends at once.
        let order: Vec<&str> = (0..40)
            .map(|i| if i % 2 == 0 { "hung" } else { "ok" })
            .collect();
        let mut lanes = Lanes::new(order);
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
        assert_eq!(lanes.first_not_started(), Some(4), "the hung lane's third");
    }

    #[test]
    fn the_pass_bounds_deliveries_in_flight_across_lanes() {
        let order: Vec<String> = (0..3 * IN_FLIGHT).map(|i| format!("lane{i}")).collect();
        let mut lanes = Lanes::new(order);
        let started: Vec<usize> = std::iter::from_fn(|| lanes.start_next()).collect();
        assert_eq!(started, (0..IN_FLIGHT).collect::<Vec<_>>());
        lanes.finish(3);
        assert_eq!(lanes.start_next(), Some(IN_FLIGHT));
        assert_eq!(lanes.start_next(), None);
    }
}
