//! A webhook message as Discord's API takes it, and Discord's documented limits, which
//! [`Message::fit`] enforces so a valid message is never refused for its size.

use serde::Serialize;

use crate::text::truncate;

/// The attachment's file name (a run's full report).
pub const REPORT_FILENAME: &str = "report.txt";

/// Discord's documented limits (counted in characters).
pub mod limits {
    pub const CONTENT: usize = 2000;
    pub(crate) const EMBEDS: usize = 10;
    pub(crate) const TITLE: usize = 256;
    pub(crate) const DESCRIPTION: usize = 4096;
    pub(crate) const FIELDS: usize = 25;
    pub(crate) const FIELD_NAME: usize = 256;
    pub(crate) const FIELD_VALUE: usize = 1024;
    pub const FOOTER: usize = 2048;
    pub const EMBED_TOTAL: usize = 6000;
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Message {
    pub content: String,
    pub embeds: Vec<Embed>,
    /// Always sent, edits too: an edit without it falls back to Discord's default parsing,
    /// and user-supplied text (titles, test names) must never ping anyone.
    pub allowed_mentions: AllowedMentions,
    /// The report file's text, sent as the `files[0]` part; the JSON lists it under
    /// `attachments` (its id and name, never its text).
    #[serde(
        rename = "attachments",
        skip_serializing_if = "Option::is_none",
        serialize_with = "attachment_entries"
    )]
    pub file: Option<String>,
}

/// `[{"id": 0, "filename": "report.txt"}]`: the entry naming the `files[0]` part.
fn attachment_entries<S: serde::Serializer>(_: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct Entry {
        id: u32,
        filename: &'static str,
    }
    [Entry {
        id: 0,
        filename: REPORT_FILENAME,
    }]
    .serialize(s)
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct AllowedMentions {
    pub parse: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Embed {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub color: Option<u32>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<Field>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Field {
    pub name: String,
    pub value: String,
    pub inline: bool,
}

impl Message {
    /// Cuts every part to Discord's limits, so a valid job never yields a rejected message.
    pub fn fit(mut self) -> Self {
        self.content = truncate(&self.content, limits::CONTENT);
        self.embeds.truncate(limits::EMBEDS);
        let mut budget = limits::EMBED_TOTAL;
        for embed in &mut self.embeds {
            budget = embed.fit(budget);
        }
        self
    }

    /// The total Discord counts against its 6000-character embed limit.
    pub fn embed_chars(&self) -> usize {
        self.embeds.iter().map(Embed::chars).sum()
    }
}

impl Embed {
    /// Cuts the embed to its own limits and to `budget` characters of the message's total;
    /// what is left of the budget.
    fn fit(&mut self, mut budget: usize) -> usize {
        self.fields.truncate(limits::FIELDS);
        self.title = self
            .title
            .take()
            .map(|t| truncate(&t, limits::TITLE.min(budget)));
        budget -= self.title.as_ref().map_or(0, |t| t.chars().count());
        for field in &mut self.fields {
            field.name = truncate(&field.name, limits::FIELD_NAME);
            field.value = truncate(&field.value, limits::FIELD_VALUE);
        }
        // Fields are kept while they fit; the description gets what is left.
        let mut kept = Vec::new();
        for field in self.fields.drain(..) {
            let size = field.chars();
            if size + 1 > budget {
                break;
            }
            budget -= size;
            kept.push(field);
        }
        self.fields = kept;
        self.description = self
            .description
            .take()
            .map(|d| truncate(&d, limits::DESCRIPTION.min(budget)))
            .filter(|d| !d.is_empty());
        budget - self.description.as_ref().map_or(0, |d| d.chars().count())
    }

    fn chars(&self) -> usize {
        self.title.as_ref().map_or(0, |t| t.chars().count())
            + self.description.as_ref().map_or(0, |d| d.chars().count())
            + self.fields.iter().map(Field::chars).sum::<usize>()
    }
}

impl Field {
    fn chars(&self) -> usize {
        self.name.chars().count() + self.value.chars().count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_keeps_every_part_within_discord_limits() {
        let msg = Message {
            file: None,
            content: "x".repeat(5000),
            embeds: vec![Embed {
                title: Some("t".repeat(400)),
                description: Some("d".repeat(9000)),
                fields: (0..40)
                    .map(|i| Field {
                        name: format!("{i}{}", "n".repeat(300)),
                        value: "v".repeat(2000),
                        inline: false,
                    })
                    .collect(),
                ..Default::default()
            }],
            allowed_mentions: AllowedMentions::default(),
        }
        .fit();
        assert_eq!(msg.content.chars().count(), limits::CONTENT);
        assert!(msg.content.ends_with('…'));
        let e = &msg.embeds[0];
        assert!(e.title.as_ref().unwrap().chars().count() <= limits::TITLE);
        assert!(e.fields.len() <= limits::FIELDS);
        assert!(
            e.fields
                .iter()
                .all(|f| f.value.chars().count() <= limits::FIELD_VALUE
                    && f.name.chars().count() <= limits::FIELD_NAME)
        );
        assert!(
            msg.embed_chars() <= limits::EMBED_TOTAL,
            "{}",
            msg.embed_chars()
        );
    }
}
