//! Logging setup for every `hostmesh` subcommand: one `tracing` subscriber
//! with an env-filter and a text or JSON formatter, writing to stderr.
//!
//! Invariants:
//! 1. The filter comes from `--log-level` when given, else from `RUST_LOG`,
//!    else `info`; an invalid directive is an error naming the flag or the
//!    variable, never silently ignored.
//! 2. JSON output is one object per line (`timestamp`, `level`, `target`,
//!    `fields`, `span`), so log pipelines need no multi-line parsing.
//! 3. Logs go to stderr: stdout belongs to commands that print results
//!    (`hostmesh crds`, `hostmesh status`).

use std::str::FromStr;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

/// The environment variable consulted when `--log-level` is absent.
pub const RUST_LOG: &str = "RUST_LOG";

/// Errors from setting up logging.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// A filter directive did not parse.
    #[error(
        "invalid {source_name} {value:?}: {reason}; use a level (error, warn, info, debug, trace) \
         or directives such as `info,hostmesh_operator=debug`"
    )]
    InvalidFilter {
        /// Where the directive came from (`--log-level` or `RUST_LOG`).
        source_name: &'static str,
        /// The rejected directive.
        value: String,
        /// What the parser said.
        reason: String,
    },
    /// A global subscriber was already installed.
    #[error("a tracing subscriber is already installed: {0}")]
    AlreadyInstalled(String),
}

/// How log lines are formatted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            other => Err(format!(
                "unknown log format {other:?}: use `text` or `json`"
            )),
        }
    }
}

/// Logging flags shared by the long-running subcommands (flatten into their
/// `clap::Args`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TelemetryArgs {
    /// Log line format.
    #[arg(long, value_enum, env = "HOSTMESH_LOG_FORMAT", default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log filter: a level (`info`) or env-filter directives
    /// (`info,hostmesh_operator=debug`). Defaults to `RUST_LOG`, then `info`.
    #[arg(long, env = "HOSTMESH_LOG_LEVEL")]
    pub log_level: Option<String>,
}

const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// Builds the filter following invariant 1; `rust_log` is the value of
/// `RUST_LOG` (passed in so tests need not touch the process environment).
pub fn build_filter(
    log_level: Option<&str>,
    rust_log: Option<&str>,
) -> Result<EnvFilter, TelemetryError> {
    let (source_name, value) = match (log_level, rust_log) {
        (Some(level), _) => ("--log-level", level),
        (None, Some(env)) if !env.trim().is_empty() => (RUST_LOG, env),
        _ => ("default", "info"),
    };
    // A bare word is a valid directive (a target at TRACE), but on this flag
    // it is nearly always a mistyped level: reject it and show the fix.
    if let Some(word) = value.split(',').map(str::trim).find(|d| {
        !d.is_empty()
            && !d.contains(['=', '['])
            && !LEVELS.contains(&d.to_ascii_lowercase().as_str())
    }) {
        return Err(TelemetryError::InvalidFilter {
            source_name,
            value: value.to_owned(),
            reason: format!("{word:?} is not a level; for a target write `{word}=debug`"),
        });
    }
    EnvFilter::builder()
        .parse(value)
        .map_err(|e| TelemetryError::InvalidFilter {
            source_name,
            value: value.to_owned(),
            reason: e.to_string(),
        })
}

/// Builds a subscriber writing to `writer`; [`init`] uses stderr.
pub fn build_subscriber<W>(
    format: LogFormat,
    filter: EnvFilter,
    writer: W,
) -> Box<dyn tracing::Subscriber + Send + Sync + 'static>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        LogFormat::Text => Box::new(builder.with_ansi(false).finish()),
        LogFormat::Json => Box::new(
            builder
                .json()
                .with_current_span(true)
                .with_span_list(false)
                .finish(),
        ),
    }
}

/// Installs the global subscriber for this process.
pub fn init(args: &TelemetryArgs) -> Result<(), TelemetryError> {
    let rust_log = std::env::var(RUST_LOG).ok();
    let filter = build_filter(args.log_level.as_deref(), rust_log.as_deref())?;
    let subscriber = build_subscriber(args.log_format, filter, std::io::stderr);
    tracing::subscriber::set_global_default(subscriber)
        .map_err(|e| TelemetryError::AlreadyInstalled(e.to_string()))
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl Write for Buf {
        fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("buffer lock").extend_from_slice(data);
            Ok(data.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'w> MakeWriter<'w> for Buf {
        type Writer = Buf;
        fn make_writer(&'w self) -> Self::Writer {
            self.clone()
        }
    }

    impl Buf {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().expect("buffer lock").clone()).expect("utf-8 logs")
        }
    }

    #[test]
    fn flag_wins_over_env_and_env_over_default() {
        let f = build_filter(Some("debug"), Some("error")).expect("valid");
        assert_eq!(f.to_string(), "debug");
        let f = build_filter(None, Some("warn,hostmesh_operator=trace")).expect("valid");
        assert!(f.to_string().contains("hostmesh_operator=trace"), "{f}");
        let f = build_filter(None, Some("  ")).expect("valid");
        assert_eq!(f.to_string(), "info");
        let f = build_filter(None, None).expect("valid");
        assert_eq!(f.to_string(), "info");
    }

    #[test]
    fn invalid_filter_names_its_source_and_the_fix() {
        let err = build_filter(Some("loud"), None).expect_err("not a level");
        let msg = err.to_string();
        assert!(msg.contains("--log-level"), "{msg}");
        assert!(msg.contains("\"loud\""), "{msg}");
        assert!(msg.contains("use a level"), "{msg}");
        assert!(msg.contains("`loud=debug`"), "{msg}");
        let err = build_filter(None, Some("x=nope")).expect_err("bad env");
        assert!(err.to_string().contains("RUST_LOG"), "{err}");
    }

    #[test]
    fn log_format_parses_case_insensitively_and_rejects_others() {
        assert_eq!("JSON".parse::<LogFormat>(), Ok(LogFormat::Json));
        assert_eq!("text".parse::<LogFormat>(), Ok(LogFormat::Text));
        let err = "yaml".parse::<LogFormat>().expect_err("unknown");
        assert!(err.contains("`text` or `json`"), "{err}");
    }

    #[test]
    fn json_format_writes_one_object_per_line_and_respects_the_filter() {
        let buf = Buf::default();
        let filter = build_filter(Some("info"), None).expect("valid");
        let subscriber = build_subscriber(LogFormat::Json, filter, buf.clone());
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("reconcile", world = "trainer");
            let _guard = span.enter();
            tracing::info!(rank = 3, "host failed");
            tracing::debug!("filtered out");
        });
        let text = buf.text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1, "{text}");
        let v: serde_json::Value = serde_json::from_str(lines[0]).expect("json line");
        assert_eq!(v["level"], "INFO");
        assert_eq!(v["fields"]["message"], "host failed");
        assert_eq!(v["fields"]["rank"], 3);
        assert_eq!(v["span"]["world"], "trainer");
        assert!(v["timestamp"].is_string(), "{v}");
    }

    #[test]
    fn text_format_has_no_ansi_escapes() {
        let buf = Buf::default();
        let filter = build_filter(Some("warn"), None).expect("valid");
        let subscriber = build_subscriber(LogFormat::Text, filter, buf.clone());
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(world = "trainer", "degraded");
            tracing::info!("filtered out");
        });
        let text = buf.text();
        assert!(text.contains("WARN"), "{text}");
        assert!(text.contains("degraded"), "{text}");
        assert!(!text.contains("filtered out"), "{text}");
        assert!(!text.contains('\u{1b}'), "{text:?}");
    }
}
