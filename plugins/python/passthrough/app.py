"""`passthrough` in Python: every record goes on unchanged (key, value,
headers), as the Rust `passthrough` plugin does."""

import sluice_guest as sluice


class Passthrough(sluice.Mapper):
    def map(self, record, emit):
        emit(record.key, record.value, record.headers)


Mapper = sluice.export_map(Passthrough)
