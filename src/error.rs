//! What error variants keep as their source when it has no type of its own to name: any
//! error, boxed, and how its chain reads in one line.

use std::error::Error;

/// Any error, kept as a variant's source.
pub(crate) type BoxError = Box<dyn Error + Send + Sync>;

/// `error` and each of its sources, `: `-separated: the whole story in one log line. A
/// source whose text its parent already ends with is not repeated.
pub fn chain(error: &(dyn Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let part = e.to_string();
        if !text.ends_with(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("wrapped: {0}")]
    struct Says(#[source] std::io::Error);

    #[test]
    fn a_chain_reads_outermost_first_without_repeats() {
        let io = || std::io::Error::other("disk on fire");
        assert_eq!(chain(&Outer(io())), "outer: disk on fire");
        assert_eq!(chain(&Says(io())), "wrapped: disk on fire");
        let boxed: BoxError = "plain words".into();
        assert_eq!(chain(boxed.as_ref()), "plain words");
    }
}
