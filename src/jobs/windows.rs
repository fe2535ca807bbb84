//! The rate-limit windows every instance spends, kept in the store: one shared entry per
//! window, taken from and told by compare-and-swap, so that all instances together stay
//! within a limit that each alone would learn only from its own answers. Each instance
//! remembers the entry as it last saw it and swaps from there: a read only where a change
//! comes to nothing, and none when another instance wrote in between (the refusal brings
//! their entry).

use std::sync::Arc;

use async_trait::async_trait;

use super::seen::SeenEntries;
use super::shared::SharedKey;
use super::store::JobStore;
use crate::error::BoxError;
use crate::time::Millis;
use crate::window::{News, SharedWindow, SharedWindows};

/// The windows, in `store`.
pub(crate) struct StoreWindows {
    store: Arc<dyn JobStore>,
    /// Each window's entry as this instance last read or wrote it.
    seen: SeenEntries,
}

impl StoreWindows {
    /// The windows kept in `store`, as the clients take them.
    pub(crate) fn of(store: Arc<dyn JobStore>) -> Arc<dyn SharedWindows> {
        Arc::new(Self {
            store,
            seen: SeenEntries::default(),
        })
    }

    /// Makes `change` on window `name` from its entry as last seen, and remembers the entry
    /// it leaves.
    async fn change<R>(
        &self,
        name: &str,
        (span, now): (Millis, Millis),
        change: impl FnMut(&mut SharedWindow) -> R,
    ) -> Result<R, BoxError> {
        let init = || SharedWindow::of_span(span);
        let key = SharedKey::Window(name);
        let changed = self
            .seen
            .update(self.store.as_ref(), (key, now), init, change);
        Ok(changed.await?.said)
    }
}

#[async_trait]
impl SharedWindows for StoreWindows {
    async fn take(
        &self,
        name: &str,
        span: Millis,
        (reserve, on_the_way, round_trip): (i64, i64, Millis),
        now: Millis,
    ) -> Result<Result<(), Millis>, BoxError> {
        let flight = (on_the_way, round_trip);
        self.change(name, (span, now), |w| w.take(reserve, now, flight))
            .await
    }

    async fn hear(
        &self,
        name: &str,
        span: Millis,
        (news, on_the_way, sent_at): (News, i64, Millis),
        now: Millis,
    ) -> Result<(), BoxError> {
        self.change(name, (span, now), |w| {
            w.hear(news, (now, sent_at), on_the_way)
        })
        .await
    }
}
