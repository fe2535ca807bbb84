//! A Discord webhook a job reports to, validated from the URL a submission names.
//!
//! The webhook token is a credential (anyone holding it can post as the webhook), so it is
//! kept in a [`SecretString`] and never printed.

use std::fmt;

use secrecy::{ExposeSecret, SecretString};

const HOSTS: &[&str] = &[
    "discord.com",
    "discordapp.com",
    "ptb.discord.com",
    "canary.discord.com",
    "ptb.discordapp.com",
    "canary.discordapp.com",
];

#[derive(Clone)]
pub struct DiscordTarget {
    pub(crate) webhook_id: String,
    pub(crate) token: SecretString,
    /// Post into this thread of the webhook's channel.
    pub(crate) thread_id: Option<String>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InvalidWebhookUrl {
    #[error("webhook_url is not a URL")]
    NotAUrl,
    #[error("webhook_url must use https")]
    NotHttps,
    #[error("webhook_url must be on discord.com or discordapp.com")]
    WrongHost,
    #[error("webhook_url must look like /api/webhooks/<id>/<token>")]
    WrongPath,
    #[error("thread_id must be a Discord snowflake (digits)")]
    BadThread,
}

fn is_snowflake(s: &str) -> bool {
    (1..=20).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit())
}

impl DiscordTarget {
    /// Parses `https://discord.com/api[/v10]/webhooks/<id>/<token>[?thread_id=<id>]`.
    pub fn parse(raw: &str, thread_id: Option<&str>) -> Result<Self, InvalidWebhookUrl> {
        let url = url::Url::parse(raw).map_err(|_| InvalidWebhookUrl::NotAUrl)?;
        if url.scheme() != "https" {
            return Err(InvalidWebhookUrl::NotHttps);
        }
        if !url.host_str().is_some_and(|h| HOSTS.contains(&h)) || url.port().is_some() {
            return Err(InvalidWebhookUrl::WrongHost);
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(InvalidWebhookUrl::WrongHost);
        }
        let segments: Vec<&str> = url.path().trim_end_matches('/').split('/').collect();
        let rest = match segments.as_slice() {
            ["", "api", "webhooks", rest @ ..] => rest,
            ["", "api", version, "webhooks", rest @ ..]
                if version
                    .strip_prefix('v')
                    .is_some_and(|n| n.parse::<u8>().is_ok()) =>
            {
                rest
            }
            _ => return Err(InvalidWebhookUrl::WrongPath),
        };
        let [id, token] = rest else {
            return Err(InvalidWebhookUrl::WrongPath);
        };
        let token_ok = (1..=100).contains(&token.len())
            && token
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'));
        if !is_snowflake(id) || !token_ok {
            return Err(InvalidWebhookUrl::WrongPath);
        }
        let from_query = url
            .query_pairs()
            .find(|(k, _)| k == "thread_id")
            .map(|(_, v)| v.into_owned());
        let thread_id = thread_id.map(str::to_owned).or(from_query);
        if thread_id.as_deref().is_some_and(|t| !is_snowflake(t)) {
            return Err(InvalidWebhookUrl::BadThread);
        }
        Ok(Self {
            webhook_id: (*id).to_owned(),
            token: SecretString::from(*token),
            thread_id,
        })
    }

    /// The rate-limit bucket its calls spend, by name: the webhook's id and a fingerprint of
    /// its token (a hash that cannot be turned back into it). A submission naming another's
    /// webhook id with a token of its own spends a bucket of its own, never the real one.
    pub(crate) fn bucket(&self) -> String {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(self.token.expose_secret().as_bytes());
        format!("{}/{}", self.webhook_id, hex::encode(&digest[..8]))
    }

    /// The webhook's path under the Discord API base, token included: never log it.
    pub(crate) fn path(&self) -> String {
        format!(
            "webhooks/{}/{}",
            self.webhook_id,
            self.token.expose_secret()
        )
    }
}

impl PartialEq for DiscordTarget {
    fn eq(&self, other: &Self) -> bool {
        self.webhook_id == other.webhook_id
            && self.token.expose_secret() == other.token.expose_secret()
            && self.thread_id == other.thread_id
    }
}

impl fmt::Debug for DiscordTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DiscordTarget")
            .field("webhook_id", &self.webhook_id)
            .field("token", &"[redacted]")
            .field("thread_id", &self.thread_id)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_webhook_s_bucket_is_its_id_and_token_never_its_token() {
        let at = |url: &str| DiscordTarget::parse(url, None).expect("a webhook URL");
        let real = at("https://discord.com/api/webhooks/42/real-token");
        let junk = at("https://discord.com/api/webhooks/42/junk-token");
        let again = at("https://discord.com/api/webhooks/42/real-token");
        assert_ne!(
            real.bucket(),
            junk.bucket(),
            "a junk token spends its own bucket"
        );
        assert_eq!(real.bucket(), again.bucket());
        assert!(real.bucket().starts_with("42/"));
        assert!(!real.bucket().contains("real-token"));
    }

    #[test]
    fn accepts_real_discord_webhook_urls() {
        for url in [
            "https://discord.com/api/webhooks/123456789012345678/abc_DEF-123",
            "https://discordapp.com/api/webhooks/1/t",
            "https://ptb.discord.com/api/v10/webhooks/1/t/",
            "https://canary.discord.com/api/webhooks/1/t?wait=true",
        ] {
            assert!(DiscordTarget::parse(url, None).is_ok(), "{url}");
        }
        let t = DiscordTarget::parse("https://discord.com/api/webhooks/1/t?thread_id=99", None)
            .unwrap();
        assert_eq!(
            (t.webhook_id.as_str(), t.thread_id.as_deref()),
            ("1", Some("99"))
        );
        assert_eq!(t.path(), "webhooks/1/t");
    }

    #[test]
    fn rejects_anything_else_with_a_reason() {
        use InvalidWebhookUrl::*;
        let cases = [
            ("not a url", NotAUrl),
            ("http://discord.com/api/webhooks/1/t", NotHttps),
            ("https://evil.com/api/webhooks/1/t", WrongHost),
            ("https://discord.com.evil.com/api/webhooks/1/t", WrongHost),
            ("https://discord.com:8443/api/webhooks/1/t", WrongHost),
            ("https://user:pw@discord.com/api/webhooks/1/t", WrongHost),
            ("https://discord.com/api/webhooks/1", WrongPath),
            ("https://discord.com/api/webhooks/abc/t", WrongPath),
            ("https://discord.com/api/webhooks/1/t/messages/2", WrongPath),
            ("https://discord.com/webhooks/1/t", WrongPath),
            ("https://discord.com/api/webhooks/1/t%2F..", WrongPath),
        ];
        for (url, want) in cases {
            assert_eq!(DiscordTarget::parse(url, None).unwrap_err(), want, "{url}");
        }
        assert_eq!(
            DiscordTarget::parse("https://discord.com/api/webhooks/1/t", Some("x")).unwrap_err(),
            BadThread
        );
    }

    #[test]
    fn debug_output_hides_the_token() {
        let t =
            DiscordTarget::parse("https://discord.com/api/webhooks/1/supersecret", None).unwrap();
        assert!(!format!("{t:?}").contains("supersecret"));
    }
}
