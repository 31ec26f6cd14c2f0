//! A bounds-checked little-endian reader over untrusted bytes. Every read either returns
//! the value and advances, or returns a typed [`GgufError`] without advancing; nothing
//! here panics or allocates more than the bytes it returns.

use super::error::GgufError;

/// Reading position within a byte slice. Invariant: `pos <= bytes.len()`.
#[derive(Debug, Clone)]
pub(crate) struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Cursor<'a> {
        Cursor { bytes, pos: 0 }
    }

    /// Absolute offset of the next byte to read.
    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    /// Bytes left after the current position.
    pub(crate) fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    /// Takes the next `n` bytes.
    pub(crate) fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], GgufError> {
        let available = self.remaining();
        if n > available {
            return Err(GgufError::Truncated {
                what,
                offset: self.pos,
                needed: n,
                available,
            });
        }
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    /// Takes exactly `N` bytes as an array.
    pub(crate) fn array<const N: usize>(
        &mut self,
        what: &'static str,
    ) -> Result<[u8; N], GgufError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8, GgufError> {
        Ok(self.array::<1>(what)?[0])
    }

    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Reads a count of `min_size`-byte items (see [`Cursor::check_count`]).
    pub(crate) fn count(
        &mut self,
        what: &'static str,
        min_size: usize,
    ) -> Result<usize, GgufError> {
        let offset = self.pos;
        let count = self.u64(what)?;
        self.check_count(what, count, offset, min_size)
    }

    /// Checks that `count` items of at least `min_size` encoded bytes each could fit in
    /// the bytes left, so a caller may reserve `count` slots without trusting the file:
    /// the reservation is then bounded by the file size times a constant. `offset` is
    /// where the count was read, for the error.
    pub(crate) fn check_count(
        &self,
        what: &'static str,
        count: u64,
        offset: usize,
        min_size: usize,
    ) -> Result<usize, GgufError> {
        let remaining = self.remaining();
        match usize::try_from(count) {
            Ok(n)
                if n.checked_mul(min_size)
                    .is_some_and(|total| total <= remaining) =>
            {
                Ok(n)
            }
            _ => Err(GgufError::CountTooLarge {
                what,
                count,
                offset,
                remaining,
                min_size,
            }),
        }
    }

    /// Reads a GGUF string: a u64 byte length, then that many bytes of UTF-8.
    pub(crate) fn string(&mut self, what: &'static str) -> Result<&'a str, GgufError> {
        let offset = self.pos;
        let len = self.u64(what)?;
        let remaining = self.remaining();
        let n = match usize::try_from(len) {
            Ok(n) if n <= remaining => n,
            _ => {
                return Err(GgufError::StringTooLong {
                    len,
                    offset,
                    remaining,
                })
            }
        };
        let start = self.pos;
        let raw = self.take(n, what)?;
        std::str::from_utf8(raw).map_err(|e| GgufError::InvalidUtf8 {
            what,
            offset: start + e.valid_up_to(),
        })
    }
}
