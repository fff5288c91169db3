//! What the app sees and gives, in its own terms: the names of fields in what the client
//! hands it ([`named`]: IDs stay on the wire, in the queue and in logs), and the natural JS
//! forms of written values ([`natural`]: `insert`/`update` in the npm package), made the
//! canonical wire form where the conversion is exact and unambiguous; anything else is left
//! as it is and refused by the wire grammar, naming the field.
//!
//! - a boolean field takes `0` and `1` too (what a read gives: SQLite has no boolean), so a
//!   row read can be written back unchanged;
//! - an int64 field takes a number too when it is a safe integer (|n| <= 2^53 - 1, what a
//!   read gives below 2^53); beyond, only a BigInt or a decimal string is exact;
//! - a datetime field takes a `Date` (JSON gives `YYYY-MM-DDTHH:MM:SS.mmmZ`) or that text, and
//!   `YYYY-MM-DDTHH:MM:SSZ`, padded to the canonical six fractional digits.

use synchro_protocol::json::Json;
use synchro_protocol::types::PortableType;

/// Largest integer a JS number holds exactly.
const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// `value` (as `JSON.stringify` gave it) in the wire form of `ty` where its natural form
/// converts exactly; otherwise unchanged.
pub fn natural(ty: PortableType, value: Json) -> Json {
    match (ty, value) {
        (PortableType::Boolean, Json::Number(t)) if t == "0" || t == "1" => Json::Bool(t == "1"),
        (PortableType::Int64, Json::Number(t)) if safe_integer(&t) => Json::String(t),
        (PortableType::Datetime, Json::String(s)) => Json::String(datetime(s)),
        (_, value) => value,
    }
}

fn safe_integer(token: &str) -> bool {
    let digits = token.strip_prefix('-').unwrap_or(token);
    !digits.is_empty()
        && digits.len() <= 16
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'))
        && digits.parse::<u64>().is_ok_and(|n| n <= MAX_SAFE_INTEGER)
        && token != "-0"
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` and `YYYY-MM-DDTHH:MM:SSZ` with six fractional digits.
fn datetime(s: String) -> String {
    let b = s.as_bytes();
    let shape = |len: usize| b.len() == len && b[10] == b'T' && b[len - 1] == b'Z';
    if shape(24) && b[19] == b'.' {
        format!("{}000Z", &s[..23])
    } else if shape(20) {
        format!("{}.000000Z", &s[..19])
    } else {
        s
    }
}

/// An outcome (or any JSON the server said about a mutation) with field IDs replaced by
/// the names `name_of` gives: object member names that are field IDs (a row's fields), the
/// items of `incompatible_field_ids` (renamed `incompatible_fields`), and IDs quoted in a
/// `message`. Row values are never touched.
pub fn named<'a>(v: Json, name_of: &impl Fn(&str) -> Option<&'a str>) -> Json {
    match v {
        Json::Object(members) => Json::Object(
            members
                .into_iter()
                .map(|(k, v)| match (k.as_str(), v) {
                    ("incompatible_field_ids", Json::Array(ids)) => (
                        "incompatible_fields".to_owned(),
                        Json::Array(
                            ids.into_iter()
                                .map(|id| match id {
                                    Json::String(id) => {
                                        Json::String(name_of(&id).map_or(id, str::to_owned))
                                    }
                                    other => other,
                                })
                                .collect(),
                        ),
                    ),
                    ("message", Json::String(m)) => {
                        let m = m
                            .split_inclusive(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                            .map(|w| {
                                let id = w.trim_end_matches(|c: char| {
                                    !(c.is_ascii_alphanumeric() || c == '_')
                                });
                                match name_of(id) {
                                    Some(name) => format!("{name}{}", &w[id.len()..]),
                                    None => w.to_owned(),
                                }
                            })
                            .collect();
                        ("message".to_owned(), Json::String(m))
                    }
                    (_, v) => {
                        let name = name_of(&k).map_or(k, str::to_owned);
                        (name, named(v, name_of))
                    }
                })
                .collect(),
        ),
        Json::Array(items) => Json::Array(items.into_iter().map(|v| named(v, name_of)).collect()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use synchro_protocol::types::FieldSpec;
    use synchro_protocol::value::TypedValue;

    fn wire(ty: PortableType, json: &str) -> Option<String> {
        let spec = FieldSpec::new(ty, false).unwrap();
        let v = natural(ty, Json::parse(json).unwrap());
        TypedValue::from_wire(&spec, &v)
            .ok()
            .map(|_| synchro_protocol::jcs::to_output_string(&v))
    }

    #[test]
    fn exact_natural_forms_become_the_wire_form() {
        use PortableType::*;
        assert_eq!(wire(Boolean, "1").as_deref(), Some("true"));
        assert_eq!(wire(Boolean, "0").as_deref(), Some("false"));
        assert_eq!(wire(Boolean, "true").as_deref(), Some("true"));
        assert_eq!(wire(Int64, "3").as_deref(), Some("\"3\""));
        assert_eq!(
            wire(Int64, "-9007199254740991").as_deref(),
            Some("\"-9007199254740991\"")
        );
        assert_eq!(
            wire(Int64, "\"9223372036854775807\"").as_deref(),
            Some("\"9223372036854775807\"")
        );
        assert_eq!(
            wire(Datetime, "\"2026-12-06T20:41:41.123Z\"").as_deref(),
            Some("\"2026-12-06T20:41:41.123000Z\"")
        );
        assert_eq!(
            wire(Datetime, "\"2026-12-06T20:41:41Z\"").as_deref(),
            Some("\"2026-12-06T20:41:41.000000Z\"")
        );
        assert_eq!(
            wire(Datetime, "\"2026-12-06T20:41:41.123456Z\"").as_deref(),
            Some("\"2026-12-06T20:41:41.123456Z\"")
        );
    }

    #[test]
    fn outcomes_name_fields_and_leave_values_alone() {
        let names = |id: &str| match id {
            "fld_aaa" => Some("title"),
            "fld_bbb" => Some("done"),
            _ => None,
        };
        let outcome = Json::parse(
            r#"{"status":"rejected_terminal","code":"invalid_value","message":"a value for field fld_aaa does not match; fld_zzz unknown","current":{"row":{"fld_aaa":"fld_bbb","fld_bbb":true},"server_version":"7"},"incompatible_field_ids":["fld_bbb","fld_zzz"]}"#,
        )
        .unwrap();
        assert_eq!(
            synchro_protocol::jcs::to_output_string(&named(outcome, &names)),
            r#"{"code":"invalid_value","current":{"row":{"done":true,"title":"fld_bbb"},"server_version":"7"},"incompatible_fields":["done","fld_zzz"],"message":"a value for field title does not match; fld_zzz unknown","status":"rejected_terminal"}"#
        );
    }

    #[test]
    fn inexact_or_ambiguous_forms_are_still_refused() {
        use PortableType::*;
        for (ty, json) in [
            (Boolean, "2"),
            (Boolean, "1.0"),
            (Boolean, "\"1\""),
            (Int64, "9007199254740992"),
            (Int64, "1e3"),
            (Int64, "3.5"),
            (Int64, "-0"),
            (Int, "\"3\""),
            (Datetime, "\"2026-12-06T20:41:41.123+01:00\""),
            (Datetime, "\"2026-12-06 20:41:41.123Z\""),
            (Datetime, "\"+275760-09-13T00:00:00.000Z\""),
            (Date, "\"2026-12-06T00:00:00.000Z\""),
        ] {
            assert_eq!(wire(ty, json), None, "{ty:?} {json}");
        }
    }
}
