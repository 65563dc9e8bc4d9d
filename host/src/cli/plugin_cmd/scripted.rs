//! `host plugin new --lang python|js`: a plugin in a language the host
//! runs through a component-building toolchain (componentize-py,
//! ComponentizeJS) — its module with the chosen stages, unit tests that
//! run natively, one build command that installs the pinned tools, a
//! `host test` input, a README, and the SDK under `sluice-sdk/`.

use std::path::PathBuf;

use super::sdk;
use super::spec::{NewPlugin, readme_flags, stages};

const PY_HEAD: &str = include_str!("template/python/head.py.txt");
const PY_MAP: &str = include_str!("template/python/map.py.txt");
const PY_SINK: &str = include_str!("template/python/sink.py.txt");
const PY_TEST: &str = include_str!("template/python/test_app.py.txt");
const PY_BUILD: &str = include_str!("template/python/build.sh.txt");
const PY_README: &str = include_str!("template/python/README.md.txt");
const JS_HEAD: &str = include_str!("template/js/head.js.txt");
const JS_MAP: &str = include_str!("template/js/map.js.txt");
const JS_SINK: &str = include_str!("template/js/sink.js.txt");
const JS_TEST: &str = include_str!("template/js/app.test.js.txt");
const JS_PACKAGE: &str = include_str!("template/js/package.json.txt");
const JS_README: &str = include_str!("template/js/README.md.txt");
const SAMPLE: &str = include_str!("template/sample.txt");

/// The componentize-py a generated Python plugin builds with (the one the
/// test command installs).
pub(super) const COMPONENTIZE_PY: &str = "0.25.1";

/// The files of a Python plugin: `app.py` with the chosen stages,
/// `test_app.py`, `sample.txt`, `build.sh`, a README, and the Python SDK
/// under `sluice-sdk/`.
pub(super) fn python_files(p: &NewPlugin<'_>, lib: &str) -> Vec<(PathBuf, String)> {
    let dir = p.parent.join(p.name);
    let stages = stages(p.map, p.sink);
    let fill = |t: &str| {
        t.replace("{{name}}", p.name)
            .replace("{{lib}}", lib)
            .replace("{{stages}}", stages)
            .replace("{{componentize}}", COMPONENTIZE_PY)
    };
    let mut app = fill(PY_HEAD);
    let mut tests = String::new();
    if p.map {
        app.push_str(&fill(PY_MAP));
        tests.push_str(
            r#"    def test_keeps_one_tables_events_and_rejects_what_is_not_json(self):
        m = testing.map_values(app.Keep, [b'{"table":"orders","data":{"v":1.10}}', b'{"table":"users","data":{}}', b"oops"])
        self.assertEqual([o.value for o in m.outputs], [b'{"table":"orders","data":{"v":1.10}}'])
        self.assertEqual([i for i, _ in m.rejected], [2])

"#,
        );
    }
    if p.sink {
        app.push_str(&fill(PY_SINK));
        tests.push_str(
            r#"    def test_the_sink_table_must_be_a_plain_sql_name(self):
        with self.assertRaises(sluice_guest.Fatal):
            testing.make(app.Store, {"sink_table": "no such; table"})

"#,
        );
    }
    app.push_str(match (p.map, p.sink) {
        (true, true) => "\n\nMapper = sluice.export_map(Keep)\nSink = sluice.export_sink(Store)\n",
        (false, true) => "\n\nSink = sluice.export_sink(Store)\n",
        _ => "\n\nMapper = sluice.export_map(Keep)\n",
    });
    let class: String = p
        .name
        .split(['-', '_'])
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect();
    let test = fill(PY_TEST)
        .replace("{{Class}}", &class)
        .replace("{{tests}}", tests.trim_end());
    let (test_flags, sink_note, run_flags) = readme_flags(p.sink, lib);
    let readme = fill(PY_README)
        .replace("{{test_flags}}", test_flags)
        .replace("{{sink_note}}", &sink_note)
        .replace("{{run_flags}}", run_flags);
    let mut files = vec![
        (dir.join("app.py"), app),
        (dir.join("test_app.py"), test),
        (dir.join("sample.txt"), SAMPLE.to_string()),
        (dir.join("build.sh"), fill(PY_BUILD)),
        (dir.join("README.md"), readme),
        (
            dir.join(".gitignore"),
            format!(
                ".venv/
__pycache__/
{lib}.wasm
sluice-sdk/build/
*.egg-info/
"
            ),
        ),
    ];
    for (path, text) in sdk::PY_FILES {
        files.push((dir.join("sluice-sdk").join(path), (*text).to_string()));
    }
    files
}

/// The dependencies of the JavaScript SDK (its `package.json`), as the
/// lines of a generated plugin's `dependencies`: the build tools at the
/// SDK's pinned versions, installed beside the plugin (npm does not
/// install the dependencies of a `file:` package).
fn js_sdk_dependencies() -> (String, String) {
    let manifest: serde_json::Value = sdk::JS_FILES
        .iter()
        .find(|(p, _)| *p == "package.json")
        .and_then(|(_, text)| serde_json::from_str(text).ok())
        .unwrap_or_default();
    let deps = manifest["dependencies"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let componentize = deps
        .get("@bytecodealliance/componentize-js")
        .and_then(|v| v.as_str())
        .unwrap_or("?")
        .to_string();
    let lines = deps
        .iter()
        .map(|(name, version)| format!("    \"{name}\": {version}"))
        .collect::<Vec<_>>()
        .join(",\n");
    (lines, componentize)
}

/// The files of a JavaScript plugin: `app.js` with the chosen stages,
/// `app.test.js`, `sample.txt`, `package.json` (whose `npm run build`
/// installs, tests and builds), a README, and the JavaScript SDK under
/// `sluice-sdk/`.
pub(super) fn js_files(p: &NewPlugin<'_>, lib: &str) -> Vec<(PathBuf, String)> {
    let dir = p.parent.join(p.name);
    let stages = stages(p.map, p.sink);
    let (dependencies, componentize) = js_sdk_dependencies();
    let fill = |t: &str| {
        t.replace("{{name}}", p.name)
            .replace("{{lib}}", lib)
            .replace("{{stages}}", stages)
            .replace("{{componentize}}", &componentize)
            .replace("{{sdk_dependencies}}", &dependencies)
    };
    let mut app = fill(JS_HEAD);
    let mut tests = Vec::new();
    if p.map {
        app.push_str(&fill(JS_MAP));
        tests.push(
            r#"test("keeps one table's events and rejects what is not JSON", () => {
  const m = mapValues(app.Keep, ['{"table":"orders","data":{"v":1.10}}', '{"table":"users","data":{}}', 'oops']);
  assert.deepEqual(m.outputs.map((o) => text(o.value)), ['{"table":"orders","data":{"v":1.10}}']);
  assert.deepEqual(m.rejected.map(([i]) => i), [2]);
});"#,
        );
    }
    if p.sink {
        app.push_str(&fill(JS_SINK));
        tests.push(
            r#"test('the sink table must be a plain SQL name', () => {
  assert.throws(() => make(app.Store, { sink_table: 'no such; table' }), sluice.Fatal);
});"#,
        );
    }
    app.push_str(match (p.map, p.sink) {
        (true, true) => {
            "\nexport const mapper = sluice.exportMap(Keep);\nexport const sink = sluice.exportSink(Store);\n"
        }
        (false, true) => "\nexport const sink = sluice.exportSink(Store);\n",
        _ => "\nexport const mapper = sluice.exportMap(Keep);\n",
    });
    let test = fill(JS_TEST).replace("{{tests}}", &(tests.join("\n\n") + "\n"));
    let (test_flags, sink_note, run_flags) = readme_flags(p.sink, lib);
    let readme = fill(JS_README)
        .replace("{{test_flags}}", test_flags)
        .replace("{{sink_note}}", &sink_note)
        .replace("{{run_flags}}", run_flags);
    let mut files = vec![
        (dir.join("app.js"), app),
        (dir.join("app.test.js"), test),
        (dir.join("sample.txt"), SAMPLE.to_string()),
        (dir.join("package.json"), fill(JS_PACKAGE)),
        (dir.join("README.md"), readme),
        (
            dir.join(".gitignore"),
            format!("node_modules/\n{lib}.wasm\n"),
        ),
    ];
    for (path, text) in sdk::JS_FILES {
        files.push((dir.join("sluice-sdk").join(path), (*text).to_string()));
    }
    files
}
