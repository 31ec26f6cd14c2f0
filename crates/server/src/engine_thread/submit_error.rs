//! Why a submission to the engine thread did not run.

use tandem_engine::EngineError;

/// Why a submission did not run.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// The engine refused a request (a client mistake: bad parameters, prompt too long).
    #[error("{0}")]
    Refused(EngineError),
    /// The engine is not running (shutting down or failed).
    #[error("the engine is not running")]
    Unavailable,
    /// The waiting queue is full (it holds this many sequences at most).
    #[error("the waiting queue is full ({0} requests)")]
    QueueFull(usize),
}
