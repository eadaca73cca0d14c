//! What the HTTP side and the engine's thread share: the counters, the choices in
//! the server, and where the server is in its life (loading, serving, stopping).

use crate::limits::Admission;
use crate::metrics::Metrics;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub struct Shared {
    pub metrics: Metrics,
    pub admission: Arc<Admission>,
    /// Set once the model is loaded.
    ready: AtomicBool,
    /// Set at Ctrl-C or SIGTERM: new requests are refused.
    stopping: AtomicBool,
    /// Set when the shutdown's bound has passed: the engine ends every choice.
    ending: AtomicBool,
}

impl Shared {
    pub fn new(slots: usize, max_queue: usize) -> Self {
        Shared {
            metrics: Metrics::new(slots),
            admission: Admission::new(slots, max_queue),
            ready: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            ending: AtomicBool::new(false),
        }
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
    }

    pub fn is_ending(&self) -> bool {
        self.ending.load(Ordering::Acquire)
    }

    pub fn end(&self) {
        self.ending.store(true, Ordering::Release);
    }
}
