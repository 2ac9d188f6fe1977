//! A small deterministic generator (xorshift) for the property tests that
//! compare provenance's reading of a value with its consumer's: the same
//! seed makes the same cases, so a failure names its case.

/// The generator's state.
pub struct Gen(pub u64);

impl Gen {
    /// The next number.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// One of `from`.
    pub fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[(self.next() % from.len() as u64) as usize]
    }
}
