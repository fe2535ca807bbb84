//! A `result` value as the text a report keeps of it, made as it is read: a string's own
//! text, any other value's JSON as serde_json writes a `Value` (compact, keys in the order
//! read). At most a little over the text's budget is ever held, whatever the value's size,
//! and the whole text's length is counted (a dropped report's note says it).

use std::{fmt, io};

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::cap;

/// The deepest nesting a `result` value may have. serde_json refuses a file nested more
/// than 127 levels deep, and a value sits under five (the file, `runs`, the run, `run`,
/// `result`); read on its own, a value is refused where the whole file would have been.
const MAX_DEPTH: usize = 122;

/// Values of at most this much JSON are read whole into a `serde_json::Value`, which settles
/// a key repeated in an object as it always was (the last value, at the first key's place).
/// Larger ones are written out as they are read.
const WHOLE: usize = 64 * 1024;

/// The text a value stands for, kept up to a little over a budget.
pub(super) struct Text {
    /// The whole text when `len` is within the budget; else its start, longer than the
    /// budget, so that cutting it to the budget cuts it as the whole would be cut.
    pub(super) start: String,
    /// The length of the whole text.
    pub(super) len: usize,
}

/// The text of `raw` (a string's own text; any other value's compact JSON) within `budget`.
pub(super) fn text(raw: &RawValue, budget: usize) -> Result<Text, serde_json::Error> {
    text_within(raw.get(), budget, WHOLE)
}

/// [`text`], reading values of more than `whole` bytes of JSON as they stream.
fn text_within(json: &str, budget: usize, whole: usize) -> Result<Text, serde_json::Error> {
    let mut sink = Sink::new(budget);
    if json.starts_with('"') {
        let mut de = serde_json::Deserializer::from_str(json);
        de.deserialize_str(Plain(&mut sink))?;
    } else if nesting(json) > MAX_DEPTH {
        return Err(de::Error::custom("recursion limit exceeded"));
    } else if json.len() <= whole {
        let value: serde_json::Value = serde_json::from_str(json)?;
        serde_json::to_writer(&mut sink, &value)?;
    } else {
        let mut de = serde_json::Deserializer::from_str(json);
        Render::new(&mut sink).deserialize(&mut de)?;
    }
    Ok(sink.finish())
}

/// `s` cut to `max` bytes as [`cap`] cuts it, copying no more of it than that.
pub(super) fn capped(s: &str, max: usize) -> String {
    let mut sink = Sink::new(max);
    sink.push(s.as_bytes());
    let mut text = sink.finish().start;
    cap(&mut text, max);
    text
}

/// How deeply `json` (one valid value) nests arrays and objects.
fn nesting(json: &str) -> usize {
    let (mut depth, mut deepest) = (0usize, 0);
    let (mut in_string, mut escaped) = (false, false);
    for b in json.bytes() {
        match (in_string, b) {
            (true, _) if escaped => escaped = false,
            (true, b'\\') => escaped = true,
            (true, b'"') | (false, b'"') => in_string = !in_string,
            (false, b'[' | b'{') => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            (false, b']' | b'}') => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// Text written to it, kept up to four bytes past a budget (one past it, and the rest of a
/// character cut there), and the length of all of it.
struct Sink {
    kept: Vec<u8>,
    keep: usize,
    len: usize,
}

impl Sink {
    fn new(budget: usize) -> Self {
        Self {
            kept: Vec::new(),
            keep: budget.saturating_add(4),
            len: 0,
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        self.len += bytes.len();
        let room = self.keep.saturating_sub(self.kept.len());
        self.kept.extend_from_slice(&bytes[..room.min(bytes.len())]);
    }

    fn finish(mut self) -> Text {
        // What was written is UTF-8; the cut may have split its last character.
        let valid = std::str::from_utf8(&self.kept).map_or_else(|e| e.valid_up_to(), str::len);
        self.kept.truncate(valid);
        self.kept.shrink_to_fit();
        Text {
            start: String::from_utf8(self.kept).unwrap_or_default(),
            len: self.len,
        }
    }
}

impl io::Write for Sink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.push(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A string's own text, written to the sink.
struct Plain<'a>(&'a mut Sink);

impl<'de> Visitor<'de> for Plain<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<(), E> {
        self.0.push(s.as_bytes());
        Ok(())
    }
}

/// Writes the value read, after `lead` (the separator before it), as serde_json writes it.
struct Render<'a> {
    sink: &'a mut Sink,
    lead: &'static [u8],
}

impl<'a> Render<'a> {
    fn new(sink: &'a mut Sink) -> Self {
        Self { sink, lead: b"" }
    }

    fn put<T: serde::Serialize + ?Sized, E: de::Error>(self, value: &T) -> Result<(), E> {
        serde_json::to_writer(&mut *self.sink, value).map_err(E::custom)
    }
}

impl<'de> DeserializeSeed<'de> for Render<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.sink.push(self.lead);
        d.deserialize_any(Render::new(self.sink))
    }
}

impl<'de> Visitor<'de> for Render<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any valid JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.put(&v)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.put(&v)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.put(&v)
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        // As a `Value` holds it (a number that is not finite is null).
        self.put(&serde_json::Value::from(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        self.put(v)
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.sink.push(b"null");
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.sink.push(b"[");
        let mut lead: &'static [u8] = b"";
        while seq
            .next_element_seed(Render {
                sink: &mut *self.sink,
                lead,
            })?
            .is_some()
        {
            lead = b",";
        }
        self.sink.push(b"]");
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.sink.push(b"{");
        let mut lead: &'static [u8] = b"";
        while map
            .next_key_seed(Key {
                sink: &mut *self.sink,
                lead,
            })?
            .is_some()
        {
            map.next_value_seed(Render {
                sink: &mut *self.sink,
                lead: b":",
            })?;
            lead = b",";
        }
        self.sink.push(b"}");
        Ok(())
    }
}

/// Writes an object's key read, after `lead`, as serde_json writes it.
struct Key<'a> {
    sink: &'a mut Sink,
    lead: &'static [u8],
}

impl<'de> DeserializeSeed<'de> for Key<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.sink.push(self.lead);
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        serde_json::to_writer(&mut *self.sink, v).map_err(E::custom)
    }
}

#[cfg(test)]
mod tests {
    use proptest::collection::{btree_map, vec};
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::*;

    /// Any JSON value, its strings in every width of UTF-8 and with characters to escape.
    fn any_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<u64>().prop_map(|n| json!(n)),
            any::<f64>().prop_map(|n| json!(n)),
            "[a-zé€😀\"\\\\\n\u{1}]{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(5, 64, 8, |inner| {
            prop_oneof![
                vec(inner.clone(), 0..8).prop_map(Value::Array),
                btree_map("[a-z€\"]{0,6}", inner, 0..8)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// The text the old read kept of a value: a string's own, else its JSON.
    fn whole_text(value: &Value) -> String {
        match value {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Written as it streams, in any layout, a value's text is its `Value`'s, cut alike.
        #[test]
        fn a_value_written_as_it_streams_is_the_text_of_the_whole(
            value in any_json(),
            budget in 0usize..200,
            pretty in any::<bool>(),
        ) {
            let json = if pretty {
                serde_json::to_string_pretty(&value)
            } else {
                serde_json::to_string(&value)
            };
            let json = json.expect("any value is written");
            // As read back (a float read may differ in its last digit from the one written).
            let read: Value = serde_json::from_str(&json).expect("it reads back");
            let full = whole_text(&read);
            for whole in [0, WHOLE] {
                let text = text_within(&json, budget, whole).expect("it reads");
                prop_assert_eq!(text.len, full.len());
                prop_assert!(full.starts_with(&text.start));
                prop_assert_eq!(text.start.len() > budget, full.len() > budget);
                let (mut kept, mut expected) = (text.start, full.clone());
                cap(&mut kept, budget);
                cap(&mut expected, budget);
                prop_assert_eq!(kept, expected);
            }
        }
    }

    #[test]
    fn nesting_counts_arrays_and_objects_outside_strings() {
        for (json, depth) in [
            ("1", 0),
            ("\"[{\"", 0),
            ("[]", 1),
            ("[[1], {\"a\": [2]}]", 3),
            ("[\"]\\\"[[\", [[]]]", 3),
            ("{\"[\": {\"\\\\\": [\"\\\\\"]}}", 3),
        ] {
            assert_eq!(nesting(json), depth, "{json}");
        }
    }

    #[test]
    fn a_huge_value_costs_its_budget_of_text() {
        let json = format!("[{}1]", "\"é\",".repeat(2_000_000));
        let text = text_within(&json, 100, WHOLE).expect("it reads");
        assert_eq!(text.len, json.len());
        assert!(text.start.len() <= 104 && text.start.capacity() <= 104);
        assert!(json.starts_with(&text.start));
    }
}
