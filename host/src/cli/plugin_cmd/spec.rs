//! What `host plugin new` generates, whatever the language: the plugin's
//! name and stages, and the words its README uses for them.

use std::path::Path;

use super::Lang;

/// What to generate.
pub(super) struct NewPlugin<'a> {
    /// The crate name (`[a-z][a-z0-9_-]*`).
    pub name: &'a str,
    /// Export a map stage.
    pub map: bool,
    /// Export a sink stage (SQL capability).
    pub sink: bool,
    /// Where the crate directory `name` is created.
    pub parent: &'a Path,
    /// The language.
    pub lang: Lang,
}

/// How a generated README names the stages.
pub(super) fn stages(map: bool, sink: bool) -> &'static str {
    match (map, sink) {
        (true, true) => "map and sink stages",
        (false, true) => "a sink stage",
        _ => "a map stage",
    }
}

/// What a generated README adds for a sink stage (or a map-only plugin):
/// the `host test` flags, the note on what they do, the `host run` flags.
pub(super) fn readme_flags(sink: bool, lib: &str) -> (&'static str, String, &'static str) {
    if sink {
        (
            " \\\n  --sink-db sqlite:try.db",
            format!(
                " (`--sink-db sqlite:try.db` runs them on that file and commits each partition's part; add `--dry-run` to roll back, or leave `--sink-db` out to print them without a database); `sqlite3 try.db 'SELECT * FROM {lib}_records'` shows the rows"
            ),
            " \\\n  --sink-db sqlite:./sink.db",
        )
    } else {
        (
            "",
            String::new(),
            " \\\n  --until-caught-up   # a map-only plugin: add a sink plugin to keep the outputs",
        )
    }
}
