//! A deployment's configuration read from its CloudFormation stack, for the operator command's
//! `--stack NAME`: the stack's `SweepFunctionName` output names the sweep function, whose
//! environment is the configuration the functions run with (the jobs table, Buildkite's org
//! and pipeline, the tunables), and the secret it names holds the rest. Nothing comes from
//! the operator's shell but which AWS account and region to ask, so a shell set up for another
//! deployment cannot mix its values in.

use std::collections::BTreeMap;

use aws_config::BehaviorVersion;
use secrecy::SecretString;

use crate::config::Role;
use crate::secrets::{SECRET_ID_VAR, SecretsError};

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
    #[error("secret {secret} could not be used")]
    Unusable {
        secret: String,
        #[source]
        source: SecretsError,
    },
}

/// A deployment's configuration: its functions' environment, and the keys of their secret
/// the sweep function uses (the operator's command works as it does).
pub struct Configuration {
    pub environment: BTreeMap<String, String>,
    pub secrets: BTreeMap<String, SecretString>,
}

/// The configuration of the deployment `stack` names: combine the two with
/// `secrets::overlay`, as the functions do.
pub async fn configuration(stack: &str) -> Result<Configuration, StackError> {
    let aws = aws_config::defaults(BehaviorVersion::latest()).load().await;
    let function = sweep_function(&aws, stack).await?;
    let mut environment = environment(&aws, &function).await?;
    // Read here with the operator's own rights: the extension runs only beside a function.
    let secrets = match environment.remove(SECRET_ID_VAR) {
        Some(secret) if !secret.trim().is_empty() => {
            let text = secret_string(&aws, &secret).await?;
            crate::secrets::keep_from(&text, &Role::Sweep.secret_keys(), &secret)
                .map_err(|source| StackError::Unusable { secret, source })?
        }
        _ => BTreeMap::new(),
    };
    Ok(Configuration {
        environment,
        secrets,
    })
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
    // Only the stack asked for, by name or id: never the first of a listing.
    described
        .stacks()
        .iter()
        .filter(|s| s.stack_name() == Some(stack) || s.stack_id() == Some(stack))
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

async fn secret_string(aws: &aws_config::SdkConfig, secret: &str) -> Result<String, StackError> {
    let value = aws_sdk_secretsmanager::Client::new(aws)
        .get_secret_value()
        .secret_id(secret)
        .send()
        .await
        .map_err(|e| StackError::Secret {
            secret: secret.to_owned(),
            source: Box::new(e.into()),
        })?;
    value
        .secret_string()
        .map(str::to_owned)
        .ok_or_else(|| StackError::Unusable {
            secret: secret.to_owned(),
            source: SecretsError::Malformed {
                secret_id: secret.to_owned(),
            },
        })
}
