//! Refuses JSON request bodies in which an object names the same key twice. `serde_json`
//! keeps the last value of a repeated key, so `{"n": 1, "n": 16}` would silently mean
//! something other than what a reader (or a proxy that keeps the first value) sees; RFC 8259
//! says names should be unique, and a request that breaks that is a client mistake (400).

use std::collections::HashSet;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// A JSON document, walked only to check that no object repeats a key.
#[derive(Debug)]
pub struct UniqueKeys;

impl<'de> Deserialize<'de> for UniqueKeys {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<UniqueKeys, D::Error> {
        d.deserialize_any(UniqueKeysVisitor)
    }
}

struct UniqueKeysVisitor;

impl<'de> Visitor<'de> for UniqueKeysVisitor {
    type Value = UniqueKeys;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_unit<E: de::Error>(self) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<UniqueKeys, A::Error> {
        while seq.next_element::<UniqueKeys>()?.is_some() {}
        Ok(UniqueKeys)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<UniqueKeys, A::Error> {
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if seen.contains(&key) {
                return Err(de::Error::custom(format!("the key `{key}` appears twice")));
            }
            map.next_value::<UniqueKeys>()?;
            seen.insert(key);
        }
        Ok(UniqueKeys)
    }
}

#[cfg(test)]
mod tests {
    use super::UniqueKeys;

    fn check(s: &str) -> Result<(), String> {
        serde_json::from_str::<UniqueKeys>(s)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn repeated_keys_are_refused_at_any_depth() {
        assert!(check(r#"{"n": 1, "n": 16}"#)
            .unwrap_err()
            .contains("`n` appears twice"));
        let nested = r#"{"messages": [{"role": "user", "role": "system", "content": "x"}]}"#;
        assert!(check(nested).unwrap_err().contains("`role`"));
        assert!(check(r#"{"a": {"b": {"c": 1, "c": 1}}}"#).is_err());
        // The same key in different objects, and every JSON type, are fine.
        let ok = r#"{"a": {"k": 1}, "b": {"k": [true, null, -1, 2.5, "s", {"k": 0}]}}"#;
        assert!(check(ok).is_ok());
        // Escapes that spell the same key are the same key.
        assert!(check(r#"{"n": 1, "\u006e": 2}"#).is_err());
    }
}
