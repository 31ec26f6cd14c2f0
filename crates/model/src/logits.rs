//! Logits of selected rows of a forward batch, and the log-probabilities derived from them.

use tandem_kernels::ops::log_softmax;

/// `[rows.len(), vocab_size]` logits; `rows[i]` is the flat batch row of logits row `i`.
#[derive(Debug, Clone, PartialEq)]
pub struct Logits {
    rows: Vec<usize>,
    vocab_size: usize,
    data: Vec<f32>,
}

impl Logits {
    pub fn new(rows: Vec<usize>, vocab_size: usize, data: Vec<f32>) -> Logits {
        assert_eq!(
            rows.len() * vocab_size,
            data.len(),
            "logits buffer does not match its rows"
        );
        Logits {
            rows,
            vocab_size,
            data,
        }
    }

    /// The flat batch rows these logits belong to.
    pub fn rows(&self) -> &[usize] {
        &self.rows
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    pub fn num_rows(&self) -> usize {
        self.rows.len()
    }

    /// Logits row `i` (not the flat batch row): `[vocab_size]`.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.vocab_size..(i + 1) * self.vocab_size]
    }

    /// Log-softmax of row `i`, or `None` if the row holds NaN or infinity.
    pub fn log_probs(&self, i: usize) -> Option<Vec<f32>> {
        let mut out = vec![0.0; self.vocab_size];
        log_softmax(self.row(i), &mut out).map(|()| out)
    }

    /// All logits: `[num_rows, vocab_size]`.
    pub fn as_slice(&self) -> &[f32] {
        &self.data
    }

    /// The buffer behind the logits, for reuse.
    pub fn into_data(self) -> Vec<f32> {
        self.data
    }
}

/// A logits buffer handed back after its step ([`crate::runner::ModelRunner::recycle_logits`]),
/// which the next step's logits are written into instead of a fresh buffer whose pages
/// fault in as they are written (at a large vocabulary a visible part of a decode step).
/// One buffer is kept, the largest handed back up to `max_bytes`: a decode step's, not a
/// long prompt's.
#[derive(Debug)]
pub struct SpareLogits {
    data: Vec<f32>,
    max_bytes: usize,
}

impl SpareLogits {
    /// Keeps buffers of at most `max_bytes`.
    pub fn new(max_bytes: usize) -> SpareLogits {
        SpareLogits {
            data: Vec::new(),
            max_bytes,
        }
    }

    /// Keeps the buffer behind `logits` if it is the larger one and within the limit.
    pub fn keep(&mut self, logits: Logits) {
        let data = logits.into_data();
        let bytes = data.capacity() * std::mem::size_of::<f32>();
        if bytes <= self.max_bytes && data.capacity() > self.data.capacity() {
            self.data = data;
        }
    }

    /// A buffer of `len` values for the caller to overwrite entirely: the kept one when it
    /// is large enough (whatever it held), else a fresh zeroed one advised onto huge pages.
    pub fn take(&mut self, len: usize) -> Vec<f32> {
        let mut data = std::mem::take(&mut self.data);
        if data.capacity() < len {
            return tandem_kernels::huge_pages::zeroed_vec(len);
        }
        data.truncate(len);
        data.resize(len, 0.0);
        data
    }
}
