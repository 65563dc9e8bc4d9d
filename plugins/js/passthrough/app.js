// `passthrough` in JavaScript: every record goes on unchanged (key, value,
// headers), as the Rust `passthrough` plugin does.

import * as sluice from 'sluice-guest';

class Passthrough extends sluice.Mapper {
  map(record, emit) {
    emit(record.key, record.value, record.headers);
  }
}

export const mapper = sluice.exportMap(Passthrough);
