//! Exit codes and signals in words, so a failure's root cause reads without
//! a table: which signal (by name), and what the shell's conventional codes
//! mean (126 not executable, 127 command not found, 128+n killed by signal
//! n). The program is named where the code is about it.
//!
//! Invariants:
//! 1. Every message starts with what happened in the old words ("exited
//!    with code N", "killed by signal NAME"), so existing readers and
//!    searches still match; the explanation follows.
//! 2. A code above 128 is read as a signal only when 128+n names a real
//!    signal; anything else is a plain exit code.

/// The name of Linux signal `sig` (`SIGKILL`), if it is a standard one.
pub fn signal_name(sig: i32) -> Option<&'static str> {
    Some(match sig {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        5 => "SIGTRAP",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        10 => "SIGUSR1",
        11 => "SIGSEGV",
        12 => "SIGUSR2",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        16 => "SIGSTKFLT",
        17 => "SIGCHLD",
        18 => "SIGCONT",
        19 => "SIGSTOP",
        20 => "SIGTSTP",
        21 => "SIGTTIN",
        22 => "SIGTTOU",
        23 => "SIGURG",
        24 => "SIGXCPU",
        25 => "SIGXFSZ",
        26 => "SIGVTALRM",
        27 => "SIGPROF",
        28 => "SIGWINCH",
        29 => "SIGIO",
        30 => "SIGPWR",
        31 => "SIGSYS",
        _ => return None,
    })
}

/// The signal an exit code of 128+n stands for (invariant 2): n when it
/// names a real signal.
pub fn signal_of_code(code: i32) -> Option<i32> {
    (code > 128)
        .then(|| code - 128)
        .filter(|s| signal_name(*s).is_some())
}

/// What a signal usually means for a training proc, when that is worth
/// saying.
fn signal_hint(sig: i32) -> Option<&'static str> {
    Some(match sig {
        9 => "killed from outside (the OOM killer, a timeout, or kill -9)",
        11 => "a segmentation fault (bad memory access in native code)",
        6 => "aborted (an assertion or abort() in native code)",
        7 => "a bus error (often a full /dev/shm)",
        8 => "an arithmetic exception",
        4 => "an illegal instruction (a binary built for another CPU)",
        13 => "a write to a closed pipe or socket",
        _ => return None,
    })
}

/// The reason of a proc the kernel's OOM killer ended (its agent saw
/// SIGKILL while its cgroup's `oom_kill` count rose).
pub const OOM_KILLED: &str = "OOMKilled";

/// How an OOM-killed proc ended, in words.
pub fn oom_killed() -> String {
    "was OOM-killed: SIGKILL (9) from the kernel's OOM killer (its cgroup's oom_kill count rose while it ran; raise the memory limit or use less)".to_string()
}

/// "killed by signal SIGKILL (9): ..." for a process killed by `sig`.
pub fn killed(sig: i32) -> String {
    let name = signal_name(sig).map_or_else(|| format!("signal {sig}"), |n| format!("{n} ({sig})"));
    match signal_hint(sig) {
        Some(h) => format!("killed by signal {name}: {h}"),
        None => format!("killed by signal {name}"),
    }
}

/// "exited with code N" with what the code means; `program` is the
/// command's first word.
pub fn exited(code: i32, program: &str) -> String {
    match code {
        126 => format!(
            "exited with code 126: {program:?} is not executable (no execute permission, or not a program)"
        ),
        127 => format!(
            "exited with code 127: command not found: {program:?} (not on PATH in the image, or the file does not exist)"
        ),
        c if let Some(sig) = signal_of_code(c) => {
            let name = signal_name(sig).unwrap_or_default();
            match signal_hint(sig) {
                Some(h) => {
                    format!("exited with code {c}: a child was killed by {name} (128+{sig}), {h}")
                }
                None => format!("exited with code {c}: a child was killed by {name} (128+{sig})"),
            }
        }
        c => format!("exited with code {c}"),
    }
}

/// The command line for the record, bounded to `max` bytes.
pub fn command_line(command: &[String], args: &[String], max: usize) -> String {
    let line = command
        .iter()
        .chain(args)
        .map(|a| {
            if !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c))
            {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ");
    hostmesh_crds::procmesh::head(&line, max).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_by_name_with_what_they_usually_mean() {
        assert_eq!(
            killed(9),
            "killed by signal SIGKILL (9): killed from outside (the OOM killer, a timeout, or kill -9)"
        );
        assert!(killed(11).contains("SIGSEGV (11): a segmentation fault"));
        assert_eq!(killed(15), "killed by signal SIGTERM (15)");
        assert_eq!(killed(77), "killed by signal signal 77");
    }

    #[test]
    fn shell_codes_name_the_program() {
        assert!(exited(127, "pythn").contains("command not found: \"pythn\""));
        assert!(exited(126, "./train.sh").contains("\"./train.sh\" is not executable"));
        assert!(
            exited(137, "sh")
                .starts_with("exited with code 137: a child was killed by SIGKILL (128+9)")
        );
        assert!(exited(139, "sh").contains("SIGSEGV (128+11), a segmentation fault"));
        assert_eq!(exited(3, "x"), "exited with code 3");
        // Not 128+signal: a plain code (invariant 2).
        assert_eq!(exited(200, "x"), "exited with code 200");
        assert_eq!(exited(128, "x"), "exited with code 128");
    }

    #[test]
    fn command_lines_are_quoted_and_bounded() {
        let cmd = vec!["sh".to_string(), "-c".to_string()];
        let args = vec!["echo 'hi' && exit 3".to_string()];
        assert_eq!(
            command_line(&cmd, &args, 200),
            r"sh -c 'echo '\''hi'\'' && exit 3'"
        );
        assert_eq!(command_line(&cmd, &[], 4), "sh -");
    }
}
