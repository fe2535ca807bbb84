//! The job's path through the system, arrow by arrow of the flow in DESIGN.md:
//! [`submit`] records a job and creates (or defers) its build, [`events`] moves it forward on
//! signed webhooks, [`deliver`] drains the Discord and callback outboxes, [`sweep`] finishes whatever the
//! others left undone. The decisions they act on are pure functions in [`rules`].
//!
//! Data flows one way: http → flow → (buildkite | discord | jobs).

pub mod cancel;
pub mod deliver;
pub mod events;
mod follow;
pub mod queues;
pub mod rules;
pub mod submit;
pub mod sweep;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use crate::buildkite::{BuildkiteClient, BuildkiteError};
use crate::callback::CallbackSender;
use crate::config::Config;
use crate::discord::Notifier;
use crate::jobs::model::{Millis, now_millis};
use crate::jobs::{Job, StoreError};
use crate::retry::Deadline;
use crate::telemetry::metrics::Metrics;

pub use cancel::Canceled;
pub use events::EventOutcome;
pub use submit::Submitted;
pub use sweep::SweepReport;

/// The clients and the store, nothing else.
#[derive(Clone)]
pub struct Dispatcher {
    pub store: Arc<dyn crate::jobs::JobStore>,
    pub buildkite: BuildkiteClient,
    pub discord: Notifier,
    /// Signed callbacks, when `CALLBACK_URL` is set.
    pub callbacks: Option<CallbackSender>,
    pub config: Arc<Config>,
    pub clock: Clock,
    pub metrics: Metrics,
}

/// Wall-clock time in milliseconds, which tests can move forward (deadlines of hours and the
/// 24 h give-up are tested without waiting).
#[derive(Clone, Debug, Default)]
pub struct Clock {
    skew: Arc<AtomicI64>,
}

impl Clock {
    pub fn now(&self) -> Millis {
        now_millis() + self.skew.load(Ordering::Relaxed)
    }

    pub fn advance(&self, by: Duration) {
        self.skew
            .fetch_add(by.as_millis() as i64, Ordering::Relaxed);
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Buildkite refused to create the build (4xx other than 429); the job is `failed`.
    #[error("Buildkite did not create the build: {source}")]
    BuildRefused {
        job: Box<Job>,
        #[source]
        source: BuildkiteError,
    },
    /// Buildkite could not be reached to read a build; the sweep will try again.
    #[error("Buildkite unavailable: {0}")]
    Buildkite(#[from] BuildkiteError),
    /// The pipeline itself is unreachable (token, org or slug wrong): nothing was changed.
    #[error(
        "the Buildkite pipeline cannot be read ({0}); check BUILDKITE_ORG, BUILDKITE_PIPELINE and the token"
    )]
    Pipeline(#[source] BuildkiteError),
}

/// Time kept back after Buildkite work for the state write (DynamoDB's own bound is 5 s).
const STORE_RESERVE: Duration = Duration::from_secs(5);

impl Dispatcher {
    /// The part of `deadline` Buildkite work may use: the state write and one Discord attempt
    /// must still fit after it, or a function could die between the two.
    pub(crate) fn buildkite_deadline(&self, deadline: Deadline) -> Deadline {
        deadline.less(STORE_RESERVE + self.discord.timeout())
    }

    pub fn new(config: Arc<Config>, store: Arc<dyn crate::jobs::JobStore>) -> Result<Self, String> {
        Ok(Self {
            store,
            buildkite: BuildkiteClient::new(&config.buildkite).map_err(|e| e.to_string())?,
            discord: Notifier::new(config.discord.api_url.clone()).map_err(|e| e.to_string())?,
            callbacks: config
                .callback
                .as_ref()
                .map(CallbackSender::new)
                .transpose()
                .map_err(|e| e.to_string())?,
            config,
            clock: Clock::default(),
            metrics: Metrics::for_function("local"),
        })
    }
}
