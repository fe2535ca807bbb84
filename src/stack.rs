//! A deployment's configuration read from its CloudFormation stack, for the operator command's
//! `--stack NAME`: the stack's `SweepFunctionName` output names the sweep function, whose
//! environment is the configuration the functions run with (the jobs table, Buildkite's org
//! and pipeline, the tunables), and the secret it names holds the rest. Nothing comes from
//! the operator's shell but which AWS account and region to ask, so a shell set up for another
//! deployment cannot mix its values in.

use std::collections::BTreeMap;

use aws_config::BehaviorVersion;

use crate::secrets::SECRET_ID_VAR;

/// The output naming the function whose configuration is the deployment's.
const FUNCTION_OUTPUT: &str = "SweepFunctionName";

#[derive(Debug, thiserror::Error)]
pub enum StackError {
    #[error("stack {stack} could not be read")]
    Stack {
        stack: String,
        #[source]
        source: Box<aws_sdk_cloudformation::Error>,
    },
    #[error("stack {stack} has no {FUNCTION_OUTPUT} output: is it a kernelbot-dispatch stack?")]
    NotOurs { stack: String },
    #[error("the configuration of function {function} could not be read")]
    Function {
        function: String,
        #[source]
        source: Box<aws_sdk_lambda::Error>,
    },
    #[error("secret {secret} could not be read")]
    Secret {
        secret: String,
        #[source]
        source: Box<aws_sdk_secretsmanager::Error>,
    },
    #[error("secret {secret} is not a JSON object of strings")]
    Malformed { secret: String },
}

/// The variables the deployment's functions see: their environment, and the keys of their
/// secret (a variable set on the function keeps its value, as in the functions).
pub async fn configuration(stack: &str) -> Result<BTreeMap<String, String>, StackError> {
    let aws = aws_config::defaults(BehaviorVersion::latest()).load().await;
    let function = sweep_function(&aws, stack).await?;
    let mut env = environment(&aws, &function).await?;
    // Read here with the operator's own rights: the extension runs only beside a function.
    if let Some(secret) = env.remove(SECRET_ID_VAR) {
        let known = crate::secrets::keys();
        for (key, value) in secret_keys(&aws, &secret).await? {
            if known.contains(&key.as_str()) {
                env.entry(key).or_insert(value);
            }
        }
    }
    Ok(env)
}

async fn sweep_function(aws: &aws_config::SdkConfig, stack: &str) -> Result<String, StackError> {
    let described = aws_sdk_cloudformation::Client::new(aws)
        .describe_stacks()
        .stack_name(stack)
        .send()
        .await
        .map_err(|e| StackError::Stack {
            stack: stack.to_owned(),
            source: Box::new(e.into()),
        })?;
    described
        .stacks()
        .iter()
        .flat_map(|s| s.outputs())
        .find(|o| o.output_key() == Some(FUNCTION_OUTPUT))
        .and_then(|o| o.output_value())
        .map(str::to_owned)
        .ok_or_else(|| StackError::NotOurs {
            stack: stack.to_owned(),
        })
}

async fn environment(
    aws: &aws_config::SdkConfig,
    function: &str,
) -> Result<BTreeMap<String, String>, StackError> {
    let config = aws_sdk_lambda::Client::new(aws)
        .get_function_configuration()
        .function_name(function)
        .send()
        .await
        .map_err(|e| StackError::Function {
            function: function.to_owned(),
            source: Box::new(e.into()),
        })?;
    let variables = config.environment().and_then(|e| e.variables());
    Ok(variables
        .map(|v| v.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default())
}

async fn secret_keys(
    aws: &aws_config::SdkConfig,
    secret: &str,
) -> Result<BTreeMap<String, String>, StackError> {
    let value = aws_sdk_secretsmanager::Client::new(aws)
        .get_secret_value()
        .secret_id(secret)
        .send()
        .await
        .map_err(|e| StackError::Secret {
            secret: secret.to_owned(),
            source: Box::new(e.into()),
        })?;
    let malformed = || StackError::Malformed {
        secret: secret.to_owned(),
    };
    let text = value.secret_string().ok_or_else(malformed)?;
    serde_json::from_str(text).map_err(|_| malformed())
}
