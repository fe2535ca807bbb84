//! CloudWatch metrics in the embedded metric format (EMF): one JSON object per line on
//! stdout, which Lambda's log pipeline turns into metrics. The lines are printed as they are,
//! not through the JSON log subscriber (a wrapped line is not extracted). Outside Lambda they
//! go to the debug log instead, so local output stays readable; tests keep them in memory.

#[cfg(feature = "devstack")]
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value, json};

/// The CloudWatch namespace of every metric (the alarms in `template.yaml` name it).
pub(crate) const NAMESPACE: &str = "KernelbotDispatch";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unit {
    Count,
    Seconds,
}

impl Unit {
    fn as_str(self) -> &'static str {
        match self {
            Self::Count => "Count",
            Self::Seconds => "Seconds",
        }
    }
}

#[derive(Clone, Debug)]
enum Sink {
    Stdout,
    Log,
    /// Kept for the local stack's tests.
    #[cfg(feature = "devstack")]
    Memory(Arc<Mutex<Vec<Value>>>),
}

/// Where a function's metrics go, with the `Function` dimension they all carry.
#[derive(Clone, Debug)]
pub(crate) struct Metrics {
    function: &'static str,
    sink: Sink,
}

impl Metrics {
    /// Stdout under Lambda, the debug log elsewhere.
    pub(crate) fn for_function(function: &'static str) -> Self {
        let sink = if super::is_lambda() {
            Sink::Stdout
        } else {
            Sink::Log
        };
        Self { function, sink }
    }

    /// Metrics kept in `kept`, which several functions may share (tests).
    #[cfg(feature = "devstack")]
    pub(crate) fn shared(function: &'static str, kept: Arc<Mutex<Vec<Value>>>) -> Self {
        Self {
            function,
            sink: Sink::Memory(kept),
        }
    }

    /// Publishes `values` with the function's dimension and `dimensions`.
    pub(crate) fn put(&self, dimensions: &[(&str, &str)], values: &[(&str, Unit, f64)]) {
        // Outside Lambda a line is only a debug log: not built unless someone reads it.
        if matches!(self.sink, Sink::Log) && !tracing::enabled!(tracing::Level::DEBUG) {
            return;
        }
        let line = emf(crate::time::now_millis(), self.function, dimensions, values);
        match &self.sink {
            Sink::Stdout => println!("{line}"),
            Sink::Log => tracing::debug!(metrics = %line, "metrics"),
            #[cfg(feature = "devstack")]
            Sink::Memory(kept) => kept.lock().unwrap_or_else(|p| p.into_inner()).push(line),
        }
    }
}

/// One EMF object: the `_aws` directive naming each metric and dimension set, then the
/// dimension and metric values as top-level keys.
pub(crate) fn emf(
    timestamp_ms: i64,
    function: &str,
    dimensions: &[(&str, &str)],
    values: &[(&str, Unit, f64)],
) -> Value {
    let mut names = vec!["Function"];
    names.extend(dimensions.iter().map(|(k, _)| *k));
    let definitions: Vec<Value> = values
        .iter()
        .map(|(name, unit, _)| json!({"Name": name, "Unit": unit.as_str()}))
        .collect();
    let mut root = Map::new();
    root.insert(
        "_aws".into(),
        json!({"Timestamp": timestamp_ms, "CloudWatchMetrics": [{
            "Namespace": NAMESPACE, "Dimensions": [names], "Metrics": definitions}]}),
    );
    root.insert("Function".into(), json!(function));
    for (k, v) in dimensions {
        root.insert((*k).into(), json!(v));
    }
    for (name, _, value) in values {
        root.insert((*name).into(), json!(value));
    }
    Value::Object(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_an_emf_object_cloudwatch_can_extract() {
        let line = emf(
            1_700_000_000_000,
            "webhook",
            &[("Outcome", "error")],
            &[("WebhookRequests", Unit::Count, 1.0)],
        );
        let aws = &line["_aws"];
        assert_eq!(aws["Timestamp"], 1_700_000_000_000_i64);
        let directive = &aws["CloudWatchMetrics"][0];
        assert_eq!(directive["Namespace"], NAMESPACE);
        assert_eq!(directive["Dimensions"], json!([["Function", "Outcome"]]));
        assert_eq!(
            directive["Metrics"],
            json!([{"Name": "WebhookRequests", "Unit": "Count"}])
        );
        // Every named dimension and metric has its value at the top level.
        assert_eq!(
            (
                &line["Function"],
                &line["Outcome"],
                &line["WebhookRequests"]
            ),
            (&json!("webhook"), &json!("error"), &json!(1.0))
        );
        assert!(!line.to_string().contains('\n'), "one object per line");
    }
}
