//! The rate-limit windows every instance spends, kept in the store: one shared entry per
//! window, taken from and told by compare-and-swap, so that all instances together stay
//! within a limit that each alone would learn only from its own answers.

use std::sync::Arc;

use async_trait::async_trait;

use super::shared::{self, SharedKey};
use super::store::JobStore;
use crate::error::BoxError;
use crate::time::Millis;
use crate::window::{News, SharedWindows, Window};

/// The windows, in `store`.
pub(crate) struct StoreWindows {
    store: Arc<dyn JobStore>,
}

impl StoreWindows {
    /// The windows kept in `store`, as the clients take them.
    pub(crate) fn of(store: Arc<dyn JobStore>) -> Arc<dyn SharedWindows> {
        Arc::new(Self { store })
    }
}

#[async_trait]
impl SharedWindows for StoreWindows {
    async fn take(
        &self,
        name: &str,
        span: Millis,
        reserve: i64,
        now: Millis,
    ) -> Result<Result<(), Millis>, BoxError> {
        let init = || Window::of_span(span);
        let taken = |w: &mut Window| w.take(reserve, now);
        let changed = shared::update(
            self.store.as_ref(),
            SharedKey::Window(name),
            now,
            init,
            taken,
        )
        .await?;
        Ok(changed.said)
    }

    async fn hear(
        &self,
        name: &str,
        span: Millis,
        news: News,
        now: Millis,
    ) -> Result<(), BoxError> {
        let init = || Window::of_span(span);
        let told = |w: &mut Window| w.hear(news, now);
        shared::update(
            self.store.as_ref(),
            SharedKey::Window(name),
            now,
            init,
            told,
        )
        .await?;
        Ok(())
    }
}
