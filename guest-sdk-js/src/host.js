// What a stage can ask of the host (`log`, `config`, `sql`, `kafka`), behind one
// object. Inside a component, the entry module that `sluice-guest-build`
// generates installs the WIT imports (`installComponentHost`); natively
// (unit tests under Node.js) a stand-in with a given config logs to
// stderr and has no SQL connection.

/** The host of native runs: `config` pairs given by the test. */
export class NativeHost {
  constructor(config = {}) {
    this.config = new Map(Object.entries(config));
  }

  log(level, message) {
    console.error(`[${level}] ${message}`);
  }

  configGet(key) {
    return this.config.get(key) ?? null;
  }

  configAll() {
    return [...this.config.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  }

  sql() {
    return null;
  }

  kafka() {
    return null;
  }
}

/** The host of a component: the imports of `sluice:plugin/log`,
 * `config` and (in a world with a sink) `sql` and `kafka`. */
class ComponentHost {
  constructor({ log, config, sql, kafka }) {
    this.imports = { log, config, sql: sql ?? null, kafka: kafka ?? null };
  }

  log(level, message) {
    this.imports.log.log(level, message);
  }

  configGet(key) {
    return this.imports.config.get(key) ?? null;
  }

  configAll() {
    return this.imports.config.getAll();
  }

  sql() {
    return this.imports.sql;
  }

  kafka() {
    return this.imports.kafka;
  }
}

let current = null;

/** The current host: the installed one, else a native one with no config. */
export function host() {
  if (current === null) current = new NativeHost();
  return current;
}

/** Use `h` from now on (the testing helpers install a `NativeHost`). */
export function install(h) {
  current = h;
}

/** Called by the generated component entry with the WIT import modules. */
export function installComponentHost(imports) {
  current = new ComponentHost(imports);
}
