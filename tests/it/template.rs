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
    // Webhooks signed with an unknown key (a rotation done on one side only) and 5xx answers,
    // each alarmed.
    for outcome in ["unknown_key", "error"] {
        let on_it = alarms.iter().map(|(_, a)| &a["Properties"]).find(|p| {
            p["MetricName"].as_str() == Some("WebhookRequests")
                && text(&p["Dimensions"]).contains(&format!("Value: {outcome}\n"))
        });
        assert!(on_it.is_some(), "an alarm on webhooks {outcome}");
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

/// The GPU incidents alarm sums every series a function may count: each kind of incident
/// (a pre-flight failure, an agent that stayed offline, throttled runs of several
/// submissions on one agent) from each function that may decide it (the webhook, where a
/// report or an agent event is handled; the sweep, which sends what the webhook did not and
/// looks for agents that stayed away). A series left out would never raise it.
#[test]
fn the_gpu_incidents_alarm_sums_every_kind_from_every_function() {
    let t = template();
    let alarm = &t["Resources"]["GpuIncidentsAlarm"]["Properties"];
    let metrics = alarm["Metrics"].as_sequence().expect("metric math");
    let expression = metrics
        .iter()
        .find_map(|m| m["Expression"].as_str())
        .expect("a sum");
    let mut series = Vec::new();
    for m in metrics.iter().filter(|m| m["MetricStat"].is_mapping()) {
        let stat = &m["MetricStat"];
        assert_eq!(stat["Metric"]["MetricName"].as_str(), Some("GpuIncidents"));
        let dimension = |name: &str| {
            stat["Metric"]["Dimensions"]
                .as_sequence()
                .unwrap()
                .iter()
                .find(|d| d["Name"].as_str() == Some(name))
                .and_then(|d| d["Value"].as_str())
                .unwrap_or_default()
                .to_owned()
        };
        let id = m["Id"].as_str().unwrap();
        assert!(
            expression.contains(&format!("FILL({id}, 0)")),
            "{id} is summed"
        );
        series.push((dimension("Function"), dimension("Kind")));
    }
    series.sort();
    let mut want = Vec::new();
    for function in ["sweep", "webhook"] {
        for kind in ["heat", "infra", "offline"] {
            want.push((function.to_owned(), kind.to_owned()));
        }
    }
    assert_eq!(series, want);
    assert_eq!(alarm["Threshold"].as_f64(), Some(1.0));
}

/// The rush benchmark prices store calls by the jobs table's indexes as the counting store
/// knows them: they are the template's (name, hash key, projected attributes).
#[test]
fn the_store_counter_knows_the_jobs_table_s_indexes() {
    let t = template();
    let tables = of_type(&t, "AWS::DynamoDB::Table");
    let (_, table) = tables.first().expect("the jobs table");
    let mut indexes: Vec<(String, String, Option<Vec<String>>)> =
        table["Properties"]["GlobalSecondaryIndexes"]
            .as_sequence()
            .expect("indexes")
            .iter()
            .map(|i| {
                let name = i["IndexName"].as_str().unwrap().to_owned();
                let key = i["KeySchema"][0]["AttributeName"]
                    .as_str()
                    .unwrap()
                    .to_owned();
                let range = i["KeySchema"][1]["AttributeName"]
                    .as_str()
                    .map(str::to_owned);
                let projected = match i["Projection"]["ProjectionType"].as_str() {
                    Some("ALL") => None,
                    _ => {
                        let mut attrs: Vec<String> = i["Projection"]["NonKeyAttributes"]
                            .as_sequence()
                            .map(|s| {
                                s.iter()
                                    .filter_map(|a| a.as_str().map(str::to_owned))
                                    .collect()
                            })
                            .unwrap_or_default();
                        attrs.extend(range);
                        attrs.sort();
                        Some(attrs)
                    }
                };
                (name, key, projected)
            })
            .collect();
    indexes.sort();
    let mut counted: Vec<(String, String, Option<Vec<String>>)> =
        kernelbot_dispatch::devstack::units::INDEXES
            .iter()
            .map(|(name, key, projected)| {
                let projected = projected.map(|p| {
                    let mut p: Vec<String> = p.iter().map(|a| (*a).to_owned()).collect();
                    p.sort();
                    p
                });
                ((*name).to_owned(), (*key).to_owned(), projected)
            })
            .collect();
    counted.sort();
    assert_eq!(counted, indexes);
}

/// The service's tunables are stack parameters, each defaulting to what
/// `docs/configuration.md` says the code's default is, so an operator changes one with
/// `--parameter-overrides` and a stack left alone behaves as documented. A failed sweep pass
/// is not invoked again by Lambda: a retry would overlap the next pass.
#[test]
fn tunables_are_parameters_with_the_documented_defaults() {
    let t = template();
    let docs = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/configuration.md"
    ))
    .unwrap();
    let documented = |name: &str| -> String {
        let row = docs
            .lines()
            .find(|l| l.starts_with(&format!("| `{name}` |")))
            .unwrap_or_else(|| panic!("{name} is documented"));
        row.split('|')
            .nth(2)
            .unwrap()
            .trim()
            .trim_matches('`')
            .to_owned()
    };
    let globals = &t["Globals"]["Function"]["Environment"]["Variables"];
    for (variable, parameter) in [
        ("QUEUE_TIMEOUT_SECS", "QueueTimeoutSeconds"),
        ("JOB_MAX_AGE_SECS", "JobMaxAgeSeconds"),
        ("SWEEP_MAX_CALLS", "SweepMaxCalls"),
        ("USER_MAX_IN_FLIGHT", "UserMaxInFlight"),
        ("USER_MAX_WAITING", "UserMaxWaiting"),
        ("PROFILE_LINK_TTL_SECS", "ProfileLinkTtlSeconds"),
        ("RESULT_CACHE_SECS", "ResultCacheSeconds"),
        ("USER_GPU_SECONDS_PER_DAY", "UserGpuSecondsPerDay"),
    ] {
        assert_eq!(
            text(&globals[variable]).trim(),
            format!("!Ref {parameter}"),
            "{variable} comes from a parameter"
        );
        let default = &t["Parameters"][parameter]["Default"];
        let default = text(default).trim().trim_matches('\'').to_owned();
        assert_eq!(default, documented(variable), "{parameter}'s default");
    }
    // A duration the functions refuse at start-up (past a year) is refused by the deploy.
    for parameter in [
        "QueueTimeoutSeconds",
        "JobMaxAgeSeconds",
        "SweepMinAgeSeconds",
    ] {
        let max = text(&t["Parameters"][parameter]["MaxValue"]);
        let max: u64 = max
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{parameter}: {max}"));
        assert!(max <= 365 * 24 * 3600, "{parameter}: {max}");
    }
    let sweep = &t["Resources"]["SweepFunction"]["Properties"];
    assert_eq!(
        sweep["EventInvokeConfig"]["MaximumRetryAttempts"].as_u64(),
        Some(0)
    );
}

/// The value an intrinsic gives for the stack's parameters, a public SSM parameter's value
/// being what `ssm` says for its path: only the functions the layer's expression uses (`!Ref`,
/// `!If`, `!Equals`, `!Not`).
fn resolve(t: &Value, v: &Value, params: &[(&str, &str)], ssm: &[(&str, &str)]) -> Option<String> {
    let given = |name: &str| {
        params
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| (*v).to_owned())
    };
    let reference = |name: &str| -> Option<String> {
        let parameter = &t["Parameters"][name];
        let default = text(&parameter["Default"])
            .trim()
            .trim_matches('\'')
            .to_owned();
        let value = given(name).unwrap_or(default);
        if parameter["Type"]
            .as_str()?
            .starts_with("AWS::SSM::Parameter::Value")
        {
            return ssm
                .iter()
                .find(|(path, _)| *path == value)
                .map(|(_, v)| (*v).to_owned());
        }
        Some(value)
    };
    let Value::Tagged(tagged) = v else {
        return v.as_str().map(str::to_owned);
    };
    let args = tagged.value.as_sequence();
    let arg = |i: usize| args.and_then(|a| a.get(i));
    let value = |v: &Value| resolve(t, v, params, ssm);
    let truth = |c: &Value| value(c).map(|s| s == "true");
    match tagged.tag.to_string().as_str() {
        "!Ref" => reference(tagged.value.as_str()?),
        "!Equals" => Some((value(arg(0)?)? == value(arg(1)?)?).to_string()),
        "!Not" => Some((!truth(arg(0)?)?).to_string()),
        "!If" => {
            let condition = &t["Conditions"][arg(0)?.as_str()?];
            value(if truth(condition)? { arg(1)? } else { arg(2)? })
        }
        _ => None,
    }
}

/// The secrets extension's layer is AWS's current one for the stack's region and the
/// functions' architecture, read at deploy time from the public parameters AWS keeps per
/// region (paths as AWS documents them); a given ARN pins one instead.
#[test]
fn the_secrets_extension_s_layer_follows_region_and_architecture() {
    let t = template();
    let layers = t["Globals"]["Function"]["Layers"].as_sequence().unwrap();
    assert_eq!(layers.len(), 1);
    const ARM: &str = "/aws/service/aws-parameters-and-secrets-lambda-extension/arm64/latest";
    const X86: &str = "/aws/service/aws-parameters-and-secrets-lambda-extension/x86/latest";
    // Two regions' public parameters, as AWS answers them (each region its own account and
    // versions).
    let eu = [
        (
            ARM,
            "arn:aws:lambda:eu-west-1:015030872274:layer:AWS-Parameters-and-Secrets-Lambda-Extension-Arm64:24",
        ),
        (
            X86,
            "arn:aws:lambda:eu-west-1:015030872274:layer:AWS-Parameters-and-Secrets-Lambda-Extension:31",
        ),
    ];
    let us = [
        (
            ARM,
            "arn:aws:lambda:us-east-1:177933569100:layer:AWS-Parameters-and-Secrets-Lambda-Extension-Arm64:26",
        ),
        (
            X86,
            "arn:aws:lambda:us-east-1:177933569100:layer:AWS-Parameters-and-Secrets-Lambda-Extension:30",
        ),
    ];
    let layer =
        |params: &[(&str, &str)], ssm: &[(&str, &str)]| resolve(&t, &layers[0], params, ssm);
    assert_eq!(
        layer(&[], &eu).as_deref(),
        Some(eu[0].1),
        "arm64 by default"
    );
    assert_eq!(
        layer(&[("Architecture", "x86_64")], &eu).as_deref(),
        Some(eu[1].1)
    );
    assert_eq!(layer(&[], &us).as_deref(), Some(us[0].1));
    assert_eq!(
        layer(&[("Architecture", "x86_64")], &us).as_deref(),
        Some(us[1].1)
    );
    let pinned = "arn:aws:lambda:eu-west-1:015030872274:layer:AWS-Parameters-and-Secrets-Lambda-Extension-Arm64:11";
    assert_eq!(
        layer(&[("SecretsExtensionLayerArn", pinned)], &eu).as_deref(),
        Some(pinned)
    );
}

/// What `kernelbot-dispatch --stack` reads is where the template puts it: the sweep function
/// named by an output, the table and the secret's name in every function's environment.
#[test]
fn the_stack_names_what_the_operator_command_reads() {
    let t = template();
    let output = text(&t["Outputs"]["SweepFunctionName"]["Value"]);
    assert_eq!(output.trim(), "!Ref SweepFunction");
    let vars = &t["Globals"]["Function"]["Environment"]["Variables"];
    assert_eq!(text(&vars["JOBS_TABLE"]).trim(), "!Ref JobsTable");
    assert_eq!(text(&vars["KERNELBOT_SECRET_ID"]).trim(), "!Ref SecretName");
}
