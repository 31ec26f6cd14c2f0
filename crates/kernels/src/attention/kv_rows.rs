//! The K/V rows the attention kernels read: a layer's keys and values in the store's format
//! ([`KvRows`]: f32, f16, or 8-bit codes with a scale per group), one KV head of them over a
//! sequence's context ([`KvView`]), and how a kernel finds one head's row of one slot.

use half::f16;

/// One layer's keys and values, `[num_slots, row_stride]` each, in the store's element type.
///
/// f16 rows are widened to f32 exactly on load, so attention over f16 rows is, bit for bit,
/// the attention over the widened rows: the numeric contract of the module docs holds for
/// both, and every variant is bitwise equal to the scalar reference for both.
///
/// 8-bit rows ([`Q8Rows`]) are read as their dequantized f32 values (`code · scale`, one
/// rounding, the same in every variant), so attention over them is the attention over those
/// f32 rows, bit for bit, in every variant too.
#[derive(Debug, Clone, Copy)]
pub enum KvRows<'a> {
    F32 {
        keys: &'a [f32],
        values: &'a [f32],
    },
    F16 {
        keys: &'a [f16],
        values: &'a [f16],
    },
    Q8 {
        keys: Q8Rows<'a>,
        values: Q8Rows<'a>,
    },
}

/// Elements that share one scale in [`Q8Rows`].
pub const Q8_GROUP: usize = 32;

/// Keys or values as 8-bit codes: element `i` is `codes[i] as f32 · scales[i / Q8_GROUP]`
/// (see [`crate::kv_quant`]). Rows and heads over them must start and end on a group
/// boundary, so a head's dimension and a slot's row length are multiples of [`Q8_GROUP`].
#[derive(Debug, Clone, Copy)]
pub struct Q8Rows<'a> {
    pub codes: &'a [i8],
    pub scales: &'a [f32],
}

impl Q8Rows<'_> {
    /// Element `i`, dequantized.
    #[inline(always)]
    pub fn get(&self, i: usize) -> f32 {
        f32::from(self.codes[i]) * self.scales[i / Q8_GROUP]
    }
}

/// One head's row of a slot in a store's format.
pub(crate) trait KvRow: Copy {
    /// Element `c` as f32: as stored, f16 widened exactly, or an 8-bit code times its scale.
    fn at(self, c: usize) -> f32;
}

impl KvRow for &[f32] {
    #[inline(always)]
    fn at(self, c: usize) -> f32 {
        self[c]
    }
}

impl KvRow for &[f16] {
    #[inline(always)]
    fn at(self, c: usize) -> f32 {
        self[c].to_f32()
    }
}

impl KvRow for Q8Rows<'_> {
    #[inline(always)]
    fn at(self, c: usize) -> f32 {
        self.get(c)
    }
}

/// One plane of a layer's rows (its keys or its values) in a store's format: how one head's
/// row of a slot is found.
pub(crate) trait KvPlane: Copy {
    /// One head's row of one slot.
    type Row: KvRow;
    /// The `len` elements from `start` on.
    fn row(self, start: usize, len: usize) -> Self::Row;
}

impl<'a, E: Copy> KvPlane for &'a [E]
where
    &'a [E]: KvRow,
{
    type Row = &'a [E];
    #[inline(always)]
    fn row(self, start: usize, len: usize) -> &'a [E] {
        &self[start..][..len]
    }
}

impl<'a> KvPlane for Q8Rows<'a> {
    type Row = Q8Rows<'a>;
    /// `start` and `len` are multiples of [`Q8_GROUP`] (asserted where a view is checked).
    #[inline(always)]
    fn row(self, start: usize, len: usize) -> Q8Rows<'a> {
        Q8Rows {
            codes: &self.codes[start..][..len],
            scales: &self.scales[start / Q8_GROUP..][..len.div_ceil(Q8_GROUP)],
        }
    }
}

/// The K/V rows of one KV head over a sequence's context, read through its slots.
#[derive(Debug, Clone, Copy)]
pub struct KvView<'a> {
    /// The layer's rows.
    pub rows: KvRows<'a>,
    /// Elements per slot (all KV heads: `num_kv_heads · head_dim`).
    pub row_stride: usize,
    /// Where this KV head starts within a slot's row.
    pub offset: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// The slot of each context position, in position order (not empty).
    pub slots: &'a [usize],
}

impl<'a> KvView<'a> {
    /// Panics, naming `caller`, unless this head lies within a slot's row.
    pub(crate) fn assert_head_in_row(&self, caller: &str) {
        assert!(
            self.offset + self.head_dim <= self.row_stride,
            "{caller}: head at {} + {} exceeds the row of {}",
            self.offset,
            self.head_dim,
            self.row_stride
        );
        if let KvRows::Q8 { .. } = self.rows {
            assert!(
                [self.offset, self.head_dim, self.row_stride]
                    .iter()
                    .all(|x| x.is_multiple_of(Q8_GROUP)),
                "{caller}: 8-bit rows need a head at {} of {} in rows of {} on groups of {Q8_GROUP}",
                self.offset,
                self.head_dim,
                self.row_stride
            );
        }
    }

    /// This view over `keys` and `values` of one format (the kernels' form).
    #[inline(always)]
    pub(crate) fn head<P>(&self, keys: P, values: P) -> HeadRows<'a, P> {
        HeadRows {
            keys,
            values,
            row_stride: self.row_stride,
            offset: self.offset,
            head_dim: self.head_dim,
            slots: self.slots,
        }
    }
}

/// [`KvView`] with its rows' format resolved (`P`: a [`KvPlane`]): what the kernels read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeadRows<'a, P> {
    pub keys: P,
    pub values: P,
    pub row_stride: usize,
    pub offset: usize,
    pub head_dim: usize,
    pub slots: &'a [usize],
}

impl<P: KvPlane> HeadRows<'_, P> {
    /// The key of `slot` for this head (`head_dim` elements).
    #[inline(always)]
    pub(crate) fn key(&self, slot: usize) -> P::Row {
        self.keys
            .row(slot * self.row_stride + self.offset, self.head_dim)
    }

    /// The value of `slot` for this head (`head_dim` elements).
    #[inline(always)]
    pub(crate) fn value(&self, slot: usize) -> P::Row {
        self.values
            .row(slot * self.row_stride + self.offset, self.head_dim)
    }
}
