//! The timings of a live session ([`LiveConfig`]) and its back-off: exponential, bounded,
//! with "equal jitter" (the upper half of each wait fixed, the lower half drawn).

/// The timings of a live session.
///
/// ```
/// use synchro_client::engine::LiveConfig;
/// let c = LiveConfig::new().with_safety_poll_ms(60_000);
/// assert_eq!(c.safety_poll_ms(), 60_000);
/// assert_eq!(LiveConfig::new().backoff_max_ms(), 30_000);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LiveConfig {
    safety_poll_ms: u64,
    backoff_min_ms: u64,
    backoff_max_ms: u64,
    stream_idle_ms: u64,
}

impl Default for LiveConfig {
    fn default() -> LiveConfig {
        LiveConfig {
            safety_poll_ms: 30_000,
            backoff_min_ms: 500,
            backoff_max_ms: 30_000,
            stream_idle_ms: 60_000,
        }
    }
}

impl LiveConfig {
    /// The defaults: a 30 s safety poll, back-off from 0.5 s to 30 s, a stream silent for 60 s
    /// is reopened (the server sends a keepalive at least every 20 s).
    pub fn new() -> LiveConfig {
        LiveConfig::default()
    }

    /// A round runs at least this often while the stream is quiet (at least 1 ms).
    pub fn with_safety_poll_ms(mut self, ms: u64) -> LiveConfig {
        self.safety_poll_ms = ms.max(1);
        self
    }

    /// The back-off after the first failure, doubling with every further one up to
    /// `max_ms`; each wait is drawn from its upper half ("equal jitter").
    pub fn with_backoff_ms(mut self, min_ms: u64, max_ms: u64) -> LiveConfig {
        self.backoff_min_ms = min_ms.max(1);
        self.backoff_max_ms = max_ms.max(self.backoff_min_ms);
        self
    }

    /// A stream that delivered no byte for this long is dropped and reopened.
    pub fn with_stream_idle_ms(mut self, ms: u64) -> LiveConfig {
        self.stream_idle_ms = ms.max(1);
        self
    }

    /// The safety poll interval.
    pub fn safety_poll_ms(&self) -> u64 {
        self.safety_poll_ms
    }

    /// The first back-off.
    pub fn backoff_min_ms(&self) -> u64 {
        self.backoff_min_ms
    }

    /// The longest back-off.
    pub fn backoff_max_ms(&self) -> u64 {
        self.backoff_max_ms
    }

    /// The stream's idle limit.
    pub fn stream_idle_ms(&self) -> u64 {
        self.stream_idle_ms
    }

    /// The wait before retry number `attempt` (0 after the first failure): the bound
    /// `min(max, min * 2^attempt)`, of which the upper half is fixed and the lower drawn
    /// from `random`.
    pub fn backoff(&self, attempt: u32, random: u64) -> u64 {
        let bound = self
            .backoff_min_ms
            .saturating_mul(1u64 << attempt.min(32))
            .min(self.backoff_max_ms);
        let half = bound / 2;
        bound - half + random % (half + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn backoff_doubles_within_its_bound_and_jitters_in_the_upper_half() {
        let c = LiveConfig::new().with_backoff_ms(100, 1600);
        for (attempt, bound) in [(0, 100), (1, 200), (2, 400), (3, 800), (4, 1600), (9, 1600)] {
            let lo = c.backoff(attempt, 0);
            let hi = c.backoff(attempt, u64::MAX - 1);
            assert!(lo >= bound / 2 && hi <= bound, "{attempt}: {lo}..{hi}");
            assert_eq!(c.backoff(attempt, bound / 2), bound, "the top is reachable");
            assert_eq!(lo, bound - bound / 2);
        }
        let huge = c.backoff(u32::MAX, u64::MAX);
        assert!((800..=1600).contains(&huge), "no overflow: {huge}");
        let one = LiveConfig::new().with_backoff_ms(0, 0);
        assert_eq!((one.backoff_min_ms(), one.backoff_max_ms()), (1, 1));
    }
}
