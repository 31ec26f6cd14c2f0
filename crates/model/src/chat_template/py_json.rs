//! JSON text exactly as Python's `json.dumps(value, ensure_ascii=False, indent=..)` writes
//! it, which is what Hugging Face chat templates get from their `tojson` filter.
//!
//! Differences from `serde_json`: `", "` and `": "` separators without indent, `","` and
//! `": "` with it; floats in Python's `repr` form (`1.0`, `1e+20`, `1.5e-07`); non-ASCII
//! characters kept; no HTML escaping (unlike minijinja's built-in `tojson`).

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// Layout options of `json.dumps`.
#[derive(Debug, Clone, Copy, Default)]
pub struct DumpOptions {
    /// Spaces per nesting level; `None` writes everything on one line.
    pub indent: Option<usize>,
    /// Writes object keys in sorted order (`sort_keys=True`).
    pub sort_keys: bool,
}

/// Serializes `value` as Python's `json.dumps` would. Undefined values and none are `null`;
/// values with no JSON form (callables, ...) are an error.
pub fn dumps(value: &Value, options: DumpOptions) -> Result<String, Error> {
    let mut out = String::new();
    write_value(&mut out, value, options, 0)?;
    Ok(out)
}

fn not_json(value: &Value) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("cannot serialize a {} to JSON", value.kind()),
    )
}

fn write_value(
    out: &mut String,
    value: &Value,
    opts: DumpOptions,
    depth: usize,
) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if let Ok(i) = i128::try_from(value.clone()) {
                out.push_str(&i.to_string());
            } else {
                let f = f64::try_from(value.clone()).map_err(|_| not_json(value))?;
                out.push_str(&python_float_repr(f));
            }
        }
        ValueKind::String => write_string(out, value.as_str().unwrap_or_default()),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(out, ('[', ']'), &items, opts, depth, |out, item, d| {
                write_value(out, item, opts, d)
            })?;
        }
        ValueKind::Map => {
            let mut entries = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                let key = match key.as_str() {
                    Some(k) => k.to_owned(),
                    None => key.to_string(),
                };
                entries.push((key, item));
            }
            if opts.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            write_container(out, ('{', '}'), &entries, opts, depth, |out, (k, v), d| {
                write_string(out, k);
                out.push_str(": ");
                write_value(out, v, opts, d)
            })?;
        }
        _ => return Err(not_json(value)),
    }
    Ok(())
}

/// Writes `[...]`/`{...}` with Python's separators and indentation.
fn write_container<T>(
    out: &mut String,
    (open, close): (char, char),
    items: &[T],
    opts: DumpOptions,
    depth: usize,
    mut write_item: impl FnMut(&mut String, &T, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    for (i, item) in items.iter().enumerate() {
        match opts.indent {
            Some(n) => {
                out.push_str(if i == 0 { "\n" } else { ",\n" });
                out.push_str(&" ".repeat(n * (depth + 1)));
            }
            None if i > 0 => out.push_str(", "),
            None => {}
        }
        write_item(out, item, depth + 1)?;
    }
    if let Some(n) = opts.indent {
        out.push('\n');
        out.push_str(&" ".repeat(n * depth));
    }
    out.push(close);
    Ok(())
}

fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0C}' => out.push_str("\\f"),
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: shortest round-trip digits, positional for exponents -4..16,
/// otherwise `d.ddde±XX`.
fn python_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    // `{:e}` gives the shortest round-trip mantissa, e.g. "1.5e-7", "-1e20", "0e0".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci
        .split_once('e')
        .expect("`{:e}` output always has an exponent");
    let exp: i32 = exp.parse().expect("`{:e}` exponent is an integer");
    let (sign, mantissa) = mantissa
        .strip_prefix('-')
        .map_or(("", mantissa), |m| ("-", m));
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        let body = if point <= 0 {
            format!("0.{}{digits}", "0".repeat(point.unsigned_abs() as usize))
        } else {
            let point = point as usize;
            let padded = format!("{digits:0<point$}");
            let (int, frac) = padded.split_at(point);
            format!("{int}.{}", if frac.is_empty() { "0" } else { frac })
        };
        format!("{sign}{body}")
    } else {
        let exp_sign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{mantissa}e{exp_sign}{:02}", exp.unsigned_abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(expr: &str) -> Value {
        let env = minijinja::Environment::new();
        env.compile_expression(expr)
            .expect("valid expression")
            .eval(())
            .expect("evaluates")
    }

    /// Expected strings are what CPython 3.11's `json.dumps(..., ensure_ascii=False)` prints.
    #[test]
    fn matches_python_json_dumps() {
        let v = eval(r#"{"b": [1, 2.5, true, none], "a": {"x": "é\n\"<>&'"}, "e": [], "f": {}}"#);
        let out = dumps(&v, DumpOptions::default()).expect("serializable");
        assert_eq!(
            out,
            r#"{"b": [1, 2.5, true, null], "a": {"x": "é\n\"<>&'"}, "e": [], "f": {}}"#
        );
        let sorted = DumpOptions {
            indent: Some(2),
            sort_keys: true,
        };
        let out = dumps(&eval(r#"{"b": [1], "a": {}}"#), sorted).expect("serializable");
        assert_eq!(out, "{\n  \"a\": {},\n  \"b\": [\n    1\n  ]\n}");
        let out = dumps(&Value::from("\u{1}\u{8}"), DumpOptions::default()).expect("string");
        assert_eq!(out, "\"\\u0001\\b\"");
    }

    #[test]
    fn floats_follow_python_repr() {
        let cases = [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e20, "1e+20"),
            (1.5e-7, "1.5e-07"),
            (0.0001, "0.0001"),
            (123456789.0, "123456789.0"),
            (1e16, "1e+16"),
            (1234.5678, "1234.5678"),
            (0.0, "0.0"),
        ];
        for (f, expected) in cases {
            assert_eq!(python_float_repr(f), expected, "{f}");
        }
    }
}
