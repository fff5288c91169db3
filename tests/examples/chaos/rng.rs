//! A small deterministic generator (xorshift64*, seeded through splitmix64): the chaos run's
//! schedule, the proxy's fault choices and each client's writes come from streams derived
//! from the one seed the run prints, so a run can be repeated.

/// One stream of pseudo-random numbers.
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    /// The stream `stream` of the run seeded with `seed`.
    pub fn new(seed: u64, stream: u64) -> Rng {
        // splitmix64 of the pair, so that nearby seeds and streams start far apart.
        let mut z = seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        Rng(z.max(1))
    }

    /// The next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `lo..hi` (`lo` when the range is empty).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next_u64() % (hi - lo)
    }

    /// True with probability `percent` / 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.range(0, 100) < percent
    }

    /// 16 random bytes (client and mutation IDs).
    pub fn bytes16(&mut self) -> [u8; 16] {
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&self.next_u64().to_le_bytes());
        out[8..].copy_from_slice(&self.next_u64().to_le_bytes());
        out
    }
}
