"""What users write to copy a topic: a confluent-kafka consumer that reads
every record of IN (offset 0 to the high watermarks at start) and produces
it, key, value and headers as read, to OUT with an idempotent producer
(acks=all, Java's murmur2 partitioner, linger.ms=5: the host's settings),
then waits for every acknowledgement. At-least-once. Prints
`records seconds`.

Usage: py_copy_loop.py BOOTSTRAP IN OUT
"""
import sys
import time

from confluent_kafka import Consumer, Producer, TopicPartition


def main():
    bootstrap, src, dst = sys.argv[1:4]
    started = time.monotonic()
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-py-copy", "enable.auto.commit": False,
                  "isolation.level": "read_committed", "fetch.wait.max.ms": 100})
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                  "partitioner": "murmur2_random", "linger.ms": 5})
    parts = c.list_topics(src, timeout=60).topics[src].partitions
    highs = {}
    for part in parts:
        _, high = c.get_watermark_offsets(TopicPartition(src, part), timeout=60)
        if high > 0:
            highs[part] = high
    c.assign([TopicPartition(src, part, 0) for part in highs])
    nxt = {part: 0 for part in highs}
    n = 0
    while any(nxt[part] < highs[part] for part in highs):
        for m in c.consume(1000, 0.1):
            if m.error():
                raise SystemExit(f"read: {m.error()}")
            nxt[m.partition()] = m.offset() + 1
            while True:
                try:
                    p.produce(dst, value=m.value(), key=m.key(), headers=m.headers())
                    break
                except BufferError:
                    p.poll(0.01)
            n += 1
        p.poll(0)
    left = p.flush(60)
    if left:
        raise SystemExit(f"{left} outputs not acknowledged")
    print(n, f"{time.monotonic() - started:.3f}")


main()
