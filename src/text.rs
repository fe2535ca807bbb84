//! Text shown to people (Discord, error bodies, reports): cut to a length with the cut
//! marked, and escaped so that text someone else wrote (a title, a test's spec, an error a
//! program printed) shows as written and never as markdown of its own.

/// Shortens `s` to at most `max` characters, marking the cut with `…`.
pub(crate) fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// What Discord's markdown acts on within a line: emphasis, strike-through, spoilers, code,
/// masked links (`[` and `]`: a `(` alone forms nothing), mentions and timestamps (`<`, `@`);
/// and `#` and `>`, which start headings and quotes. A bare link needs `://`, whose colon is
/// escaped where it occurs. Escaped text never starts a line (it follows our own words, and a
/// line break becomes a space), so the list markers need no escape.
const MARKDOWN: &[char] = &['\\', '*', '_', '~', '`', '|', '>', '#', '[', ']', '<', '@'];

/// `s` as plain text in a Discord message, placed after text of ours on a line: every
/// character markdown acts on is escaped with a backslash, so it cannot form emphasis, a
/// link (masked or bare: `https\://` is no link), a heading, a code span or block, or a
/// mention; a line break becomes a space.
pub(crate) fn plain(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + s.len() / 4);
    for (i, c) in s.char_indices() {
        let bare_link = c == ':' && s[i + 1..].starts_with("//");
        match c {
            '\n' | '\r' => out.push(' '),
            c if bare_link || MARKDOWN.contains(&c) => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out
}

/// What an empty value shows as: Discord's inline-code rule needs a character that is not a
/// backtick between the two, and an empty span's backticks would pair with the next lone
/// backtick instead, possibly lines later, leaving what lies between as markdown.
const EMPTY: &str = "(empty)";

/// `s` as a whole code span (`` `…` ``), where markdown, links and mentions do not apply:
/// it cannot end the span early (a backtick becomes `ˋ`), break the line it is on, or be
/// empty (it shows as `(empty)`), so the span always closes where it was meant to.
pub(crate) fn span(s: &str) -> String {
    let inside: String = s
        .chars()
        .map(|c| match c {
            '`' => 'ˋ',
            '\n' | '\r' => ' ',
            c => c,
        })
        .collect();
    let inside = if inside.is_empty() { EMPTY } else { &inside };
    format!("`{inside}`")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_is_marked_and_counted_in_characters() {
        assert_eq!(truncate("héllo", 5), "héllo");
        assert_eq!(truncate("héllo wörld", 5), "héll…");
        assert_eq!(truncate("abc", 0), "…");
    }

    #[test]
    fn shown_text_cannot_become_markdown() {
        assert_eq!(
            plain("x` [Claim](https://evil) `y"),
            r"x\` \[Claim\](https\://evil) \`y"
        );
        assert_eq!(
            plain("# @everyone\n> **hi**"),
            r"\# \@everyone \> \*\*hi\*\*"
        );
        assert_eq!(
            plain(r"a\[b"),
            r"a\\\[b",
            "a backslash cannot undo an escape"
        );
        assert_eq!(
            span("x` [Claim](https://evil) `y\nz"),
            "`xˋ [Claim](https://evil) ˋy z`"
        );
    }

    #[test]
    fn a_span_is_never_empty() {
        for (value, shown) in [("", "`(empty)`"), ("`", "`ˋ`"), (" ", "` `"), ("\n", "` `")] {
            assert_eq!(span(value), shown, "{value:?}");
        }
    }
}
