//! `$(VAR)` expansion in env values, commands and args, with the rules the
//! Kubernetes kubelet uses.
//!
//! Invariants:
//! 1. `$(NAME)` becomes the value of `NAME` when it is defined; an undefined
//!    reference is kept verbatim, so `$(MISSING)` stays `$(MISSING)`.
//! 2. `$$` is an escaped `$`: `$$(NAME)` yields the literal `$(NAME)`.
//! 3. A `$` followed by anything else, and an unclosed `$(`, are kept as is.

/// Expands `input` with `lookup`, which answers the value of a variable name
/// or `None` when it is undefined.
pub(crate) fn expand<'a>(input: &str, lookup: impl Fn(&str) -> Option<&'a str>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        match after.chars().next() {
            Some('$') => {
                out.push('$');
                rest = &after[1..];
            }
            Some('(') => match after.find(')') {
                Some(close) => {
                    let name = &after[1..close];
                    match lookup(name) {
                        Some(value) if !name.is_empty() => out.push_str(value),
                        _ => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &after[close + 1..];
                }
                None => {
                    out.push('$');
                    out.push_str(after);
                    rest = "";
                }
            },
            _ => {
                out.push('$');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn run(input: &str) -> String {
        let vars: HashMap<&str, &str> = [("A", "alpha"), ("EMPTY", ""), ("B", "$(A)")].into();
        expand(input, |k| vars.get(k).copied())
    }

    #[test]
    fn defined_references_are_replaced() {
        assert_eq!(run("x$(A)y"), "xalphay");
        assert_eq!(run("$(A)$(A)"), "alphaalpha");
        assert_eq!(run("[$(EMPTY)]"), "[]");
    }

    #[test]
    fn values_are_not_expanded_twice() {
        assert_eq!(run("$(B)"), "$(A)");
    }

    #[test]
    fn undefined_references_are_kept() {
        assert_eq!(run("$(MISSING)"), "$(MISSING)");
        assert_eq!(run("$()"), "$()");
    }

    #[test]
    fn escapes_and_stray_dollars() {
        assert_eq!(run("$$(A)"), "$(A)");
        assert_eq!(run("$$$(A)"), "$alpha");
        assert_eq!(run("cost: 5$"), "cost: 5$");
        assert_eq!(run("$x $(A"), "$x $(A");
        assert_eq!(run("no vars"), "no vars");
    }
}
