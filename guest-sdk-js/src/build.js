#!/usr/bin/env node
// `sluice-guest-build app.js -o plugin.wasm`: bundle a plugin module and
// the SDK with esbuild, then build a WebAssembly component from the bundle
// with ComponentizeJS against `sluice:plugin` (`wit/plugin.wit`). The
// world follows the module's exports: `mapper` → map-plugin, `sink` →
// sink-plugin, both → map-sink-plugin. Exit codes: 0 built, 1 build
// failed, 2 usage.

import { existsSync, realpathSync } from 'node:fs';
import { appendFile, mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const HERE = dirname(fileURLToPath(import.meta.url));
const PACKAGE = resolve(HERE, '..');

const USAGE = `usage: sluice-guest-build APP.js -o PLUGIN.wasm [--keep]

Builds APP.js (an ES module exporting \`mapper\`, \`sink\` or both, made with
exportMap / exportSink of 'sluice-guest') into a Sluice plugin component.
  -o, --output FILE   where to write the component (required)
  --keep              keep the bundle and the generated entry (printed)`;

/** The contract's WIT file: shipped in the package (`wit/plugin.wit`), or
 * the repository's when the package is used from a checkout. */
export function witPath() {
  for (const p of [join(PACKAGE, 'wit', 'plugin.wit'), join(PACKAGE, '..', 'wit', 'plugin.wit')]) {
    if (existsSync(p)) return p;
  }
  throw new Error(`no wit/plugin.wit in ${PACKAGE} or its parent: the SDK is incomplete`);
}

/** The world for a module exporting `names`. */
export function worldFor(names) {
  const map = names.includes('mapper');
  const sink = names.includes('sink');
  if (map && sink) return 'map-sink-plugin';
  if (map) return 'map-plugin';
  if (sink) return 'sink-plugin';
  return null;
}

/** The entry module: installs the WIT imports as the SDK's host, then
 * re-exports the app's stages. */
export function entrySource(app, world) {
  const host = JSON.stringify(join(PACKAGE, 'src', 'host.js'));
  const withSql = world !== 'map-plugin';
  const exports = world === 'map-sink-plugin' ? 'mapper, sink' : world === 'map-plugin' ? 'mapper' : 'sink';
  return [
    `import * as log from 'sluice:plugin/log@0.2.4';`,
    `import * as config from 'sluice:plugin/config@0.2.4';`,
    withSql ? `import * as sql from 'sluice:plugin/sql@0.2.4';` : `const sql = null;`,
    withSql ? `import * as kafka from 'sluice:plugin/kafka@0.2.4';` : `const kafka = null;`,
    `import { installComponentHost } from ${host};`,
    `installComponentHost({ log, config, sql, kafka });`,
    `export { ${exports} } from ${JSON.stringify(app)};`,
    '',
  ].join('\n');
}

// `sluice-guest` and its subpaths are this SDK's own files, wherever the
// app lives: the stages and the entry's host must be one module instance.
const SUBPATHS = { '': 'index.js', '/json': 'json.js', '/kafka': 'kafka.js', '/sql': 'sql.js', '/testing': 'testing.js' };
const thisSdk = {
  name: 'sluice-guest',
  setup(build) {
    build.onResolve({ filter: /^sluice-guest(\/.*)?$/ }, (args) => {
      const file = SUBPATHS[args.path.slice('sluice-guest'.length)];
      if (file === undefined) return { errors: [{ text: `${args.path} is not part of sluice-guest (${Object.keys(SUBPATHS).map((s) => `sluice-guest${s}`).join(', ')})` }] };
      return { path: join(PACKAGE, 'src', file) };
    });
  },
};

const BUNDLE = {
  bundle: true,
  plugins: [thisSdk],
  format: 'esm',
  platform: 'neutral',
  mainFields: ['module', 'main'],
  target: 'es2022',
  external: ['sluice:*'],
  keepNames: true,
  logLevel: 'silent',
};

/**
 * The bundle's line table, as the statement appended to it: for each
 * line of the bundle (1-based) the source file and line it came from, so
 * the SDK can print an uncaught error's stack as `app.js:27` rather than
 * `plugin.js:729` (SpiderMonkey does not read source maps). `map`: the
 * esbuild source map (JSON text) of the bundle in `dir`.
 */
export async function lineTable(map, dir, app) {
  const { SourceMapConsumer } = await import('source-map-js');
  const consumer = new SourceMapConsumer(JSON.parse(map));
  const sources = [];
  const index = new Map();
  const lines = [];
  const name = (source) => {
    const abs = resolve(dir, source);
    const sdk = relative(join(PACKAGE, 'src'), abs);
    return sdk.startsWith('..') ? relative(dirname(app), abs) : `sluice-guest/${sdk}`;
  };
  consumer.eachMapping((m) => {
    if (m.source === null || lines[m.generatedLine] !== undefined) return;
    if (!index.has(m.source)) {
      index.set(m.source, sources.length);
      sources.push(name(m.source));
    }
    lines[m.generatedLine] = [index.get(m.source), m.originalLine];
  });
  const table = { sources, lines: Array.from(lines, (l) => l ?? 0) };
  return `\nglobalThis.__sluiceGuestLines = ${JSON.stringify(table)};\n`;
}

const STAGE = Symbol.for('sluice-guest.stage');
const STAGE_CLASS = Symbol.for('sluice-guest.stage-class');
const NAMES = { map: 'mapper', sink: 'sink' };
const MAKERS = { map: 'exportMap', sink: 'exportSink' };

/**
 * What is wrong with a module's exports (`exports`: its namespace, loaded
 * natively): a stage exported under a name the contract does not look
 * for, or a stage class exported with no stage made from it. An empty
 * list when they are right.
 */
export function exportProblems(exports) {
  const problems = [];
  const made = new Set();
  for (const [name, value] of Object.entries(exports)) {
    const kind = value !== null && typeof value === 'object' ? value[STAGE] : undefined;
    if (kind === undefined) continue;
    made.add(kind);
    if (name !== NAMES[kind]) {
      problems.push(`\`${name}\` is a ${kind} stage, but the contract finds it only as \`${NAMES[kind]}\`: \`export const ${NAMES[kind]} = ${MAKERS[kind]}(…)\``);
    }
  }
  for (const [name, value] of Object.entries(exports)) {
    const kind = typeof value === 'function' ? value.prototype?.[STAGE_CLASS] : undefined;
    if (kind !== undefined && !made.has(kind)) {
      problems.push(`\`${name}\` is a ${kind} stage class, but no ${kind} stage is exported: \`export const ${NAMES[kind]} = ${MAKERS[kind]}(${name})\``);
    }
  }
  return problems;
}

async function main() {
  let args;
  try {
    args = parseArgs({
      allowPositionals: true,
      options: { output: { type: 'string', short: 'o' }, keep: { type: 'boolean' }, help: { type: 'boolean', short: 'h' } },
    });
  } catch (e) {
    console.error(`${e.message}\n${USAGE}`);
    return 2;
  }
  if (args.values.help) {
    console.log(USAGE);
    return 0;
  }
  if (args.positionals.length !== 1 || !args.values.output) {
    console.error(USAGE);
    return 2;
  }
  const app = resolve(args.positionals[0]);
  const output = resolve(args.values.output);
  if (!existsSync(app)) {
    console.error(`sluice-guest-build: ${app}: no such file`);
    return 2;
  }
  const started = Date.now();
  const esbuild = await import('esbuild');
  const { componentize } = await import('@bytecodealliance/componentize-js');

  let probe;
  try {
    probe = await esbuild.build({ ...BUNDLE, entryPoints: [app], write: false, metafile: true, outdir: 'out' });
  } catch (e) {
    console.error(`sluice-guest-build: ${app} does not bundle:\n${(e.errors ?? []).map((m) => esbuild.formatMessagesSync([m], { kind: 'error' }).join('')).join('') || e.message}`);
    return 1;
  }
  const names = Object.values(probe.metafile.outputs).flatMap((o) => o.exports ?? []);
  // Load the module natively (as the Python build imports app.py) to
  // check what its exports are, not only their names.
  let loaded = null;
  try {
    const code = probe.outputFiles[0].text;
    loaded = await import(`data:text/javascript;base64,${Buffer.from(code).toString('base64')}`);
  } catch (e) {
    console.error(`sluice-guest-build: warning: ${app} did not load under Node.js (${e.message}); its exports are checked by name only`);
  }
  const problems = loaded === null ? [] : exportProblems(loaded);
  if (problems.length) {
    console.error(`sluice-guest-build: ${app}:\n  ${problems.join('\n  ')}`);
    return 1;
  }
  const world = worldFor(names);
  if (world === null) {
    console.error(
      `sluice-guest-build: ${app} exports neither \`mapper\` nor \`sink\` (found: ${names.join(', ') || 'nothing'}); ` +
        `add \`export const mapper = exportMap(MyMapper)\` and/or \`export const sink = exportSink(MySink)\``,
    );
    return 1;
  }

  const work = await mkdtemp(join(tmpdir(), 'sluice-guest-build-'));
  try {
    const entry = join(work, 'entry.js');
    const bundle = join(work, 'plugin.js');
    await writeFile(entry, entrySource(app, world));
    await esbuild.build({ ...BUNDLE, entryPoints: [entry], outfile: bundle, sourcemap: 'external' });
    await appendFile(bundle, await lineTable(await readFile(`${bundle}.map`, 'utf8'), work, app));
    const { component } = await componentize({
      sourcePath: bundle,
      witPath: witPath(),
      worldName: world,
      // No outgoing HTTP and no fetch event: the host grants neither.
      disableFeatures: ['http', 'fetch-event'],
    });
    await writeFile(output, component);
    const size = (await stat(output)).size;
    console.log(
      `built ${output} (${world}, ${(size / 1048576).toFixed(1)} MiB) in ${((Date.now() - started) / 1000).toFixed(1)} s`,
    );
    if (args.values.keep) console.log(`kept ${entry} and ${bundle}`);
    return 0;
  } catch (e) {
    console.error(`sluice-guest-build: ${e.message ?? e}`);
    return 1;
  } finally {
    if (!args.values.keep) await rm(work, { recursive: true, force: true });
  }
}

// Run as a program (also through node_modules/.bin's symlink), not when
// imported by the tests.
if (process.argv[1] && realpathSync(process.argv[1]) === fileURLToPath(import.meta.url)) {
  process.exitCode = await main();
}
