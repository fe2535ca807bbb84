//! `template.yaml` as a deployment needs it: alarms that reach a person (a topic under a key
//! CloudWatch may use), logs that expire, a sweep that is missed when it stops, a dashboard,
//! and nothing an account may refuse (no fixed reserved concurrency).

use serde_yaml_ng::Value;

fn template() -> Value {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/template.yaml"))
        .expect("template.yaml");
    serde_yaml_ng::from_str(&text).expect("parses")
}

/// A value as YAML text (the intrinsics, `!Ref X`, show as written).
fn text(v: &Value) -> String {
    serde_yaml_ng::to_string(v).unwrap()
}

fn of_type<'a>(t: &'a Value, kind: &str) -> Vec<(&'a str, &'a Value)> {
    t["Resources"]
        .as_mapping()
        .unwrap()
        .iter()
        .filter(|(_, r)| r["Type"].as_str() == Some(kind))
        .map(|(k, r)| (k.as_str().unwrap(), r))
        .collect()
}

#[test]
fn alarms_reach_a_person_through_a_key_cloudwatch_may_use() {
    let t = template();
    let topic = &t["Resources"]["AlarmTopic"]["Properties"]["KmsMasterKeyId"];
    assert!(
        !text(topic).contains("alias/aws/sns"),
        "CloudWatch cannot use the AWS-managed key"
    );
    let keys = of_type(&t, "AWS::KMS::Key");
    let [(key, resource)] = keys.as_slice() else {
        panic!("one customer key: {keys:?}");
    };
    assert!(
        text(topic).contains(key),
        "the topic is under {key}: {}",
        text(topic)
    );
    let grants = resource["Properties"]["KeyPolicy"]["Statement"]
        .as_sequence()
        .unwrap();
    let cloudwatch = grants
        .iter()
        .find(|s| s["Principal"]["Service"].as_str() == Some("cloudwatch.amazonaws.com"))
        .expect("CloudWatch may use the key");
    let actions = text(&cloudwatch["Action"]);
    assert!(
        actions.contains("kms:Decrypt") && actions.contains("kms:GenerateDataKey"),
        "{actions}"
    );
    // Every alarm tells the topic.
    for (name, alarm) in of_type(&t, "AWS::CloudWatch::Alarm") {
        let actions = text(&alarm["Properties"]["AlarmActions"]);
        assert!(actions.contains("AlarmTopic"), "{name}: {actions}");
    }
}

#[test]
fn every_function_logs_to_a_group_that_expires() {
    let t = template();
    assert_eq!(
        t["Parameters"]["LogRetentionDays"]["Default"].as_u64(),
        Some(30)
    );
    let groups = of_type(&t, "AWS::Logs::LogGroup");
    for function in ["SubmitFunction", "WebhookFunction", "SweepFunction"] {
        let props = &t["Resources"][function]["Properties"];
        let group = text(&props["LoggingConfig"]["LogGroup"]);
        let (name, resource) = groups
            .iter()
            .find(|(name, _)| group.contains(name))
            .unwrap_or_else(|| panic!("{function} logs to {group}"));
        let retention = text(&resource["Properties"]["RetentionInDays"]);
        assert!(
            retention.contains("LogRetentionDays"),
            "{name}: {retention}"
        );
        // No fixed reservation: a new account refuses one below its unreserved floor.
        let reserved = text(&props["ReservedConcurrentExecutions"]);
        assert!(reserved.contains("AWS::NoValue"), "{function}: {reserved}");
        assert!(
            text(&props["Timeout"]).contains("Timeout"),
            "{function}: a parameter"
        );
    }
}

#[test]
fn a_stopped_sweep_and_undelivered_results_raise_alarms_and_a_dashboard_shows_them() {
    let t = template();
    let alarms = of_type(&t, "AWS::CloudWatch::Alarm");
    let heartbeat = alarms
        .iter()
        .map(|(_, a)| &a["Properties"])
        .find(|p| {
            p["MetricName"].as_str() == Some("Invocations")
                && text(&p["Dimensions"]).contains("SweepFunction")
        })
        .expect("a heartbeat on the sweep's invocations");
    assert_eq!(heartbeat["TreatMissingData"].as_str(), Some("breaching"));
    assert_eq!(
        heartbeat["ComparisonOperator"].as_str(),
        Some("LessThanThreshold")
    );
    for metric in ["DeliveriesGivenUp", "OpenJobsPastDeadline"] {
        assert!(
            alarms.iter().any(|(_, a)| text(a).contains(metric)),
            "an alarm on {metric}"
        );
    }
    let dashboards = of_type(&t, "AWS::CloudWatch::Dashboard");
    let [(_, dashboard)] = dashboards.as_slice() else {
        panic!("one dashboard");
    };
    let body = text(&dashboard["Properties"]["DashboardBody"]);
    for metric in [
        "JobsFinished",
        "ReportLatency",
        "ReportsPending",
        "BuildkiteRateLimitRemaining",
    ] {
        assert!(body.contains(metric), "the dashboard shows {metric}");
    }
}
