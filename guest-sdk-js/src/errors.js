// The three errors a stage throws on purpose, as in the Rust and Python
// SDKs (the WIT `stage-error` variant). Anything else thrown is a trap.

/** Base of the errors a stage throws on purpose. */
export class StageError extends Error {}

/**
 * This record cannot be processed: the host applies `--on-error` to it
 * (`fail` stops the batch, `dlq` dead-letters it with its bytes, `skip`
 * counts it); the rest of the call goes on. `index`: from
 * `Sink.writeChunk`, the position of the record in the chunk (not needed
 * elsewhere: the SDK knows the record).
 */
export class BadRecord extends StageError {
  constructor(message, index = null) {
    super(message);
    this.name = 'BadRecord';
    this.index = index;
  }
}

/** The call may succeed if tried again (the host retries it, `--attempts`). */
export class Retryable extends StageError {
  constructor(message) {
    super(message);
    this.name = 'Retryable';
  }
}

/** Stop the batch before it commits (it is re-run on the next start). */
export class Fatal extends StageError {
  constructor(message) {
    super(message);
    this.name = 'Fatal';
  }
}
