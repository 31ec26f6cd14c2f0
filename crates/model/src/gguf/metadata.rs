//! GGUF metadata: typed key/value pairs, and accessors that check the stored type.
//!
//! Integer accessors accept any stored integer type whose value fits the requested type
//! (files written by different tools disagree on, say, u32 versus i32 for token ids);
//! anything else is a typed error naming the key.

use std::collections::BTreeMap;

use super::error::GgufError;

/// One metadata value. GGUF arrays are homogeneous and may nest.
#[derive(Debug, Clone, PartialEq)]
pub enum MetadataValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<MetadataValue>),
}

impl MetadataValue {
    /// The GGUF value type id of this value (`gguf_type` in the format description).
    pub fn type_id(&self) -> u32 {
        match self {
            MetadataValue::U8(_) => 0,
            MetadataValue::I8(_) => 1,
            MetadataValue::U16(_) => 2,
            MetadataValue::I16(_) => 3,
            MetadataValue::U32(_) => 4,
            MetadataValue::I32(_) => 5,
            MetadataValue::F32(_) => 6,
            MetadataValue::Bool(_) => 7,
            MetadataValue::String(_) => 8,
            MetadataValue::Array(_) => 9,
            MetadataValue::U64(_) => 10,
            MetadataValue::I64(_) => 11,
            MetadataValue::F64(_) => 12,
        }
    }

    /// A short name of the value's type, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            MetadataValue::U8(_) => "u8",
            MetadataValue::I8(_) => "i8",
            MetadataValue::U16(_) => "u16",
            MetadataValue::I16(_) => "i16",
            MetadataValue::U32(_) => "u32",
            MetadataValue::I32(_) => "i32",
            MetadataValue::U64(_) => "u64",
            MetadataValue::I64(_) => "i64",
            MetadataValue::F32(_) => "f32",
            MetadataValue::F64(_) => "f64",
            MetadataValue::Bool(_) => "bool",
            MetadataValue::String(_) => "string",
            MetadataValue::Array(_) => "array",
        }
    }

    /// The value as an integer, if it is one of the integer types.
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            MetadataValue::U8(v) => v.into(),
            MetadataValue::I8(v) => v.into(),
            MetadataValue::U16(v) => v.into(),
            MetadataValue::I16(v) => v.into(),
            MetadataValue::U32(v) => v.into(),
            MetadataValue::I32(v) => v.into(),
            MetadataValue::U64(v) => v.into(),
            MetadataValue::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// The value as an f32: floats (f64 narrowed; finite values beyond the f32 range are
    /// `None`) and integers (rounded to the nearest f32).
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            MetadataValue::F32(v) => Some(v),
            MetadataValue::F64(v) => {
                let narrow = v as f32;
                (narrow.is_finite() || !v.is_finite()).then_some(narrow)
            }
            _ => self.as_i128().map(|v| v as f32),
        }
    }
}

/// All metadata of a file, by key. Keys are unique (the parser rejects duplicates).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metadata {
    map: BTreeMap<String, MetadataValue>,
}

impl Metadata {
    /// Inserts a pair; returns the previous value of `key`, if any.
    pub fn insert(&mut self, key: String, value: MetadataValue) -> Option<MetadataValue> {
        self.map.insert(key, value)
    }

    pub fn get(&self, key: &str) -> Option<&MetadataValue> {
        self.map.get(key)
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.map.keys().map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    fn require(&self, key: &str) -> Result<&MetadataValue, GgufError> {
        self.get(key)
            .ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    pub fn str(&self, key: &str) -> Result<&str, GgufError> {
        match self.require(key)? {
            MetadataValue::String(s) => Ok(s),
            other => Err(wrong_type(key, "string", other)),
        }
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        self.optional(key, Metadata::str)
    }

    /// Any integer value in `0..=u32::MAX`.
    pub fn u32(&self, key: &str) -> Result<u32, GgufError> {
        integer(key, self.require(key)?, "u32")
    }

    pub fn opt_u32(&self, key: &str) -> Result<Option<u32>, GgufError> {
        self.optional(key, Metadata::u32)
    }

    /// Any integer value in `0..=u64::MAX`.
    pub fn u64(&self, key: &str) -> Result<u64, GgufError> {
        integer(key, self.require(key)?, "u64")
    }

    pub fn opt_u64(&self, key: &str) -> Result<Option<u64>, GgufError> {
        self.optional(key, Metadata::u64)
    }

    /// An f32, f64 (narrowed) or integer value.
    pub fn f32(&self, key: &str) -> Result<f32, GgufError> {
        to_f32(key, self.require(key)?)
    }

    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>, GgufError> {
        self.optional(key, Metadata::f32)
    }

    pub fn bool(&self, key: &str) -> Result<bool, GgufError> {
        match self.require(key)? {
            MetadataValue::Bool(b) => Ok(*b),
            other => Err(wrong_type(key, "bool", other)),
        }
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        self.optional(key, Metadata::bool)
    }

    /// An array of strings.
    pub fn str_array(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        self.array(key, "array of strings", |v| match v {
            MetadataValue::String(s) => Some(s.as_str()),
            _ => None,
        })
    }

    /// An array of integers, each in the i32 range.
    pub fn i32_array(&self, key: &str) -> Result<Vec<i32>, GgufError> {
        self.int_array(key, "array of i32 integers")
    }

    /// An array of integers, each in the u32 range.
    pub fn u32_array(&self, key: &str) -> Result<Vec<u32>, GgufError> {
        self.int_array(key, "array of u32 integers")
    }

    /// An array of floats or integers, converted as by [`Metadata::f32`].
    pub fn f32_array(&self, key: &str) -> Result<Vec<f32>, GgufError> {
        self.array(key, "array of numbers", MetadataValue::as_f32)
    }

    fn int_array<T: TryFrom<i128>>(
        &self,
        key: &str,
        expected: &'static str,
    ) -> Result<Vec<T>, GgufError> {
        self.array(key, expected, |v| T::try_from(v.as_i128()?).ok())
    }

    /// Converts every element with `convert`; the first element it rejects makes the
    /// whole value a [`GgufError::WrongType`].
    fn array<'s, T>(
        &'s self,
        key: &str,
        expected: &'static str,
        convert: impl Fn(&'s MetadataValue) -> Option<T>,
    ) -> Result<Vec<T>, GgufError> {
        let items = match self.require(key)? {
            MetadataValue::Array(items) => items,
            other => return Err(wrong_type(key, expected, other)),
        };
        items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                convert(item).ok_or_else(|| GgufError::WrongType {
                    key: key.to_string(),
                    expected,
                    found: format!("element {i}: {}", describe(item)),
                })
            })
            .collect()
    }

    fn optional<'s, T>(
        &'s self,
        key: &str,
        get: impl Fn(&'s Metadata, &str) -> Result<T, GgufError>,
    ) -> Result<Option<T>, GgufError> {
        match self.map.contains_key(key) {
            true => get(self, key).map(Some),
            false => Ok(None),
        }
    }
}

fn wrong_type(key: &str, expected: &'static str, found: &MetadataValue) -> GgufError {
    GgufError::WrongType {
        key: key.to_string(),
        expected,
        found: found.type_name().to_string(),
    }
}

/// The type of `value`, with the value itself when it is a scalar.
fn describe(value: &MetadataValue) -> String {
    match value {
        MetadataValue::String(_) | MetadataValue::Array(_) => value.type_name().to_string(),
        scalar => format!("{scalar:?}"),
    }
}

fn integer<T: TryFrom<i128>>(
    key: &str,
    value: &MetadataValue,
    expected: &'static str,
) -> Result<T, GgufError> {
    let v = value
        .as_i128()
        .ok_or_else(|| wrong_type(key, expected, value))?;
    T::try_from(v).map_err(|_| GgufError::OutOfRange {
        key: key.to_string(),
        expected,
        value: v.to_string(),
    })
}

fn to_f32(key: &str, value: &MetadataValue) -> Result<f32, GgufError> {
    match value.as_f32() {
        Some(v) => Ok(v),
        None if matches!(value, MetadataValue::F64(_)) => Err(GgufError::OutOfRange {
            key: key.to_string(),
            expected: "f32",
            value: format!("{value:?}"),
        }),
        None => Err(wrong_type(key, "f32", value)),
    }
}
