//! The load benchmarks' closed-loop load generator: requests in flight at a fixed
//! concurrency, their latencies in a histogram, and the answers that were wrong.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// Microsecond histogram, 3 significant figures, up to a minute.
pub(crate) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds")
}

/// One closed-loop run: `concurrency` workers, each sending its next request as soon as
/// the last one is answered.
pub(crate) struct Run {
    pub requests: usize,
    pub elapsed: Duration,
    /// Whole round trips as the client saw them (queueing included), in µs.
    pub latency: Histogram<u64>,
    /// Answers `check` refused.
    pub wrong: usize,
}

impl Run {
    pub(crate) fn rate(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }
}

/// Sends `requests` through `client` at `concurrency`; `check` judges each answer's status
/// and body (a benchmark of wrong answers would measure nothing).
pub(crate) async fn drive(
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
pub(crate) fn client(concurrency: usize) -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .build()
        .expect("client")
}

/// `p50 / p99 / p99.9` of a µs histogram, in ms.
pub(crate) fn percentiles(h: &Histogram<u64>) -> String {
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    format!("{:.2} / {:.2} / {:.2}", ms(0.5), ms(0.99), ms(0.999))
}
