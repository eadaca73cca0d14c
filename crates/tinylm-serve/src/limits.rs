//! What the server takes from a client, each bound a flag of `tinylm serve` with
//! its own refusal: a body's bytes (413), a request's prompt tokens and `max_tokens`
//! (400), choices waiting for a slot (429 with `Retry-After`), a request's time
//! (408), a connection's idle time (closed), and the events a stream may hold for a
//! client that stops reading (dropped). [`Admission`] counts the choices in the
//! server against its room.

use crate::error::ApiError;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub const DEFAULT_MAX_BODY_BYTES: usize = 1 << 20;
pub const DEFAULT_MAX_QUEUE: usize = 64;
pub const DEFAULT_REQUEST_TIMEOUT_S: u64 = 600;
pub const DEFAULT_IDLE_TIMEOUT_S: u64 = 60;
pub const DEFAULT_STREAM_BUFFER: usize = 256;
pub const DEFAULT_SHUTDOWN_TIMEOUT_S: u64 = 10;
/// Seconds a refused client is told to wait (`Retry-After`).
pub const RETRY_AFTER_S: u64 = 1;

/// The bounds on what clients send and hold.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Bytes of a request body.
    pub max_body_bytes: usize,
    /// Prompt tokens of a request, all its prompts together.
    pub max_prompt_tokens: usize,
    /// A request's `max_tokens`.
    pub max_completion_tokens: usize,
    /// Choices that may wait for a slot, beyond those decoding.
    pub max_queue: usize,
    /// From a request's arrival to its last token.
    pub request_timeout: Duration,
    /// A connection with no request, a request's body, or a client not reading
    /// what it is sent, for longer than this is closed.
    pub idle_timeout: Duration,
    /// Events (pieces of text) a request's choices may hold for a client that
    /// does not read them, per choice; beyond, its choices stop and free their slots.
    pub stream_buffer: usize,
    /// After Ctrl-C or SIGTERM, how long streams may go on before they are ended.
    pub shutdown_timeout: Duration,
}

impl Limits {
    /// The defaults for a model of `context_length` served with `slots` sequences:
    /// a prompt as long as the context for every slot, `max_tokens` up to the
    /// context less one prompt token.
    pub fn defaults(context_length: usize, slots: usize) -> Self {
        Limits {
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_prompt_tokens: context_length * slots,
            max_completion_tokens: context_length - 1,
            max_queue: DEFAULT_MAX_QUEUE,
            request_timeout: Duration::from_secs(DEFAULT_REQUEST_TIMEOUT_S),
            idle_timeout: Duration::from_secs(DEFAULT_IDLE_TIMEOUT_S),
            stream_buffer: DEFAULT_STREAM_BUFFER,
            shutdown_timeout: Duration::from_secs(DEFAULT_SHUTDOWN_TIMEOUT_S),
        }
    }
}

/// The choices in the server — decoding, or waiting for a slot — against its
/// room, `slots + max_queue`.
pub struct Admission {
    in_flight: AtomicUsize,
    slots: usize,
    max_queue: usize,
}

/// One admitted choice; dropped when the choice ends (or never starts).
pub struct Ticket(Arc<Admission>);

impl Drop for Ticket {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Admission {
    pub fn new(slots: usize, max_queue: usize) -> Arc<Self> {
        Arc::new(Admission {
            in_flight: AtomicUsize::new(0),
            slots,
            max_queue,
        })
    }

    /// Choices decoding or waiting.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// A ticket for each of `choices` choices, or a 429 when they would make the
    /// queue longer than `max_queue` (a 400 when they never fit).
    pub fn admit(self: &Arc<Self>, choices: usize) -> Result<Vec<Ticket>, ApiError> {
        let room = self.slots + self.max_queue;
        if choices > room {
            let message = format!(
                "the request has {choices} choices (prompts × n); this server takes {room} at once ({} slots and --max-queue {})",
                self.slots, self.max_queue
            );
            return Err(ApiError::invalid(Some("n"), message));
        }
        let before = self.in_flight.fetch_add(choices, Ordering::Relaxed);
        if before + choices > room {
            self.in_flight.fetch_sub(choices, Ordering::Relaxed);
            let message = format!(
                "the server is busy: {} choices wait for a slot (--max-queue {}); try again later",
                before.saturating_sub(self.slots),
                self.max_queue
            );
            return Err(ApiError::busy(message, RETRY_AFTER_S));
        }
        Ok((0..choices).map(|_| Ticket(Arc::clone(self))).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::Admission;

    #[test]
    fn admission_refuses_beyond_the_slots_and_the_queue_and_tickets_give_room_back() {
        let admission = Admission::new(2, 3);
        let first = admission.admit(4).unwrap();
        assert_eq!(admission.in_flight(), 4);
        let busy = admission.admit(2).err().unwrap();
        assert_eq!(busy.status().as_u16(), 429);
        assert_eq!(admission.in_flight(), 4, "a refusal takes no room");
        let one = admission.admit(1).unwrap();
        assert_eq!(admission.admit(6).err().unwrap().status().as_u16(), 400);
        drop(first);
        assert_eq!(admission.in_flight(), 1);
        drop(one);
        assert_eq!(admission.admit(5).unwrap().len(), 5);
    }
}
