//! The Kubernetes remote-command channel protocols.
//!
//! Over WebSocket (`v4.channel.k8s.io`, `v5.channel.k8s.io`) every binary
//! message starts with a channel byte: 0 stdin, 1 stdout, 2 stderr, 3 error
//! (one `metav1.Status` JSON document when the command ends), 4 resize
//! (`{"Width":w,"Height":h}`); in v5 a message `[255, c]` closes channel
//! `c` (the client's end of stdin). Over SPDY the same roles are separate
//! streams named by the `streamtype` header.
//!
//! The status follows the kubelet's `remotecommand.ServeExec`: `Success`,
//! or `Failure` with reason `NonZeroExitCode` and a cause `ExitCode` whose
//! message is the code (client-go turns it into the process exit code), or
//! an `InternalError` when the command could not run.

use serde_json::{Value, json};

/// WebSocket subprotocol: v5 (adds the close message).
pub(crate) const V5: &str = "v5.channel.k8s.io";
/// WebSocket and SPDY protocol v4 (JSON status on the error channel).
pub(crate) const V4: &str = "v4.channel.k8s.io";
/// The port-forward protocol over SPDY.
pub(crate) const PORT_FORWARD: &str = "portforward.k8s.io";
/// kubectl 1.31+: SPDY/3.1 frames for port-forward carried in WebSocket
/// binary messages.
pub(crate) const TUNNELED_PORT_FORWARD: &str = "SPDY/3.1+portforward.k8s.io";

/// Channel ids of the WebSocket protocols.
pub(crate) const STDIN: u8 = 0;
/// Standard output.
pub(crate) const STDOUT: u8 = 1;
/// Standard error.
pub(crate) const STDERR: u8 = 2;
/// The status document.
pub(crate) const ERROR: u8 = 3;
/// Terminal size changes.
pub(crate) const RESIZE: u8 = 4;
/// v5: `[CLOSE, channel]` half-closes a channel.
pub(crate) const CLOSE: u8 = 255;

/// A terminal size, as kubectl sends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
pub(crate) struct TermSize {
    /// Columns.
    #[serde(rename = "Width")]
    pub(crate) width: u16,
    /// Rows.
    #[serde(rename = "Height")]
    pub(crate) height: u16,
}

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ExecOutcome {
    /// The command exited with this code (a signal `s` counts as `128 + s`).
    Exited(i32),
    /// The command could not run, or the session failed.
    Error(String),
}

/// The status document for `outcome` of `command`.
pub(crate) fn status(outcome: &ExecOutcome, command: &[String]) -> Value {
    match outcome {
        ExecOutcome::Exited(0) => json!({"metadata": {}, "status": "Success"}),
        ExecOutcome::Exited(code) => json!({
            "metadata": {},
            "status": "Failure",
            "message": format!(
                "command terminated with non-zero exit code: error executing command {command:?}, exit code {code}"
            ),
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
        }),
        ExecOutcome::Error(message) => json!({
            "metadata": {},
            "status": "Failure",
            "message": format!("Internal error occurred: {message}"),
            "reason": "InternalError",
            "details": {"causes": [{"message": message}]},
            "code": 500,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_travel_as_client_go_reads_them() {
        let cmd = vec!["sh".to_string(), "-c".into(), "exit 3".into()];
        assert_eq!(status(&ExecOutcome::Exited(0), &cmd)["status"], "Success");
        let s = status(&ExecOutcome::Exited(3), &cmd);
        assert_eq!(s["reason"], "NonZeroExitCode");
        assert_eq!(s["details"]["causes"][0]["reason"], "ExitCode");
        assert_eq!(s["details"]["causes"][0]["message"], "3");
        let e = status(&ExecOutcome::Error("no such file".into()), &cmd);
        assert_eq!(
            (e["reason"].as_str(), e["code"].as_u64()),
            (Some("InternalError"), Some(500))
        );
    }

    #[test]
    fn resize_messages_parse() {
        let t: TermSize = serde_json::from_str(r#"{"Width":80,"Height":24}"#).unwrap();
        assert_eq!(
            t,
            TermSize {
                width: 80,
                height: 24
            }
        );
    }
}
