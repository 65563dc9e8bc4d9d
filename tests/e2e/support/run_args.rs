//! The one builder of `host run` argument lists. Each test area starts
//! from it and adds its own defaults:
//! `RunArgs::new(bootstrap, &["t"], &ckpt).sink_db(&db).plugin("company").args(["--until-caught-up"]).build()`.

use std::path::Path;

use super::{Db, plugin};

/// `host run` arguments, in order.
#[derive(Debug, Clone)]
pub struct RunArgs(Vec<String>);

impl RunArgs {
    /// `run --brokers B --topic T… --checkpoint DIR`.
    pub fn new(bootstrap: &str, topics: &[&str], ckpt: &Path) -> RunArgs {
        let mut v: Vec<String> = vec!["run".into(), "--brokers".into(), bootstrap.into()];
        for t in topics {
            v.extend(["--topic".to_string(), t.to_string()]);
        }
        v.extend(["--checkpoint".to_string(), ckpt.display().to_string()]);
        RunArgs(v)
    }

    /// `--sink-db` of `db`.
    pub fn sink_db(self, db: &Db) -> RunArgs {
        self.args(["--sink-db", db.url.as_str()])
    }

    /// `--plugin` of a built component (`company`, `sql_counter`, …).
    pub fn plugin(self, name: &str) -> RunArgs {
        let p = plugin(name);
        self.plugin_file(&p)
    }

    /// `--plugin FILE`.
    pub fn plugin_file(self, file: &Path) -> RunArgs {
        self.args(["--plugin", &file.display().to_string()])
    }

    /// More arguments, as given.
    pub fn args<S: AsRef<str>>(mut self, more: impl IntoIterator<Item = S>) -> RunArgs {
        self.0
            .extend(more.into_iter().map(|s| s.as_ref().to_string()));
        self
    }

    /// The list.
    pub fn build(self) -> Vec<String> {
        self.0
    }
}
