//! `route` config: which source tables go to which destination table.
//!
//! A route is `SOURCE=DEST` or `SOURCE` (keep the table's name), several
//! comma-separated; the first that matches wins. SOURCE is
//! `database.table` (Maxwell, the Debezium MySQL connector) or
//! `schema.table` (the Debezium PostgreSQL and SQL Server connectors);
//! either part is a name, `*` (any) or a prefix ending in `*`. DEST is a
//! plain SQL identifier or `*` (the source table's name).

use sluice_guest::{Error, sql};

/// One part of a source pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    /// `*`.
    Any,
    /// `cust*`: names starting with `cust`.
    Prefix(String),
    /// An exact name.
    Exact(String),
}

impl Part {
    fn parse(s: &str) -> Part {
        match s.strip_suffix('*') {
            Some("") => Part::Any,
            Some(p) => Part::Prefix(p.to_string()),
            None => Part::Exact(s.to_string()),
        }
    }

    fn matches(&self, name: &str) -> bool {
        match self {
            Part::Any => true,
            Part::Prefix(p) => name.starts_with(p.as_str()),
            Part::Exact(e) => name == e,
        }
    }
}

/// One `SOURCE=DEST` rule.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    database: Part,
    table: Part,
    /// `None`: the source table's name.
    dest: Option<String>,
}

/// The routes of a pipeline, in configured order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Routes {
    rules: Vec<Rule>,
}

impl Routes {
    /// Parse the `route` config's entries (already split on commas).
    ///
    /// # Errors
    /// [`Error::Fatal`] naming the entry: no `.` in SOURCE, an empty
    /// part, or a DEST that is not a plain SQL identifier; no entry at all.
    pub fn parse(entries: &[String]) -> Result<Routes, Error> {
        let mut rules = Vec::new();
        for entry in entries.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
            let (source, dest) = match entry.split_once('=') {
                Some((s, d)) => (s.trim(), Some(d.trim())),
                None => (entry, None),
            };
            let bad = |why: &str| {
                Error::fatal(format!(
                    "route `{entry}`: {why} (the form is SOURCE=DEST, e.g. route=shop.customers=customers or route=shop.*=*)"
                ))
            };
            let (database, table) = source
                .split_once('.')
                .ok_or_else(|| bad("SOURCE needs a `.` between database (or schema) and table"))?;
            if database.is_empty() || table.is_empty() {
                return Err(bad("an empty database or table in SOURCE"));
            }
            let dest = match dest {
                None | Some("*") => None,
                Some(d) => Some(sql::identifier("route destination", d)?.to_string()),
            };
            rules.push(Rule {
                database: Part::parse(database),
                table: Part::parse(table),
                dest,
            });
        }
        if rules.is_empty() {
            return Err(Error::fatal(
                "the cdc plugin needs `route`: which source tables go where, e.g. --config route=shop.customers=customers (several comma-separated; `shop.*=*` keeps every table's name)",
            ));
        }
        Ok(Routes { rules })
    }

    /// The destination of `database.table`; `None` when no route matches.
    pub fn destination<'a>(&'a self, database: &str, table: &'a str) -> Option<&'a str> {
        let rule = self
            .rules
            .iter()
            .find(|r| r.database.matches(database) && r.table.matches(table))?;
        Some(rule.dest.as_deref().unwrap_or(table))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes(s: &[&str]) -> Routes {
        Routes::parse(&s.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn first_matching_rule_wins_and_star_keeps_the_name() {
        let r = routes(&[
            "shop.customers=clients",
            "shop.*",
            "*.orders=all_orders",
            "hr.emp*=*",
        ]);
        assert_eq!(r.destination("shop", "customers"), Some("clients"));
        assert_eq!(r.destination("shop", "items"), Some("items"));
        assert_eq!(r.destination("eu", "orders"), Some("all_orders"));
        assert_eq!(r.destination("hr", "employees"), Some("employees"));
        assert_eq!(r.destination("hr", "salaries"), None);
        assert_eq!(r.destination("shopx", "customers"), None);
    }

    #[test]
    fn malformed_routes_are_refused_with_the_entry() {
        for (entries, says) in [
            (vec!["customers=c"], "needs a `.`"),
            (vec![".t=c"], "empty database"),
            (vec!["s.t=bad-name"], "not a plain SQL identifier"),
            (vec![" ", ""], "needs `route`"),
        ] {
            let entries: Vec<String> = entries.iter().map(|s| s.to_string()).collect();
            let e = Routes::parse(&entries).unwrap_err().to_string();
            assert!(e.contains(says), "{entries:?}: {e}");
        }
    }
}
