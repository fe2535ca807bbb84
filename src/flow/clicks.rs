//! What a profile link's click may cost Buildkite, decided across every function instance
//! through the store: the storage URL one click obtained is kept (by run and profile index)
//! until shortly before it expires, so repeat clicks from anywhere make no Buildkite call;
//! one instance at a time fetches a link's URL; and a click never dips into the share of the
//! token's requests kept for submissions and finishes (the last `RateLimit-Remaining` a
//! click saw is kept beside the URLs).

use serde::{Deserialize, Serialize};

use crate::jobs::{CacheEntry, SharedKey};
use crate::time::Millis;

/// Of the token's requests left in Buildkite's window (50 a minute by default), those a click
/// leaves to submissions, finishes and the sweep.
pub(crate) const QUOTA_RESERVE: i64 = 20;
/// A kept URL is used until this long before it expires (a quarter of a short life): time
/// for the browser to follow it.
const URL_MARGIN_MS: Millis = 60_000;
/// A storage URL that says nothing of its expiry is taken to last this long (the shortest
/// Buildkite's artifact API is known to sign for).
const URL_DEFAULT_LIFE_MS: Millis = 60_000;
/// However long a URL is signed for, it is kept at most this long.
const URL_MAX_KEPT_MS: Millis = 10 * 60_000;
/// One instance's claim to fetch a link's URL holds the others off this long: longer than a
/// Buildkite call may take (10 s) with the store's reads and writes around it.
pub(crate) const CLAIM_MS: Millis = 20_000;
/// When Buildkite's window resets, if it did not say.
const DEFAULT_RESET_MS: Millis = 60_000;

/// Where the quota is kept.
pub(crate) fn quota_key() -> String {
    SharedKey::BuildkiteQuota.key()
}

/// A storage URL, the artifact it is of, and until when it may be handed out.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct KeptUrl {
    pub(crate) url: String,
    pub(crate) artifact_id: String,
    pub(crate) until: Millis,
}

/// What a click on a link does, given what the store keeps of its URL.
#[derive(Debug, PartialEq)]
pub(crate) enum Next {
    /// Hand out the kept URL.
    Use(String),
    /// Fetch it, after claiming the fetch (`expected`: the entry's version now).
    Claim { expected: Option<Millis> },
    /// Another instance is fetching it: wait for its URL.
    Wait,
}

/// What a click on the link to `artifact_id` does at `now`, given what is kept under its key
/// (a URL kept for another artifact, as after a run id's reuse, is not this one's).
pub(crate) fn next(entry: Option<&CacheEntry>, artifact_id: &str, now: Millis) -> Next {
    let Some(entry) = entry else {
        return Next::Claim { expected: None };
    };
    let kept: Option<KeptUrl> = entry
        .value
        .as_deref()
        .and_then(|v| serde_json::from_str(v).ok());
    match kept {
        Some(k) if now < k.until && k.artifact_id == artifact_id => Next::Use(k.url),
        _ if now - entry.claimed_at < CLAIM_MS && entry.claimed_at > entry.fetched_at => Next::Wait,
        _ => Next::Claim {
            expected: Some(entry.version),
        },
    }
}

/// Until when `url` (obtained at `now`) may be handed out: its own expiry (S3's
/// `X-Amz-Expires`, from its `X-Amz-Date` or else from now; Google's `X-Goog-*` alike; else
/// a minute) less a margin of a quarter of its life, a minute at most.
pub(crate) fn usable_until(url: &url::Url, now: Millis) -> Millis {
    let param = |names: [&str; 2]| {
        url.query_pairs()
            .find(|(k, _)| names.iter().any(|n| k.eq_ignore_ascii_case(n)))
            .map(|(_, v)| v.into_owned())
    };
    let signed_at = param(["X-Amz-Date", "X-Goog-Date"]).and_then(|d| basic_iso8601(&d));
    let life = param(["X-Amz-Expires", "X-Goog-Expires"])
        .and_then(|s| s.parse::<i64>().ok())
        .map_or(URL_DEFAULT_LIFE_MS, |secs| secs.saturating_mul(1000));
    let from = signed_at.unwrap_or(now);
    let margin = (life / 4).min(URL_MARGIN_MS);
    (from.saturating_add(life) - margin).min(now + URL_MAX_KEPT_MS)
}

/// `20261125T133000Z` as milliseconds since the epoch.
fn basic_iso8601(text: &str) -> Option<Millis> {
    let t = text.strip_suffix('Z').filter(|t| t.is_ascii())?;
    let (date, time) = t.split_once('T')?;
    if date.len() != 8 || time.len() != 6 {
        return None;
    }
    let rfc3339 = format!(
        "{}-{}-{}T{}:{}:{}Z",
        &date[..4],
        &date[4..6],
        &date[6..],
        &time[..2],
        &time[2..4],
        &time[4..]
    );
    let at = humantime::parse_rfc3339(&rfc3339).ok()?;
    let since = at.duration_since(std::time::UNIX_EPOCH).ok()?;
    Millis::try_from(since.as_millis()).ok()
}

/// The token's requests left, as the last click's answer said.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Quota {
    pub(crate) remaining: i64,
    pub(crate) reset_at: Millis,
}

impl Quota {
    /// `remaining` requests left and the window resetting in `reset_secs` (when said).
    pub(crate) fn seen(remaining: i64, reset_secs: Option<i64>, now: Millis) -> Self {
        let reset = reset_secs.map_or(DEFAULT_RESET_MS, |s| s.saturating_mul(1000));
        Self {
            remaining,
            reset_at: now + reset.clamp(1000, DEFAULT_RESET_MS),
        }
    }
}

/// Whether a click may spend a request now; else in how many seconds to try again.
pub(crate) fn quota_allows(quota: Option<&Quota>, now: Millis) -> Result<(), u64> {
    match quota {
        Some(q) if now < q.reset_at && q.remaining < QUOTA_RESERVE => {
            Err(((q.reset_at - now) as u64).div_ceil(1000))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(value: Option<KeptUrl>, fetched_at: Millis, claimed_at: Millis) -> CacheEntry {
        CacheEntry {
            value: value.map(|v| serde_json::to_string(&v).unwrap()),
            fetched_at,
            claimed_at,
            // Apart from the times, so a claim that named a time would not match it.
            version: 7,
            expires_at: None,
        }
    }

    fn kept(until: Millis) -> Option<KeptUrl> {
        Some(KeptUrl {
            url: "https://s3/zip".into(),
            artifact_id: "a1".into(),
            until,
        })
    }

    #[test]
    fn a_click_uses_a_kept_url_waits_for_a_fetch_or_claims_one() {
        let now = 100_000;
        let use_it = Next::Use("https://s3/zip".into());
        // (what the store keeps, what the click does)
        let table = [
            (None, Next::Claim { expected: None }),
            (Some(entry(kept(now + 1), 90_000, 90_000)), use_it),
            // Expired: whoever claims first fetches; the others wait for its URL.
            (
                Some(entry(kept(now), 90_000, 90_000)),
                Next::Claim { expected: Some(7) },
            ),
            (Some(entry(kept(now), 90_000, now - 1)), Next::Wait),
            (Some(entry(None, 0, now - 5_000)), Next::Wait),
            // A claim whose holder died is taken over.
            (
                Some(entry(None, 0, now - CLAIM_MS)),
                Next::Claim { expected: Some(7) },
            ),
            (Some(entry(None, 0, 0)), Next::Claim { expected: Some(7) }),
        ];
        for (stored, expected) in table {
            assert_eq!(next(stored.as_ref(), "a1", now), expected, "{stored:?}");
        }
        // A URL kept for another artifact (a run id used again) is not this link's.
        let other = entry(kept(now + 60_000), 90_000, 90_000);
        assert_eq!(
            next(Some(&other), "a2", now),
            Next::Claim { expected: Some(7) }
        );
    }

    #[test]
    fn a_url_is_used_until_shortly_before_it_expires() {
        let now = 1_764_077_400_000; // 2025-11-25T13:30:00Z
        let s3 = "https://bucket.s3.amazonaws.com/zip?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Date=20251125T133000Z&X-Amz-Expires=600&X-Amz-Signature=ab";
        let minute =
            "https://bucket.s3.amazonaws.com/zip?X-Amz-Date=20251125T133000Z&X-Amz-Expires=60";
        let gcs =
            "https://storage.googleapis.com/b/zip?X-Goog-Date=20251125T132900Z&X-Goog-Expires=300";
        let long =
            "https://bucket.s3.amazonaws.com/zip?X-Amz-Date=20251125T133000Z&X-Amz-Expires=604800";
        let undated = "https://bucket.s3.amazonaws.com/zip?X-Amz-Expires=60";
        for (url, until) in [
            (s3, now + 540_000),
            (minute, now + 45_000),
            (gcs, now + 180_000),
            (long, now + URL_MAX_KEPT_MS),
            (undated, now + 45_000),
            ("https://storage/zip", now + 45_000),
            (
                "https://s3/zip?X-Amz-Date=2025112éT133000Z&X-Amz-Expires=60",
                now + 45_000,
            ),
            (
                "https://s3/zip?X-Amz-Date=garbage&X-Amz-Expires=600",
                now + 540_000,
            ),
        ] {
            assert_eq!(usable_until(&url.parse().unwrap(), now), until, "{url}");
        }
    }

    #[test]
    fn a_click_leaves_the_reserve_alone() {
        let now = 10_000;
        let q = |remaining, reset_at| {
            Some(Quota {
                remaining,
                reset_at,
            })
        };
        for (quota, allowed) in [
            (None, Ok(())),
            (q(QUOTA_RESERVE, now + 30_000), Ok(())),
            (q(QUOTA_RESERVE - 1, now + 30_000), Err(30)),
            (q(0, now + 1_500), Err(2)),
            (q(0, now), Ok(())),
        ] {
            assert_eq!(quota_allows(quota.as_ref(), now), allowed, "{quota:?}");
        }
        assert_eq!(Quota::seen(7, Some(12), now).reset_at, now + 12_000);
        assert_eq!(Quota::seen(7, None, now).reset_at, now + 60_000);
        assert_eq!(Quota::seen(7, Some(0), now).reset_at, now + 1_000);
    }
}
