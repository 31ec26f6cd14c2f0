//! The wire form of a prompt's KV blocks moving between instances (disaggregated prefill,
//! ARCHITECTURE.md § KV transfer): a fixed little-endian header, then the blocks' contents as
//! the runner's [`tandem_model::runner::ModelRunner::read_blocks`] wrote them.
//!
//! | bytes | field |
//! | --- | --- |
//! | 8 | magic `TANDEMKV` |
//! | 4 | format version (1) |
//! | 4 | KV dtype: 0 f32, 1 f16, 2 bf16, 3 q8 |
//! | 4 | block size (token slots) |
//! | 4 | number of blocks |
//! | 8 | bytes per block |
//! | 8 | compatibility ([`KvBlockFormat::compatibility`]: model, numeric mode, layout) |
//! | 4 | index of the first block (the receiver already holds the blocks before it) |
//! | 4 | zero (reserved) |
//!
//! Block `first + j` covers prompt tokens `(first + j) * block_size..`; the tokens
//! themselves do not travel: the receiver knows which prompt it asked for, and keys the
//! blocks under its own prefix cache's keys for those tokens.

use tandem_model::kv_store::KvDtype;
use tandem_model::runner::KvBlockFormat;

use crate::error::{EngineError, Result};

const MAGIC: &[u8; 8] = b"TANDEMKV";
const VERSION: u32 = 1;
/// Bytes before the first block.
pub const HEADER_BYTES: usize = 48;

/// A prompt's leading KV blocks in wire form (header and contents in one buffer).
#[derive(Debug, Clone, PartialEq)]
pub struct KvPayload {
    format: KvBlockFormat,
    first_block: usize,
    num_blocks: usize,
    bytes: Vec<u8>,
}

fn dtype_code(dtype: KvDtype) -> u32 {
    match dtype {
        KvDtype::F32 => 0,
        KvDtype::F16 => 1,
        KvDtype::Bf16 => 2,
        KvDtype::Q8 => 3,
    }
}

fn dtype_of(code: u32) -> Option<KvDtype> {
    Some(match code {
        0 => KvDtype::F32,
        1 => KvDtype::F16,
        2 => KvDtype::Bf16,
        3 => KvDtype::Q8,
        _ => return None,
    })
}

fn malformed(what: impl std::fmt::Display) -> EngineError {
    EngineError::KvTransfer(format!("malformed payload: {what}"))
}

impl KvPayload {
    /// An empty payload of `format` whose blocks, from prompt block `first_block` on,
    /// [`KvPayload::append_blocks`] fills, with room reserved for `capacity` blocks. An
    /// error for a block size the header cannot hold.
    pub fn with_capacity(
        format: KvBlockFormat,
        first_block: u32,
        capacity: usize,
    ) -> Result<KvPayload> {
        let block_size = u32::try_from(format.block_size)
            .map_err(|_| malformed(format!("block size {}", format.block_size)))?;
        let mut bytes = Vec::with_capacity(HEADER_BYTES + capacity * format.bytes_per_block);
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&VERSION.to_le_bytes());
        bytes.extend_from_slice(&dtype_code(format.dtype).to_le_bytes());
        bytes.extend_from_slice(&block_size.to_le_bytes());
        bytes.extend_from_slice(&0u32.to_le_bytes());
        bytes.extend_from_slice(&(format.bytes_per_block as u64).to_le_bytes());
        bytes.extend_from_slice(&format.compatibility.to_le_bytes());
        bytes.extend_from_slice(&first_block.to_le_bytes());
        bytes.extend_from_slice(&0u32.to_le_bytes());
        debug_assert_eq!(bytes.len(), HEADER_BYTES);
        Ok(KvPayload {
            format,
            first_block: first_block as usize,
            num_blocks: 0,
            bytes,
        })
    }

    /// Appends whole blocks' contents written by `fill` (which must append a multiple of
    /// the block size in bytes); on any error the payload is left as it was.
    pub fn append_blocks(
        &mut self,
        fill: impl FnOnce(&mut Vec<u8>) -> Result<()>,
    ) -> Result<usize> {
        let before = self.bytes.len();
        let filled = fill(&mut self.bytes);
        let size = self.format.bytes_per_block;
        let added = self.bytes.len().saturating_sub(before);
        let count = match filled {
            Ok(()) if size > 0 && added.is_multiple_of(size) => {
                let total = self.num_blocks + added / size;
                u32::try_from(total).map_err(|_| malformed("too many blocks"))
            }
            Ok(()) => Err(EngineError::KvTransfer(format!(
                "{added} bytes are not whole blocks of {size}"
            ))),
            Err(e) => Err(e),
        };
        let count = match count {
            Ok(n) => n,
            Err(e) => {
                self.bytes.truncate(before);
                return Err(e);
            }
        };
        self.num_blocks = count as usize;
        self.bytes[20..24].copy_from_slice(&count.to_le_bytes());
        Ok(added / size)
    }

    /// Reads a payload, checking its header and that its length is exactly its blocks'.
    pub fn decode(bytes: Vec<u8>) -> Result<KvPayload> {
        if bytes.len() < HEADER_BYTES || &bytes[..8] != MAGIC {
            return Err(malformed("it does not start with a tandem KV header"));
        }
        let u32_at =
            |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        let u64_at = |i: usize| u64::from(u32_at(i)) | (u64::from(u32_at(i + 4)) << 32);
        let version = u32_at(8);
        if version != VERSION {
            return Err(malformed(format!(
                "format version {version}, not {VERSION}"
            )));
        }
        let dtype = dtype_of(u32_at(12)).ok_or_else(|| malformed("unknown KV dtype"))?;
        let (block_size, num_blocks) = (u32_at(16) as usize, u32_at(20) as usize);
        let bytes_per_block = usize::try_from(u64_at(24)).map_err(|_| malformed("block size"))?;
        let body = num_blocks
            .checked_mul(bytes_per_block)
            .ok_or_else(|| malformed("its size overflows"))?;
        if block_size == 0 || bytes_per_block == 0 || bytes.len() - HEADER_BYTES != body {
            return Err(malformed(format!(
                "{} bytes of blocks for {num_blocks} blocks of {bytes_per_block} bytes \
                 ({block_size} slots each)",
                bytes.len() - HEADER_BYTES
            )));
        }
        let format = KvBlockFormat {
            compatibility: u64_at(32),
            dtype,
            block_size,
            bytes_per_block,
        };
        if u32_at(44) != 0 {
            return Err(malformed("the reserved header field is not zero"));
        }
        Ok(KvPayload {
            format,
            first_block: u32_at(40) as usize,
            num_blocks,
            bytes,
        })
    }

    /// The payload's bytes (header and blocks), to send.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Takes the payload's bytes.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    pub fn format(&self) -> KvBlockFormat {
        self.format
    }

    /// The prompt block the payload's first block is.
    pub fn first_block(&self) -> usize {
        self.first_block
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// The contents of the payload's block `i` (prompt block `first_block() + i`).
    pub fn block(&self, i: usize) -> &[u8] {
        let size = self.format.bytes_per_block;
        &self.bytes[HEADER_BYTES + i * size..HEADER_BYTES + (i + 1) * size]
    }

    /// Checks that this payload's blocks mean the same on a runner of `format` (the same
    /// model in the same numeric mode, KV dtype and block size), naming what differs.
    pub fn check_format(&self, format: KvBlockFormat) -> Result<()> {
        let theirs = self.format;
        let differs = if theirs.dtype != format.dtype {
            format!("KV dtype {:?}, not {:?}", theirs.dtype, format.dtype)
        } else if theirs.block_size != format.block_size {
            format!(
                "block size {}, not {}",
                theirs.block_size, format.block_size
            )
        } else if theirs.bytes_per_block != format.bytes_per_block {
            format!(
                "{} bytes a block, not {}",
                theirs.bytes_per_block, format.bytes_per_block
            )
        } else if theirs.compatibility != format.compatibility {
            "another model or numeric mode".to_string()
        } else {
            return Ok(());
        };
        Err(EngineError::KvTransfer(format!(
            "the blocks come from an instance with {differs}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn format() -> KvBlockFormat {
        KvBlockFormat {
            compatibility: 0x0123_4567_89ab_cdef,
            dtype: KvDtype::F16,
            block_size: 4,
            bytes_per_block: 6,
        }
    }

    #[test]
    fn a_payload_decodes_to_what_was_encoded() {
        let mut p = KvPayload::with_capacity(format(), 3, 2).expect("format");
        p.append_blocks(|out| {
            out.extend(0..12u8);
            Ok(())
        })
        .expect("two blocks");
        p.append_blocks(|out| {
            out.extend(12..18u8);
            Ok(())
        })
        .expect("a third");
        let back = KvPayload::decode(p.as_bytes().to_vec()).expect("decode");
        assert_eq!(back, p);
        assert_eq!((back.first_block(), back.num_blocks()), (3, 3));
        assert_eq!(back.block(2), &[12, 13, 14, 15, 16, 17]);
        assert!(back.check_format(format()).is_ok());
    }

    #[test]
    fn bad_payloads_are_refused_by_name() {
        let mut p = KvPayload::with_capacity(format(), 0, 1).expect("format");
        let partial = p.append_blocks(|out| {
            out.extend(0..5u8);
            Ok(())
        });
        assert!(partial.is_err() && p.num_blocks() == 0 && p.as_bytes().len() == HEADER_BYTES);
        p.append_blocks(|out| {
            out.extend(0..6u8);
            Ok(())
        })
        .expect("one block");
        let good = p.as_bytes().to_vec();
        let mut cases: Vec<(Vec<u8>, &str)> = vec![
            (good[..good.len() - 1].to_vec(), "bytes of blocks"),
            ([good.clone(), vec![0]].concat(), "bytes of blocks"),
            (good[..10].to_vec(), "header"),
        ];
        let mut edit = |at: usize, v: u8, why: &'static str| {
            let mut b = good.clone();
            b[at] = v;
            cases.push((b, why));
        };
        edit(0, b'X', "header");
        edit(8, 2, "version");
        edit(12, 9, "dtype");
        edit(20, 2, "bytes of blocks");
        edit(24, 7, "bytes of blocks");
        edit(45, 1, "reserved");
        for (bytes, why) in cases {
            let e = KvPayload::decode(bytes).expect_err(why);
            assert!(e.to_string().contains(why), "{e} should name {why}");
        }
        let ok = KvPayload::decode(good).expect("good");
        for (other, why) in [
            (
                KvBlockFormat {
                    dtype: KvDtype::Q8,
                    ..format()
                },
                "dtype",
            ),
            (
                KvBlockFormat {
                    block_size: 8,
                    ..format()
                },
                "block size",
            ),
            (
                KvBlockFormat {
                    compatibility: 1,
                    ..format()
                },
                "model",
            ),
        ] {
            let e = ok.check_format(other).expect_err(why);
            assert!(e.to_string().contains(why), "{e}");
        }
    }
}
