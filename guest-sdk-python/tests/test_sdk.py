"""Unit tests of the Python SDK, natively (no component, no host)."""

import struct
import unittest

import sluice_guest as sluice
from sluice_guest import _host, json, sql, testing, wire


def record(offset, value, key=None, headers=()):
    return wire.Record("t", 3, offset, 1_700_000_000_123, "create-time", key, value, list(headers))


class Wire(unittest.TestCase):
    def test_records_round_trip_with_tombstones_empty_values_and_headers(self):
        records = [
            record(0, b"v", b"k", [("h", b"x"), ("none", None)]),
            record(1, None),
            record(2, b"", None),
        ]
        self.assertEqual(wire.read_records(wire.write_records(records)), records)

    def test_the_layout_is_the_wit_one(self):
        packed = wire.write_records([record(7, b"ab", None)])
        # u32 count, bytes topic, i32 partition, i64 offset, i64 ts, u8 type
        self.assertEqual(packed[:4], struct.pack("<I", 1))
        self.assertEqual(packed[4:9], struct.pack("<I", 1) + b"t")
        self.assertEqual(struct.unpack_from("<iqqB", packed, 9), (3, 7, 1_700_000_000_123, 1))
        # key none, value "ab", no headers
        rest = packed[9 + 21 :]
        self.assertEqual(rest, struct.pack("<I", 0xFFFF_FFFF) + struct.pack("<I", 2) + b"ab" + struct.pack("<I", 0))

    def test_a_truncated_buffer_is_an_error_at_every_length(self):
        packed = wire.write_records([record(0, b"value", b"key", [("h", b"x")])])
        for n in range(len(packed)):
            with self.assertRaises(wire.WireError, msg=f"length {n}"):
                wire.read_records(packed[:n])

    def test_outputs_take_bytes_text_and_none(self):
        out = wire.Outputs()
        out.push(0, "k", b"v", [("h", "x")])
        out.push(2, None, None)
        self.assertEqual(
            wire.read_outputs(out.finish()),
            [(0, b"k", b"v", [("h", b"x")]), (2, None, None, [])],
        )
        with self.assertRaises(TypeError):
            out.push(0, 1, b"v")


class Json(unittest.TestCase):
    def test_values_keep_their_source_text(self):
        fields = json.object_fields(b'{"v": 999999999999.999998, "d":"0000-00-00 00:00:00","o":{"a":[1, 2.50]}}')
        self.assertEqual(
            fields,
            [("v", "999999999999.999998"), ("d", '"0000-00-00 00:00:00"'), ("o", '{"a":[1, 2.50]}')],
        )

    def test_errors_are_bad_records(self):
        for bad, start in [(b"oops", "not JSON"), (b"[1]", "unexpected JSON"), (b'{"a":1', "not JSON"), (b"\xff", "not JSON")]:
            with self.assertRaises(sluice.BadRecord) as e:
                json.object_fields(bad)
            self.assertTrue(str(e.exception).startswith(start), str(e.exception))

    def test_nan_deep_nesting_and_lone_surrogates_are_not_json(self):
        for bad in [b'{"v": NaN}', b'{"v": -Infinity}', b'{"\\ud800": 1}', b'{"v": ' + b"[" * 5000 + b"]" * 5000 + b"}"]:
            with self.assertRaises(json.JsonError, msg=bad[:20]):
                json.object_fields(bad)

    def test_objects_are_written_without_spaces(self):
        self.assertEqual(json.write_object([("id", "1"), ("n", '"é"')]), '{"id":1,"n":"é"}')


class Upper(sluice.Mapper):
    def __init__(self, config):
        self.suffix = config.get("suffix", "")
        self.times = config.int("times", 1)

    def map(self, record, emit):
        if record.value is None:
            raise sluice.BadRecord("tombstone")
        for _ in range(self.times):
            emit(record.key, record.text().upper() + self.suffix)


class Stages(unittest.TestCase):
    def test_map_values_runs_the_stage_with_its_config(self):
        m = testing.map_values(Upper, ["ab", None, b"\xff", "c"], config={"suffix": "!", "times": "2"})
        self.assertEqual([(o.input_index, o.value) for o in m.outputs], [(0, b"AB!"), (0, b"AB!"), (3, b"C!"), (3, b"C!")])
        self.assertEqual([i for i, _ in m.rejected], [1, 2])
        self.assertEqual(m.rejected[0][1], "tombstone")
        self.assertIn("not UTF-8", m.rejected[1][1])

    def test_a_rejected_record_keeps_none_of_its_outputs(self):
        class Half(sluice.Mapper):
            def map(self, record, emit):
                emit(None, record.value)
                if record.value == b"bad":
                    raise sluice.BadRecord("after an output")

        m = testing.map_values(Half, ["a", "bad", "c"])
        self.assertEqual([(o.input_index, o.value) for o in m.outputs], [(0, b"a"), (2, b"c")])
        with self.assertRaises(TypeError):
            wire.Outputs().push(0, None, b"v", [(b"bytes-name", b"x")])

    def test_bad_config_is_fatal_and_names_the_key(self):
        with self.assertRaises(sluice.Fatal) as e:
            testing.map_values(Upper, ["a"], config={"times": "two"})
        self.assertIn("`times`", str(e.exception))

    def test_a_sinks_bad_record_names_its_place_in_the_chunk(self):
        class S(sluice.Sink):
            def write(self, r):
                if r.record.value == b"bad":
                    raise sluice.BadRecord("no")

        chunk = [sluice.SinkRecord(f"t/0/{i}", record(i, v)) for i, v in enumerate([b"a", b"bad", b"c"])]
        with self.assertRaises(sluice.BadRecord) as e:
            S(sluice.Config()).write_chunk(chunk)
        self.assertEqual(e.exception.index, 1)

    def test_sql_without_a_grant_says_so(self):
        _host.install(_host.NativeHost())
        with self.assertRaises(sql.SqlError) as e:
            sql.execute("SELECT 1")
        self.assertIn("no sql capability granted", str(e.exception))
        self.assertIsNone(sql.dialect())
        with self.assertRaises(sluice.Fatal):
            sql.identifier("table", "a; drop")


class Tables(unittest.TestCase):
    def test_names_are_checked_when_the_table_is_made(self):
        t = sql.Table("t", ["k", "v"], ["k"])
        self.assertEqual((t.name, t.columns, t.key), ("t", ["k", "v"], ["k"]))
        for bad in [("t; drop", ["k"], ["k"]), ("t", ["k", "k"], ["k"]), ("t", ["k"], ["x"]), ("t", [], [])]:
            with self.assertRaises(sluice.Fatal, msg=str(bad)):
                sql.Table(*bad)

    def test_natively_apply_has_no_connection(self):
        t = sql.Table("t", ["k"], ["k"])
        self.assertEqual(t.apply([]), 0)
        with self.assertRaises(sql.SqlError) as e:
            t.apply([("delete", ["a"])])
        self.assertIn("no sql capability granted", str(e.exception))
        self.assertEqual(t.apply_versioned("v", None, []), 0)
        with self.assertRaises(sql.SqlError) as e:
            t.apply_versioned("v", "a:", [("delete", ["a", "a:1"])])
        self.assertIn("no sql capability granted", str(e.exception))


if __name__ == "__main__":
    unittest.main()


class Build(unittest.TestCase):
    def test_a_stage_under_the_wrong_name_or_never_exported_is_refused(self):
        from sluice_guest.build import export_problems

        class Keep(sluice.Mapper):
            pass

        class Store(sluice.Sink):
            pass

        good = {"Keep": Keep, "Store": Store, "Mapper": sluice.export_map(Keep), "Sink": sluice.export_sink(Store)}
        self.assertEqual(export_problems(good), [])
        wrong = export_problems({"Keep": Keep, "mapper": sluice.export_map(Keep)})
        self.assertEqual(len(wrong), 1)
        self.assertIn("`mapper` is a map stage, but componentize-py exports it only as `Mapper`", wrong[0])
        never = export_problems({"Keep": Keep, "Sink": sluice.export_sink(Store), "base": sluice.Mapper})
        self.assertEqual(len(never), 1)
        self.assertIn("`Keep` is a map stage class, but no map stage is exported", never[0])


class Refusals(unittest.TestCase):
    def test_an_async_map_is_refused_not_dropped(self):
        class Later(sluice.Mapper):
            async def map(self, record, emit):
                emit(None, b"late")

        with self.assertRaises(TypeError):
            testing.map_values(Later, [b"x"])

    def test_a_string_with_a_lone_surrogate_escape_is_not_json(self):
        with self.assertRaises(json.JsonError):
            json.string('"\\ud800"')
        self.assertEqual(json.string('"\\ud83d\\ude00"'), "\U0001F600")

    def test_long_integers_are_kept_as_text(self):
        digits = "9" * 5000
        self.assertEqual(json.object_fields('{"ts":' + digits + "}"), [("ts", digits)])
