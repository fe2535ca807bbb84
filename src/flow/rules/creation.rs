//! When a build still to be created is due, and what a create call that did not answer
//! means for the next try.

use crate::jobs::{Creation, Job, JobState};
use crate::time::Millis;

/// How long a create call may be in flight: nobody else creates or looks up the build of a
/// run before this has passed (it exceeds every function's timeout).
pub(crate) const CREATE_HOLD_MS: Millis = 90_000;

/// After a create whose answer was lost, wait this long before looking the build up, so a
/// build Buildkite did create is visible to the lookup.
pub(crate) const LOOK_UP_AFTER_MS: Millis = 60_000;

/// Takes a deferred creation that is due, holding it for [`CREATE_HOLD_MS`]; returns the job
/// as written and the creation as it was (which says whether to look the build up first).
pub(crate) fn claim_creation(job: &Job, now: Millis) -> Option<(Job, Creation)> {
    let creation = job.creation.as_ref()?;
    // A job its user's limit holds back is fair share's to release first.
    if job.state != JobState::Submitted
        || job.build.is_some()
        || job.waiting
        || creation.after > now
    {
        return None;
    }
    let mut next = job.clone();
    next.creation.as_mut()?.after = now + CREATE_HOLD_MS;
    Some((next, creation.clone()))
}

/// What a create call did, for [`defer_creation`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CreateMiss {
    /// 429: create once the rate limit resets (`reset_ms` from now).
    RateLimited { reset_ms: Millis },
    /// The call may have created the build: look it up before creating another.
    Unconfirmed,
    /// The call surely did not reach Buildkite: create on the next pass.
    NotSent,
}

/// The job with its creation rescheduled after `miss`; `earlier_unconfirmed`: a create
/// before this one may have made a build. A create known to have made nothing (refused, or
/// never sent) needs no look-up before the next unless an earlier one does: the look-up a
/// new job is recorded with (should its function stop mid-call) is dropped, else each create
/// deferred in a rush would cost the quota a look-up too.
pub(crate) fn defer_creation(
    job: &Job,
    (miss, earlier_unconfirmed): (CreateMiss, bool),
    now: Millis,
) -> Option<Job> {
    let mut next = job.clone();
    let c = next.creation.as_mut()?;
    match miss {
        CreateMiss::RateLimited { reset_ms } => {
            c.after = now + reset_ms;
            c.look_up_first = earlier_unconfirmed;
        }
        CreateMiss::Unconfirmed => {
            c.after = now + LOOK_UP_AFTER_MS;
            c.look_up_first = true;
        }
        CreateMiss::NotSent => {
            c.after = now;
            c.look_up_first = earlier_unconfirmed;
        }
    }
    next.updated_at = now;
    Some(next)
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{build, job};
    use super::*;
    use crate::jobs::Transition;

    #[test]
    fn deferred_creations_are_claimed_once_and_rescheduled() {
        let mut j = job(JobState::Submitted);
        j.creation = Some(Creation {
            payload: "p".into(),
            after: 100,
            look_up_first: false,
        });
        assert_eq!(claim_creation(&j, 99), None, "not due");
        let (held, was) = claim_creation(&j, 100).unwrap();
        assert!(!was.look_up_first);
        assert_eq!(
            claim_creation(&held, 101),
            None,
            "held by the first claimant"
        );
        let unconfirmed = defer_creation(&held, (CreateMiss::Unconfirmed, false), 200).unwrap();
        let c = unconfirmed.creation.as_ref().unwrap();
        assert_eq!((c.after, c.look_up_first), (200 + LOOK_UP_AFTER_MS, true));
        // (what the call did, whether one before may have made a build, when the next is
        // due, whether it looks the build up first)
        let limited = CreateMiss::RateLimited { reset_ms: 42_000 };
        for (miss, earlier, after, look_up) in [
            (limited, false, 42_200, false),
            (limited, true, 42_200, true),
            (CreateMiss::NotSent, false, 200, false),
            (CreateMiss::NotSent, true, 200, true),
            (CreateMiss::Unconfirmed, false, 200 + LOOK_UP_AFTER_MS, true),
        ] {
            // From a job as submit records it (looked up first, should its function stop).
            let mut recorded = held.clone();
            recorded.creation.as_mut().unwrap().look_up_first = true;
            let next = defer_creation(&recorded, (miss, earlier), 200).unwrap();
            let c = next.creation.unwrap();
            assert_eq!(
                (c.after, c.look_up_first),
                (after, look_up),
                "{miss:?} {earlier}"
            );
        }
        let scheduled = held
            .apply(&Transition::to(JobState::Scheduled, 300).with_build(build()))
            .unwrap();
        assert_eq!(
            scheduled.creation, None,
            "a recorded build ends the creation"
        );
    }
}
