//! Shared pieces of the benchmark binaries: the Maxwell event generator
//! (~200-byte company events) and the expected final table.

use std::collections::BTreeMap;

/// Deterministic Maxwell `company` events and the table they produce.
pub struct Events {
    /// Expected `companies` rows: pk JSON → row JSON (byte-exact).
    pub expected: BTreeMap<String, String>,
    n: u64,
}

impl Default for Events {
    fn default() -> Self {
        Self::new()
    }
}

impl Events {
    /// A fresh generator.
    pub fn new() -> Self {
        Events {
            expected: BTreeMap::new(),
            n: 0,
        }
    }

    /// The next event: (company id, Kafka key, Kafka value).
    pub fn next_event(&mut self, companies: u64) -> (u64, String, String) {
        self.n += 1;
        let id = (self.n * 7919) % companies + 1;
        let pk = format!(r#"{{"id":{id}}}"#);
        let delete = self.n.is_multiple_of(50) && self.expected.contains_key(&pk);
        let row = format!(
            r#"{{"id":{id},"name":"Company {id}","valuation":{}.{:06},"founded":"0000-00-00 00:00:00"}}"#,
            999_999_000_000u64 + id,
            self.n % 1_000_000
        );
        let kind = if delete {
            "delete"
        } else if self.expected.contains_key(&pk) {
            "update"
        } else {
            "insert"
        };
        let value = format!(
            r#"{{"database":"shop","table":"company","type":"{kind}","ts":{},"xid":{},"commit":true,"data":{row}}}"#,
            1_700_000_000 + self.n,
            self.n * 3
        );
        if delete {
            self.expected.remove(&pk);
        } else {
            self.expected.insert(pk, row);
        }
        let key = format!(r#"{{"database":"shop","table":"company","pk.id":{id}}}"#);
        (id, key, value)
    }
}
