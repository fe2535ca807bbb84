//! The environment the functions read when they run against the stand-ins: where the
//! stand-ins listen, and the secrets the functions share with them and with their callers.
//! The stack (tests, benchmarks) and the local run both build theirs here.

use std::collections::BTreeMap;

use super::buildkite::BuildkiteStandin;
use super::discord::DiscordStandin;

/// What the functions, the stand-ins and the callers must agree on.
pub struct Secrets {
    /// `BUILDKITE_API_TOKEN`: the one token the Buildkite stand-in was started with.
    pub buildkite_token: String,
    /// `BUILDKITE_WEBHOOK_SECRET`: one or more, comma-separated; any verifies a webhook.
    pub webhook_secret: String,
    /// `SUBMIT_API_TOKEN`.
    pub submit_token: String,
    /// `PROFILE_LINK_SECRET`.
    pub profile_link_secret: String,
}

/// The functions' environment: the stand-ins' URLs and names, and `secrets`.
pub fn function_env(
    buildkite: &BuildkiteStandin,
    discord: &DiscordStandin,
    secrets: &Secrets,
) -> BTreeMap<String, String> {
    [
        ("BUILDKITE_API_URL", &buildkite.api_url),
        ("BUILDKITE_API_TOKEN", &secrets.buildkite_token),
        ("BUILDKITE_ORG", &buildkite.org),
        ("BUILDKITE_PIPELINE", &buildkite.pipeline),
        ("BUILDKITE_WEBHOOK_SECRET", &secrets.webhook_secret),
        ("DISCORD_API_URL", &discord.api_url),
        ("SUBMIT_API_TOKEN", &secrets.submit_token),
        ("PROFILE_LINK_SECRET", &secrets.profile_link_secret),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_owned(), value.clone()))
    .collect()
}
