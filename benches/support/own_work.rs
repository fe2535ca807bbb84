//! A tracing layer that times our own work per request: the request span's time entered,
//! less its outbound calls', both as CPU time and as wall time.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use kernelbot_dispatch::telemetry::{OUTBOUND_SPAN, REQUEST_SPAN};
use tracing::span::{Attributes, Id};
use tracing::{Subscriber, subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{Layer, Registry};

use super::load::histogram;

/// Per request span: time spent entered (any thread), and the part of that in outbound
/// calls; index 0 is CPU time, 1 wall time.
#[derive(Default)]
struct Busy {
    total_ns: [AtomicU64; 2],
    outbound_ns: [AtomicU64; 2],
}

/// When a span was entered: the thread's CPU time, and the wall clock.
type Mark = (Duration, Instant);

/// A span entered on this thread; `mark` only where its time counts (the outermost span, or
/// the outermost outbound call), so nested spans cost no clock reads.
struct Frame {
    id: Id,
    outbound: bool,
    mark: Option<Mark>,
}

thread_local! {
    /// Spans entered on this thread, outermost first.
    static ENTERED: RefCell<Vec<Frame>> = const { RefCell::new(Vec::new()) };
}

/// CPU time this thread has run. Wall time would also count the slices the thread spent
/// preempted mid-span while the other threads of a busy 2-core machine ran.
fn thread_cpu() -> Duration {
    let mut ts = std::mem::MaybeUninit::<libc::timespec>::zeroed();
    // SAFETY: the clock writes one `timespec` we own; this clock exists on every Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, ts.as_mut_ptr()) };
    debug_assert_eq!(rc, 0, "CLOCK_THREAD_CPUTIME_ID");
    // SAFETY: zeroed is a valid `timespec`, and the clock only ever writes a whole one.
    let ts = unsafe { ts.assume_init() };
    Duration::new(
        ts.tv_sec.max(0) as u64,
        ts.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

/// Times every `request` span's own work into shared histograms. A span counts as busy
/// while it is entered (polled, or running store work on the store's thread): waiting on a
/// lock or a socket is not work. CPU time leaves out the slices the thread spent preempted
/// mid-span; wall time keeps them. Only the outermost span entered on a thread is counted,
/// so nested spans are not counted twice.
#[derive(Clone)]
pub(crate) struct OwnWork {
    histograms: Arc<Mutex<OwnTimes>>,
}

/// Own work per request, in µs.
pub(crate) struct OwnTimes {
    pub cpu: Histogram<u64>,
    pub wall: Histogram<u64>,
}

impl OwnTimes {
    fn new() -> Self {
        Self {
            cpu: histogram(),
            wall: histogram(),
        }
    }
}

impl OwnWork {
    /// Installs the layer as the process's subscriber (spans only: events are disabled).
    pub(crate) fn install() -> Self {
        let own = Self {
            histograms: Arc::new(Mutex::new(OwnTimes::new())),
        };
        let filtered = own
            .clone()
            .with_filter(tracing_subscriber::filter::filter_fn(|m| m.is_span()));
        subscriber::set_global_default(Registry::default().with(filtered)).expect("one subscriber");
        own
    }

    /// The histograms so far, emptied for the next scenario.
    pub(crate) fn take(&self) -> OwnTimes {
        let mut h = self.histograms.lock().expect("histograms");
        std::mem::replace(&mut *h, OwnTimes::new())
    }
}

fn request_of<'a, S>(
    ctx: &'a Context<'_, S>,
    id: &Id,
) -> Option<tracing_subscriber::registry::SpanRef<'a, S>>
where
    S: Subscriber + for<'l> LookupSpan<'l>,
{
    ctx.span(id)?.scope().find(|s| s.name() == REQUEST_SPAN)
}

impl<S> Layer<S> for OwnWork
where
    S: Subscriber + for<'l> LookupSpan<'l>,
{
    fn on_new_span(&self, _attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id)
            && span.name() == REQUEST_SPAN
        {
            span.extensions_mut().insert(Busy::default());
        }
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        let outbound = ctx.span(id).is_some_and(|s| s.name() == OUTBOUND_SPAN);
        ENTERED.with(|e| {
            let mut e = e.borrow_mut();
            let timed = e.is_empty() || (outbound && !e.iter().any(|f| f.outbound));
            let mark = timed.then(|| (thread_cpu(), Instant::now()));
            e.push(Frame {
                id: id.clone(),
                outbound,
                mark,
            });
        });
    }

    fn on_exit(&self, id: &Id, ctx: Context<'_, S>) {
        let (popped, outermost) = ENTERED.with(|e| {
            let mut e = e.borrow_mut();
            (e.pop(), e.is_empty())
        });
        let Some(Frame {
            id: entered,
            outbound,
            mark: Some((cpu, wall)),
        }) = popped.filter(|f| f.id == *id)
        else {
            return;
        };
        let ns = [
            thread_cpu().saturating_sub(cpu).as_nanos() as u64,
            wall.elapsed().as_nanos() as u64,
        ];
        let Some(request) = request_of(&ctx, &entered) else {
            return;
        };
        let ext = request.extensions();
        let Some(busy) = ext.get::<Busy>() else {
            return;
        };
        // A marked frame is the outermost span, the outermost outbound call, or both.
        for (i, ns) in ns.into_iter().enumerate() {
            if outermost {
                busy.total_ns[i].fetch_add(ns, Ordering::Relaxed);
            }
            if outbound {
                busy.outbound_ns[i].fetch_add(ns, Ordering::Relaxed);
            }
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        if span.name() != REQUEST_SPAN {
            return;
        }
        if let Some(busy) = span.extensions().get::<Busy>() {
            let own_us = |i: usize| {
                let total = busy.total_ns[i].load(Ordering::Relaxed);
                let outbound = busy.outbound_ns[i].load(Ordering::Relaxed);
                (total.saturating_sub(outbound) / 1000).max(1)
            };
            let mut h = self.histograms.lock().expect("histograms");
            let _ = h.cpu.record(own_us(0));
            let _ = h.wall.record(own_us(1));
        }
    }
}
