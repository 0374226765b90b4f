//! Durations in specs, written as Go/Kubernetes-style text (`500ms`, `30s`,
//! `1m30s`, `2h`): parsing with errors that name the field.

use std::time::Duration;

use crate::field::FieldError;

/// The pattern duration fields must match in the schema.
pub const DURATION_PATTERN: &str = "^([0-9]+(\\.[0-9]+)?(ms|s|m|h))+$";

/// Parses `text` (e.g. `1m30s`) for the field at `field`.
pub fn parse(field: &str, text: &str) -> Result<Duration, FieldError> {
    let bad = || {
        FieldError::new(
            field,
            format!(
                "{text:?} is not a duration; write a number with a unit, e.g. \"30s\", \"500ms\", \"1m30s\" or \"2h\""
            ),
        )
    };
    if text.is_empty() {
        return Err(bad());
    }
    let mut total = 0f64;
    let mut rest = text;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        if num_len == 0 {
            return Err(bad());
        }
        let value: f64 = rest[..num_len].parse().map_err(|_| bad())?;
        rest = &rest[num_len..];
        let (unit, len) = if rest.starts_with("ms") {
            (0.001, 2)
        } else if rest.starts_with('s') {
            (1.0, 1)
        } else if rest.starts_with('m') {
            (60.0, 1)
        } else if rest.starts_with('h') {
            (3600.0, 1)
        } else {
            return Err(bad());
        };
        total += value * unit;
        rest = &rest[len..];
    }
    if !total.is_finite() || total > 366.0 * 24.0 * 3600.0 {
        return Err(FieldError::new(
            field,
            format!("{text:?} is longer than a year; use a shorter duration"),
        ));
    }
    Ok(Duration::from_secs_f64(total))
}

/// Parses an optional field, falling back to `default` when absent.
pub fn parse_or(
    field: &str,
    text: Option<&str>,
    default: Duration,
) -> Result<Duration, FieldError> {
    match text {
        Some(t) => parse(field, t),
        None => Ok(default),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_compounds() {
        assert_eq!(parse("f", "30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse("f", "500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse("f", "1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse("f", "2h").unwrap(), Duration::from_secs(7200));
        assert_eq!(parse("f", "1.5s").unwrap(), Duration::from_millis(1500));
    }

    #[test]
    fn rejects_with_field_name() {
        for bad in ["", "30", "s", "3x", "-1s", "1s2"] {
            let e = parse("spec.healthTimeout", bad).unwrap_err();
            assert_eq!(e.field, "spec.healthTimeout", "{bad}");
            assert!(e.message.contains("e.g."), "{bad}: {}", e.message);
        }
        assert!(parse("f", "9999999h").is_err());
    }
}
