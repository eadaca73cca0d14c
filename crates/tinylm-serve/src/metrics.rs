//! What `GET /metrics` reports, in Prometheus's text format (version 0.0.4):
//! requests answered by route and status, prompt and generated tokens, the queue's
//! depth and the slots decoding, and histograms of the time to a choice's first
//! token and between its tokens. Counters are atomics the engine's thread and the
//! HTTP side add to; a scrape reads them without stopping either.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Upper bounds (seconds) of the time-to-first-token buckets.
const FIRST_TOKEN_BOUNDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Upper bounds (seconds) of the time-per-token buckets.
const PER_TOKEN_BOUNDS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

/// A Prometheus histogram of durations.
pub struct Histogram {
    bounds: &'static [f64],
    /// Observations in each bucket alone (not cumulative), the last one past every bound.
    buckets: Vec<AtomicU64>,
    sum_ns: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_ns: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let bucket = self.bounds.partition_point(|&b| b < s);
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut count = 0;
        for (i, bucket) in self.buckets.iter().enumerate() {
            count += bucket.load(Ordering::Relaxed);
            let le = match self.bounds.get(i) {
                Some(b) => b.to_string(),
                None => "+Inf".into(),
            };
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {count}");
        }
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {count}");
    }
}

/// The server's counters.
pub struct Metrics {
    /// Requests answered, by route and status.
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    /// Prompt tokens of admitted completion requests (each prompt once).
    pub prompt_tokens: AtomicU64,
    /// Tokens drawn, for every choice.
    pub generated_tokens: AtomicU64,
    /// Slots decoding a sequence now.
    pub busy: AtomicUsize,
    slots: usize,
    /// From a request's arrival to each of its choices' first token.
    pub first_token: Histogram,
    /// Between a choice's consecutive tokens.
    pub per_token: Histogram,
}

impl Metrics {
    pub fn new(slots: usize) -> Self {
        Metrics {
            requests: Mutex::new(BTreeMap::new()),
            prompt_tokens: AtomicU64::new(0),
            generated_tokens: AtomicU64::new(0),
            busy: AtomicUsize::new(0),
            slots,
            first_token: Histogram::new(FIRST_TOKEN_BOUNDS),
            per_token: Histogram::new(PER_TOKEN_BOUNDS),
        }
    }

    /// One request answered on `route` with `status`.
    pub fn count_request(&self, route: &str, status: u16) {
        let mut requests = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        *requests.entry((route.to_owned(), status)).or_default() += 1;
    }

    /// The text `GET /metrics` returns; `in_flight` choices are decoding or waiting.
    pub fn render(&self, in_flight: usize) -> String {
        let mut out = String::new();
        let counter = |out: &mut String, name: &str, help: &str, value: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
            );
        };
        let gauge = |out: &mut String, name: &str, help: &str, value: usize| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
            );
        };
        let name = "tinylm_requests_total";
        let _ = writeln!(
            out,
            "# HELP {name} HTTP requests answered, by route and status.\n# TYPE {name} counter"
        );
        let requests = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        for ((route, status), n) in requests.iter() {
            let _ = writeln!(out, "{name}{{route=\"{route}\",status=\"{status}\"}} {n}");
        }
        drop(requests);
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        counter(
            &mut out,
            "tinylm_prompt_tokens_total",
            "Prompt tokens of the completion requests admitted.",
            load(&self.prompt_tokens),
        );
        counter(
            &mut out,
            "tinylm_generated_tokens_total",
            "Tokens drawn, over every choice.",
            load(&self.generated_tokens),
        );
        let busy = self.busy.load(Ordering::Relaxed);
        gauge(
            &mut out,
            "tinylm_queue_depth",
            "Choices waiting for a slot.",
            in_flight.saturating_sub(busy),
        );
        gauge(
            &mut out,
            "tinylm_slots_busy",
            "Slots decoding a sequence.",
            busy,
        );
        gauge(
            &mut out,
            "tinylm_slots",
            "Sequences decoded together at most.",
            self.slots,
        );
        self.first_token.render(
            &mut out,
            "tinylm_time_to_first_token_seconds",
            "From a request's arrival to a choice's first token.",
        );
        self.per_token.render(
            &mut out,
            "tinylm_time_per_token_seconds",
            "Between a choice's consecutive tokens.",
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::Metrics;
    use std::time::Duration;

    #[test]
    fn the_text_format_has_cumulative_buckets_and_labelled_counters() {
        let metrics = Metrics::new(4);
        metrics.count_request("/v1/completions", 200);
        metrics.count_request("/v1/completions", 200);
        metrics.count_request("/v1/models", 401);
        for ms in [3, 30, 30, 20_000] {
            metrics.first_token.observe(Duration::from_millis(ms));
        }
        let text = metrics.render(6);
        for line in [
            "tinylm_requests_total{route=\"/v1/completions\",status=\"200\"} 2",
            "tinylm_requests_total{route=\"/v1/models\",status=\"401\"} 1",
            "tinylm_queue_depth 6",
            "tinylm_time_to_first_token_seconds_bucket{le=\"0.0025\"} 0",
            "tinylm_time_to_first_token_seconds_bucket{le=\"0.005\"} 1",
            "tinylm_time_to_first_token_seconds_bucket{le=\"0.05\"} 3",
            "tinylm_time_to_first_token_seconds_bucket{le=\"10\"} 3",
            "tinylm_time_to_first_token_seconds_bucket{le=\"+Inf\"} 4",
            "tinylm_time_to_first_token_seconds_sum 20.063",
            "tinylm_time_to_first_token_seconds_count 4",
            "tinylm_time_per_token_seconds_count 0",
            "# TYPE tinylm_slots_busy gauge",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in:\n{text}");
        }
    }
}
