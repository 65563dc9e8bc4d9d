//! `create=print`: for a destination table that does not exist, the
//! `CREATE TABLE` it needs, guessed from the first change routed to it,
//! and the table as if it existed (so `host test` can show the
//! statements that would fill it). The user owns the DDL: the plugin
//! prints it, it never runs it.
//!
//! Column types come from the change's JSON values (the change record
//! carries values, not the source's types): a string is text, an integer
//! of 64 bits a 64-bit integer, another number a decimal (`NUMERIC` on PostgreSQL,
//! `TEXT` on SQLite, whose `NUMERIC` keeps only 15 significant digits), a
//! boolean a boolean, an object or array JSON (`JSONB`; `TEXT` on
//! SQLite), a null text. Key columns are `NOT NULL` and the primary key;
//! the position column is `TEXT`.

use sluice_guest::Error;
use sluice_guest::json::{Object, RawValue};

use crate::table::{Column, Dialect, Table, kind, quote};

/// The DDL type and PostgreSQL's name for it (what
/// `information_schema.columns.udt_name` would show) for `value`.
fn guess_type(dialect: Dialect, value: &RawValue) -> (&'static str, &'static str) {
    let pg = dialect == Dialect::Postgres;
    let text = value.get();
    match text.as_bytes().first() {
        Some(b'"') | Some(b'n') | None => ("TEXT", "text"),
        Some(b't' | b'f') => ("BOOLEAN", "bool"),
        Some(b'{' | b'[') if pg => ("JSONB", "jsonb"),
        Some(b'{' | b'[') => ("TEXT", "text"),
        // A whole number beyond 64 bits (MySQL's BIGINT UNSIGNED, BIT(64))
        // needs a decimal column.
        Some(_) if !text.contains(['.', 'e', 'E']) && text.parse::<i64>().is_ok() => {
            ("BIGINT", "int8")
        }
        Some(_) if pg => ("NUMERIC", "numeric"),
        Some(_) => ("TEXT", "text"),
    }
}

/// The `CREATE TABLE` for `name` from a change's `key` and `row` (`None`
/// for a delete: the key columns only), and the table it describes.
///
/// # Errors
/// [`Error::BadRecord`]: the change has no key, or a column name the
/// position column already has.
pub fn guess(
    dialect: Dialect,
    name: &str,
    key: &Object<'_>,
    row: Option<&Object<'_>>,
    position_column: &str,
) -> Result<(String, Table), Error> {
    if key.is_empty() {
        return Err(Error::bad_record(format!(
            "create=print: the first change for {name} has no primary key to guess the table from"
        )));
    }
    let mut names: Vec<&str> = Vec::new();
    let mut values: Vec<&RawValue> = Vec::new();
    // Key columns first, then the row's others, in the row's order; a
    // key column takes the row's value when it has one.
    for (k, v) in key.iter() {
        let v = row.and_then(|r| r.get(k)).unwrap_or(v);
        names.push(k);
        values.push(v);
    }
    if let Some(row) = row {
        for (k, v) in row.iter() {
            if !names.iter().any(|n| n.eq_ignore_ascii_case(k)) {
                names.push(k);
                values.push(v);
            }
        }
    }
    if names
        .iter()
        .any(|n| n.eq_ignore_ascii_case(position_column))
    {
        return Err(Error::bad_record(format!(
            "create=print: {name} has a source column named like the position column {position_column}; set position_column to another name"
        )));
    }
    let keys = key.len();
    let mut cells = Vec::new();
    let mut columns = Vec::new();
    for (i, (n, v)) in names.iter().zip(&values).enumerate() {
        let (ddl, udt) = guess_type(dialect, v);
        let not_null = i < keys;
        cells.push(format!(
            "{} {ddl}{}",
            quote(n),
            if not_null { " NOT NULL" } else { "" }
        ));
        columns.push(Column {
            name: n.to_string(),
            kind: kind(dialect, udt),
            not_null,
            has_default: false,
            cast: udt.to_string(),
            max_chars: None,
            numeric: None,
        });
    }
    cells.push(format!("{} TEXT", quote(position_column)));
    columns.push(Column {
        name: position_column.to_string(),
        kind: kind(dialect, "text"),
        not_null: false,
        has_default: false,
        cast: "text".into(),
        max_chars: None,
        numeric: None,
    });
    let primary: Vec<String> = names[..keys].iter().map(|n| quote(n)).collect();
    let ddl = format!(
        "CREATE TABLE {} ({}, PRIMARY KEY ({}))",
        quote(name),
        cells.join(", "),
        primary.join(", ")
    );
    let table = Table::new(dialect, name, columns, position_column)?;
    Ok((ddl, table))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_are_guessed_from_the_values_and_the_key_leads() {
        let key = Object::parse(br#"{"id":1}"#).unwrap();
        let row = Object::parse(
            br#"{"name":"Acme","id":1,"revenue":12.5,"ok":true,"tags":["a"],"note":null}"#,
        )
        .unwrap();
        let (ddl, t) = guess(Dialect::Postgres, "company", &key, Some(&row), "_p").unwrap();
        assert_eq!(
            ddl,
            "CREATE TABLE \"company\" (\"id\" BIGINT NOT NULL, \"name\" TEXT, \"revenue\" NUMERIC, \
             \"ok\" BOOLEAN, \"tags\" JSONB, \"note\" TEXT, \"_p\" TEXT, PRIMARY KEY (\"id\"))"
        );
        assert_eq!(t.columns.len(), 7);
        assert_eq!(t.position_column().name, "_p");
        let (ddl, _) = guess(Dialect::Sqlite, "company", &key, Some(&row), "_p").unwrap();
        assert!(
            ddl.contains("\"revenue\" TEXT") && ddl.contains("\"tags\" TEXT"),
            "{ddl}"
        );
        // Beyond 64 bits: a decimal on PostgreSQL, text on SQLite.
        let big = Object::parse(br#"{"u":18446744073709551615}"#).unwrap();
        let (ddl, _) = guess(Dialect::Postgres, "g", &key, Some(&big), "_p").unwrap();
        assert!(ddl.contains("\"u\" NUMERIC"), "{ddl}");
        let (ddl, _) = guess(Dialect::Sqlite, "g", &key, Some(&big), "_p").unwrap();
        assert!(ddl.contains("\"u\" TEXT"), "{ddl}");
        // A delete knows only its key.
        let (ddl, _) = guess(Dialect::Sqlite, "company", &key, None, "_p").unwrap();
        assert_eq!(
            ddl,
            "CREATE TABLE \"company\" (\"id\" BIGINT NOT NULL, \"_p\" TEXT, PRIMARY KEY (\"id\"))"
        );
        let empty = Object::parse(b"{}").unwrap();
        assert!(guess(Dialect::Sqlite, "company", &empty, Some(&row), "_p").is_err());
        let clash = Object::parse(br#"{"id":1,"_P":"x"}"#).unwrap();
        assert!(guess(Dialect::Sqlite, "company", &key, Some(&clash), "_p").is_err());
    }
}
