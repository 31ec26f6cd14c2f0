//! How the int8 kernels' tiles get the scales of a super-scaled record kind (the K-quants,
//! IQ4_XS): each row's scale is stored as an 8-bit multiplier of its super-block's f16
//! (`packed/record.rs`), and turning the two into f32 costs a few instructions a block. Tiles
//! after a group's first one read the same records again, so the first tile stores the f32
//! tables in scratch and the others load them back, as cheaply as a record holding f32
//! tables would give them. Without it, 64 tokens of a cache-resident Q4_K matrix ran about
//! 10 % slower than from the f32 tables the records held before the super-block headers.

use super::PACKED_SCALES_PER_BLOCK as PER_BLOCK;

/// What one tile does with the scale tables.
#[derive(Clone, Copy)]
pub(super) enum ScaleTables {
    /// Converts them block by block (not super-scaled, or no tile would read them back).
    Convert,
    /// Converts them and stores block `b`'s at `PER_BLOCK·b`.
    Store(*mut f32),
    /// Loads what the first tile stored.
    Load(*const f32),
}

impl ScaleTables {
    /// What tile `i` (from 0; the remainder tile counts too) of a group with `full` full
    /// tiles does, `scratch` holding [`PER_BLOCK`] values per block of `blocks`. Only groups
    /// of two full tiles or more store them.
    pub(super) fn for_tile(
        super_scaled: bool,
        full: usize,
        i: usize,
        scratch: &mut [f32],
        blocks: usize,
    ) -> ScaleTables {
        if !super_scaled || full < 2 {
            return ScaleTables::Convert;
        }
        assert!(
            scratch.len() >= PER_BLOCK * blocks,
            "packed kernel: the scale scratch holds {} values, {} blocks need {}",
            scratch.len(),
            blocks,
            PER_BLOCK * blocks
        );
        if i == 0 {
            ScaleTables::Store(scratch.as_mut_ptr())
        } else {
            ScaleTables::Load(scratch.as_ptr())
        }
    }

    /// Whether the tile converts the tables itself.
    pub(super) fn converts(self) -> bool {
        !matches!(self, ScaleTables::Load(_))
    }
}
