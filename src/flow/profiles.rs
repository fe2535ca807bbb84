//! Profile runs' files: each finished `profile.<i>` run gets a signed link of ours to its
//! zip (see [`crate::profile_link`]), and a click on one is answered with a redirect to the
//! zip's storage URL, asked of Buildkite's artifact API then (its token never leaves us).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::{Deps, DispatchError};
use crate::config::ProfileLinkConfig;
use crate::jobs::RunId;
use crate::profile_link::{self, Refused};
use crate::result::Outcome;
use crate::retry::Deadline;
use crate::time::Millis;

/// Clicks one run's links may take in a [`WINDOW`], per function instance.
const CLICKS_PER_WINDOW: u32 = 30;
const WINDOW: Millis = 60_000;
/// Clicks on all links one function instance answers in a [`WINDOW`]: each costs a call
/// against the Buildkite rate limit the whole service shares.
const INSTANCE_CLICKS_PER_WINDOW: u32 = 60;
/// Runs the click counter remembers before it forgets the quiet ones.
const MAX_COUNTED_RUNS: usize = 10_000;

/// Why a click on a link is not answered with the file.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProfileError {
    /// 403: not a link of ours, or no longer open.
    #[error("{0}")]
    Refused(Refused),
    /// 404
    #[error("no such profile")]
    NotFound,
    /// 429
    #[error("too many downloads of this run's profiles; try again in a minute")]
    TooMany,
    #[error(transparent)]
    Dispatch(#[from] DispatchError),
}

/// `outcome` with each profile run's `profile` pointing at its link (valid `ttl` from
/// `now`), and no other link or trace: what a program wrote there is not ours to show.
pub(crate) fn attach(
    links: Option<&ProfileLinkConfig>,
    run_id: &RunId,
    now: Millis,
    mut outcome: Outcome,
) -> Outcome {
    let Outcome {
        result,
        profile_zips: zips,
        ..
    } = &mut outcome;
    let Some(result) = result.as_mut() else {
        return outcome;
    };
    for (name, eval) in &mut result.runs {
        let Some(profile) = eval.profile.as_mut() else {
            continue;
        };
        profile.trace = None;
        // Only a run whose files were uploaded gets a link.
        let index = name.strip_prefix("profile.").and_then(|i| i.parse().ok());
        let index = index.filter(|_| zips.contains_key(name));
        profile.download_url = index.and_then(|i| link(links?, run_id, i, now));
    }
    outcome
}

/// The link to run `run_id`'s profile `index`, if this function makes links.
fn link(links: &ProfileLinkConfig, run_id: &RunId, index: usize, now: Millis) -> Option<String> {
    let base = links.base_url.as_ref()?;
    let expires = (now / 1000).checked_add(i64::try_from(links.ttl.as_secs()).ok()?)?;
    let path = profile_link::path(run_id.as_str(), index);
    let query = profile_link::query(links.signing_key(), &path, expires);
    Some(format!(
        "{}{path}?{query}",
        base.as_str().trim_end_matches('/')
    ))
}

/// Where a click on run `run_id`'s profile `index` link goes: the zip's storage URL.
pub(crate) async fn download(
    d: &Deps,
    run_id: &RunId,
    index: usize,
    (expires, signature): (i64, &str),
    deadline: Deadline,
) -> Result<String, ProfileError> {
    let links = d
        .config
        .profile_links
        .as_ref()
        .ok_or(ProfileError::NotFound)?;
    let path = profile_link::path(run_id.as_str(), index);
    let now = d.clock.now();
    profile_link::verify_any(links.keys(), &path, expires, signature, now / 1000)
        .map_err(ProfileError::Refused)?;
    if !d.profile_clicks.allow(run_id.as_str(), now) {
        return Err(ProfileError::TooMany);
    }
    let job = d.store.get(run_id).await.map_err(DispatchError::from)?;
    let job = job.ok_or(ProfileError::NotFound)?;
    let zip = job
        .outcome
        .as_ref()
        .and_then(|o| o.profile_zips.get(&format!("profile.{index}")));
    let (Some(zip), Some(build)) = (zip, job.build.as_ref()) else {
        return Err(ProfileError::NotFound);
    };
    let at = (zip.job_id.as_str(), zip.artifact_id.as_str());
    let bk_deadline = d.buildkite_deadline(deadline);
    let url = d
        .buildkite
        .artifact_location(build.number, at, bk_deadline)
        .await;
    Ok(url.map_err(DispatchError::from)?.to_string())
}

/// Clicks per run, and in all, in the current window, shared by one function instance's
/// requests.
#[derive(Clone, Default)]
pub(crate) struct ClickCounter(Arc<Mutex<Clicks>>);

#[derive(Default)]
struct Clicks {
    runs: HashMap<String, Window>,
    all: Window,
}

/// Clicks since `start`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Window {
    start: Millis,
    clicks: u32,
}

/// Counts a click at `now` in `window`: whether it is within `limit`.
fn count(window: &mut Window, now: Millis, limit: u32) -> bool {
    if now - window.start >= WINDOW || now < window.start {
        *window = Window {
            start: now,
            clicks: 0,
        };
    }
    window.clicks = window.clicks.saturating_add(1);
    window.clicks <= limit
}

impl ClickCounter {
    fn allow(&self, run_id: &str, now: Millis) -> bool {
        let mut clicks = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if clicks.runs.len() >= MAX_COUNTED_RUNS {
            clicks.runs.retain(|_, w| now - w.start < WINDOW);
        }
        let run = clicks.runs.entry(run_id.to_owned()).or_insert(Window {
            start: now,
            clicks: 0,
        });
        count(run, now, CLICKS_PER_WINDOW)
            && count(&mut clicks.all, now, INSTANCE_CLICKS_PER_WINDOW)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::result::{EvalResult, FullResult, ProfileResult};
    use secrecy::SecretString;

    fn outcome() -> Outcome {
        let profiled = |url: &str| EvalResult {
            profile: Some(ProfileResult {
                profiler: "Nsight-Compute".into(),
                trace: Some("UEsDBA==".into()),
                download_url: Some(url.into()),
            }),
            ..Default::default()
        };
        let mut result = FullResult {
            success: true,
            ..Default::default()
        };
        result
            .runs
            .insert("profile.0".into(), profiled("https://evil.example/a"));
        result
            .runs
            .insert("profile.1".into(), EvalResult::default());
        result
            .runs
            .insert("profile.2".into(), profiled("https://evil.example/c"));
        result
            .runs
            .insert("benchmark".into(), profiled("https://evil.example/b"));
        let mut outcome = Outcome::judge("passed", Some(result), None);
        // Only profile.0's files were uploaded.
        outcome
            .profile_zips
            .insert("profile.0".into(), Default::default());
        outcome
    }

    fn links(base: Option<&str>) -> ProfileLinkConfig {
        ProfileLinkConfig {
            secret: SecretString::from("k"),
            base_url: base.map(|b| b.parse().unwrap()),
            ttl: std::time::Duration::from_secs(100),
        }
    }

    #[test]
    fn profile_runs_link_to_their_zip_and_nothing_else_links_anywhere() {
        let run_id: RunId = "kb-1".parse().unwrap();
        let config = links(Some("https://submit.example/"));
        let out = attach(Some(&config), &run_id, 5_000, outcome());
        let runs = &out.result.as_ref().unwrap().runs;
        let profile = runs["profile.0"].profile.as_ref().unwrap();
        let url = profile.download_url.as_deref().unwrap();
        let query = profile_link::query(b"k", "/submissions/kb-1/profiles/0", 105);
        assert_eq!(
            url,
            format!("https://submit.example/submissions/kb-1/profiles/0?{query}")
        );
        assert_eq!(profile.trace, None);
        assert!(runs["profile.1"].profile.is_none());
        let unzipped = runs["profile.2"].profile.as_ref().unwrap();
        assert_eq!(unzipped.download_url, None, "no files uploaded, no link");
        let other = runs["benchmark"].profile.as_ref().unwrap();
        assert_eq!(
            (other.download_url.as_deref(), other.trace.as_deref()),
            (None, None)
        );
        for none in [None, Some(links(None))] {
            let out = attach(none.as_ref(), &run_id, 5_000, outcome());
            let runs = &out.result.as_ref().unwrap().runs;
            assert_eq!(
                runs["profile.0"].profile.as_ref().unwrap().download_url,
                None
            );
        }
    }

    #[test]
    fn clicks_are_counted_per_window() {
        let mut w = Window {
            start: 0,
            clicks: 0,
        };
        for (now, allowed, clicks) in [
            (0, true, 1),
            (59_999, true, 2),
            (60_000, true, 1),
            (59_000, true, 1),
        ] {
            assert_eq!(count(&mut w, now, CLICKS_PER_WINDOW), allowed, "{now}");
            assert_eq!(w.clicks, clicks, "{now}");
        }
        let mut full = Window {
            start: 0,
            clicks: CLICKS_PER_WINDOW,
        };
        assert!(!count(&mut full, 1_000, CLICKS_PER_WINDOW));
        assert!(count(&mut full, 61_000, CLICKS_PER_WINDOW));
        let counter = ClickCounter::default();
        let allowed = (0..40).filter(|_| counter.allow("kb-1", 10)).count();
        assert_eq!(allowed, CLICKS_PER_WINDOW as usize);
        assert!(counter.allow("kb-2", 10), "another run has its own count");
        // The instance answers so many in all, whatever the runs.
        let all = (0..100)
            .filter(|i| counter.allow(&format!("kb-x{i}"), 20))
            .count();
        assert_eq!(
            all,
            (INSTANCE_CLICKS_PER_WINDOW - CLICKS_PER_WINDOW - 1) as usize
        );
    }
}
