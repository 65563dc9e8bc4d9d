//! Checkpoint (todo)
