//! Which deployment a store belongs to: every sweep pass notes its functions' Buildkite
//! organization and pipeline and the id of their default Discord webhook (never its token)
//! in the store, and the operator command compares its own configuration with that before
//! it acts, so a shell set up for another deployment cannot cancel someone else's build #N
//! or post into the wrong channel.

use serde::{Deserialize, Serialize};

use super::{Deps, DispatchError};
use crate::jobs::{CacheEntry, StoreError, next_version};

/// Where the identity is kept: `~` is never in a run id.
const KEY: &str = "~deployment";

/// What tells one deployment from another, as its configuration says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Identity {
    org: String,
    pipeline: String,
    /// The default webhook's id (its URL's public part), when there is one.
    webhook: Option<String>,
}

impl Identity {
    /// This instance's.
    pub(crate) fn of(d: &Deps) -> Self {
        Self {
            org: d.config.buildkite.org.clone(),
            pipeline: d.config.buildkite.pipeline.clone(),
            webhook: d.default_discord.as_ref().map(|t| t.webhook_id.clone()),
        }
    }

    /// How `self` (the command's) differs from `recorded` (the functions'), in words; `None`
    /// when they agree.
    pub(crate) fn differs(&self, recorded: &Self) -> Option<String> {
        let mut what = Vec::new();
        if (&self.org, &self.pipeline) != (&recorded.org, &recorded.pipeline) {
            what.push(format!(
                "pipeline {}/{} here, {}/{} in the store",
                self.org, self.pipeline, recorded.org, recorded.pipeline
            ));
        }
        if self.webhook != recorded.webhook {
            let id = |w: &Option<String>| w.clone().unwrap_or_else(|| "none".into());
            what.push(format!(
                "default Discord webhook {} here, {} in the store",
                id(&self.webhook),
                id(&recorded.webhook)
            ));
        }
        (!what.is_empty()).then(|| what.join("; "))
    }
}

/// The identity the functions last noted in the store, if any.
pub(crate) async fn recorded(d: &Deps) -> Result<Option<Identity>, StoreError> {
    Ok(d.store.cached(KEY).await?.as_ref().and_then(noted))
}

/// The identity an entry holds (`None`: none, or one this release cannot read).
fn noted(entry: &CacheEntry) -> Option<Identity> {
    serde_json::from_str(entry.value.as_deref()?).ok()
}

/// Notes this deployment's identity in the store unless it is there already (a read a pass;
/// a write only when the configuration changed).
pub(crate) async fn note(d: &Deps) -> Result<(), DispatchError> {
    let ours = Identity::of(d);
    let entry = d.store.cached(KEY).await?;
    if entry.as_ref().and_then(noted).is_some_and(|r| r == ours) {
        return Ok(());
    }
    let now = d.clock.now();
    let version = entry.as_ref().map(|e| e.version);
    let value = serde_json::to_string(&ours).ok();
    let fresh = CacheEntry::unclaimed(value, now, next_version(version, now), None);
    // A refusal is another pass noting the same at the same time: nothing to do.
    d.store.put_cached(KEY, &fresh, version).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(org: &str, pipeline: &str, webhook: Option<&str>) -> Identity {
        Identity {
            org: org.into(),
            pipeline: pipeline.into(),
            webhook: webhook.map(Into::into),
        }
    }

    #[test]
    fn a_command_set_up_for_another_deployment_is_told_how() {
        let store = id("gpu-mode", "kernelbot", Some("111"));
        let table = [
            (id("gpu-mode", "kernelbot", Some("111")), None),
            (
                id("gpu-mode", "kernelbot-staging", Some("111")),
                Some("pipeline gpu-mode/kernelbot-staging here, gpu-mode/kernelbot in the store"),
            ),
            (
                id("gpu-mode", "kernelbot", Some("222")),
                Some("default Discord webhook 222 here, 111 in the store"),
            ),
            (
                id("other", "kernelbot", None),
                Some(
                    "pipeline other/kernelbot here, gpu-mode/kernelbot in the store; \
                     default Discord webhook none here, 111 in the store",
                ),
            ),
        ];
        for (here, says) in table {
            assert_eq!(here.differs(&store).as_deref(), says, "{here:?}");
        }
    }
}
