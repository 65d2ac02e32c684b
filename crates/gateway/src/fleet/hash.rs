//! Hashes that are stable across processes, builds and platforms (which the
//! standard library's hashers do not promise), so that every gateway replica
//! derives the same affinity keys and backend ids.

/// SplitMix64's finalizer: a bijection that spreads every input bit.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// FNV-1a over bytes: stable across processes, builds and platforms, which the
/// standard library's hashers do not promise.
#[derive(Debug, Clone, Copy)]
pub struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    /// Adds bytes, then a separator, so that ("ab", "c") and ("a", "bc") differ.
    pub fn write(&mut self, bytes: &[u8]) -> &mut Self {
        for &b in bytes.iter().chain(&[0xff]) {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
        self
    }

    /// The hash so far.
    pub fn finish(&self) -> u64 {
        mix(self.0)
    }
}

/// The stable id of a backend, from what names it in the configuration.
pub fn backend_id(name: &str) -> u64 {
    Fnv::default().write(name.as_bytes()).finish()
}
