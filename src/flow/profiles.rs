//! Profile runs' files: each finished `profile.<i>` run gets a signed link of ours to its
//! zip (see [`crate::profile_link`]), and a click on one is answered with a redirect to the
//! zip's storage URL, asked of Buildkite's artifact API then (its token never leaves us).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use secrecy::ExposeSecret;

use super::{Deps, DispatchError};
use crate::buildkite::pick_beside_result;
use crate::config::ProfileLinkConfig;
use crate::jobs::RunId;
use crate::profile_link::{self, Refused};
use crate::result::Outcome;
use crate::retry::Deadline;
use crate::time::Millis;

/// Clicks one run's links may take in a [`WINDOW`], per function instance.
const CLICKS_PER_WINDOW: u32 = 30;
const WINDOW: Millis = 60_000;
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
    let Some(result) = outcome.result.as_mut() else {
        return outcome;
    };
    for (name, eval) in &mut result.runs {
        let Some(profile) = eval.profile.as_mut() else {
            continue;
        };
        profile.trace = None;
        let index = name.strip_prefix("profile.").and_then(|i| i.parse().ok());
        profile.download_url = index.and_then(|i| link(links?, run_id, i, now));
    }
    outcome
}

/// The link to run `run_id`'s profile `index`, if this function makes links.
fn link(links: &ProfileLinkConfig, run_id: &RunId, index: usize, now: Millis) -> Option<String> {
    let base = links.base_url.as_ref()?;
    let expires = now / 1000 + i64::try_from(links.ttl.as_secs()).ok()?;
    let path = profile_link::path(run_id.as_str(), index);
    let query = profile_link::query(links.secret.expose_secret().as_bytes(), &path, expires);
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
    let key = links.secret.expose_secret().as_bytes();
    let now = d.clock.now();
    profile_link::verify(key, &path, expires, signature, now / 1000)
        .map_err(ProfileError::Refused)?;
    if !d.profile_clicks.allow(run_id.as_str(), now) {
        return Err(ProfileError::TooMany);
    }
    let job = d.store.get(run_id).await.map_err(DispatchError::from)?;
    let job = job.ok_or(ProfileError::NotFound)?;
    let has_profile = job
        .outcome
        .as_ref()
        .and_then(|o| o.result.as_ref())
        .and_then(|r| r.runs.get(&format!("profile.{index}")))
        .is_some_and(|run| run.profile.is_some());
    let build = job
        .build
        .as_ref()
        .filter(|_| has_profile)
        .ok_or(ProfileError::NotFound)?;
    let bk_deadline = d.buildkite_deadline(deadline);
    let artifacts = d.buildkite.list_artifacts(build.number, bk_deadline).await;
    let artifacts = artifacts.map_err(DispatchError::from)?;
    let zip = pick_beside_result(&artifacts, &format!("profile.{index}.zip"));
    let zip = zip.ok_or(ProfileError::NotFound)?;
    let url = d
        .buildkite
        .artifact_location(build.number, zip, bk_deadline)
        .await;
    Ok(url.map_err(DispatchError::from)?.to_string())
}

/// Clicks per run in the current window, shared by one function instance's requests.
#[derive(Clone, Default)]
pub(crate) struct ClickCounter(Arc<Mutex<HashMap<String, Window>>>);

/// One run's clicks since `start`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Window {
    start: Millis,
    clicks: u32,
}

/// Counts a click at `now` in `window`: whether it is allowed.
fn count(window: &mut Window, now: Millis) -> bool {
    if now - window.start >= WINDOW || now < window.start {
        *window = Window {
            start: now,
            clicks: 0,
        };
    }
    window.clicks += 1;
    window.clicks <= CLICKS_PER_WINDOW
}

impl ClickCounter {
    fn allow(&self, run_id: &str, now: Millis) -> bool {
        let mut runs = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if runs.len() >= MAX_COUNTED_RUNS {
            runs.retain(|_, w| now - w.start < WINDOW);
        }
        let window = runs.entry(run_id.to_owned()).or_insert(Window {
            start: now,
            clicks: 0,
        });
        count(window, now)
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
            .insert("benchmark".into(), profiled("https://evil.example/b"));
        Outcome::judge("passed", Some(result), None)
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
            assert_eq!(count(&mut w, now), allowed, "{now}");
            assert_eq!(w.clicks, clicks, "{now}");
        }
        let mut full = Window {
            start: 0,
            clicks: CLICKS_PER_WINDOW,
        };
        assert!(!count(&mut full, 1_000));
        assert!(count(&mut full, 61_000));
        let counter = ClickCounter::default();
        let allowed = (0..40).filter(|_| counter.allow("kb-1", 10)).count();
        assert_eq!(allowed, CLICKS_PER_WINDOW as usize);
        assert!(counter.allow("kb-2", 10), "another run has its own count");
    }
}
