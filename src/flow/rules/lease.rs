//! A queue's fair-share lease as the store keeps it: until when it is held, and the releases
//! asked of it while it was. A caller that finds it held does not wait or give up: it marks
//! the lease asked, with what it knows that the queue's index may not show yet (a job just
//! ended, a job just submitted), and the holder releases again before it lets go. A holder
//! that dies leaves the marks for whoever takes the lease next.

use serde::{Deserialize, Serialize};

use crate::jobs::RunId;
use crate::time::Millis;

/// Jobs one lease remembers at most of each kind (askers past them still mark it asked: the
/// holder's next read of the index shows them soon enough).
const MAX_NOTED: usize = 32;

/// What the releases asked while the lease was held knew.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Asked {
    /// Jobs that ended: no longer in flight, whatever the index shows.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) ended: Vec<RunId>,
    /// Jobs just submitted: waiting, though the index may not show them yet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) new: Vec<RunId>,
}

impl Asked {
    fn add(&mut self, other: &Asked) {
        for (mine, theirs) in [(&mut self.ended, &other.ended), (&mut self.new, &other.new)] {
            for id in theirs {
                if mine.len() < MAX_NOTED && !mine.contains(id) {
                    mine.push(id.clone());
                }
            }
        }
    }
}

/// The lease entry's value.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Lease {
    /// Held until then (`None`: free).
    pub(crate) until: Option<Millis>,
    /// Releases were asked while it was held (the holder owes another).
    #[serde(default)]
    pub(crate) asked: bool,
    #[serde(default)]
    pub(crate) knew: Asked,
}

/// What a caller does with the lease as it finds it at `now`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Move {
    /// Take it, until the time given, with the asks it holds (a holder that died left them).
    Take(Lease, Asked),
    /// Mark it asked: its holder releases again.
    Ask(Lease),
}

impl Lease {
    /// The stored value: this version's JSON, or an earlier release's plain "held until".
    pub(crate) fn parse(value: Option<&str>) -> Self {
        let Some(text) = value else {
            return Self::default();
        };
        serde_json::from_str(text).unwrap_or_else(|_| Self {
            until: text.parse().ok(),
            ..Self::default()
        })
    }

    pub(crate) fn held_at(&self, now: Millis) -> bool {
        self.until.is_some_and(|t| t > now)
    }

    /// What a caller who knew `knew` does at `now`, and the value it writes.
    pub(crate) fn arrive(&self, knew: &Asked, now: Millis, hold_ms: Millis) -> Move {
        if self.held_at(now) {
            let mut marked = self.clone();
            marked.asked = true;
            marked.knew.add(knew);
            return Move::Ask(marked);
        }
        let left = if self.asked {
            self.knew.clone()
        } else {
            Asked::default()
        };
        let taken = Self {
            until: Some(now + hold_ms),
            ..Self::default()
        };
        Move::Take(taken, left)
    }

    /// What the holder of the lease held until `mine` does when letting go at `now`: `Ok`
    /// with the value to write (free; with the asks kept when `last`, for the next holder),
    /// or `Err` with the value that holds it again and the asks to release for.
    /// `None` when the lease is no longer this holder's (it expired and another took it).
    pub(crate) fn leave(
        &self,
        mine: Millis,
        (now, hold_ms): (Millis, Millis),
        last: bool,
    ) -> Option<Result<Lease, (Lease, Asked)>> {
        if self.until != Some(mine) {
            return None;
        }
        if !self.asked {
            return Some(Ok(Self::default()));
        }
        if last {
            return Some(Ok(Self {
                until: None,
                ..self.clone()
            }));
        }
        let again = Self {
            until: Some(now + hold_ms),
            ..Self::default()
        };
        Some(Err((again, self.knew.clone())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> RunId {
        s.parse().unwrap()
    }

    fn ended(ids: &[&str]) -> Asked {
        Asked {
            ended: ids.iter().map(|s| id(s)).collect(),
            new: Vec::new(),
        }
    }

    #[test]
    fn a_caller_takes_a_free_lease_and_marks_a_held_one() {
        let free = Lease::default();
        let held = Lease {
            until: Some(5_000),
            ..Lease::default()
        };
        let left = Lease {
            until: None,
            asked: true,
            knew: ended(&["a"]),
        };
        let taken = |until| Lease {
            until: Some(until),
            ..Lease::default()
        };
        // (lease found, at, what the caller does)
        let cases = [
            (&free, 1_000, Move::Take(taken(6_000), Asked::default())),
            (&held, 6_000, Move::Take(taken(11_000), Asked::default())),
            (&left, 1_000, Move::Take(taken(6_000), ended(&["a"]))),
            (
                &held,
                1_000,
                Move::Ask(Lease {
                    until: Some(5_000),
                    asked: true,
                    knew: ended(&["b"]),
                }),
            ),
        ];
        for (lease, now, expected) in cases {
            assert_eq!(
                lease.arrive(&ended(&["b"]), now, 5_000),
                expected,
                "{lease:?} at {now}"
            );
        }
    }

    #[test]
    fn the_holder_releases_again_while_asked_and_leaves_the_asks_at_its_last_round() {
        let mine = Lease {
            until: Some(5_000),
            ..Lease::default()
        };
        let asked = Lease {
            until: Some(5_000),
            asked: true,
            knew: ended(&["a", "b"]),
        };
        let again = Lease {
            until: Some(7_000),
            ..Lease::default()
        };
        assert_eq!(
            mine.leave(5_000, (2_000, 5_000), false),
            Some(Ok(Lease::default()))
        );
        assert_eq!(
            asked.leave(5_000, (2_000, 5_000), false),
            Some(Err((again, ended(&["a", "b"]))))
        );
        let kept = asked.leave(5_000, (2_000, 5_000), true);
        assert_eq!(
            kept,
            Some(Ok(Lease {
                until: None,
                ..asked.clone()
            })),
            "the last round frees it with the asks for the next holder"
        );
        assert_eq!(asked.leave(4_000, (2_000, 5_000), false), None, "another's");
    }

    #[test]
    fn an_earlier_release_s_value_and_many_asks_read_as_they_should() {
        assert_eq!(Lease::parse(Some("5000")).until, Some(5_000));
        assert_eq!(Lease::parse(None), Lease::default());
        let mut l = Lease {
            until: Some(9_000),
            ..Lease::default()
        };
        for i in 0..40 {
            if let Move::Ask(next) = l.arrive(&ended(&[&format!("r{i}")]), 0, 5_000) {
                l = next;
            }
        }
        assert_eq!(l.knew.ended.len(), MAX_NOTED);
        assert!(l.asked);
        let back = Lease::parse(Some(&serde_json::to_string(&l).unwrap()));
        assert_eq!(back, l);
    }
}
