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
