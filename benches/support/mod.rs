//! What the load benchmarks share: a closed-loop load generator, and a tracing layer that
//! times our own work per request (the request span's time on a CPU, less its outbound calls').
#![allow(dead_code)]

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use kernelbot_dispatch::telemetry::{OUTBOUND_SPAN, REQUEST_SPAN};
use tracing::span::{Attributes, Id};
use tracing::{Subscriber, subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{Layer, Registry};

/// Microsecond histogram, 3 significant figures, up to a minute.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds")
}

/// Per request span: CPU time spent in it (any thread), and the part of that in outbound calls.
#[derive(Default)]
struct Busy {
    total_ns: AtomicU64,
    outbound_ns: AtomicU64,
}

thread_local! {
    /// Spans entered on this thread, outermost first, with when.
    static ENTERED: RefCell<Vec<(Id, Instant)>> = const { RefCell::new(Vec::new()) };
}

/// Times every `request` span's own work into a shared histogram. A span counts as busy
/// while it is entered (polled, or running store work on a blocking thread): waiting for
/// a CPU, a lock or a socket is not work. Only the outermost span entered on a thread is
/// counted, so nested spans are not counted twice.
#[derive(Clone)]
pub struct OwnWork {
    pub histogram: Arc<Mutex<Histogram<u64>>>,
}

impl OwnWork {
    /// Installs the layer as the process's subscriber (spans only: events are disabled).
    pub fn install() -> Self {
        let own = Self {
            histogram: Arc::new(Mutex::new(histogram())),
        };
        let filtered = own
            .clone()
            .with_filter(tracing_subscriber::filter::filter_fn(|m| m.is_span()));
        subscriber::set_global_default(Registry::default().with(filtered)).expect("one subscriber");
        own
    }

    /// The histogram so far, emptied for the next scenario.
    pub fn take(&self) -> Histogram<u64> {
        let mut h = self.histogram.lock().expect("histogram");
        std::mem::replace(&mut *h, histogram())
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

    fn on_enter(&self, id: &Id, _ctx: Context<'_, S>) {
        ENTERED.with(|e| e.borrow_mut().push((id.clone(), Instant::now())));
    }

    fn on_exit(&self, id: &Id, ctx: Context<'_, S>) {
        let (popped, outermost, in_outbound) = ENTERED.with(|e| {
            let mut e = e.borrow_mut();
            let popped = e.pop();
            let in_outbound = e
                .iter()
                .any(|(i, _)| ctx.span(i).is_some_and(|s| s.name() == OUTBOUND_SPAN));
            (popped, e.is_empty(), in_outbound)
        });
        let Some((entered, at)) = popped.filter(|(i, _)| i == id) else {
            return;
        };
        let ns = at.elapsed().as_nanos() as u64;
        let Some(request) = request_of(&ctx, &entered) else {
            return;
        };
        let is_outbound = ctx
            .span(&entered)
            .is_some_and(|s| s.name() == OUTBOUND_SPAN);
        let ext = request.extensions();
        let Some(busy) = ext.get::<Busy>() else {
            return;
        };
        if outermost {
            busy.total_ns.fetch_add(ns, Ordering::Relaxed);
        }
        if is_outbound && !in_outbound {
            busy.outbound_ns.fetch_add(ns, Ordering::Relaxed);
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        if span.name() != REQUEST_SPAN {
            return;
        }
        if let Some(busy) = span.extensions().get::<Busy>() {
            let own = busy
                .total_ns
                .load(Ordering::Relaxed)
                .saturating_sub(busy.outbound_ns.load(Ordering::Relaxed));
            let _ = self
                .histogram
                .lock()
                .expect("histogram")
                .record((own / 1000).max(1));
        }
    }
}

/// One closed-loop run: `concurrency` workers, each sending its next request as soon as
/// the last one is answered.
pub struct Run {
    pub requests: usize,
    pub elapsed: Duration,
    /// Whole round trips as the client saw them (queueing included), in µs.
    pub latency: Histogram<u64>,
    /// Answers `check` refused.
    pub wrong: usize,
}

impl Run {
    pub fn rate(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }
}

/// Sends `requests` through `client` at `concurrency`; `check` judges each answer's status
/// and body (a benchmark of wrong answers would measure nothing).
pub async fn drive(
    client: &reqwest::Client,
    requests: Vec<reqwest::Request>,
    concurrency: usize,
    check: fn(u16, &[u8]) -> bool,
) -> Run {
    let total = requests.len();
    let queue: Arc<Mutex<std::vec::IntoIter<reqwest::Request>>> =
        Arc::new(Mutex::new(requests.into_iter()));
    let wrong = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (client, queue, wrong) = (client.clone(), queue.clone(), wrong.clone());
            tokio::spawn(async move {
                let mut latency = histogram();
                loop {
                    let Some(req) = queue.lock().expect("queue").next() else {
                        break;
                    };
                    let sent = Instant::now();
                    let ok = match client.execute(req).await {
                        Ok(resp) => {
                            let status = resp.status().as_u16();
                            let body = resp.bytes().await.unwrap_or_default();
                            let ok = check(status, &body);
                            if !ok && wrong.load(Ordering::Relaxed) == 0 {
                                let text = String::from_utf8_lossy(&body);
                                eprintln!("unexpected answer: {status} {:.300}", text);
                            }
                            ok
                        }
                        Err(_) => false,
                    };
                    let _ = latency.record((sent.elapsed().as_micros() as u64).max(1));
                    if !ok {
                        wrong.fetch_add(1, Ordering::Relaxed);
                    }
                }
                latency
            })
        })
        .collect();
    let mut latency = histogram();
    for w in workers {
        latency.add(w.await.expect("worker")).expect("same bounds");
    }
    Run {
        requests: total,
        elapsed: started.elapsed(),
        latency,
        wrong: wrong.load(Ordering::Relaxed),
    }
}

/// A client for the generator: enough idle connections for every worker.
pub fn client(concurrency: usize) -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .build()
        .expect("client")
}

/// `p50 / p99 / p99.9` of a µs histogram, in ms.
pub fn percentiles(h: &Histogram<u64>) -> String {
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    format!("{:.2} / {:.2} / {:.2}", ms(0.5), ms(0.99), ms(0.999))
}
