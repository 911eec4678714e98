//! Cancellation from another thread: a flag the executors check before every
//! batch (`crate::executor`) and a caller sets (`crate::session::control`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A shared cancellation flag: clones are cheap and see the same flag, so one
/// clone goes to the trainer and another to whoever may cancel (a request
/// handler, a signal handler, a watchdog thread). Cancelling is permanent for the
/// token; give the trainer a fresh one
/// ([`crate::session::Trainer::set_cancel_token`]) to train again.
#[derive(Clone, Debug, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    /// A token that is not cancelled.
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks every holder to stop; takes effect at the trainer's next batch.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether [`CancelToken::cancel`] was called on this token or a clone.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_the_flag_across_threads() {
        let t = CancelToken::new();
        let c = t.clone();
        assert!(!t.is_cancelled());
        std::thread::spawn(move || c.cancel()).join().unwrap();
        assert!(t.is_cancelled());
        assert!(!CancelToken::new().is_cancelled());
    }
}
