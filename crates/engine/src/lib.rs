//! tandem's engine: requests and sequences, the block allocator and prefix cache, the
//! scheduler, the runner, the sampler and `Engine::step`. Synchronous: no async, no HTTP.
//! (The generation engine issue builds it; for now it only fixes the crate graph.)

pub use tandem_model as model;

pub mod sampler;
