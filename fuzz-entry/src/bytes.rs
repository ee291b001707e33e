//! Byte-level reading and writing shared by every harness.
//!
//! Inputs are decoded one byte at a time through [`arbitrary::Unstructured`], so a
//! libFuzzer mutation of one byte changes one decision, and a seed written with
//! [`Writer`] decodes back to exactly the operations it was built from. Past the end of
//! the data every read yields zero (as `Unstructured` does), so no input is invalid.

use arbitrary::{Arbitrary, Unstructured};

/// The next byte, or zero once the data is used up.
pub(crate) fn byte(u: &mut Unstructured<'_>) -> u8 {
    u8::arbitrary(u).unwrap_or(0)
}

/// Two bytes, little-endian.
pub(crate) fn u16le(u: &mut Unstructured<'_>) -> u16 {
    let lo = byte(u);
    let hi = byte(u);
    u16::from_le_bytes([lo, hi])
}

/// Eight bytes, little-endian.
pub(crate) fn u64le(u: &mut Unstructured<'_>) -> u64 {
    let mut b = [0u8; 8];
    for x in &mut b {
        *x = byte(u);
    }
    u64::from_le_bytes(b)
}

/// Up to `len` raw bytes (fewer at the end of the data).
pub(crate) fn take<'a>(u: &mut Unstructured<'a>, len: usize) -> &'a [u8] {
    let n = len.min(u.len());
    u.bytes(n).unwrap_or(&[])
}

/// Writes seeds in the exact format the decoders read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Writer(Vec<u8>);

impl Writer {
    /// An empty input.
    pub fn new() -> Self {
        Writer(Vec::new())
    }

    /// Appends one byte.
    pub fn byte(&mut self, b: u8) -> &mut Self {
        self.0.push(b);
        self
    }

    /// Appends bytes.
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }

    /// Appends a little-endian `u16`.
    pub fn u16le(&mut self, v: u16) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }

    /// Appends a little-endian `u64`.
    pub fn u64le(&mut self, v: u64) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }

    /// The bytes written.
    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether nothing was written.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}
