//! `passthrough`: the identity map. Every record comes out unchanged (key,
//! value, headers), tombstones and null keys included. Useful as a
//! baseline in benchmarks and as the smallest possible plugin.

use sluice_guest::{Config, Emit, Error, Mapper, Record};

/// The identity map stage.
pub struct Passthrough;

impl Mapper for Passthrough {
    fn new(_config: &Config) -> Result<Self, Error> {
        Ok(Passthrough)
    }

    fn map(&mut self, record: &Record<'_>, out: &mut Emit<'_>) -> Result<(), Error> {
        out.forward(record);
        Ok(())
    }
}

sluice_guest::export!(map: Passthrough);

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_guest::testing;

    #[test]
    fn forwards_values_and_tombstones() {
        let mut r = Record::with_value("t", 0, 0, b"");
        let mut tomb = Record::with_value("t", 0, 1, b"");
        tomb.value = None;
        r.key = Some(b"k");
        let got = testing::map::<Passthrough>(&Config::default(), &[r, tomb]).unwrap();
        assert_eq!(got.outputs.len(), 2);
        assert_eq!(got.outputs[0].value.as_deref(), Some(&b""[..]));
        assert_eq!(got.outputs[0].key.as_deref(), Some(&b"k"[..]));
        assert_eq!(got.outputs[1].value, None);
    }
}
