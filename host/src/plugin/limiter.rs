//! The memory cap of an instance (wasmtime's `ResourceLimiter`): a
//! growth past it traps at the `memory.grow`, and the size it asked for
//! is kept so the trap can say so. (A limiter does not bound CPU: epochs
//! do, see `instance`.)

use wasmtime::ResourceLimiter;

/// Memory cap that remembers what was refused, so the trap can say so.
pub(super) struct Limiter {
    /// The cap, bytes.
    pub(super) max_memory: usize,
    /// The size a refused growth asked for, bytes.
    pub(super) refused: Option<usize>,
}

#[derive(Debug)]
struct MemoryCapHit;

impl std::fmt::Display for MemoryCapHit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("memory cap reached")
    }
}

impl std::error::Error for MemoryCapHit {}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.max_memory {
            self.refused = Some(desired);
            // An error (rather than `Ok(false)`) traps at the `memory.grow`,
            // so the guest cannot carry on in a half-failed state.
            return Err(wasmtime::Error::new(MemoryCapHit));
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 1_000_000)
    }
}
