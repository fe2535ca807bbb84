//! What an outbox does next, the same for both receivers: a sender takes the job's message
//! (a lease, so only one sender at a time and an older message never lands after a newer
//! one), sends the job as it is then, and records the answer, which releases the lease.
//! Only the state owed now counts: a failure of a state the job has since left does not
//! count against the new one. A final message failing for a day is given up.

use crate::jobs::{Channel, Delivery, DeliveryStatus, DiscordOutbox, Job, JobState, Lease, Target};
use crate::time::Millis;

/// A final message the receiver has not accepted for this long is given up.
pub(crate) const GIVE_UP_AFTER_MS: Millis = 24 * 3600 * 1000;

/// A lease outlasts its holder's deadline by this much, for an answer still on its way.
pub(crate) const LEASE_SLACK_MS: Millis = 30_000;

/// What the receiver said to one message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Accepted; with the new message's id when one was posted (Discord).
    Accepted { posted: Option<String> },
    /// Not accepted now (5xx, 429, a timeout, any refusal of a callback receiver): sent
    /// again later, for up to a day.
    Failed(String),
    /// The Discord message is gone or can no longer be edited: post a new one.
    MessageGone,
    /// The receiver is gone (a deleted webhook, a 410): nothing more is sent.
    Gone(String),
    /// This message will never be accepted (a Discord 4xx): not sent again until the job
    /// moves on.
    Refused(String),
}

/// Takes the job's message to `channel` for `owner` until `until`, if one is owed and no
/// one else holds it.
pub(crate) fn claim(
    job: &Job,
    channel: Channel,
    owner: &str,
    now: Millis,
    until: Millis,
) -> Option<Job> {
    if !job.owes(channel) || job.delivery(channel)?.held_at(now) {
        return None;
    }
    let mut next = job.clone();
    next.delivery_mut(channel)?.lease = Some(Lease {
        owner: owner.to_owned(),
        until,
    });
    Some(next)
}

/// Records what the receiver said to `owner`'s message about the job in state `sent`, and
/// releases the lease. Only the holder records: a sender whose lease passed to another
/// changes nothing (the other sends what is owed), and a repeated record cannot count twice.
pub fn record(
    job: &Job,
    channel: Channel,
    owner: &str,
    sent: JobState,
    answer: &Answer,
    now: Millis,
) -> Option<Job> {
    let mut next = job.clone();
    let delivery = next.delivery_mut(channel)?;
    if delivery.lease.as_ref().is_none_or(|l| l.owner != owner) {
        return None;
    }
    delivery.lease = None;
    settle(delivery, sent, job.state == sent, answer, now);
    if let (Channel::Discord, Some(outbox)) = (channel, next.discord.as_mut()) {
        settle_discord(outbox, sent, answer);
    }
    Some(next)
}

/// The bookkeeping both receivers share; `current`: the message was of the state owed now.
fn settle(d: &mut Delivery, sent: JobState, current: bool, answer: &Answer, now: Millis) {
    let rank = sent.rank();
    match answer {
        Answer::Accepted { .. } => {
            d.accepted = Some(d.accepted.map_or(rank, |a| a.max(rank)));
            if current {
                d.restart();
            }
            if sent.is_terminal() {
                d.status = DeliveryStatus::Delivered;
            }
        }
        Answer::Gone(e) => {
            d.status = DeliveryStatus::Gone;
            d.last_error = Some(e.clone());
        }
        _ if !current => {}
        Answer::MessageGone => d.fail("the status message was deleted; posting a new one", now),
        Answer::Refused(e) => {
            d.fail(e, now);
            if sent.is_terminal() {
                d.status = DeliveryStatus::GivenUp;
            }
        }
        Answer::Failed(e) => {
            d.fail(e, now);
            if sent.is_terminal() && d.failing_for(now) >= GIVE_UP_AFTER_MS {
                d.status = DeliveryStatus::GivenUp;
            }
        }
    }
}

/// What only a Discord message has: its id, the rank refused for good, and the webhook
/// token, which is not kept once nothing more will be sent.
fn settle_discord(o: &mut DiscordOutbox, sent: JobState, answer: &Answer) {
    match answer {
        Answer::Accepted { posted } if o.message_id.is_none() => o.message_id.clone_from(posted),
        Answer::MessageGone => o.message_id = None,
        Answer::Refused(_) => o.refused = Some(sent.rank()),
        _ => {}
    }
    // A webhook a submission named carries its token: not kept once its message is settled
    // (delivered, or the webhook gone). A given-up message keeps it, so an operator can
    // replay it once Discord is back; the table's TTL removes it with the job. The
    // deployment's default is a reference, always kept.
    let settled = matches!(
        o.delivery.status,
        DeliveryStatus::Delivered | DeliveryStatus::Gone
    );
    if settled && matches!(o.target, Some(Target::Webhook(_))) {
        o.target = None;
    }
}

/// Why a job's final message to a receiver cannot be sent again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotReopened {
    /// The job has not ended: its messages are still on their way.
    NotEnded,
    /// The job reports to no such receiver.
    NoReceiver,
    /// The webhook the submission named is no longer kept (its token is dropped once
    /// nothing more is owed).
    WebhookForgotten,
    /// This configuration has no such receiver (no `CALLBACK_URL`, no default Discord
    /// webhook): sending would give the message up, so it is left as it is.
    Unconfigured,
}

/// Owes the ended job's final message to `channel` again, whatever came of it (delivered,
/// refused, given up): an operator's resend or replay. It starts afresh, with its own tries
/// and its own day; the Discord message is the same one, edited. A receiver that is gone
/// (a deleted webhook) is tried again too: the operator says it is back.
pub(crate) fn reopen(job: &Job, channel: Channel) -> Result<Job, NotReopened> {
    if !job.state.is_terminal() {
        return Err(NotReopened::NotEnded);
    }
    let mut next = job.clone();
    if let (Channel::Discord, Some(o)) = (channel, next.discord.as_mut()) {
        if o.target.is_none() {
            return Err(NotReopened::WebhookForgotten);
        }
        o.refused = None;
    }
    let d = next.delivery_mut(channel).ok_or(NotReopened::NoReceiver)?;
    d.status = DeliveryStatus::Active;
    d.accepted = None;
    d.restart();
    Ok(next)
}

/// Gives up the job's owed message to `channel` when its receiver is no longer configured
/// (`CALLBACK_URL` unset since): it would otherwise stay in the sweep's outbox for ever.
pub(crate) fn abandon(job: &Job, channel: Channel, reason: &str) -> Option<Job> {
    if !job.owes(channel) {
        return None;
    }
    let mut next = job.clone();
    let d = next.delivery_mut(channel)?;
    d.status = DeliveryStatus::GivenUp;
    d.last_error = Some(reason.to_owned());
    d.lease = None;
    Some(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::{CallbackOutbox, Transition, WebhookAddress};

    const DISCORD: Channel = Channel::Discord;
    const CALLBACK: Channel = Channel::Callback;

    fn job(state: JobState) -> Job {
        let target = Target::Webhook(WebhookAddress {
            webhook_id: "1".into(),
            token: "t".into(),
            thread_id: None,
        });
        let mut j = Job::new(
            "r".parse().unwrap(),
            "g".into(),
            "q".into(),
            None,
            Some(target),
            0,
        );
        j.state = state;
        j
    }

    fn discord(job: &Job) -> &DiscordOutbox {
        job.discord.as_ref().unwrap()
    }

    fn accepted(posted: Option<&str>) -> Answer {
        Answer::Accepted {
            posted: posted.map(str::to_owned),
        }
    }

    #[test]
    fn one_sender_at_a_time_and_a_lease_expires() {
        let j = job(JobState::Running);
        let held = claim(&j, DISCORD, "a", 1_000, 5_000).expect("owed and free");
        assert_eq!(claim(&held, DISCORD, "b", 2_000, 9_000), None, "held by a");
        assert!(
            claim(&held, DISCORD, "b", 5_001, 9_000).is_some(),
            "a's lease ran out"
        );
        let shown = record(
            &held,
            DISCORD,
            "a",
            JobState::Running,
            &accepted(Some("m")),
            2_000,
        )
        .unwrap();
        assert_eq!(
            claim(&shown, DISCORD, "b", 2_000, 9_000),
            None,
            "nothing owed"
        );
        let o = discord(&shown);
        assert_eq!(
            (
                o.delivery.accepted,
                o.message_id.as_deref(),
                o.delivery.lease.as_ref()
            ),
            (Some(2), Some("m"), None)
        );
    }

    /// `job` with its message to `channel` held by `owner`.
    fn held(job: &Job, channel: Channel, owner: &str) -> Job {
        claim(job, channel, owner, 0, Millis::MAX).expect("owed and free")
    }

    /// One send by `owner` of the job as it is, answered `answer` at `now`.
    fn send(job: &Job, channel: Channel, owner: &str, answer: Answer, now: Millis) -> Job {
        let h = held(job, channel, owner);
        record(&h, channel, owner, h.state, &answer, now).expect("the holder records")
    }

    #[test]
    fn a_render_of_an_older_state_never_counts_as_the_newer() {
        // The job moved on while a render of `running` was in flight.
        let h = held(&job(JobState::Running), DISCORD, "a");
        let finished = h.apply(&Transition::to(JobState::Finished, 5)).unwrap();
        let after = record(
            &finished,
            DISCORD,
            "a",
            JobState::Running,
            &accepted(None),
            6,
        )
        .unwrap();
        assert!(after.owes(DISCORD), "the final report is still owed");
        let done = send(&after, DISCORD, "b", accepted(None), 7);
        let o = discord(&done);
        assert_eq!(o.delivery.status, DeliveryStatus::Delivered);
        assert!(
            o.target.is_none(),
            "the token is dropped once the final report is accepted"
        );
    }

    #[test]
    fn only_the_lease_holder_records() {
        let h = held(&job(JobState::Finished), DISCORD, "a");
        let down = || Answer::Failed("503".into());
        assert_eq!(
            record(
                &h,
                DISCORD,
                "b",
                JobState::Finished,
                &Answer::MessageGone,
                1
            ),
            None
        );
        let once = record(&h, DISCORD, "a", JobState::Finished, &down(), 1).unwrap();
        assert_eq!(
            record(&once, DISCORD, "a", JobState::Finished, &down(), 2),
            None,
            "a repeated record does not count twice"
        );
    }

    #[test]
    fn discord_answers_decide_what_happens_next() {
        let j = job(JobState::Finished);
        let gone_msg = send(&j, DISCORD, "a", Answer::MessageGone, 1);
        assert!(gone_msg.owes(DISCORD) && discord(&gone_msg).message_id.is_none());
        let gone = send(&j, DISCORD, "a", Answer::Gone("10015".into()), 1);
        assert_eq!(discord(&gone).delivery.status, DeliveryStatus::Gone);
        assert!(!gone.owes(DISCORD));
        let refused = send(&j, DISCORD, "a", Answer::Refused("50035".into()), 1);
        assert_eq!(discord(&refused).delivery.status, DeliveryStatus::GivenUp);
        let refused = send(
            &job(JobState::Running),
            DISCORD,
            "a",
            Answer::Refused("x".into()),
            1,
        );
        assert!(!refused.owes(DISCORD), "that render is not retried");
        let moved = refused
            .apply(&Transition::to(JobState::Finished, 2))
            .unwrap();
        assert!(moved.owes(DISCORD), "the next state is tried again");
    }

    #[test]
    fn a_report_failing_for_a_day_is_given_up() {
        let down = || Answer::Failed("503".into());
        let once = send(&job(JobState::Running), DISCORD, "a", down(), 1_000);
        // The job moving on starts a new render's clock.
        let finished = once
            .apply(&Transition::to(JobState::Finished, 2_000))
            .unwrap();
        let first = send(&finished, DISCORD, "a", down(), 5_000);
        let later = send(&first, DISCORD, "a", down(), 5_000 + GIVE_UP_AFTER_MS - 1);
        assert!(later.owes(DISCORD));
        assert_eq!(discord(&later).delivery.attempts, 2);
        let day = send(&later, DISCORD, "a", down(), 5_000 + GIVE_UP_AFTER_MS);
        assert_eq!(discord(&day).delivery.status, DeliveryStatus::GivenUp);
    }

    #[test]
    fn only_a_final_message_is_given_up_so_a_long_run_still_gets_its_report() {
        let down = || Answer::Failed("503".into());
        let once = send(&job(JobState::Running), DISCORD, "a", down(), 1_000);
        let day = send(&once, DISCORD, "a", down(), 1_000 + GIVE_UP_AFTER_MS);
        let d = &discord(&day).delivery;
        assert_eq!((d.status, d.attempts), (DeliveryStatus::Active, 2));
        assert!(discord(&day).target.is_some(), "the token is kept");
        let finished = day
            .apply(&Transition::to(
                JobState::Finished,
                2_000 + GIVE_UP_AFTER_MS,
            ))
            .unwrap();
        let done = send(
            &finished,
            DISCORD,
            "b",
            accepted(None),
            3_000 + GIVE_UP_AFTER_MS,
        );
        assert_eq!(discord(&done).delivery.status, DeliveryStatus::Delivered);
    }

    fn with_callback(state: JobState) -> Job {
        let mut j = job(JobState::Submitted);
        j.callback = Some(CallbackOutbox::new(0));
        j.apply(&Transition::to(state, 10)).unwrap()
    }

    fn callback(job: &Job) -> &Delivery {
        job.delivery(CALLBACK).unwrap()
    }

    #[test]
    fn one_callback_sender_at_a_time_and_an_accepted_one_is_never_owed_again() {
        let running = with_callback(JobState::Running);
        let held = claim(&running, CALLBACK, "a", 100, 1_000).expect("owed");
        assert_eq!(claim(&held, CALLBACK, "b", 200, 1_000), None, "held by a");
        assert!(
            claim(&held, CALLBACK, "b", 1_000, 2_000).is_some(),
            "a's lease passed"
        );
        assert_eq!(
            record(
                &held,
                CALLBACK,
                "b",
                JobState::Running,
                &accepted(None),
                300
            ),
            None
        );
        let done = record(
            &held,
            CALLBACK,
            "a",
            JobState::Running,
            &accepted(None),
            300,
        )
        .unwrap();
        assert!(!done.owes(CALLBACK));
        assert_eq!(claim(&done, CALLBACK, "c", 400, 1_000), None);
        let finished = done
            .apply(&Transition::to(JobState::Finished, 500))
            .unwrap();
        assert!(finished.owes(CALLBACK), "a new state owes its own callback");
    }

    #[test]
    fn failures_are_retried_for_a_day_and_a_410_stops_at_once() {
        let finished = with_callback(JobState::Finished);
        let down = || Answer::Failed("500".into());
        let mut j = finished.clone();
        for now in [1_000, 2_000] {
            let held = claim(&j, CALLBACK, "s", now, now + 10).unwrap();
            j = record(&held, CALLBACK, "s", JobState::Finished, &down(), now).unwrap();
        }
        let c = callback(&j);
        assert_eq!(
            (c.attempts, c.pending_since, c.status),
            (2, Some(1_000), DeliveryStatus::Active)
        );
        let late = 1_000 + GIVE_UP_AFTER_MS;
        let held = claim(&j, CALLBACK, "s", late, late + 10).unwrap();
        let j = record(&held, CALLBACK, "s", JobState::Finished, &down(), late).unwrap();
        assert_eq!(callback(&j).status, DeliveryStatus::GivenUp);
        assert!(!j.owes(CALLBACK));

        let held = claim(&finished, CALLBACK, "s", 5, 10).unwrap();
        let gone = Answer::Gone("the receiver answered 410 Gone".into());
        let gone = record(&held, CALLBACK, "s", JobState::Finished, &gone, 5).unwrap();
        assert_eq!(callback(&gone).status, DeliveryStatus::Gone);
        assert!(!gone.owes(CALLBACK));
    }

    #[test]
    fn an_earlier_states_answer_does_not_touch_the_later_state_now_owed() {
        let running = with_callback(JobState::Running);
        let held = claim(&running, CALLBACK, "s", 100, 1_000).unwrap();
        // The build finished while the `running` callback was in flight.
        let finished = held
            .apply(&Transition::to(JobState::Finished, 150))
            .unwrap();
        let down = Answer::Failed("503".into());
        let failed = record(&finished, CALLBACK, "s", JobState::Running, &down, 200).unwrap();
        let c = callback(&failed);
        assert_eq!(
            (c.attempts, c.pending_since, c.lease.as_ref()),
            (0, None, None)
        );
        let ok = record(
            &finished,
            CALLBACK,
            "s",
            JobState::Running,
            &accepted(None),
            200,
        )
        .unwrap();
        assert!(ok.owes(CALLBACK), "finished is still owed");
        assert_eq!(callback(&ok).accepted, Some(JobState::Running.rank()));
    }

    #[test]
    fn a_submitted_job_owes_no_callback_and_an_unset_receiver_gives_up() {
        let mut submitted = job(JobState::Submitted);
        submitted.callback = Some(CallbackOutbox::new(0));
        assert_eq!(claim(&submitted, CALLBACK, "s", 0, 10), None);
        assert_eq!(abandon(&submitted, CALLBACK, "unset"), None);
        let abandoned = abandon(&with_callback(JobState::Finished), CALLBACK, "unset").unwrap();
        assert_eq!(callback(&abandoned).status, DeliveryStatus::GivenUp);
    }

    #[test]
    fn an_ended_job_s_message_is_owed_again_whatever_came_of_it() {
        let ended = |status, target: Option<Target>| {
            let mut j = job(JobState::Finished);
            j.callback = Some(CallbackOutbox::new(0));
            let o = j.discord.as_mut().unwrap();
            o.target = target;
            o.refused = Some(JobState::Finished.rank());
            for d in [&mut o.delivery, &mut j.callback.as_mut().unwrap().delivery] {
                d.status = status;
                d.accepted = Some(JobState::Finished.rank());
                d.attempts = 9;
                d.pending_since = Some(1);
                d.last_error = Some("503".into());
            }
            j
        };
        use DeliveryStatus::*;
        use NotReopened::*;
        let named = || Some(job(JobState::Running).discord.unwrap().target.unwrap());
        // (status, Discord target, channel, what reopening does)
        let table = [
            (GivenUp, Some(Target::Default), DISCORD, Ok(())),
            (Delivered, Some(Target::Default), DISCORD, Ok(())),
            (Gone, named(), DISCORD, Ok(())),
            (GivenUp, named(), DISCORD, Ok(())),
            (GivenUp, None, DISCORD, Err(WebhookForgotten)),
            (GivenUp, None, CALLBACK, Ok(())),
            (Delivered, None, CALLBACK, Ok(())),
        ];
        for (status, target, channel, expected) in table {
            let before = ended(status, target);
            let got = reopen(&before, channel);
            assert_eq!(
                got.as_ref().map(|_| ()),
                expected.as_ref().map(|_| ()),
                "{status:?} {channel:?}"
            );
            let Ok(next) = got else { continue };
            assert!(next.owes(channel), "{status:?} {channel:?}");
            let d = next.delivery(channel).unwrap();
            assert_eq!(
                (d.attempts, d.pending_since, &d.last_error),
                (0, None, &None)
            );
            // The other receiver is left as it was.
            let other = if channel == DISCORD {
                CALLBACK
            } else {
                DISCORD
            };
            assert_eq!(next.delivery(other), before.delivery(other));
        }
        assert_eq!(
            reopen(&job(JobState::Running), DISCORD).err(),
            Some(NotEnded)
        );
        let mut no_callback = ended(GivenUp, Some(Target::Default));
        no_callback.callback = None;
        assert_eq!(reopen(&no_callback, CALLBACK).err(), Some(NoReceiver));
    }

    #[test]
    fn a_named_webhook_is_forgotten_once_delivered_but_kept_while_given_up() {
        let mut j = job(JobState::Finished);
        let claimed = claim(&j, DISCORD, "me", 0, 10).unwrap();
        let refused = Answer::Refused("400".into());
        let given_up = record(&claimed, DISCORD, "me", JobState::Finished, &refused, 1).unwrap();
        assert_eq!(discord(&given_up).delivery.status, DeliveryStatus::GivenUp);
        assert!(discord(&given_up).target.is_some(), "kept for a replay");
        j.discord.as_mut().unwrap().delivery.status = DeliveryStatus::Active;
        let claimed = claim(&j, DISCORD, "me", 0, 10).unwrap();
        let gone = Answer::Gone("404".into());
        let gone = record(&claimed, DISCORD, "me", JobState::Finished, &gone, 1).unwrap();
        assert!(discord(&gone).target.is_none(), "the webhook is gone");
    }

    #[test]
    fn the_default_webhook_is_kept_once_nothing_is_owed_and_a_named_one_is_not() {
        for (target, kept) in [
            (Target::Default, true),
            (
                job(JobState::Finished).discord.unwrap().target.unwrap(),
                false,
            ),
        ] {
            let mut j = job(JobState::Finished);
            j.discord.as_mut().unwrap().target = Some(target);
            let claimed = claim(&j, DISCORD, "me", 0, 10).unwrap();
            let done = record(
                &claimed,
                DISCORD,
                "me",
                JobState::Finished,
                &accepted(Some("m")),
                1,
            )
            .unwrap();
            assert_eq!(discord(&done).delivery.status, DeliveryStatus::Delivered);
            assert_eq!(discord(&done).target.is_some(), kept);
        }
    }
}
