// The host's kafka capability, for sink stages (`sluice:plugin/kafka`,
// contract 0.2.4): produce records to the topics the pipeline names with
// `host run --output-topic`.
//
// The host keeps what a range sent until the range's `close` succeeds,
// then produces it in the order sent: exactly once in the batch's Kafka
// transaction (no --sink-db), or at-least-once, acknowledged before the
// range is recorded applied, each record carrying its idempotency key in
// the header `sluice-idempotency-key`. A range written again drops what
// its failed attempt sent.

import { Fatal } from './errors.js';
import { host } from './host.js';
import { asBytes } from './wire.js';

/** Queue `records` for production when the range closes. Each record is
 * `{ topic, idempotencyKey, key, value, headers, partition }`: `topic` one
 * of the pipeline's output topics; `idempotencyKey` the key of the input
 * it comes from (`sinkRecord.idempotencyKey`, plus `#n` for its n-th
 * further record); `key` and `value` a Uint8Array, a string (UTF-8) or
 * `null` (a null key; a tombstone), `null` when left out; `headers`
 * optional `[name, value]` pairs; `partition` optional (by default the
 * partition of the key, as Kafka's Java client picks it). Throws `Fatal`
 * with the host's reason when it refuses (no --output-topic, a topic the
 * pipeline does not name, a partition the topic lacks, more than 64 MiB
 * in one range): the range fails even if the error is caught. */
export function send(records) {
  const kafka = host().kafka();
  if (kafka === null) throw new Fatal('kafka: no kafka capability granted (outside a sink stage in the host)');
  const wit = records.map((r) => ({
    topic: r.topic,
    partition: r.partition ?? undefined,
    key: asBytes('key', r.key ?? null) ?? undefined,
    value: asBytes('value', r.value ?? null) ?? undefined,
    headers: (r.headers ?? []).map(([name, v]) => ({ key: name, value: asBytes('header', v ?? null) ?? undefined })),
    idempotencyKey: r.idempotencyKey,
  }));
  try {
    kafka.send(wit);
  } catch (e) {
    throw new Fatal(`kafka: ${e?.payload ?? e}`);
  }
}
