//! Process checks from `/proc`.

/// Whether a process is gone (no such pid, or a zombie nobody reaped yet).
pub fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_process_is_not_gone_and_a_reaped_child_is() {
        assert!(!super::gone(std::process::id()));
        let mut child = std::process::Command::new("true").spawn().expect("true");
        let pid = child.id();
        child.wait().expect("reaped");
        assert!(super::gone(pid));
    }
}
