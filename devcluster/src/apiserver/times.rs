//! Owns the wire formats of `metav1.Time` and `metav1.MicroTime` in
//! built-in objects, as kube-apiserver decodes them:
//!
//! 1. A `Time` is RFC 3339 (`2006-01-02T15:04:05Z07:00`); as Go's parser
//!    does, a fraction is accepted and dropped. It is stored in UTC
//!    without a fraction.
//! 2. A `MicroTime` has exactly six fractional digits
//!    (`2006-01-02T15:04:05.000000Z07:00`); nine digits, three, or none
//!    are refused. It is stored in UTC.
//! 3. A refused value fails the request the way the real server's decoder
//!    does: 400 BadRequest for a create or update body, 422 Invalid for a
//!    patch (see `body_error` and `patch_error`).
//!
//! The fields are found by path per kind (`FIELDS`); custom resources are
//! judged by their schemas instead.

use serde_json::Value;

use super::registry::ResourceInfo;
use super::status::ApiError;

/// Which of the two formats a field takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Time,
    Micro,
}

const TIME_LAYOUT: &str = "2006-01-02T15:04:05Z07:00";
const MICRO_LAYOUT: &str = "2006-01-02T15:04:05.000000Z07:00";

/// Paths (dot-separated, `[]` for every item of a list) of the time
/// fields of every object.
const COMMON: &[(&str, Kind)] = &[
    ("metadata.creationTimestamp", Kind::Time),
    ("metadata.deletionTimestamp", Kind::Time),
    ("metadata.managedFields[].time", Kind::Time),
    ("status.conditions[].lastTransitionTime", Kind::Time),
    ("status.conditions[].lastProbeTime", Kind::Time),
    ("status.conditions[].lastUpdateTime", Kind::Time),
    ("status.conditions[].lastHeartbeatTime", Kind::Time),
];

/// Kind-specific time fields, by `(group, plural)`.
fn fields(group: &str, plural: &str) -> &'static [(&'static str, Kind)] {
    match (group, plural) {
        ("coordination.k8s.io", "leases") => &[
            ("spec.acquireTime", Kind::Micro),
            ("spec.renewTime", Kind::Micro),
        ],
        ("", "events") => &[
            ("eventTime", Kind::Micro),
            ("series.lastObservedTime", Kind::Micro),
            ("firstTimestamp", Kind::Time),
            ("lastTimestamp", Kind::Time),
        ],
        ("events.k8s.io", "events") => &[
            ("eventTime", Kind::Micro),
            ("series.lastObservedTime", Kind::Micro),
            ("deprecatedFirstTimestamp", Kind::Time),
            ("deprecatedLastTimestamp", Kind::Time),
        ],
        ("", "pods") => &[
            ("status.startTime", Kind::Time),
            (
                "status.containerStatuses[].state.running.startedAt",
                Kind::Time,
            ),
            (
                "status.containerStatuses[].state.terminated.startedAt",
                Kind::Time,
            ),
            (
                "status.containerStatuses[].state.terminated.finishedAt",
                Kind::Time,
            ),
            (
                "status.containerStatuses[].lastState.terminated.startedAt",
                Kind::Time,
            ),
            (
                "status.containerStatuses[].lastState.terminated.finishedAt",
                Kind::Time,
            ),
            (
                "status.initContainerStatuses[].state.running.startedAt",
                Kind::Time,
            ),
            (
                "status.initContainerStatuses[].state.terminated.startedAt",
                Kind::Time,
            ),
            (
                "status.initContainerStatuses[].state.terminated.finishedAt",
                Kind::Time,
            ),
        ],
        ("batch", "jobs") => &[
            ("status.startTime", Kind::Time),
            ("status.completionTime", Kind::Time),
        ],
        ("policy", "poddisruptionbudgets") => &[],
        _ => &[],
    }
}

/// Checks and normalizes the time fields of a built-in object; the error
/// is Go's parse error for the first bad one.
fn normalize(info: &ResourceInfo, obj: &mut Value) -> Result<(), String> {
    if !info.builtin {
        return Ok(());
    }
    for (path, kind) in COMMON.iter().chain(fields(&info.group, &info.plural)) {
        let segs: Vec<&str> = path.split('.').collect();
        walk(obj, &segs, *kind)?;
    }
    Ok(())
}

fn walk(v: &mut Value, segs: &[&str], kind: Kind) -> Result<(), String> {
    let Some((first, rest)) = segs.split_first() else {
        return match v {
            Value::Null => Ok(()),
            Value::String(s) => {
                *s = parse(s, kind)?;
                Ok(())
            }
            other => Err(format!(
                "parsing time {other} as {:?}: the value is not a string",
                layout(kind)
            )),
        };
    };
    let (name, all) = match first.strip_suffix("[]") {
        Some(n) => (n, true),
        None => (*first, false),
    };
    let Some(child) = v.get_mut(name) else {
        return Ok(());
    };
    if all {
        if let Some(items) = child.as_array_mut() {
            for item in items {
                walk(item, rest, kind)?;
            }
        }
        Ok(())
    } else {
        walk(child, rest, kind)
    }
}

fn layout(kind: Kind) -> &'static str {
    match kind {
        Kind::Time => TIME_LAYOUT,
        Kind::Micro => MICRO_LAYOUT,
    }
}

/// Parses one value (invariants 1 and 2); returns the stored form.
fn parse(s: &str, kind: Kind) -> Result<String, String> {
    let fail = |rest: &str, elem: &str| {
        Err(format!(
            "parsing time {s:?} as {:?}: cannot parse {rest:?} as {elem:?}",
            layout(kind)
        ))
    };
    // Date and time of day: `2006-01-02T15:04:05`, digits where digits go.
    let b = s.as_bytes();
    let shape = b"dddd-dd-ddTdd:dd:dd";
    for (i, want) in shape.iter().enumerate() {
        let ok = b.get(i).is_some_and(|c| match want {
            b'd' => c.is_ascii_digit(),
            w => c == w,
        });
        if !ok {
            let elems = [
                "2006", "-", "01", "-", "02", "T", "15", ":", "04", ":", "05",
            ];
            let idx = [0, 4, 5, 7, 8, 10, 11, 13, 14, 16, 17]
                .iter()
                .rposition(|&start| start <= i)
                .unwrap_or(0);
            let start = [0, 4, 5, 7, 8, 10, 11, 13, 14, 16, 17][idx];
            return fail(s.get(start..).unwrap_or(""), elems[idx]);
        }
    }
    let rest = &s[shape.len()..];
    let (digits, tz) = match rest.strip_prefix('.') {
        Some(r) => {
            let n = r.bytes().take_while(u8::is_ascii_digit).count();
            (Some(&r[..n]), &r[n..])
        }
        None => (None, rest),
    };
    if kind == Kind::Micro {
        match digits {
            Some(d) if d.len() == 6 => {}
            Some(d) if d.len() > 6 => return fail(&rest[7..], "Z07:00"),
            _ => return fail(rest, ".000000"),
        }
    } else if digits.is_some_and(str::is_empty) {
        return fail(rest, "Z07:00");
    }
    let tz_ok = tz == "Z" || {
        let t = tz.as_bytes();
        t.len() == 6
            && matches!(t[0], b'+' | b'-')
            && t[1].is_ascii_digit()
            && t[2].is_ascii_digit()
            && t[3] == b':'
            && t[4].is_ascii_digit()
            && t[5].is_ascii_digit()
    };
    if !tz_ok {
        return fail(tz, "Z07:00");
    }
    let t = chrono::DateTime::parse_from_rfc3339(s)
        .map_err(|e| format!("parsing time {s:?}: {e}"))?
        .with_timezone(&chrono::Utc);
    Ok(match kind {
        Kind::Time => t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        Kind::Micro => t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
    })
}

/// Checks a create or update body: 400 as the real server's decoder
/// answers (`<Kind> in version "v1" cannot be handled as a <Kind>: ...`).
pub(crate) fn check_body(
    info: &ResourceInfo,
    version: &str,
    obj: &mut Value,
) -> Result<(), ApiError> {
    normalize(info, obj).map_err(|e| {
        ApiError::bad_request(format!(
            "{kind} in version {version:?} cannot be handled as a {kind}: {e}",
            kind = info.kind
        ))
    })
}

/// Checks a patched object: 422 on the `patch` field, as the real server
/// answers a patch whose result does not decode.
pub(crate) fn check_patched(info: &ResourceInfo, obj: &mut Value) -> Result<(), ApiError> {
    let before = obj.to_string();
    normalize(info, obj).map_err(|e| {
        ApiError::invalid(
            &info.group_kind(),
            "",
            vec![("patch".into(), format!("Invalid value: {before:?}: {e}"))],
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn micro_time_takes_exactly_six_digits() {
        let ok = parse("2026-01-02T03:04:05.123456Z", Kind::Micro).expect("six digits");
        assert_eq!(ok, "2026-01-02T03:04:05.123456Z");
        assert_eq!(
            parse("2026-01-02T05:04:05.123456+02:00", Kind::Micro).expect("offset"),
            "2026-01-02T03:04:05.123456Z"
        );
        let nine = parse("2026-01-02T03:04:05.123456789Z", Kind::Micro).expect_err("nine");
        assert!(
            nine.contains("cannot parse \"789Z\" as \"Z07:00\""),
            "{nine}"
        );
        for bad in [
            "2026-01-02T03:04:05.123Z",
            "2026-01-02T03:04:05Z",
            "2026-01-02 03:04:05.123456Z",
        ] {
            parse(bad, Kind::Micro).expect_err(bad);
        }
    }

    #[test]
    fn time_is_rfc3339_and_drops_a_fraction() {
        assert_eq!(
            parse("2026-01-02T03:04:05Z", Kind::Time).expect("plain"),
            "2026-01-02T03:04:05Z"
        );
        assert_eq!(
            parse("2026-01-02T03:04:05.999Z", Kind::Time).expect("fraction"),
            "2026-01-02T03:04:05Z"
        );
        for bad in [
            "2026-01-02",
            "2026-01-02T03:04:05",
            "2026-13-02T03:04:05Z",
            "yesterday",
            "2026-01-02T03:04:05.Z",
        ] {
            parse(bad, Kind::Time).expect_err(bad);
        }
    }
}
