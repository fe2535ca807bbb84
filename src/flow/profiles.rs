//! Profile runs' files: each finished `profile.<i>` run gets a signed link of ours to its
//! zip (see [`crate::profile_link`]), and a click on one is answered with a redirect to the
//! zip's storage URL, asked of Buildkite's artifact API then (its token never leaves us).

use std::sync::{Arc, Mutex};

use std::time::Duration;

use super::clicks::{self, Next};
use super::{Deps, DispatchError};
use crate::buildkite::CallBudget;
use crate::config::ProfileLinkConfig;
use crate::jobs::{CacheEntry, RunId, SharedKey, next_version};
use crate::profile_link::{self, Refused};
use crate::result::Outcome;
use crate::retry::Deadline;
use crate::time::Millis;

/// Storage URLs one function instance fetches in a [`WINDOW`] at most.
const FETCHES_PER_WINDOW: u32 = 30;
const WINDOW: Millis = 60_000;

/// Why a click on a link is not answered with the file.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProfileError {
    /// 403: not a link of ours, or no longer open.
    #[error("{0}")]
    Refused(Refused),
    /// 404
    #[error("no such profile")]
    NotFound,
    /// 503: this deployment has no `PROFILE_LINK_SECRET`, so no link of it can be checked.
    #[error("profile links are not configured on this deployment")]
    NotConfigured,
    /// 429: this instance fetched many links' files in a minute.
    #[error("too many downloads; try again in {retry_after} s")]
    TooMany { retry_after: u64 },
    /// 503: a fetch now would take requests Buildkite's quota keeps for submissions, or
    /// another instance is fetching this link's files.
    #[error("the download is not available right now; try again in {retry_after} s")]
    Busy { retry_after: u64 },
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
        .ok_or(ProfileError::NotConfigured)?;
    let path = profile_link::path(run_id.as_str(), index);
    let now = d.clock.now();
    profile_link::verify_any(links.keys(), &path, expires, signature, now / 1000)
        .map_err(ProfileError::Refused)?;
    let job = d.store.get(run_id).await.map_err(DispatchError::from)?;
    let job = job.ok_or(ProfileError::NotFound)?;
    let zip = job
        .outcome
        .as_ref()
        .and_then(|o| o.profile_zips.get(&format!("profile.{index}")));
    let (Some(zip), Some(build)) = (zip, job.build.as_ref()) else {
        return Err(ProfileError::NotFound);
    };
    let artifact = Artifact {
        build: build.number,
        job_id: zip.job_id.as_str(),
        artifact_id: zip.artifact_id.as_str(),
    };
    storage_url(d, SharedKey::ProfileUrl(run_id, index), &artifact, deadline).await
}

/// Where a profile's zip is, in Buildkite's artifact API.
struct Artifact<'a> {
    build: u64,
    job_id: &'a str,
    artifact_id: &'a str,
}

/// How long a click waits for another instance's fetch of the same link: as long as the
/// fetch's claim holds the others off, since that fetch may take a Buildkite call's whole
/// timeout (a shorter wait answered a burst of clicks 503 while the one fetch was on its way).
const WAIT_FOR_FETCH: Duration = Duration::from_millis(clicks::CLAIM_MS as u64);

/// The zip's storage URL: the one kept under `key` while it lasts, else fetched by whichever
/// click claims the fetch first (the others wait for it), within the quota's reserve.
async fn storage_url(
    d: &Deps,
    key: SharedKey<'_>,
    artifact: &Artifact<'_>,
    deadline: Deadline,
) -> Result<String, ProfileError> {
    let waiting = Deadline::after(WAIT_FOR_FETCH.min(deadline.remaining()));
    // Reads of a waiting click back off, so a burst does not hammer the store.
    let mut pause = Duration::from_millis(50);
    loop {
        let now = d.clock.now();
        let entry = d
            .store
            .cached(&key.key())
            .await
            .map_err(DispatchError::from)?;
        match clicks::next(entry.as_ref(), artifact.artifact_id, now) {
            Next::Use(url) => return Ok(url),
            Next::Wait => {}
            Next::Claim { expected } => {
                let claim = CacheEntry {
                    claimed_at: now,
                    version: next_version(expected, now),
                    expires_at: key.expires(now),
                    ..entry.unwrap_or(CacheEntry {
                        value: None,
                        fetched_at: 0,
                        claimed_at: 0,
                        version: 0,
                        expires_at: None,
                    })
                };
                let claimed = d.store.put_cached(&key.key(), &claim, expected).await;
                if claimed.map_err(DispatchError::from)? {
                    return fetch_claimed(d, key, &claim, artifact, deadline).await;
                }
                // Another click claimed first: wait for its URL, as any waiter does.
            }
        }
        if waiting.remaining().is_zero() {
            return Err(ProfileError::Busy { retry_after: 1 });
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(400));
    }
}

/// Fetches the URL for the claim this instance holds; a click refused or failed gives the
/// claim back.
async fn fetch_claimed(
    d: &Deps,
    key: SharedKey<'_>,
    claim: &CacheEntry,
    artifact: &Artifact<'_>,
    deadline: Deadline,
) -> Result<String, ProfileError> {
    let fetched = match spend(d, claim.claimed_at).await {
        Ok(()) => fetch(d, key, claim, artifact, deadline).await,
        Err(e) => Err(e),
    };
    if fetched.is_err() {
        release(d, key, claim).await;
    }
    fetched
}

/// Whether this instance may spend a Buildkite call on a click now: the quota's reserve
/// is left alone (the call is taken from the kept count first, so clicks at once on other
/// instances see it spent), and one instance fetches so many a minute.
async fn spend(d: &Deps, now: Millis) -> Result<(), ProfileError> {
    let mut taken = false;
    let key = clicks::quota_key();
    for _ in 0..3 {
        let entry = d.store.cached(&key).await;
        let entry = entry.map_err(DispatchError::from)?;
        let quota: Option<clicks::Quota> = entry.as_ref().and_then(parse);
        clicks::quota_allows(quota.as_ref(), now)
            .map_err(|retry_after| ProfileError::Busy { retry_after })?;
        let (Some(entry), Some(quota)) = (entry, quota) else {
            taken = true; // nothing known yet: this call will tell
            break;
        };
        let less = clicks::Quota {
            remaining: quota.remaining - 1,
            ..quota
        };
        let version = next_version(Some(entry.version), now);
        let write = CacheEntry::unclaimed(
            serde_json::to_string(&less).ok(),
            entry.fetched_at,
            version,
            SharedKey::BuildkiteQuota.expires(now),
        );
        let put = d.store.put_cached(&key, &write, Some(entry.version));
        if put.await.map_err(DispatchError::from)? {
            taken = true;
            break;
        }
    }
    if !taken {
        return Err(ProfileError::Busy { retry_after: 1 });
    }
    d.profile_clicks
        .allow(now)
        .map_err(|retry_after| ProfileError::TooMany { retry_after })
}

/// Gives the claim back: the next click tries again at once.
async fn release(d: &Deps, key: SharedKey<'_>, claim: &CacheEntry) {
    let released = CacheEntry {
        claimed_at: claim.fetched_at,
        version: next_version(Some(claim.version), claim.claimed_at),
        ..claim.clone()
    };
    let _ = d
        .store
        .put_cached(&key.key(), &released, Some(claim.version))
        .await;
}

/// A stored value of ours, if it reads.
fn parse<T: serde::de::DeserializeOwned>(entry: &CacheEntry) -> Option<T> {
    serde_json::from_str(entry.value.as_deref()?).ok()
}

/// Asks Buildkite for the zip's storage URL (this instance holds `claim`), keeps it for
/// every instance, and keeps the quota Buildkite said is left.
async fn fetch(
    d: &Deps,
    key: SharedKey<'_>,
    claim: &CacheEntry,
    artifact: &Artifact<'_>,
    deadline: Deadline,
) -> Result<String, ProfileError> {
    let budget = CallBudget::new(1, d.clock.clone());
    let buildkite = d.buildkite.with_budget(budget.clone());
    let at = (artifact.job_id, artifact.artifact_id);
    let bk_deadline = d.buildkite_deadline(deadline);
    let url = buildkite
        .artifact_location(artifact.build, at, bk_deadline)
        .await;
    let now = d.clock.now();
    if let Some(remaining) = budget.remaining() {
        let quota = clicks::Quota::seen(remaining, budget.reset_secs(), now);
        // Whoever writes last saw the newest count: no claim is needed.
        let quota_key = clicks::quota_key();
        let old = d.store.cached(&quota_key).await.ok().flatten();
        let expected = old.map(|e| e.version);
        let version = next_version(expected, now);
        let entry = CacheEntry::unclaimed(
            serde_json::to_string(&quota).ok(),
            now,
            version,
            SharedKey::BuildkiteQuota.expires(now),
        );
        let _ = d.store.put_cached(&quota_key, &entry, expected).await;
    }
    let url = url.map_err(DispatchError::from)?;
    let kept = clicks::KeptUrl {
        url: url.to_string(),
        artifact_id: artifact.artifact_id.to_owned(),
        until: clicks::usable_until(&url, now),
    };
    let entry = CacheEntry {
        value: serde_json::to_string(&kept).ok(),
        fetched_at: now,
        claimed_at: claim.claimed_at,
        version: next_version(Some(claim.version), now),
        expires_at: key.expires(now),
    };
    // Lost only to a later claim, whose URL is as good.
    let _ = d
        .store
        .put_cached(&key.key(), &entry, Some(claim.version))
        .await;
    Ok(kept.url)
}

/// Fetches of storage URLs one function instance makes in the current window: each costs a
/// call against the Buildkite rate limit the whole service shares. Kept URLs cost nothing
/// and are not counted, nor are clicks refused.
#[derive(Clone, Default)]
pub(crate) struct ClickCounter(Arc<Mutex<Window>>);

/// Fetches since `start`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Window {
    start: Millis,
    fetches: u32,
}

/// Counts a fetch at `now` in `window` if it is within `limit`; else the seconds until the
/// window ends.
fn count(window: &mut Window, now: Millis, limit: u32) -> Result<(), u64> {
    if now - window.start >= WINDOW || now < window.start {
        *window = Window {
            start: now,
            fetches: 0,
        };
    }
    if window.fetches >= limit {
        return Err(((window.start + WINDOW - now) as u64).div_ceil(1000).max(1));
    }
    window.fetches += 1;
    Ok(())
}

impl ClickCounter {
    fn allow(&self, now: Millis) -> Result<(), u64> {
        let mut window = self.0.lock().unwrap_or_else(|e| e.into_inner());
        count(&mut window, now, FETCHES_PER_WINDOW)
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
    fn fetches_are_counted_per_window_and_a_refusal_costs_nothing() {
        let mut w = Window {
            start: 0,
            fetches: 0,
        };
        // (now, answer, fetches counted after)
        for (now, allowed, fetches) in [
            (0, Ok(()), 1),
            (59_999, Ok(()), 2),
            (60_000, Ok(()), 1),
            (59_000, Ok(()), 1),
        ] {
            assert_eq!(count(&mut w, now, FETCHES_PER_WINDOW), allowed, "{now}");
            assert_eq!(w.fetches, fetches, "{now}");
        }
        let mut full = Window {
            start: 0,
            fetches: FETCHES_PER_WINDOW,
        };
        assert_eq!(count(&mut full, 1_000, FETCHES_PER_WINDOW), Err(59));
        assert_eq!(count(&mut full, 59_999, FETCHES_PER_WINDOW), Err(1));
        assert_eq!(full.fetches, FETCHES_PER_WINDOW, "refusals are not counted");
        assert_eq!(count(&mut full, 61_000, FETCHES_PER_WINDOW), Ok(()));
        let counter = ClickCounter::default();
        let allowed = (0..40).filter(|_| counter.allow(10).is_ok()).count();
        assert_eq!(allowed, FETCHES_PER_WINDOW as usize);
    }
}
